//! The backend and the manager over an in-memory kernel with the filter's verdict ([`MemKernel`]) and the reference model.

use super::*;
use kyverno_runtime_policy::values::FieldPath;

use crate::fake::{Call, FakeOp};

// ---- an in-memory kernel with the egress program's verdict ----------------

#[derive(Debug, Default)]
struct MemKernel {
    allow: BTreeSet<(u32, Prefix)>,
    deny: BTreeSet<(u32, Prefix)>,
    filters: BTreeMap<CgroupId, (u32, FilterFlags)>,
    attached: BTreeMap<CgroupId, PathBuf>,
    /// Every call, in order, for ordering assertions.
    log: Vec<String>,
    fail_insert: bool,
    /// How many prefixes the maps hold before an insert fails as a
    /// full map does (`None`: no limit).
    capacity: Option<usize>,
    counts: BTreeMap<(u32, IpAddr, bpf::Decision), u64>,
    /// Keeps a ledger (as a pinned kernel does).
    pinned: bool,
    /// Reports its maps as adopted (a restarted process over the pins).
    restarted: bool,
    ledger: BTreeMap<Vec<u8>, bpf::LedgerPolicy>,
    ledger_writes: usize,
    /// `egress_domains`: (set, name) -> sides and name id.
    domains: BTreeMap<(u32, Domain), (DomainVerdicts, u32)>,
    /// What the snooper would have learned: (set, address) -> sides
    /// and name id (tests write it with `learn`).
    learned: BTreeMap<(u32, IpAddr), (DomainVerdicts, u32)>,
    /// Cgroups the snooper is attached to.
    snooped: BTreeSet<CgroupId>,
    /// The snooper did not load.
    no_snoop: bool,
}

impl MemKernel {
    /// The program's verdict for a packet of `cgroup` to `dst`.
    fn packet(&mut self, cgroup: CgroupId, dst: IpAddr) -> Option<bpf::Decision> {
        let (set, flags) = *self.filters.get(&cgroup)?;
        if !self.attached.contains_key(&cgroup) {
            return None;
        }
        let hit = |l: &BTreeSet<(u32, Prefix)>| l.iter().any(|(s, p)| *s == set && p.contains(dst));
        let learned = if flags.domains {
            self.learned
                .get(&(set, dst))
                .map(|(v, _)| *v)
                .unwrap_or_default()
        } else {
            DomainVerdicts::default()
        };
        let d = if learned.deny || hit(&self.deny) {
            bpf::Decision::Denied
        } else if learned.allow || hit(&self.allow) {
            bpf::Decision::Allowed
        } else if flags.default_deny {
            bpf::Decision::DefaultDenied
        } else {
            bpf::Decision::Unmatched
        };
        if flags.observe {
            *self.counts.entry((set, dst, d)).or_default() += 1;
        }
        Some(d)
    }
}

