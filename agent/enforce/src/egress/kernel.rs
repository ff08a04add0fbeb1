//! The kernel side: what the backend needs of the kernel ([`EgressKernel`]) and the real one over the cgroup_skb filter ([`KernelEgress`]).

use super::*;

/// Where the backend learns a cgroup's directory, which attaching needs
/// (the seam speaks of cgroup ids only). The manager registers a pod's
/// container cgroups before binding them.
pub trait CgroupPaths {
    /// `cgroup`'s cgroup v2 directory.
    fn set_cgroup_path(&mut self, cgroup: CgroupId, path: PathBuf);
    /// Forgets it (its pod is gone).
    fn forget_cgroup_path(&mut self, cgroup: CgroupId);
    /// Releases what a previous process left attached that this backend
    /// does not own (the links of a discarded pin layout), once the
    /// manager has re-programmed what it wants
    /// ([`EgressManager::reconcile_adopted`]); returns how many went.
    /// Backends that adopt nothing have nothing to release.
    fn release_unowned(&mut self) -> Result<usize> {
        Ok(0)
    }
}

/// The reference model attaches nothing, so it needs no paths.
impl<V: Ord> CgroupPaths for FakeEnforcer<V> {
    fn set_cgroup_path(&mut self, _: CgroupId, _: PathBuf) {}
    fn forget_cgroup_path(&mut self, _: CgroupId) {}
}

/// What the manager asks a backend about domains.
pub trait DomainSupport {
    /// `Err(why)` when domains cannot be programmed here (the kernel
    /// refused the DNS answer snooper): a domain value is then refused.
    fn domains_available(&self) -> std::result::Result<(), String>;

    /// The unexpired addresses DNS answers for `domain` taught any set.
    fn learned_addresses(&self, domain: &Domain) -> Result<BTreeSet<IpAddr>>;

    /// Every unexpired address a bound cgroup's set learned, with the
    /// domain it was learned under (the first name of the answer a policy
    /// of the set names): what the kernel's filter holds for the cgroup
    /// beside its literal entries, for the monitor to judge domain values
    /// by. One read of the learned map.
    fn learned_names(&self) -> Result<BTreeMap<(CgroupId, IpAddr), String>>;
}

