//! Driver (b), dns: the real DNS question observer (the
//! `cgroup_skb/egress` program of `bpf/dns/query.bpf.c`), its gate
//! programmed by the real [`DnsGateManager`] from policies the real
//! compiler evaluated, fed DNS queries with `BPF_PROG_TEST_RUN`; each
//! question it observes is judged by the product's [`judge_name`] with the
//! merged dns lists of every policy the product finds selecting the pod,
//! and the reported (policy, verdict) pairs are compared with the model's
//! findings; so are the findings the real monitor makes of the record, as
//! the daemon hands it over.
//!
//! dns never refuses: every test run must pass the frame. What the kernel
//! decides is *whether* a question is observed (only the questions of a
//! cgroup some monitor policy with an active dns behavior selects: a
//! privacy boundary) and *as what* (the name lowercased, read off the
//! wire). So each question is sent as the universe spells it and in mixed
//! case with a trailing dot (the wire form has no trailing dot: both
//! spellings' dots encode as the one root label, so only the case differs
//! on the wire), over IPv4 and IPv6; the model is asked about the
//! spelling sent, the product judges the name the kernel observed.
//!
//! A question must be observed exactly when some selecting policy has a
//! dns behavior with a value on either side (the model's rule for an inert
//! behavior, `model::judge_name`): else it must leave no record. After each
//! case's policies are deleted no question may be observed. The observer
//! keeps no per-flow state, so frames need not be fresh flows.
//!
//! The process moves into a scratch child cgroup for the run, as the other
//! kernel drivers do (see [`crate::kernel_protocol`]).

use crate::kernel_common::{mode, pod, pod_labels, run_driver, run_sequences, KernelCase};
use crate::kernel_protocol::dns_query;
use crate::model::{self, Decision, Event, Kind, Mode, Policy};
use crate::reporting::{self, Reporter};
use crate::{step_of, universe, userspace, Run};
use kyverno_runtime_bpf::dns::{DnsQuestion, DnsReader};
use kyverno_runtime_bpf::frame::udp_datagram_to;
use kyverno_runtime_enforce::dns::{judge_name, DnsGateManager, DnsPolicy, KernelDns};
use kyverno_runtime_enforce::egress::{ContainerCgroup, NetworkPod};
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_plane::{Event as PlaneEvent, Facts};
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::BehaviorKind;
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The driver's name, as `Run.driver` reports it.
const DRIVER: &str = "dns-bpf";

/// The sequences driver's name.
const SEQUENCE_DRIVER: &str = "dns-bpf-seq";

/// `BPF_PROG_TEST_RUN`'s return value for a passed packet: the observer's
/// only verdict.
const PASS: u32 = 1;

/// The resolver the queries go to: the observer reads UDP to port 53.
const RESOLVER_V4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const RESOLVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x53);

// ---- cases --------------------------------------------------------------------------

/// 1 to 8 policies of dns behaviors only (monitor: the universe never puts
/// dns in enforce), from the universe's values.
pub fn dns_policies() -> impl Strategy<Value = Vec<Policy>> {
    universe::policies_of(&[Kind::Dns], universe::values_of)
}

/// `name` in mixed case (every other letter upper) with a trailing dot:
/// what a resolver library may send, and the kernel must lowercase.
fn mixed_case(name: &str) -> String {
    let mut upper = true;
    let mut out: String = name
        .chars()
        .map(|c| {
            if !c.is_ascii_alphabetic() {
                return c;
            }
            upper = !upper;
            if upper {
                c.to_ascii_lowercase()
            } else {
                c.to_ascii_uppercase()
            }
        })
        .collect();
    out.push('.');
    out
}

/// The name the observer reports for `spelling`: lowercase, no trailing
/// dot (`bpf/src/dns/mod.rs`, `DnsQuestion::qname`).
fn observed_form(spelling: &str) -> String {
    spelling.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether the model's rules observe the pod at all: a selecting monitor
/// policy with a dns behavior that is not inert (a value on either side).
fn observed_by_model(policies: &[Policy]) -> bool {
    policies.iter().any(|p| {
        p.selects
            && p.mode == Mode::Monitor
            && p.behaviors
                .iter()
                .any(|b| b.kind == Kind::Dns && (!b.allow.is_empty() || !b.deny.is_empty()))
    })
}

/// The model's reported verdict as the product names it
/// ([`kyverno_runtime_enforce::dns::NameVerdict::name`]).
fn verdict_of(d: Decision) -> &'static str {
    match d {
        Decision::Discovered => "discovered",
        Decision::Denied => "denied",
        Decision::Unexpected => "unexpected",
        Decision::DefaultDenied => "default-denied (never for dns)",
    }
}

// ---- the product --------------------------------------------------------------------

/// One policy as the product holds it for judging: its selector and its
/// merged dns lists.
struct Compiled {
    name: String,
    target: PodTarget,
    dns: Option<BehaviorLists>,
}

