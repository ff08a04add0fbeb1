//! The backend: each cgroup's set as the union of its bound policies ([`EgressEnforcer`]), its ledger and its adoption after a restart.

use super::*;

/// The union one cgroup should have, or has, in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SetState {
    pub(super) allow: BTreeSet<Prefix>,
    pub(super) deny: BTreeSet<Prefix>,
    /// Domains, each on the sides some bound policy puts it.
    pub(super) domains: BTreeMap<Domain, DomainVerdicts>,
    pub(super) flags: FilterFlags,
}

/// The backend's numbers for domain names (what a learned address carries
/// to say which name taught it): one per name, the same in every set.
#[derive(Clone, Debug, Default)]
pub(super) struct NameIds {
    pub(super) ids: BTreeMap<Domain, u32>,
    pub(super) next: u32,
}

impl NameIds {
    /// `domain`'s number, assigned on first use (from 1).
    pub(super) fn id(&mut self, domain: &Domain) -> u32 {
        if let Some(id) = self.ids.get(domain) {
            return *id;
        }
        self.next = self.next.wrapping_add(1).max(1);
        self.ids.insert(domain.clone(), self.next);
        self.next
    }

    /// Keeps a number the kernel already holds (adoption).
    pub(super) fn adopt(&mut self, domain: &Domain, id: u32) {
        self.ids.entry(domain.clone()).or_insert(id);
        self.next = self.next.max(id);
    }

    /// The number of `domain`, if it has one.
    pub(super) fn get(&self, domain: &Domain) -> Option<u32> {
        self.ids.get(domain).copied()
    }
}

/// Writes `domain`'s sides in set `set_id` (none: removes it) and updates
/// the mirror once the kernel took it.
pub(super) fn write_domain<K: EgressKernel>(
    k: &mut K,
    ids: &mut NameIds,
    state: &mut SetState,
    set_id: u32,
    domain: &Domain,
    verdicts: DomainVerdicts,
    cgroup: CgroupId,
) -> Result<()> {
    k.set_domain(set_id, domain, verdicts, ids.id(domain))
        .map_err(|e| kernel_error(format!("naming {domain} for cgroup {cgroup}"), &e))?;
    if verdicts.is_empty() {
        state.domains.remove(domain);
    } else {
        state.domains.insert(domain.clone(), verdicts);
    }
    Ok(())
}

/// One cgroup's kernel mirror.
#[derive(Clone, Debug)]
pub(super) struct CgroupSet {
    pub(super) set_id: u32,
    /// What the kernel holds for the set (changed only by calls that
    /// succeeded).
    pub(super) kernel: SetState,
    /// Whether the program is attached and the cgroup mapped.
    pub(super) attached: bool,
}

/// How many bound policies hold a cgroup's flags up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlagCounts {
    /// Bound enforce policies that are default deny.
    pub default_deny: usize,
    /// Bound observe policies.
    pub observe: usize,
}

/// The network [`Enforcer`] over the cgroup_skb egress filter (see the
/// [module docs](self)).
pub struct EgressEnforcer<K = KernelEgress> {
    pub(super) kernel: K,
    pub(super) policies: BTreeMap<PolicyId, Held<Destination>>,
    pub(super) sets: BTreeMap<CgroupId, CgroupSet>,
    pub(super) paths: BTreeMap<CgroupId, PathBuf>,
    pub(super) free_set_ids: Vec<u32>,
    pub(super) next_set_id: u32,
    pub(super) name_ids: NameIds,
    /// What released sets counted before their ids were freed, attributed
    /// to their cgroups: handed out by the next drain.
    pub(super) released_observations: Vec<Observation<IpAddr>>,
}

impl<K> fmt::Debug for EgressEnforcer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressEnforcer")
            .field("policies", &self.policies.len())
            .field("cgroups", &self.sets.len())
            .finish_non_exhaustive()
    }
}

impl EgressEnforcer<KernelEgress> {
    /// Loads the egress filter, unpinned, and serves the network behavior
    /// with it: its programs detach when the process exits.
    pub fn load() -> Result<Self> {
        KernelEgress::load()
            .map(Self::new)
            .map_err(|e| kernel_error("loading the egress filter".to_owned(), &e))
    }