/// The reference model takes domains as values and learns nothing.
impl<V: Ord> DomainSupport for FakeEnforcer<V> {
    fn domains_available(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn learned_addresses(&self, _: &Domain) -> Result<BTreeSet<IpAddr>> {
        Ok(BTreeSet::new())
    }

    fn learned_names(&self) -> Result<BTreeMap<(CgroupId, IpAddr), String>> {
        Ok(BTreeMap::new())
    }
}

/// The kernel operations the backend needs: the egress filter's maps and
/// its per-cgroup links. [`KernelEgress`] is the real one; tests use one in
/// memory.
pub trait EgressKernel: Send {
    /// Adds `prefix` to a list of set `set_id`.
    fn insert(&mut self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<(), EgressError>;
    /// Removes it.
    fn remove(&mut self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<(), EgressError>;
    /// Maps `cgroup` to the set and flags, then attaches the program to
    /// `path` (which must be that cgroup's directory).
    fn attach(
        &mut self,
        cgroup: CgroupId,
        path: &Path,
        set_id: u32,
        flags: FilterFlags,
    ) -> Result<(), EgressError>;
    /// Rewrites an attached cgroup's flags.
    fn set_flags(
        &mut self,
        cgroup: CgroupId,
        set_id: u32,
        flags: FilterFlags,
    ) -> Result<(), EgressError>;
    /// Revokes `cgroup` from the filter map, then detaches its link.
    fn detach(&mut self, cgroup: CgroupId) -> Result<(), EgressError>;
    /// Reads and resets the per-destination counters.
    fn drain(&mut self) -> Result<Vec<bpf::Observation>, EgressError>;

    /// Records policy `policy` in the ledger (see the [module
    /// docs](self#restarts)) as `kind`, or removes its record (`None`).
    /// A kernel that is not pinned records nothing.
    fn ledger_policy(
        &mut self,
        policy: &[u8],
        kind: Option<LedgerKind>,
    ) -> Result<(), EgressError> {
        let _ = (policy, kind);
        Ok(())
    }

    /// Records or removes one prefix of a policy in the ledger.
    fn ledger_rule(
        &mut self,
        policy: &[u8],
        verdict: Verdict,
        prefix: Prefix,
        present: bool,
    ) -> Result<(), EgressError> {
        let _ = (policy, verdict, prefix, present);
        Ok(())
    }

    /// Records or removes the binding of `cgroup` to a policy in the
    /// ledger.
    fn ledger_binding(
        &mut self,
        policy: &[u8],
        cgroup: CgroupId,
        present: bool,
    ) -> Result<(), EgressError> {
        let _ = (policy, cgroup, present);
        Ok(())
    }

    /// What a pinned load adopted from an earlier process (the maps'
    /// contents and the cgroups whose links it holds); `None` when it
    /// adopted nothing.
    fn adopted(&mut self) -> Result<Option<Adopted>, EgressError> {
        Ok(None)
    }

    /// Releases the links a pinned load found but does not serve (see
    /// [`bpf::PinnedLinks::stale`]); returns how many.
    fn release_stale(&mut self) -> Result<usize, EgressError> {
        Ok(0)
    }

    /// `Err(why)` when the kernel cannot serve domains (it refused the
    /// DNS answer snooper). A kernel without a snooper serves none.
    fn domains_available(&self) -> std::result::Result<(), String> {
        Err("this kernel backend has no DNS answer snooper".to_owned())
    }

    /// Puts `domain` on the sides `verdicts` of set `set_id` (none:
    /// removes it), with the backend's number for the name.
    fn set_domain(
        &mut self,
        set_id: u32,
        domain: &Domain,
        verdicts: DomainVerdicts,
        name_id: u32,
    ) -> Result<(), EgressError> {
        let _ = (set_id, domain, verdicts, name_id);
        Ok(())
    }

    /// Forgets the addresses set `set_id` learned (only from name
    /// `name_id`, when given).
    fn forget_learned(&mut self, set_id: u32, name_id: Option<u32>) -> Result<(), EgressError> {
        let _ = (set_id, name_id);
        Ok(())
    }

    /// What the sets learned from DNS answers.
    fn learned(&self) -> Result<Vec<Learned>, EgressError> {
        Ok(Vec::new())
    }

    /// Attaches the snooper to an attached cgroup that lacks it (an
    /// adopted cgroup whose snooper link is gone); a no-op otherwise.
    fn ensure_snoop(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), EgressError> {
        let _ = (cgroup, path);
        Ok(())
    }

    /// Records or removes one domain of a policy in the ledger.
    fn ledger_domain_rule(
        &mut self,
        policy: &[u8],
        verdict: Verdict,
        domain: &Domain,
        present: bool,
    ) -> Result<(), EgressError> {
        let _ = (policy, verdict, domain, present);
        Ok(())
    }
}

/// What an [`EgressKernel`] adopted from pins an earlier process left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// The maps' contents: filters, set entries, the ledger.
    pub state: PinnedState,
    /// The cgroups whose pinned links were adopted (the program is
    /// attached to them).
    pub attached: BTreeSet<CgroupId>,
}

/// The real kernel: one loaded [`EgressFilter`] and its links, keyed by
/// cgroup id: the filter's, and the DNS answer snooper's (attached first,
/// released last, to every filtered cgroup while the snooper is loaded).
#[derive(Debug)]
pub struct KernelEgress {
    pub(super) filter: EgressFilter,
    pub(super) links: BTreeMap<CgroupId, CgroupLink>,
    pub(super) snoop_links: BTreeMap<CgroupId, CgroupLink>,
    /// Pinned links a previous process left that this state does not
    /// serve (see [`bpf::PinnedLinks::stale`]), the filter's and the
    /// snooper's.
    pub(super) stale: Vec<CgroupLink>,
    /// Whether the ledger is kept (only with pins: without them nothing
    /// outlives the process, and the writes would be wasted).
    pub(super) ledger: bool,
    pub(super) mutations: u64,
}

impl KernelEgress {
    /// Loads the filter (root needed), unpinned: everything goes with the
    /// process.
    pub fn load() -> Result<Self, EgressError> {
        let k = Self {
            filter: EgressFilter::load()?,
            links: BTreeMap::new(),
            snoop_links: BTreeMap::new(),
            stale: Vec::new(),
            ledger: false,
            mutations: 0,
        };
        k.log_snoop();
        Ok(k)
    }

    /// Says, once at load, when domains cannot be served here.
    pub(super) fn log_snoop(&self) {
        if let Some(e) = self.filter.snoop_error() {
            tracing::warn!(error = %e, "egress: the DNS answer snooper did not load; network values naming domains are refused on this node");
        }
    }