/// The gate manager over the kernel observer, its reader, and one pod on
/// the scratch cgroup.
struct Kernel {
    manager: DnsGateManager<KernelDns>,
    reader: DnsReader,
    pod: NetworkPod,
    cgroup: u64,
    /// The policies programmed now, by name, as the product judges them.
    held: BTreeMap<String, Compiled>,
    reporter: Reporter,
}

impl Kernel {
    fn new(cgroup: ContainerCgroup) -> Result<Self, String> {
        let mut manager = DnsGateManager::load().map_err(|e| format!("loading: {e}"))?;
        let reader = manager.reader().map_err(|e| format!("reader: {e}"))?;
        let id = cgroup.id;
        let pod = pod(cgroup);
        if let Some(f) = manager.upsert_pod(pod.clone()).first() {
            return Err(f.to_string());
        }
        let mut k = Self {
            manager,
            reader,
            pod,
            cgroup: id,
            held: BTreeMap::new(),
            reporter: Reporter::new(pod_labels()),
        };
        // Nothing selects the pod yet: nothing may be observed.
        for q in universe::QUESTIONS {
            if let Some(got) = k.ask(q, false)?.first() {
                return Err(format!("{q} observed before any policy: {got:?}"));
            }
        }
        // The stats baseline, so a case's losses are its own.
        k.manager.stats_delta().map_err(|e| format!("stats: {e}"))?;
        Ok(k)
    }

    /// Sends a query for `spelling` from the pod; what the kernel observed.
    fn ask(&mut self, spelling: &str, v6: bool) -> Result<Vec<DnsQuestion>, String> {
        let dst = if v6 {
            SocketAddr::new(IpAddr::V6(RESOLVER_V6), 53)
        } else {
            SocketAddr::new(IpAddr::V4(RESOLVER_V4), 53)
        };
        let frame = udp_datagram_to(40053, dst, &dns_query(spelling));
        let verdict = self
            .manager
            .kernel()
            .observer()
            .test_run(&frame)
            .map_err(|e| format!("test run: {e}"))?;
        if verdict != PASS {
            return Err(format!(
                "the observer returned {verdict} for a query for {spelling}: dns never drops"
            ));
        }
        // A committed record is readable at once; no wait needed.
        self.reader
            .poll_questions(Duration::ZERO)
            .map_err(|e| format!("reading the questions: {e}"))
    }

