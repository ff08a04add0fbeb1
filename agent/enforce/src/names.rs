//! Named network destinations as the network manager resolves them.
//!
//! A cluster Service (`<name>.<namespace>.svc[.<cluster domain>]`) is
//! resolved from the API: its ClusterIPs and the addresses of its
//! EndpointSlices, which the daemon watches (`agent/src/daemon/services.rs`)
//! and hands to [`crate::egress::EgressManager::set_service_addresses`] as
//! they change. The manager programs them into the filter sets exactly like
//! literal addresses. Every other domain name is learned in the kernel from
//! the pod's own DNS answers (the egress backend's snooper); nothing here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

/// A cluster Service, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceName {
    /// The Service's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceName {
    /// The Service `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// `<name>.<namespace>.svc`, as a policy names it.
impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.svc", self.name, self.namespace)
    }
}

/// The addresses of the Services the API reported, and whether it has
/// reported all of them once (the watches listed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceAddresses {
    /// Services that exist, with their addresses (possibly none: a
    /// headless Service without endpoints yet). An absent Service is not
    /// here.
    addresses: BTreeMap<ServiceName, BTreeSet<IpAddr>>,
    synced: bool,
}

impl ServiceAddresses {
    /// Nothing known, not synced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `service`'s addresses (`None`: the Service does not exist).
    /// Returns whether that changed anything.
    pub fn set(&mut self, service: ServiceName, addresses: Option<BTreeSet<IpAddr>>) -> bool {
        match addresses {
            Some(a) => self.addresses.insert(service, a.clone()) != Some(a),
            None => self.addresses.remove(&service).is_some(),
        }
    }

    /// The addresses of `service`; `None` while it does not exist (as far
    /// as the API said).
    pub fn get(&self, service: &ServiceName) -> Option<&BTreeSet<IpAddr>> {
        self.addresses.get(service)
    }

    /// Marks the table complete: every existing Service has been reported.
    pub fn mark_synced(&mut self) {
        self.synced = true;
    }

    /// Whether the table is complete (see [`Self::mark_synced`]).
    pub fn synced(&self) -> bool {
        self.synced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_print_as_a_policy_names_them() {
        assert_eq!(ServiceName::new("prod", "api").to_string(), "api.prod.svc");
    }

    #[test]
    fn the_table_says_what_changed() {
        let mut t = ServiceAddresses::new();
        let api = ServiceName::new("prod", "api");
        let one: BTreeSet<IpAddr> = ["10.96.0.5".parse().unwrap()].into();
        assert!(t.set(api.clone(), Some(one.clone())));
        assert!(!t.set(api.clone(), Some(one.clone())), "the same again");
        assert_eq!(t.get(&api), Some(&one));
        assert!(
            t.set(api.clone(), Some(BTreeSet::new())),
            "headless, no endpoints"
        );
        assert_eq!(t.get(&api), Some(&BTreeSet::new()));
        assert!(t.set(api.clone(), None));
        assert!(!t.set(api.clone(), None));
        assert_eq!(t.get(&api), None);
        assert!(!t.synced());
        t.mark_synced();
        assert!(t.synced());
    }
}