    /// Loads the filter pinned under `dir` (a bpffs directory, created if
    /// missing), adopting what an earlier process pinned there (see the
    /// [module docs](self#restarts)); a pin set of another layout is
    /// discarded, with a warning.
    pub fn load_pinned(dir: &Path) -> Result<Self, EgressError> {
        let mut filter = EgressFilter::load_pinned(dir)?;
        let pinned = filter.take_pinned_links();
        match filter.pin_outcome() {
            PinOutcome::Discarded { reason } => tracing::warn!(
                pin_dir = %dir.display(),
                %reason,
                stale_links = pinned.stale.len(),
                "egress: discarding pinned state of an incompatible layout; its links keep enforcing until replaced or reconciled"
            ),
            PinOutcome::Adopted => tracing::info!(
                pin_dir = %dir.display(),
                links = pinned.adopted.len(),
                stale_links = pinned.stale.len(),
                "egress: adopting pinned state"
            ),
            PinOutcome::Fresh | PinOutcome::Unpinned => tracing::debug!(
                pin_dir = %dir.display(),
                "egress: nothing pinned yet"
            ),
        }
        let k = Self {
            filter,
            links: pinned
                .adopted
                .into_iter()
                .map(|l| (l.cgroup_id(), l))
                .collect(),
            snoop_links: pinned
                .snoop_adopted
                .into_iter()
                .map(|l| (l.cgroup_id(), l))
                .collect(),
            stale: pinned.stale.into_iter().chain(pinned.snoop_stale).collect(),
            ledger: true,
            mutations: 0,
        };
        k.log_snoop();
        Ok(k)
    }

    /// The loaded filter (its stats, for metrics; its pin outcome).
    pub fn filter(&self) -> &EgressFilter {
        &self.filter
    }

    /// The directories attached now (for a link adopted from a pin, its
    /// pin: the kernel does not record the directory).
    pub fn attached(&self) -> impl Iterator<Item = &Path> {
        self.links.values().map(CgroupLink::path)
    }

    /// The cgroups the snooper is attached to.
    pub fn snooped(&self) -> impl Iterator<Item = CgroupId> + '_ {
        self.snoop_links.keys().copied()
    }

    /// Attaches the snooper to `path` unless it is attached there or not
    /// loaded.
    pub(super) fn attach_snoop(
        &mut self,
        cgroup: CgroupId,
        path: &Path,
    ) -> Result<(), EgressError> {
        if self.snoop_links.contains_key(&cgroup) || self.filter.snoop_error().is_some() {
            return Ok(());
        }
        self.count();
        let link = self.filter.attach_snoop(path)?;
        if link.cgroup_id() != cgroup {
            let attached_id = link.cgroup_id();
            let _ = self.filter.release_snoop(link);
            return Err(EgressError::Layout {
                map: "cgroup_filters",
                what: format!(
                    "path {} is cgroup {attached_id}, not {cgroup}",
                    path.display()
                ),
            });
        }
        self.snoop_links.insert(cgroup, link);
        self.release_stale_of(cgroup)
    }