    /// Sends every question, as spelled and in mixed case, over both
    /// families; nothing may be observed.
    fn nothing_observed(&mut self) -> Result<(), String> {
        for q in universe::QUESTIONS {
            for v6 in [false, true] {
                let got = self.ask(q, v6)?;
                if !got.is_empty() {
                    return Err(format!(
                        "after every policy was deleted, {q} is still observed: {got:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The (policy, verdict) pairs the product reports for an observed
    /// `qname`: each policy whose selector selects the pod, judged alone.
    fn judged(&self, qname: &str) -> BTreeSet<(String, &'static str)> {
        self.held
            .values()
            .filter(|c| {
                c.target
                    .matches(&self.pod.namespace_labels, &self.pod.labels)
            })
            .filter_map(|c| {
                let verdict = judge_name(c.dns.as_ref()?, qname);
                verdict.reported().then(|| (c.name.clone(), verdict.name()))
            })
            .collect()
    }
}

impl KernelCase for Kernel {
    /// Compiles `p` as the daemon does and upserts its dns part; the
    /// monitor is given it too.
    fn apply(&mut self, p: &Policy) -> Result<(), String> {
        let (compiled, result) = userspace::compile(p).map_err(|e| e.0)?;
        let dns = BehaviorLists::merge(&result, BehaviorKind::Dns);
        let outcome = self.manager.upsert_policy(DnsPolicy {
            id: PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?,
            name: p.name.clone(),
            mode: mode(p.mode),
            target: compiled.target.clone(),
            dns: dns.clone(),
        });
        self.reporter.set_policy(p, &compiled, &result);
        self.held.insert(
            p.name.clone(),
            Compiled {
                name: p.name.clone(),
                target: compiled.target,
                dns,
            },
        );
        if !outcome.rejections.is_empty() || !outcome.failures.is_empty() {
            return Err(format!("{}: dns not gated: {outcome:?}", p.name));
        }
        Ok(())
    }

    fn delete(&mut self, name: &str) -> Result<(), String> {
        let id = PolicyId::new(name.to_owned()).map_err(|e| e.to_string())?;
        self.reporter.remove_policy(name);
        self.held.remove(name);
        match self.manager.delete_policy(&id).first() {
            Some(f) => Err(f.to_string()),
            None => Ok(()),
        }
    }

    fn probe(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
        let observed = observed_by_model(policies);
        for q in universe::QUESTIONS {
            checked.set(checked.get() + 1);
            for spelling in [(*q).to_owned(), mixed_case(q)] {
                for v6 in [false, true] {
                    let family = if v6 { "IPv6" } else { "IPv4" };
                    let got = self.ask(&spelling, v6)?;
                    let want = model::decide(policies, &Event::Dns(spelling.clone()));
                    let want: BTreeSet<(String, &str)> = want
                        .findings
                        .iter()
                        .map(|f| (f.policy.clone(), verdict_of(f.decision)))
                        .collect();
                    let question = match got.as_slice() {
                        [] if !observed && want.is_empty() => continue,
                        [one] if observed => one,
                        _ => {
                            return Err(format!(
                                "a query for {spelling:?} over {family}: the kernel observed \
                                 {got:?}, the model {} the pod (its findings: {want:?})",
                                if observed {
                                    "observes"
                                } else {
                                    "does not observe"
                                }
                            ))
                        }
                    };
                    if question.cgroup_id != self.cgroup
                        || question.qname != observed_form(&spelling)
                    {
                        return Err(format!(
                            "a query for {spelling:?} over {family} from cgroup {}: the kernel \
                             observed {question:?}",
                            self.cgroup
                        ));
                    }
                    let reported = self.judged(&question.qname);
                    if reported != want {
                        return Err(format!(
                            "a query for {spelling:?} over {family}, observed as {:?}: the \
                             product reports {reported:?}, the model {want:?}",
                            question.qname
                        ));
                    }
                    // The manager's own attribution must say the same.
                    let attributed: BTreeSet<(String, &str)> = self
                        .manager
                        .verdicts(question.cgroup_id, &question.qname)
                        .into_iter()
                        .filter(|v| v.verdict.reported())
                        .map(|v| (v.name, v.verdict.name()))
                        .collect();
                    if attributed != reported {
                        return Err(format!(
                            "{:?}: the manager's verdicts report {attributed:?}, judge_name \
                             over the selecting policies {reported:?}",
                            question.qname
                        ));
                    }
                    // And the monitor, given the record as the daemon
                    // gives it (engine/observe.rs, `dns_event`).
                    let mut e = PlaneEvent::new(
                        "dnsquery",
                        Facts::Dns {
                            qname: question.qname.clone(),
                        },
                    );
                    e.cgroup = Some(question.cgroup_id);
                    let found = self.reporter.findings(vec![e]);
                    let model = reporting::reported(&model::decide(
                        policies,
                        &Event::Dns(spelling.clone()),
                    ));
                    if found != model {
                        return Err(format!(
                            "{:?}: the monitor reports {found:?}, the model {model:?}",
                            question.qname
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Nothing may stay observed or attached, nothing may have been lost,
    /// and no question is observed any more.
    fn check_empty(&mut self) -> Result<(), String> {
        // Whatever a failed probe left unread.
        let left = self
            .reader
            .poll_questions(Duration::ZERO)
            .map_err(|e| format!("reading the questions: {e}"))?;
        let lost = self
            .manager
            .stats_delta()
            .map_err(|e| format!("stats: {e}"))?;
        let observed = self.manager.observed();
        let attached: Vec<u64> = self.manager.kernel().attached().collect();
        if !observed.is_empty() || !attached.is_empty() {
            return Err(format!(
                "deleted every policy, still observed {observed:?}, attached {attached:?}"
            ));
        }
        if lost.ringbuf_full != 0 || lost.name_unreadable != 0 {
            return Err(format!(
                "the kernel lost questions: {lost:?} (left: {left:?})"
            ));
        }
        if self.reader.undecodable() != 0 {
            return Err(format!(
                "{} records did not decode",
                self.reader.undecodable()
            ));
        }
        self.nothing_observed()
    }
}

/// Driver (b), dns: about `cases` (policy set, question) pairs, each
/// policy set drawn from the dns universe (seeded with `seed`), gated by
/// the real [`DnsGateManager`] over the real kernel observer, which is fed
/// a query for every name of [`universe::QUESTIONS`] (as spelled and in
/// mixed case, over IPv4 and IPv6; `BPF_PROG_TEST_RUN`). Whether the
/// question is observed, as what, and the (policy, verdict) pairs the
/// product's [`judge_name`] reports for it are compared with
/// [`model::decide`]'s findings. After each set its policies are deleted
/// and no question may be observed.
///
/// Needs root and a cgroup v2 mount (otherwise the run has no cases and
/// says why); moves this process into a scratch child cgroup for the run
/// (moved back and removed on the way out), so it must be called with no
/// other thread running.
pub fn kernel_dns(cases: u64, seed: u64) -> Run {
    // The replay scenario of a disagreement asks every question.
    let every: Vec<Event> = universe::QUESTIONS
        .iter()
        .map(|q| Event::Dns((*q).to_owned()))
        .collect();
    run_driver(
        DRIVER,
        cases,
        seed,
        universe::QUESTIONS.len(),
        dns_policies(),
        every,
        Kernel::new,
    )
}

/// Driver (d), dns: about `cases` (step, question) pairs over sequences of
/// dns policy steps (add, edit, selector change, delete; dns is monitor
/// only), every question asked after each step as [`kernel_dns`] does,
/// against the model over the policies then current. Same needs as
/// [`kernel_dns`].
pub fn kernel_dns_sequences(cases: u64, seed: u64) -> Run {
    run_sequences(
        SEQUENCE_DRIVER,
        cases,
        seed,
        universe::QUESTIONS.len(),
        step_of(&[Kind::Dns], universe::values_of),
        Kernel::new,
    )
}