impl EgressKernel for MemKernel {
    fn insert(&mut self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<(), EgressError> {
        let present = match verdict {
            Verdict::Allow => self.allow.contains(&(set_id, prefix)),
            Verdict::Deny => self.deny.contains(&(set_id, prefix)),
        };
        let full = self
            .capacity
            .is_some_and(|c| self.allow.len() + self.deny.len() >= c);
        if self.fail_insert || (full && !present) {
            return Err(EgressError::MapFull {
                map: "allow_v4",
                max_entries: 1,
            });
        }
        self.log.push(format!("insert {verdict:?} {prefix}"));
        match verdict {
            Verdict::Allow => self.allow.insert((set_id, prefix)),
            Verdict::Deny => self.deny.insert((set_id, prefix)),
        };
        Ok(())
    }

    fn remove(&mut self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<(), EgressError> {
        self.log.push(format!("remove {verdict:?} {prefix}"));
        match verdict {
            Verdict::Allow => self.allow.remove(&(set_id, prefix)),
            Verdict::Deny => self.deny.remove(&(set_id, prefix)),
        };
        Ok(())
    }

    fn attach(
        &mut self,
        cgroup: CgroupId,
        path: &Path,
        set_id: u32,
        flags: FilterFlags,
    ) -> Result<(), EgressError> {
        if !self.no_snoop {
            self.snooped.insert(cgroup);
        }
        self.log.push(format!("attach {cgroup}"));
        self.filters.insert(cgroup, (set_id, flags));
        self.attached.insert(cgroup, path.to_owned());
        Ok(())
    }

    fn set_flags(
        &mut self,
        cgroup: CgroupId,
        set_id: u32,
        flags: FilterFlags,
    ) -> Result<(), EgressError> {
        self.log.push(format!(
            "flags {cgroup} dd={} obs={}",
            flags.default_deny, flags.observe
        ));
        self.filters.insert(cgroup, (set_id, flags));
        Ok(())
    }

    fn detach(&mut self, cgroup: CgroupId) -> Result<(), EgressError> {
        self.log.push(format!("detach {cgroup}"));
        self.filters.remove(&cgroup);
        self.attached.remove(&cgroup);
        self.snooped.remove(&cgroup);
        Ok(())
    }

    fn drain(&mut self) -> Result<Vec<bpf::Observation>, EgressError> {
        Ok(std::mem::take(&mut self.counts)
            .into_iter()
            .map(
                |((set_id, destination, decision), count)| bpf::Observation {
                    set_id,
                    destination,
                    decision,
                    count,
                },
            )
            .collect())
    }

    fn ledger_policy(
        &mut self,
        policy: &[u8],
        kind: Option<LedgerKind>,
    ) -> Result<(), EgressError> {
        if self.pinned {
            self.ledger_writes += 1;
            self.ledger.entry(policy.to_vec()).or_default().kind = kind;
            self.prune(policy);
        }
        Ok(())
    }

    fn ledger_rule(
        &mut self,
        policy: &[u8],
        verdict: Verdict,
        prefix: Prefix,
        present: bool,
    ) -> Result<(), EgressError> {
        if self.pinned {
            self.ledger_writes += 1;
            let e = self.ledger.entry(policy.to_vec()).or_default();
            let list = match verdict {
                Verdict::Allow => &mut e.allow,
                Verdict::Deny => &mut e.deny,
            };
            if present {
                list.insert(prefix);
            } else {
                list.remove(&prefix);
            }
            self.prune(policy);
        }
        Ok(())
    }

    fn ledger_binding(
        &mut self,
        policy: &[u8],
        cgroup: CgroupId,
        present: bool,
    ) -> Result<(), EgressError> {
        if self.pinned {
            self.ledger_writes += 1;
            let e = self.ledger.entry(policy.to_vec()).or_default();
            if present {
                e.cgroups.insert(cgroup);
            } else {
                e.cgroups.remove(&cgroup);
            }
            self.prune(policy);
        }
        Ok(())
    }

    fn domains_available(&self) -> std::result::Result<(), String> {
        if self.no_snoop {
            Err("the kernel refused it".to_owned())
        } else {
            Ok(())
        }
    }

    fn set_domain(
        &mut self,
        set_id: u32,
        domain: &Domain,
        verdicts: DomainVerdicts,
        name_id: u32,
    ) -> Result<(), EgressError> {
        self.log.push(format!(
            "domain {domain} allow={} deny={}{}",
            verdicts.allow,
            verdicts.deny,
            if verdicts.observe { " observe" } else { "" }
        ));
        if verdicts.is_empty() {
            self.domains.remove(&(set_id, domain.clone()));
        } else {
            self.domains
                .insert((set_id, domain.clone()), (verdicts, name_id));
        }
        Ok(())
    }

    fn forget_learned(&mut self, set_id: u32, name_id: Option<u32>) -> Result<(), EgressError> {
        // Logged only when it forgets something: a release of a set
        // that learned nothing is not worth a line in the ordering
        // assertions.
        let before = self.learned.len();
        self.learned
            .retain(|(s, _), (_, id)| *s != set_id || name_id.is_some_and(|n| n != *id));
        if self.learned.len() != before {
            self.log
                .push(format!("forget set {set_id} name {name_id:?}"));
        }
        Ok(())
    }

    fn learned(&self) -> Result<Vec<Learned>, EgressError> {
        Ok(self
            .learned
            .iter()
            .map(|((set_id, addr), (verdicts, name_id))| Learned {
                set_id: *set_id,
                addr: *addr,
                verdicts: *verdicts,
                name_id: *name_id,
                remaining: Some(std::time::Duration::from_secs(60)),
            })
            .collect())
    }

    fn ensure_snoop(&mut self, cgroup: CgroupId, _: &Path) -> Result<(), EgressError> {
        if !self.no_snoop && self.snooped.insert(cgroup) {
            self.log.push(format!("snoop {cgroup}"));
        }
        Ok(())
    }

    fn ledger_domain_rule(
        &mut self,
        policy: &[u8],
        verdict: Verdict,
        domain: &Domain,
        present: bool,
    ) -> Result<(), EgressError> {
        if self.pinned {
            self.ledger_writes += 1;
            let e = self.ledger.entry(policy.to_vec()).or_default();
            let list = match verdict {
                Verdict::Allow => &mut e.allow_domains,
                Verdict::Deny => &mut e.deny_domains,
            };
            if present {
                list.insert(domain.clone());
            } else {
                list.remove(domain);
            }
            self.prune(policy);
        }
        Ok(())
    }

    fn adopted(&mut self) -> Result<Option<Adopted>, EgressError> {
        if !self.restarted {
            return Ok(None);
        }
        let mut sets: BTreeMap<u32, bpf::SetEntries> = BTreeMap::new();
        for (set, p) in &self.allow {
            sets.entry(*set).or_default().allow.insert(*p);
        }
        for (set, p) in &self.deny {
            sets.entry(*set).or_default().deny.insert(*p);
        }
        for ((set, d), entry) in &self.domains {
            sets.entry(*set)
                .or_default()
                .domains
                .insert(d.clone(), *entry);
        }
        Ok(Some(Adopted {
            state: PinnedState {
                filters: self.filters.clone(),
                sets,
                ledger: self.ledger.clone(),
            },
            attached: self.attached.keys().copied().collect(),
        }))
    }
}

impl MemKernel {
    fn pinned() -> Self {
        Self {
            pinned: true,
            ..Self::default()
        }
    }

    /// A DNS answer for the name numbered `name_id` taught set `set`
    /// `addr` (what the snooper would do).
    fn learn(&mut self, set: u32, addr: IpAddr, name_id: u32) {
        let sides = self
            .domains
            .iter()
            .find(|((s, _), (_, id))| *s == set && *id == name_id)
            .map(|(_, (v, _))| *v)
            .unwrap_or_default();
        self.learned.insert((set, addr), (sides, name_id));
    }

    /// The same kernel state, seen by a new process.
    fn restart(mut self) -> Self {
        self.restarted = true;
        self.log.clear();
        self.ledger_writes = 0;
        self
    }

    /// A ledger id with nothing left is no entry (as in the maps).
    fn prune(&mut self, policy: &[u8]) {
        if self
            .ledger
            .get(policy)
            .is_some_and(|e| *e == bpf::LedgerPolicy::default())
        {
            self.ledger.remove(policy);
        }
    }
}

mod adoption;
mod backend;
mod domains;
mod manager;
mod values;

// The helpers each part defines, for every part.
use adoption::*;
use backend::*;
use manager::*;
use values::*;
