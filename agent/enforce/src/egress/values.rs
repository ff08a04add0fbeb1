//! The network values: what a policy's entries compile to ([`compile_network`]).

use super::*;

/// One destination a policy's network entry names, as the backend
/// programs it: a prefix into the tries, or a domain into the set's
/// domains, whose addresses the snooper learns from the pod's DNS
/// answers. A Service never reaches the backend: the manager programs the
/// prefixes of its addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    /// An address or a network of any prefix length.
    Prefix(Prefix),
    /// A domain name (exact: no wildcard).
    Domain(Domain),
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Prefix(p) => write!(f, "{p}"),
            Destination::Domain(d) => write!(f, "{d}"),
        }
    }
}

/// Why a network value was not programmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The value is not a valid network value (the parser's reason).
    Invalid(Reason),
    /// A domain whose wire form the kernel's 128-byte name key cannot hold
    /// (a DNS answer for it could never be matched).
    DomainTooLong(EncodeError),
    /// A domain, on a node whose kernel refused the DNS answer snooper
    /// that learns domains' addresses (the reason).
    DomainsUnavailable(String),
}

/// A network value the kernel map cannot hold: where it was, what it was
/// and why. The rest of the list is programmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressRejection {
    /// The field path, such as `spec.behaviors[0].network.deny`.
    pub path: String,
    /// The value as written.
    pub value: String,
    /// Why it was refused.
    pub reason: RejectReason,
}

impl EgressRejection {
    pub(super) fn invalid(e: ValueError) -> Self {
        Self {
            path: e.path,
            value: e.value,
            reason: RejectReason::Invalid(e.reason),
        }
    }
}

impl fmt::Display for EgressRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            RejectReason::Invalid(reason) => {
                write!(
                    f,
                    "{}: {:?} is not programmed: {reason}",
                    self.path, self.value
                )
            }
            RejectReason::DomainTooLong(e) => write!(
                f,
                "{}: domain {:?} is not programmed: {e}",
                self.path, self.value
            ),
            RejectReason::DomainsUnavailable(why) => write!(
                f,
                "{}: domain {:?} is not programmed: this node cannot learn domain addresses ({why})",
                self.path, self.value
            ),
        }
    }
}

/// What the compiler of a `network` behavior needs to know besides the
/// lists: the Services' addresses, and whether this node can serve
/// domains.
#[derive(Clone, Copy, Debug)]
pub struct NameContext<'a> {
    /// The Services the API reported.
    pub services: &'a ServiceAddresses,
    /// `Err(why)` when domains cannot be served (the kernel refused the
    /// DNS answer snooper).
    pub domains: std::result::Result<(), &'a str>,
}

/// A `network` behavior compiled for the backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompiledNetwork {
    /// The program, `None` when there is nothing to hold.
    pub program: Option<Program<Destination>>,
    /// The values refused, in list order.
    pub rejections: Vec<EgressRejection>,
    /// Every Service the lists name (in enforce mode, each one's
    /// addresses are in the program).
    pub services: BTreeSet<ServiceName>,
    /// The named Services with no address yet (absent, or without
    /// endpoints): they resolve to nothing until they have one.
    pub unresolved: BTreeSet<ServiceName>,
}

/// Adds what one parsed value programs to `side`: its prefix, its
/// Service's addresses, or its domain; or says why it cannot.
pub(super) fn program_value(
    target: NetworkTarget,
    names: &NameContext<'_>,
    out: &mut CompiledNetwork,
    side: &mut BTreeSet<Destination>,
    path: &str,
    value: &str,
) -> Result<(), EgressRejection> {
    let reject = |reason| EgressRejection {
        path: path.to_owned(),
        value: value.to_owned(),
        reason,
    };
    match target {
        NetworkTarget::Ip(addr) => {
            side.insert(Destination::Prefix(Prefix::host(addr)));
        }
        NetworkTarget::Cidr(c) => {
            let p = Prefix::new(c.addr(), c.prefix_len())
                // The policy crate checked the length against the family.
                .map_err(|_| reject(RejectReason::Invalid(Reason::BadCidrAddress)))?;
            side.insert(Destination::Prefix(p));
        }
        NetworkTarget::Service { name, namespace } => {
            let service = ServiceName { namespace, name };
            match names.services.get(&service) {
                Some(addrs) if !addrs.is_empty() => {
                    side.extend(addrs.iter().map(|a| Destination::Prefix(Prefix::host(*a))))
                }
                _ => {
                    out.unresolved.insert(service.clone());
                }
            }
            out.services.insert(service);
        }
        NetworkTarget::Domain(name) => {
            if let Err(why) = names.domains {
                return Err(reject(RejectReason::DomainsUnavailable(why.to_owned())));
            }
            let d = Domain::new(&name).map_err(|e| reject(RejectReason::DomainTooLong(e)))?;
            side.insert(Destination::Domain(d));
        }
        // Handled by the caller: in deny it is the default deny, in allow
        // it is refused before parsing.
        NetworkTarget::Any => return Err(reject(RejectReason::Invalid(Reason::StarInAllow))),
    }
    Ok(())
}

/// Compiles a `network` behavior's lists for `mode`, resolving Services
/// from `names.services`: the program (none when there is nothing to
/// hold), the values refused in list order, and the Services named.
///
/// Monitor mode parses the values too (their rejections belong on the
/// status either way) but programs [`Program::Observe`], naming the
/// domains among them so their answers are learned.
pub fn compile_network(
    mode: Mode,
    lists: Option<&BehaviorLists>,
    names: &NameContext<'_>,
) -> CompiledNetwork {
    let mut out = CompiledNetwork::default();
    let Some(lists) = lists else {
        return out;
    };
    let mut rules = Rules::default();
    let allow_at = lists.field.field("allow");
    for value in &lists.allow {
        if value == STAR {
            out.rejections
                .push(EgressRejection::invalid(ValueError::new(
                    &allow_at,
                    value,
                    Reason::StarInAllow,
                )));
            continue;
        }
        let programmed = parse_network(value, &allow_at)
            .map_err(EgressRejection::invalid)
            .and_then(|t| {
                program_value(
                    t,
                    names,
                    &mut out,
                    &mut rules.allow,
                    allow_at.as_str(),
                    value,
                )
            });
        if let Err(r) = programmed {
            out.rejections.push(r);
        }
    }
    let deny_at = lists.field.field("deny");
    for value in &lists.deny {
        if value == STAR {
            // The default deny; the explicit denies beside it are still
            // programmed, and win over every allow (kyverno_runtime_policy::rule).
            rules.default_deny = true;
            continue;
        }
        let programmed = parse_network(value, &deny_at)
            .map_err(EgressRejection::invalid)
            .and_then(|t| {
                program_value(t, names, &mut out, &mut rules.deny, deny_at.as_str(), value)
            });
        if let Err(r) = programmed {
            out.rejections.push(r);
        }
    }
    out.program = match mode {
        // The domains are named so the kernel learns their answers, for
        // the monitor to know what a destination was known under.
        Mode::Monitor => Some(Program::Observe(
            rules
                .allow
                .iter()
                .chain(&rules.deny)
                .filter(|d| matches!(d, Destination::Domain(_)))
                .cloned()
                .collect(),
        )),
        Mode::Enforce
            if rules.allow.is_empty()
                && rules.deny.is_empty()
                && !rules.default_deny
                && out.services.is_empty() =>
        {
            None
        }
        Mode::Enforce => Some(Program::Enforce(rules)),
    };
    out
}