    /// Loads the egress filter pinned under `dir` (a bpffs directory,
    /// created if missing, e.g. `<pin dir>/egress`) and adopts what an
    /// earlier process pinned there ([`Self::adopt`]): its programs and
    /// maps outlive the process, and [`Enforcer::held`] starts from what
    /// the earlier one held. See the [module docs](self#restarts).
    ///
    /// Pinned state that loads but cannot be read back (an undecodable
    /// entry) is discarded too, with a warning: the map pins are removed
    /// and the filter loaded afresh, its links left enforcing until
    /// replaced or reconciled.
    pub fn load_pinned(dir: &Path) -> Result<Self> {
        let load = || {
            KernelEgress::load_pinned(dir).map_err(|e| {
                kernel_error(
                    format!("loading the egress filter pinned at {}", dir.display()),
                    &e,
                )
            })
        };
        match Self::adopt(load()?) {
            Err(e @ EnforceError::Adopt { .. }) => {
                tracing::warn!(pin_dir = %dir.display(), error = %e, "egress: discarding pinned state that cannot be read back");
                EgressFilter::discard_pinned_maps(dir).map_err(|e| {
                    kernel_error(
                        format!("discarding the maps pinned at {}", dir.display()),
                        &e,
                    )
                })?;
                Self::adopt(load()?)
            }
            other => other,
        }
    }

    /// Removes the egress backend's pins under `dir` (uninstall), and
    /// nothing else ([`EgressFilter::remove_pins`]): each link detaches
    /// once no process holds it, after an RCU grace period.
    pub fn remove_pins(
        dir: &Path,
    ) -> kyverno_runtime_bpf::pins::Result<kyverno_runtime_bpf::pins::Removal> {
        EgressFilter::remove_pins(dir)
    }
}

pub(super) fn adopt_err(reason: String) -> EnforceError {
    EnforceError::Adopt {
        behavior: BEHAVIOR,
        reason,
    }
}

/// A policy id as the ledger keys it.
pub(super) fn ledger_id(policy: &PolicyId) -> &[u8] {
    policy.as_str().as_bytes()
}

impl<K: EgressKernel> EgressEnforcer<K> {
    /// A backend over `kernel`, holding nothing.
    pub fn new(kernel: K) -> Self {
        Self {
            kernel,
            policies: BTreeMap::new(),
            sets: BTreeMap::new(),
            paths: BTreeMap::new(),
            free_set_ids: Vec::new(),
            next_set_id: 1,
            name_ids: NameIds::default(),
            released_observations: Vec::new(),
        }
    }