    /// Closes the stale links of `cgroup` whose pins new links replaced.
    pub(super) fn release_stale_of(&mut self, cgroup: CgroupId) -> Result<(), EgressError> {
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.stale).into_iter().partition(|l| {
                let replaced = if l.program() == SNOOP_PROGRAM {
                    self.snoop_links.contains_key(&cgroup)
                } else {
                    self.links.contains_key(&cgroup)
                };
                l.cgroup_id() == cgroup && replaced
            });
        self.stale = rest;
        let mut first = Ok(());
        for old in mine {
            // Its pin was just replaced by the new link's: closing it
            // detaches the old program.
            if let Err(e) = self.filter.release_link(old) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// How many stale links (see [`bpf::PinnedLinks::stale`]) are held.
    pub fn stale_links(&self) -> usize {
        self.stale.len()
    }

    /// How many kernel writes (map updates and deletes, attaches,
    /// detaches, ledger writes) went through this handle: what a test
    /// asserts stays put when a change is a no-op.
    pub fn mutations(&self) -> u64 {
        self.mutations
    }

    pub(super) fn count(&mut self) {
        self.mutations = self.mutations.saturating_add(1);
    }
}

impl EgressKernel for KernelEgress {
    fn insert(&mut self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<(), EgressError> {
        self.count();
        self.filter.insert(set_id, verdict, prefix)
    }

    fn remove(&mut self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<(), EgressError> {
        self.count();
        self.filter.remove(set_id, verdict, prefix).map(|_| ())
    }

    fn attach(
        &mut self,
        cgroup: CgroupId,
        path: &Path,
        set_id: u32,
        flags: FilterFlags,
    ) -> Result<(), EgressError> {
        if self.links.contains_key(&cgroup) {
            return Ok(());
        }
        // The snooper first: it does nothing until the cgroup is in the
        // filter map, and from then on no answer is missed.
        let snooping = self.snoop_links.contains_key(&cgroup);
        self.attach_snoop(cgroup, path)?;
        self.count();
        let link = match self.filter.attach_cgroup(path, set_id, flags) {
            Ok(link) => link,
            Err(e) => {
                // Not filtered after all: a snooper attached just now goes
                // too (best effort; the attach error is the one to report).
                if let (false, Some(snoop)) = (snooping, self.snoop_links.remove(&cgroup)) {
                    let _ = self.filter.release_snoop(snoop);
                }
                return Err(e);
            }
        };
        if link.cgroup_id() != cgroup {
            // The path names another cgroup (recreated, or a stale path):
            // undo, or the wrong cgroup would be filtered.
            let attached_id = link.cgroup_id();
            let _ = self.filter.detach_cgroup(link);
            return Err(EgressError::Layout {
                map: "cgroup_filters",
                what: format!(
                    "path {} is cgroup {attached_id}, not {cgroup}",
                    path.display()
                ),
            });
        }
        self.links.insert(cgroup, link);
        self.release_stale_of(cgroup)
    }

    fn set_flags(
        &mut self,
        cgroup: CgroupId,
        set_id: u32,
        flags: FilterFlags,
    ) -> Result<(), EgressError> {
        self.count();
        self.filter.set_filter(cgroup, set_id, flags)
    }

    fn detach(&mut self, cgroup: CgroupId) -> Result<(), EgressError> {
        self.count();
        match self.links.remove(&cgroup) {
            Some(link) => self.filter.detach_cgroup(link).map(|_| ())?,
            // Never attached: make sure no map entry is left either.
            None => self.filter.remove_cgroup(cgroup).map(|_| ())?,
        }
        // Revoked and detached: the snooper goes last.
        if let Some(link) = self.snoop_links.remove(&cgroup) {
            self.count();
            self.filter.release_snoop(link)?;
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<Vec<bpf::Observation>, EgressError> {
        self.filter.drain_observations()
    }

    fn ledger_policy(
        &mut self,
        policy: &[u8],
        kind: Option<LedgerKind>,
    ) -> Result<(), EgressError> {
        if !self.ledger {
            return Ok(());
        }
        self.count();
        self.filter.ledger_set_policy(policy, kind)
    }

    fn ledger_rule(
        &mut self,
        policy: &[u8],
        verdict: Verdict,
        prefix: Prefix,
        present: bool,
    ) -> Result<(), EgressError> {
        if !self.ledger {
            return Ok(());
        }
        self.count();
        self.filter
            .ledger_set_rule(policy, verdict, prefix, present)
    }

    fn ledger_binding(
        &mut self,
        policy: &[u8],
        cgroup: CgroupId,
        present: bool,
    ) -> Result<(), EgressError> {
        if !self.ledger {
            return Ok(());
        }
        self.count();
        self.filter.ledger_set_binding(policy, cgroup, present)
    }

    fn adopted(&mut self) -> Result<Option<Adopted>, EgressError> {
        if self.filter.pin_outcome() != &PinOutcome::Adopted {
            return Ok(None);
        }
        Ok(Some(Adopted {
            state: self.filter.read_state()?,
            attached: self.links.keys().copied().collect(),
        }))
    }

    fn release_stale(&mut self) -> Result<usize, EgressError> {
        let mut released = 0;
        let mut first = Ok(());
        for link in std::mem::take(&mut self.stale) {
            self.count();
            let cgroup = link.cgroup_id();
            match self.filter.release_link(link) {
                Ok(()) => released += 1,
                Err(e) => {
                    tracing::warn!(cgroup, error = %e, "egress: releasing a stale link failed");
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        first.map(|()| released)
    }

    fn domains_available(&self) -> std::result::Result<(), String> {
        match self.filter.snoop_error() {
            None => Ok(()),
            Some(e) => Err(e.to_string()),
        }
    }

    fn set_domain(
        &mut self,
        set_id: u32,
        domain: &Domain,
        verdicts: DomainVerdicts,
        name_id: u32,
    ) -> Result<(), EgressError> {
        self.count();
        self.filter.set_domain(set_id, domain, verdicts, name_id)
    }

    fn forget_learned(&mut self, set_id: u32, name_id: Option<u32>) -> Result<(), EgressError> {
        self.count();
        self.filter.forget_learned(set_id, name_id).map(|_| ())
    }

    fn learned(&self) -> Result<Vec<Learned>, EgressError> {
        self.filter.learned()
    }

    fn ensure_snoop(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), EgressError> {
        if !self.links.contains_key(&cgroup) {
            return Ok(());
        }
        self.attach_snoop(cgroup, path)
    }

    fn ledger_domain_rule(
        &mut self,
        policy: &[u8],
        verdict: Verdict,
        domain: &Domain,
        present: bool,
    ) -> Result<(), EgressError> {
        if !self.ledger {
            return Ok(());
        }
        self.count();
        self.filter
            .ledger_set_domain_rule(policy, verdict, domain, present)
    }
}

pub(super) fn kernel_error(op: String, e: &EgressError) -> EnforceError {
    match e {
        EgressError::MapFull { map, max_entries } => EnforceError::MapFull {
            behavior: BEHAVIOR,
            map,
            capacity: *max_entries,
        },
        other => EnforceError::Kernel {
            behavior: BEHAVIOR,
            op,
            source: std::io::Error::other(other.to_string()),
        },
    }
}
