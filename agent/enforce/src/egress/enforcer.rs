//! The backend behind the seam: [`Enforcer`], [`DomainSupport`] and [`CgroupPaths`] for [`EgressEnforcer`].

use super::*;

impl<K: EgressKernel> DomainSupport for EgressEnforcer<K> {
    fn domains_available(&self) -> std::result::Result<(), String> {
        self.kernel.domains_available()
    }

    /// The addresses a DNS answer for `domain` taught any set and that
    /// still count (through the name's number, which every learned entry
    /// carries).
    fn learned_addresses(&self, domain: &Domain) -> Result<BTreeSet<IpAddr>> {
        let Some(id) = self.name_ids.get(domain) else {
            return Ok(BTreeSet::new());
        };
        let learned = self
            .kernel
            .learned()
            .map_err(|e| kernel_error("reading learned addresses".to_owned(), &e))?;
        Ok(learned
            .into_iter()
            .filter(|l| l.name_id == id && l.remaining.is_some())
            .map(|l| l.addr)
            .collect())
    }

    fn learned_names(&self) -> Result<BTreeMap<(CgroupId, IpAddr), String>> {
        let mut out = BTreeMap::new();
        if self.name_ids.ids.is_empty() {
            // No set names a domain: nothing is learned, nothing to read.
            return Ok(out);
        }
        let names: HashMap<u32, &Domain> =
            self.name_ids.ids.iter().map(|(d, id)| (*id, d)).collect();
        let learned = self
            .kernel
            .learned()
            .map_err(|e| kernel_error("reading learned addresses".to_owned(), &e))?;
        let mut by_set: HashMap<u32, Vec<(IpAddr, &Domain)>> = HashMap::new();
        for l in &learned {
            if l.remaining.is_none() {
                continue;
            }
            if let Some(d) = names.get(&l.name_id) {
                by_set.entry(l.set_id).or_default().push((l.addr, d));
            }
        }
        for (cgroup, set) in &self.sets {
            for (addr, d) in by_set.get(&set.set_id).into_iter().flatten() {
                out.insert((*cgroup, *addr), d.as_str().to_owned());
            }
        }
        Ok(out)
    }
}

impl<K: EgressKernel> CgroupPaths for EgressEnforcer<K> {
    fn set_cgroup_path(&mut self, cgroup: CgroupId, path: PathBuf) {
        self.paths.insert(cgroup, path);
    }

    fn forget_cgroup_path(&mut self, cgroup: CgroupId) {
        self.paths.remove(&cgroup);
    }

    fn release_unowned(&mut self) -> Result<usize> {
        self.kernel
            .release_stale()
            .map_err(|e| kernel_error("releasing stale links".to_owned(), &e))
    }
}

/// The ledger entries of an enforce program's lists, deny entries first.
pub(super) fn rule_entries(rules: &Rules<Destination>) -> Vec<(Verdict, Destination)> {
    rules
        .deny
        .iter()
        .map(|d| (Verdict::Deny, d.clone()))
        .chain(rules.allow.iter().map(|d| (Verdict::Allow, d.clone())))
        .collect()
}

/// The ledger entries of a program: an enforce program's lists, an
/// observer's domains on the allow side (its record's kind says what the
/// side means).
pub(super) fn ledger_entries(program: &Program<Destination>) -> Vec<(Verdict, Destination)> {
    match program {
        Program::Enforce(rules) => rule_entries(rules),
        Program::Observe(watch) => watch
            .iter()
            .filter(|d| matches!(d, Destination::Domain(_)))
            .map(|d| (Verdict::Allow, d.clone()))
            .collect(),
    }
}

/// How the ledger records a program.
pub(super) fn ledger_kind(program: &Program<Destination>) -> LedgerKind {
    match program {
        Program::Enforce(r) => LedgerKind::Enforce {
            default_deny: r.default_deny,
        },
        Program::Observe(_) => LedgerKind::Observe,
    }
}

impl<K: EgressKernel> Enforcer for EgressEnforcer<K> {
    type Value = Destination;
    type Observed = IpAddr;

    fn behavior(&self) -> Behavior {
        Behavior::Network
    }

    fn backend(&self) -> Backend {
        Backend::CgroupSkbEgress
    }