    /// A backend over `kernel`, adopting what it adopted from pins (see the
    /// [module docs](self#restarts)): the policies of the ledger become
    /// [`Enforcer::held`], each filtered cgroup's mirror is read from the
    /// maps, leftovers of an interrupted change are cleaned, and each
    /// cgroup is synced once to the union of its policies. Over a kernel
    /// that adopted nothing this is [`Self::new`]. Fails only when the
    /// pinned state cannot be read.
    pub fn adopt(kernel: K) -> Result<Self> {
        let mut b = Self::new(kernel);
        let Some(Adopted { state, attached }) = b
            .kernel
            .adopted()
            .map_err(|e| adopt_err(format!("reading the pinned maps: {e}")))?
        else {
            return Ok(b);
        };
        let PinnedState {
            filters,
            sets: entries,
            ledger,
        } = state;

        // Cgroups: the mirror is what the maps hold. A map entry without
        // an adopted link (an interrupted attach or detach), or one that
        // shares its set with another cgroup (never written so), is
        // revoked: no program of this object filters it.
        let mut used = BTreeSet::new();
        for (cgroup, (set_id, flags)) in filters {
            if attached.contains(&cgroup) && used.insert(set_id) {
                let e = entries.get(&set_id).cloned().unwrap_or_default();
                for (d, (_, id)) in &e.domains {
                    b.name_ids.adopt(d, *id);
                }
                b.sets.insert(
                    cgroup,
                    CgroupSet {
                        set_id,
                        kernel: SetState {
                            allow: e.allow,
                            deny: e.deny,
                            domains: e.domains.into_iter().map(|(d, (v, _))| (d, v)).collect(),
                            flags,
                        },
                        attached: true,
                    },
                );
            } else if let Err(e) = b.kernel.detach(cgroup) {
                tracing::warn!(cgroup, error = %e, "egress adoption: revoking an unattached cgroup failed");
            }
        }
        // Entries of sets no cgroup uses (an interrupted release).
        for (set_id, e) in &entries {
            if used.contains(set_id) {
                continue;
            }
            for (verdict, list) in [(Verdict::Allow, &e.allow), (Verdict::Deny, &e.deny)] {
                for p in list {
                    if let Err(e) = b.kernel.remove(*set_id, verdict, *p) {
                        tracing::warn!(set = set_id, prefix = %p, error = %e, "egress adoption: removing an unused entry failed");
                    }
                }
            }
            for (d, (_, id)) in &e.domains {
                if let Err(e) = b
                    .kernel
                    .set_domain(*set_id, d, DomainVerdicts::default(), *id)
                {
                    tracing::warn!(set = set_id, domain = %d, error = %e, "egress adoption: removing an unused domain failed");
                }
            }
            if let Err(e) = b.kernel.forget_learned(*set_id, None) {
                tracing::warn!(set = set_id, error = %e, "egress adoption: forgetting an unused set's learned addresses failed");
            }
        }
        if let Some(max) = used.iter().max() {
            b.next_set_id = max.wrapping_add(1).max(1);
            if *max <= 1 << 16 {
                b.free_set_ids = (1..*max).rev().filter(|id| !used.contains(id)).collect();
            }
        }

        // Policies: from the ledger. Bindings of cgroups not attached any
        // more are dropped (and forgotten), so the manager binds them
        // anew; entries of ids without a record are an interrupted
        // removal, cleaned.
        for (raw, entry) in ledger {
            let id = std::str::from_utf8(&raw)
                .ok()
                .and_then(|s| PolicyId::new(s).ok());
            let destinations = |prefixes: &BTreeSet<Prefix>, domains: &BTreeSet<Domain>| {
                prefixes
                    .iter()
                    .map(|p| Destination::Prefix(*p))
                    .chain(domains.iter().map(|d| Destination::Domain(d.clone())))
                    .collect::<BTreeSet<_>>()
            };
            let program = match entry.kind {
                Some(LedgerKind::Enforce { default_deny }) => Some(Program::Enforce(Rules {
                    allow: destinations(&entry.allow, &entry.allow_domains),
                    deny: destinations(&entry.deny, &entry.deny_domains),
                    default_deny,
                })),
                // An observer's domains are recorded on the allow side.
                Some(LedgerKind::Observe) => Some(Program::Observe(
                    entry
                        .allow_domains
                        .iter()
                        .map(|d| Destination::Domain(d.clone()))
                        .collect(),
                )),
                None => None,
            };
            let (Some(id), Some(program)) = (id, program) else {
                b.forget_ledger(&raw, &entry);
                continue;
            };
            if program.is_observe() {
                // An observer has no rules but its domains: stray ones
                // are forgotten.
                let rules_only = bpf::LedgerPolicy {
                    kind: None,
                    cgroups: BTreeSet::new(),
                    allow_domains: BTreeSet::new(),
                    ..entry.clone()
                };
                b.forget_ledger(&raw, &rules_only);
            }
            let mut cgroups = BTreeSet::new();
            for c in entry.cgroups {
                if b.sets.contains_key(&c) {
                    cgroups.insert(c);
                } else if let Err(e) = b.kernel.ledger_binding(&raw, c, false) {
                    tracing::warn!(policy = %id, cgroup = c, error = %e, "egress adoption: forgetting a binding failed");
                }
            }
            b.policies.insert(id, Held { program, cgroups });
        }

        // Each cgroup to the union of its adopted policies: nothing is
        // written when the maps already hold it.
        let cgroups: BTreeSet<CgroupId> = b.sets.keys().copied().collect();
        if let Err(e) = b.sync_all(&cgroups) {
            tracing::warn!(error = %e, "egress adoption: a cgroup did not converge; retried on its next change");
        }
        tracing::info!(
            policies = b.policies.len(),
            cgroups = b.sets.len(),
            "egress: adopted pinned state"
        );
        Ok(b)
    }