    fn add_policy(&mut self, policy: &PolicyId, program: &Program<Destination>) -> Result<()> {
        if self.policies.contains_key(policy) {
            return Err(EnforceError::Kernel {
                behavior: BEHAVIOR,
                op: format!("adding policy {policy}"),
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        // Bound to nothing yet: no filter change, only the ledger (its
        // record last, so an interrupted add leaves only entries without a
        // record, which the next adoption cleans).
        let entries = ledger_entries(program);
        self.ledger_rules(policy, &entries, true)?;
        if let Err(e) = self
            .kernel
            .ledger_policy(ledger_id(policy), Some(ledger_kind(program)))
        {
            for (verdict, d) in &entries {
                let _ = self.ledger_entry(policy, *verdict, d, false);
            }
            return Err(kernel_error(format!("recording policy {policy}"), &e));
        }
        self.policies.insert(
            policy.clone(),
            Held {
                program: program.clone(),
                cgroups: BTreeSet::new(),
            },
        );
        Ok(())
    }

    fn update_policy(&mut self, policy: &PolicyId, diff: &ProgramDiff<Destination>) -> Result<()> {
        let held = self
            .policies
            .get_mut(policy)
            .ok_or_else(|| EnforceError::UnknownPolicy(policy.clone(), BEHAVIOR))?;
        if held.program.is_observe() {
            return self.update_observer(policy, diff);
        }
        // The ledger first, in the diff's tightening order; a failure
        // leaves the rules as they were (the manager retries the diff,
        // and every ledger write is idempotent).
        let added: Vec<(Verdict, Destination)> = diff
            .add_deny
            .iter()
            .map(|d| (Verdict::Deny, d.clone()))
            .chain(diff.add_allow.iter().map(|d| (Verdict::Allow, d.clone())))
            .collect();
        let removed: Vec<(Verdict, Destination)> = diff
            .remove_allow
            .iter()
            .map(|d| (Verdict::Allow, d.clone()))
            .chain(diff.remove_deny.iter().map(|d| (Verdict::Deny, d.clone())))
            .collect();
        self.ledger_rules(policy, &added, true)?;
        if let Some(default_deny) = diff.default_deny {
            self.kernel
                .ledger_policy(
                    ledger_id(policy),
                    Some(LedgerKind::Enforce { default_deny }),
                )
                .map_err(|e| kernel_error(format!("recording policy {policy}"), &e))?;
        }
        self.ledger_rules(policy, &removed, false)?;
        let Some(Held {
            program: Program::Enforce(rules),
            cgroups,
        }) = self.policies.get_mut(policy)
        else {
            return Ok(());
        };
        rules.allow.extend(diff.add_allow.iter().cloned());
        rules.deny.extend(diff.add_deny.iter().cloned());
        if let Some(dd) = diff.default_deny {
            rules.default_deny = dd;
        }
        rules.allow.retain(|v| !diff.remove_allow.contains(v));
        rules.deny.retain(|v| !diff.remove_deny.contains(v));
        let cgroups = cgroups.clone();
        // Each bound cgroup's union is recomputed and applied tightening
        // first, so the diff's adds land before its removes.
        self.sync_all(&cgroups)
    }

    fn remove_policy(&mut self, policy: &PolicyId) -> Result<()> {
        let Some(held) = self.policies.get(policy) else {
            return Ok(());
        };
        // The ledger first, its record first (an interrupted removal
        // leaves entries without a record: not adopted, cleaned); a
        // failure keeps the policy, and the retry rewrites every delete.
        let entries = ledger_entries(&held.program);
        let cgroups = held.cgroups.clone();
        let id = ledger_id(policy);
        let recorded = self.kernel.ledger_policy(id, None).and_then(|()| {
            cgroups
                .iter()
                .try_for_each(|c| self.kernel.ledger_binding(id, *c, false))?;
            entries
                .iter()
                .try_for_each(|(verdict, d)| self.ledger_entry(policy, *verdict, d, false))
        });
        recorded.map_err(|e| kernel_error(format!("forgetting policy {policy}"), &e))?;
        self.policies.remove(policy);
        self.sync_all(&cgroups)
    }

    fn bind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()> {
        let held = self
            .policies
            .get_mut(policy)
            .ok_or_else(|| EnforceError::UnknownPolicy(policy.clone(), BEHAVIOR))?;
        let fresh = held.cgroups.insert(cgroup);
        if fresh {
            // Recorded before the kernel: an interrupted bind is adopted
            // as bound only if the cgroup's link was pinned, and then
            // synced to include this policy.
            if let Err(e) = self.kernel.ledger_binding(ledger_id(policy), cgroup, true) {
                if let Some(h) = self.policies.get_mut(policy) {
                    h.cgroups.remove(&cgroup);
                }
                return Err(kernel_error(
                    format!("recording the binding of cgroup {cgroup} to {policy}"),
                    &e,
                ));
            }
        }
        let result = self.sync(cgroup);
        if result.is_err() && fresh {
            // Not bound after all; converge the cgroup back to what its
            // other policies ask (best effort, the first error reported).
            if let Some(h) = self.policies.get_mut(policy) {
                h.cgroups.remove(&cgroup);
            }
            let _ = self.kernel.ledger_binding(ledger_id(policy), cgroup, false);
            let _ = self.sync(cgroup);
        }
        result
    }

    fn unbind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()> {
        let Some(held) = self.policies.get_mut(policy) else {
            return Ok(());
        };
        if !held.cgroups.remove(&cgroup) {
            // Not bound: still converge, in case an earlier call failed
            // halfway.
            return if self.sets.contains_key(&cgroup) && !self.bound_anywhere(cgroup) {
                self.sync(cgroup)
            } else {
                Ok(())
            };
        }
        if let Err(e) = self.kernel.ledger_binding(ledger_id(policy), cgroup, false) {
            if let Some(h) = self.policies.get_mut(policy) {
                h.cgroups.insert(cgroup);
            }
            return Err(kernel_error(
                format!("forgetting the binding of cgroup {cgroup} to {policy}"),
                &e,
            ));
        }
        self.sync(cgroup)
    }

    fn held(&self) -> Result<BTreeMap<PolicyId, Held<Destination>>> {
        Ok(self.policies.clone())
    }

    fn drain(&mut self) -> Result<Vec<Observation<IpAddr>>> {
        let raw = self
            .kernel
            .drain()
            .map_err(|e| kernel_error("draining observations".to_owned(), &e))?;
        let fresh = self.attribute(raw, None);
        let mut out = std::mem::take(&mut self.released_observations);
        out.extend(fresh);
        Ok(out)
    }
}