    /// Changes the domains an observe policy names ([`ProgramDiff::between_programs`]:
    /// the allow side of `diff`); an observer has no other rules.
    pub(super) fn update_observer(
        &mut self,
        policy: &PolicyId,
        diff: &ProgramDiff<Destination>,
    ) -> Result<()> {
        if diff.is_empty() {
            return Ok(());
        }
        let named =
            |set: &BTreeSet<Destination>| set.iter().all(|d| matches!(d, Destination::Domain(_)));
        if !diff.add_deny.is_empty()
            || !diff.remove_deny.is_empty()
            || diff.default_deny.is_some()
            || !named(&diff.add_allow)
            || !named(&diff.remove_allow)
        {
            return Err(EnforceError::Kernel {
                behavior: BEHAVIOR,
                op: format!("updating policy {policy}"),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "an observe policy has no rules to update but the domains it names",
                ),
            });
        }
        let entries = |set: &BTreeSet<Destination>| -> Vec<(Verdict, Destination)> {
            set.iter().map(|d| (Verdict::Allow, d.clone())).collect()
        };
        self.ledger_rules(policy, &entries(&diff.add_allow), true)?;
        self.ledger_rules(policy, &entries(&diff.remove_allow), false)?;
        let Some(Held {
            program: Program::Observe(watch),
            cgroups,
        }) = self.policies.get_mut(policy)
        else {
            return Ok(());
        };
        watch.extend(diff.add_allow.iter().cloned());
        watch.retain(|d| !diff.remove_allow.contains(d));
        let cgroups = cgroups.clone();
        self.sync_all(&cgroups)
    }

    /// Removes every ledger entry of `entry` (best effort, logged).
    pub(super) fn forget_ledger(&mut self, raw: &[u8], entry: &bpf::LedgerPolicy) {
        let id = String::from_utf8_lossy(raw).into_owned();
        let mut failed = Vec::new();
        for c in &entry.cgroups {
            failed.extend(self.kernel.ledger_binding(raw, *c, false).err());
        }
        for (verdict, list) in [(Verdict::Allow, &entry.allow), (Verdict::Deny, &entry.deny)] {
            for p in list {
                failed.extend(self.kernel.ledger_rule(raw, verdict, *p, false).err());
            }
        }
        for (verdict, list) in [
            (Verdict::Allow, &entry.allow_domains),
            (Verdict::Deny, &entry.deny_domains),
        ] {
            for d in list {
                failed.extend(self.kernel.ledger_domain_rule(raw, verdict, d, false).err());
            }
        }
        if entry.kind.is_some() {
            failed.extend(self.kernel.ledger_policy(raw, None).err());
        }
        for e in failed {
            tracing::warn!(policy = %id, error = %e, "egress adoption: forgetting a ledger entry failed");
        }
    }

    /// Writes `rules`' entries into the ledger (`present`) or out of it,
    /// deny entries first; on a failure, returns it after undoing what it
    /// wrote (best effort).
    pub(super) fn ledger_rules(
        &mut self,
        policy: &PolicyId,
        rules: &[(Verdict, Destination)],
        present: bool,
    ) -> Result<()> {
        for (i, (verdict, d)) in rules.iter().enumerate() {
            if let Err(e) = self.ledger_entry(policy, *verdict, d, present) {
                for (verdict, d) in &rules[..i] {
                    let _ = self.ledger_entry(policy, *verdict, d, !present);
                }
                return Err(kernel_error(format!("recording policy {policy}"), &e));
            }
        }
        Ok(())
    }

    /// Records or removes one entry of a policy in the ledger.
    pub(super) fn ledger_entry(
        &mut self,
        policy: &PolicyId,
        verdict: Verdict,
        destination: &Destination,
        present: bool,
    ) -> Result<(), EgressError> {
        match destination {
            Destination::Prefix(p) => {
                self.kernel
                    .ledger_rule(ledger_id(policy), verdict, *p, present)
            }
            Destination::Domain(d) => {
                self.kernel
                    .ledger_domain_rule(ledger_id(policy), verdict, d, present)
            }
        }
    }

    /// The kernel side.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The kernel side, taken out (tests: a restart over the same kernel
    /// state, with [`Self::adopt`]).
    pub fn into_kernel(self) -> K {
        self.kernel
    }

    /// The kernel side, mutably (tests: simulated packets).
    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    /// The set id a cgroup's union lives in, while it is bound.
    pub fn set_of(&self, cgroup: CgroupId) -> Option<u32> {
        self.sets.get(&cgroup).map(|s| s.set_id)
    }

    /// The counts behind a cgroup's flags (a flag is on while its count is
    /// not zero).
    pub fn flag_counts(&self, cgroup: CgroupId) -> FlagCounts {
        let mut counts = FlagCounts::default();
        for held in self.policies.values() {
            if !held.cgroups.contains(&cgroup) {
                continue;
            }
            match &held.program {
                Program::Observe(_) => counts.observe += 1,
                Program::Enforce(r) if r.default_deny => counts.default_deny += 1,
                Program::Enforce(_) => {}
            }
        }
        counts
    }

    /// The union the bound policies ask of `cgroup`.
    pub(super) fn desired(&self, cgroup: CgroupId) -> SetState {
        let mut s = SetState::default();
        let counts = self.flag_counts(cgroup);
        for held in self.policies.values() {
            if let (true, Program::Observe(watch)) = (held.cgroups.contains(&cgroup), &held.program)
            {
                for d in watch {
                    if let Destination::Domain(d) = d {
                        s.domains.entry(d.clone()).or_default().observe = true;
                    }
                }
            }
            if let (true, Program::Enforce(r)) = (held.cgroups.contains(&cgroup), &held.program) {
                for (verdict, list) in [(Verdict::Allow, &r.allow), (Verdict::Deny, &r.deny)] {
                    for d in list {
                        match (d, verdict) {
                            (Destination::Prefix(p), Verdict::Allow) => {
                                s.allow.insert(*p);
                            }
                            (Destination::Prefix(p), Verdict::Deny) => {
                                s.deny.insert(*p);
                            }
                            (Destination::Domain(d), Verdict::Allow) => {
                                s.domains.entry(d.clone()).or_default().allow = true;
                            }
                            (Destination::Domain(d), Verdict::Deny) => {
                                s.domains.entry(d.clone()).or_default().deny = true;
                            }
                        }
                    }
                }
            }
        }
        s.flags = FilterFlags {
            default_deny: counts.default_deny > 0,
            observe: counts.observe > 0,
            domains: !s.domains.is_empty(),
        };
        s
    }

    pub(super) fn bound_anywhere(&self, cgroup: CgroupId) -> bool {
        self.policies.values().any(|h| h.cgroups.contains(&cgroup))
    }

    /// Brings `cgroup`'s kernel set to the union of its bound policies,
    /// tightening first (see the module docs). The mirror follows every
    /// call that succeeded, so a failure leaves a difference the next call
    /// converges.
    pub(super) fn sync(&mut self, cgroup: CgroupId) -> Result<()> {
        let bound = self.bound_anywhere(cgroup);
        if !bound {
            return self.release(cgroup);
        }
        let desired = self.desired(cgroup);
        let set_id = match self.sets.get(&cgroup) {
            Some(s) => s.set_id,
            None => {
                let id = self.free_set_ids.pop().unwrap_or_else(|| {
                    let id = self.next_set_id;
                    self.next_set_id = self.next_set_id.wrapping_add(1).max(1);
                    id
                });
                self.sets.insert(
                    cgroup,
                    CgroupSet {
                        set_id: id,
                        kernel: SetState::default(),
                        attached: false,
                    },
                );
                id
            }
        };
        let Some(mut state) = self.sets.get(&cgroup).cloned() else {
            return Ok(());
        };
        let result = self.apply(cgroup, set_id, &mut state, &desired);
        self.sets.insert(cgroup, state);
        result
    }

    pub(super) fn apply(
        &mut self,
        cgroup: CgroupId,
        set_id: u32,
        state: &mut CgroupSet,
        desired: &SetState,
    ) -> Result<()> {
        let k = &mut self.kernel;
        let ids = &mut self.name_ids;
        let op = |what: &str, p: &Prefix| format!("{what} {p} for cgroup {cgroup}");
        let forget = |what: &Domain| format!("forgetting what {what} taught cgroup {cgroup}");
        // 1. Deny entries in: prefixes, and the deny side of domains.
        for p in desired.deny.difference(&state.kernel.deny.clone()) {
            k.insert(set_id, Verdict::Deny, *p)
                .map_err(|e| kernel_error(op("denying", p), &e))?;
            state.kernel.deny.insert(*p);
        }
        for (d, want) in &desired.domains {
            let have = state.kernel.domains.get(d).copied().unwrap_or_default();
            // The observe side changes no verdict: it comes with the denies.
            if (want.deny && !have.deny) || (want.observe && !have.observe) {
                let sides = DomainVerdicts {
                    deny: have.deny || want.deny,
                    observe: have.observe || want.observe,
                    ..have
                };
                write_domain(k, ids, &mut state.kernel, set_id, d, sides, cgroup)?;
            }
        }
        // 2. Allow entries out; what a domain taught the allow side goes
        // with it.
        for p in state.kernel.allow.clone().difference(&desired.allow) {
            k.remove(set_id, Verdict::Allow, *p)
                .map_err(|e| kernel_error(op("removing allow", p), &e))?;
            state.kernel.allow.remove(p);
        }
        for (d, have) in state.kernel.domains.clone() {
            let want = desired.domains.get(&d).copied().unwrap_or_default();
            if have.allow && !want.allow {
                let sides = DomainVerdicts {
                    allow: false,
                    ..have
                };
                write_domain(k, ids, &mut state.kernel, set_id, &d, sides, cgroup)?;
                k.forget_learned(set_id, Some(ids.id(&d)))
                    .map_err(|e| kernel_error(forget(&d), &e))?;
            }
        }
        // 3. Default deny and the domains flag raised (observe as it will
        // be), so what a deny domain teaches counts at once.
        let raise_dd = desired.flags.default_deny && !state.kernel.flags.default_deny;
        let raise_domains = desired.flags.domains && !state.kernel.flags.domains;
        if state.attached && (raise_dd || raise_domains) {
            let flags = FilterFlags {
                default_deny: state.kernel.flags.default_deny || desired.flags.default_deny,
                observe: state.kernel.flags.observe || desired.flags.observe,
                domains: state.kernel.flags.domains || desired.flags.domains,
            };
            k.set_flags(cgroup, set_id, flags)
                .map_err(|e| kernel_error(format!("raising flags of cgroup {cgroup}"), &e))?;
            state.kernel.flags = flags;
        }
        // 4. Allow entries in.
        for p in desired.allow.difference(&state.kernel.allow.clone()) {
            k.insert(set_id, Verdict::Allow, *p)
                .map_err(|e| kernel_error(op("allowing", p), &e))?;
            state.kernel.allow.insert(*p);
        }
        for (d, want) in &desired.domains {
            let have = state.kernel.domains.get(d).copied().unwrap_or_default();
            if want.allow && !have.allow {
                let sides = DomainVerdicts {
                    allow: true,
                    ..have
                };
                write_domain(k, ids, &mut state.kernel, set_id, d, sides, cgroup)?;
            }
        }
        // 5. Flags as desired (lowering), or the first attach (the
        // snooper, then the set, then the filter).
        let path = self.paths.get(&cgroup).cloned();
        if !state.attached {
            let path = path.ok_or_else(|| EnforceError::Kernel {
                behavior: BEHAVIOR,
                op: format!("attaching cgroup {cgroup}"),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no cgroup directory is known for it",
                ),
            })?;
            self.kernel
                .attach(cgroup, &path, set_id, desired.flags)
                .map_err(|e| kernel_error(format!("attaching to {}", path.display()), &e))?;
            state.attached = true;
            state.kernel.flags = desired.flags;
        } else {
            if let (true, Some(path)) = (desired.flags.domains, &path) {
                self.kernel.ensure_snoop(cgroup, path).map_err(|e| {
                    kernel_error(
                        format!("attaching the DNS answer snooper to {}", path.display()),
                        &e,
                    )
                })?;
            }
            if state.kernel.flags != desired.flags {
                self.kernel
                    .set_flags(cgroup, set_id, desired.flags)
                    .map_err(|e| kernel_error(format!("setting flags of cgroup {cgroup}"), &e))?;
                state.kernel.flags = desired.flags;
            }
        }
        // 6. Deny entries out; what a domain taught the deny side goes
        // with it.
        let k = &mut self.kernel;
        let ids = &mut self.name_ids;
        for p in state.kernel.deny.clone().difference(&desired.deny) {
            k.remove(set_id, Verdict::Deny, *p)
                .map_err(|e| kernel_error(op("removing deny", p), &e))?;
            state.kernel.deny.remove(p);
        }
        for (d, have) in state.kernel.domains.clone() {
            let want = desired.domains.get(&d).copied().unwrap_or_default();
            // The observe side goes with the denies (it changes no verdict).
            if (have.deny && !want.deny) || (have.observe && !want.observe) {
                let sides = DomainVerdicts {
                    deny: have.deny && want.deny,
                    observe: have.observe && want.observe,
                    ..have
                };
                write_domain(k, ids, &mut state.kernel, set_id, &d, sides, cgroup)?;
                // What a denied name taught still denies; what only an
                // observed name taught is forgotten with the name.
                if have.deny != sides.deny || sides.is_empty() {
                    k.forget_learned(set_id, Some(ids.id(&d)))
                        .map_err(|e| kernel_error(forget(&d), &e))?;
                }
            }
        }
        Ok(())
    }

    /// `cgroup` is bound to nothing any more: revoke and detach, then clear
    /// its set and free the id.
    pub(super) fn release(&mut self, cgroup: CgroupId) -> Result<()> {
        let Some(mut state) = self.sets.remove(&cgroup) else {
            return Ok(());
        };
        let result = self.clear(cgroup, &mut state);
        if result.is_err() {
            // Keep the mirror of what is left, for the retry.
            self.sets.insert(cgroup, state);
            return result;
        }
        // The id is reused by the next cgroup bound: what the set counted
        // is read now, while the id still names this cgroup, or another
        // pod would be reported for it.
        match self.kernel.drain() {
            Ok(raw) => {
                let observations = self.attribute(raw, Some((state.set_id, cgroup)));
                self.released_observations.extend(observations);
                self.free_set_ids.push(state.set_id);
            }
            Err(e) => {
                // Its counts stay in the map under an id never reused:
                // the next drain finds no cgroup for them and says so.
                tracing::warn!(cgroup, set = state.set_id, error = %e, "egress: the counters of a released set could not be read; its id is retired");
            }
        }
        Ok(())
    }

    /// Names the cgroup of each observation by its set: the sets held, and
    /// `released` (a set just let go). A set known to neither (retired
    /// after a failed read) is given cgroup 0, which no pod has: the event
    /// plane's attribution counts it as unattributed rather than lose it.
    pub(super) fn attribute(
        &self,
        raw: Vec<bpf::Observation>,
        released: Option<(u32, CgroupId)>,
    ) -> Vec<Observation<IpAddr>> {
        let mut by_set: BTreeMap<u32, CgroupId> =
            self.sets.iter().map(|(c, s)| (s.set_id, *c)).collect();
        by_set.extend(released);
        raw.into_iter()
            .map(|o| {
                let cgroup = by_set.get(&o.set_id).copied().unwrap_or_else(|| {
                    tracing::warn!(
                        set = o.set_id,
                        count = o.count,
                        "egress: an observation of a set no cgroup holds"
                    );
                    0
                });
                Observation {
                    cgroup,
                    observed: o.destination,
                    decision: match o.decision {
                        bpf::Decision::Denied => Decision::Denied,
                        bpf::Decision::Allowed => Decision::Allowed,
                        bpf::Decision::DefaultDenied => Decision::DefaultDenied,
                        bpf::Decision::Unmatched => Decision::Unmatched,
                    },
                    count: o.count,
                }
            })
            .collect()
    }

    pub(super) fn clear(&mut self, cgroup: CgroupId, state: &mut CgroupSet) -> Result<()> {
        if state.attached {
            self.kernel
                .detach(cgroup)
                .map_err(|e| kernel_error(format!("detaching cgroup {cgroup}"), &e))?;
            state.attached = false;
        }
        // No program reads the set now: the order of removals is free.
        for (verdict, list) in [
            (Verdict::Allow, &mut state.kernel.allow),
            (Verdict::Deny, &mut state.kernel.deny),
        ] {
            for p in list.clone() {
                self.kernel
                    .remove(state.set_id, verdict, p)
                    .map_err(|e| kernel_error(format!("clearing {p} of cgroup {cgroup}"), &e))?;
                list.remove(&p);
            }
        }
        for d in state.kernel.domains.keys().cloned().collect::<Vec<_>>() {
            write_domain(
                &mut self.kernel,
                &mut self.name_ids,
                &mut state.kernel,
                state.set_id,
                &d,
                DomainVerdicts::default(),
                cgroup,
            )?;
        }
        // The set id is reused: nothing it learned may carry over.
        self.kernel
            .forget_learned(state.set_id, None)
            .map_err(|e| kernel_error(format!("forgetting what cgroup {cgroup} learned"), &e))?;
        Ok(())
    }

    /// Syncs every cgroup in `cgroups`, continuing past failures; returns
    /// the first.
    pub(super) fn sync_all(&mut self, cgroups: &BTreeSet<CgroupId>) -> Result<()> {
        let mut first = Ok(());
        for c in cgroups {
            if let Err(e) = self.sync(*c) {
                tracing::warn!(cgroup = c, error = %e, "egress: cgroup not converged");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}
