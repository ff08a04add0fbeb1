//! Cluster Service names for network policies: the Services and
//! EndpointSlices the API reports, turned into the addresses of each
//! Service, which the engine hands to the network manager.
//!
//! A Service's addresses are its ClusterIPs (`spec.clusterIPs`, both
//! families of a dual-stack Service; none for a headless one) and the
//! endpoint addresses of the EndpointSlices labelled
//! `kubernetes.io/service-name` with its name, of the IPv4 and IPv6
//! address types (FQDN slices carry names, not addresses). Every endpoint
//! counts, ready or not: a deny must cover a pod that is still starting,
//! and an allow of one costs nothing. A Service that does not exist has no
//! addresses, whatever slices are left (slices outlive their Service until
//! the garbage collector gets to them). An ExternalName Service has no
//! address either: its name is a DNS alias, which a policy names as a
//! domain instead.
//!
//! [`ServiceIndex`] is the pure bookkeeping, fed watch events in order; it
//! says which Services an event changed, so only those are recomputed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use kyverno_runtime_enforce::names::ServiceName;

/// The label an EndpointSlice names its Service with.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the Services and EndpointSlices seen so far say.
#[derive(Debug, Default)]
pub struct ServiceIndex {
    /// Existing Services and their ClusterIPs.
    services: BTreeMap<ServiceName, BTreeSet<IpAddr>>,
    /// EndpointSlices by (namespace, slice name): the Service they belong
    /// to and their endpoint addresses.
    slices: BTreeMap<(String, String), (ServiceName, BTreeSet<IpAddr>)>,
}

/// The key of an object: namespace and name, when both are set.
fn key(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<(String, String)> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// Parses the addresses an object lists, skipping what is not an IP
/// (`"None"` for a headless Service, or anything malformed): the API
/// server validates both fields, so a skip here is logged, not fatal.
fn addresses<'a>(what: &str, values: impl Iterator<Item = &'a String>) -> BTreeSet<IpAddr> {
    values
        .filter(|v| v.as_str() != "None" && !v.is_empty())
        .filter_map(|v| match v.parse::<IpAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                tracing::debug!(%what, value = %v, "not an IP address, skipped");
                None
            }
        })
        .collect()
}

impl ServiceIndex {
    /// A Service was created or changed; returns it if its addresses may
    /// have changed.
    pub fn apply_service(&mut self, svc: &Service) -> Option<ServiceName> {
        let (namespace, name) = key(&svc.metadata)?;
        let spec = svc.spec.as_ref();
        let external = spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let ips = if external {
            BTreeSet::new()
        } else {
            let listed = spec.and_then(|s| s.cluster_ips.as_ref());
            let single = spec.and_then(|s| s.cluster_ip.as_ref());
            addresses("clusterIP", listed.into_iter().flatten().chain(single))
        };
        let service = ServiceName::new(namespace, name);
        (self.services.insert(service.clone(), ips.clone()) != Some(ips)).then_some(service)
    }

    /// A Service was deleted.
    pub fn delete_service(&mut self, svc: &Service) -> Option<ServiceName> {
        let (namespace, name) = key(&svc.metadata)?;
        self.delete_service_named(&ServiceName::new(namespace, name))
    }

    fn delete_service_named(&mut self, service: &ServiceName) -> Option<ServiceName> {
        self.services.remove(service).map(|_| service.clone())
    }

    /// An EndpointSlice was created or changed; returns the Services whose
    /// addresses may have changed (its Service, and the one it belonged to
    /// before if its label changed).
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> Vec<ServiceName> {
        let Some((namespace, slice_name)) = key(&slice.metadata) else {
            return Vec::new();
        };
        let owner = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .map(|name| ServiceName::new(namespace.clone(), name.clone()));
        let ips = match slice.address_type.as_str() {
            "IPv4" | "IPv6" => addresses(
                "endpoint address",
                slice
                    .endpoints
                    .iter()
                    .flatten()
                    .flat_map(|e| e.addresses.iter()),
            ),
            _ => BTreeSet::new(),
        };
        let slice_key = (namespace, slice_name);
        let new = owner.map(|o| (o, ips));
        let old = match &new {
            Some(n) => self.slices.insert(slice_key, n.clone()),
            None => self.slices.remove(&slice_key),
        };
        if old == new {
            return Vec::new();
        }
        let mut changed: Vec<ServiceName> = old.into_iter().chain(new).map(|(o, _)| o).collect();
        changed.sort();
        changed.dedup();
        changed
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> Vec<ServiceName> {
        let Some(k) = key(&slice.metadata) else {
            return Vec::new();
        };
        self.slices
            .remove(&k)
            .map(|(o, _)| vec![o])
            .unwrap_or_default()
    }

    /// The addresses of `service`: `None` while it does not exist.
    pub fn addresses(&self, service: &ServiceName) -> Option<BTreeSet<IpAddr>> {
        let mut out = self.services.get(service)?.clone();
        for (owner, ips) in self.slices.values() {
            if owner == service {
                out.extend(ips.iter().copied());
            }
        }
        Some(out)
    }

    /// The Services known, by key (for a relist's deletions).
    pub fn service_keys(&self) -> BTreeSet<(String, String)> {
        self.services
            .keys()
            .map(|s| (s.namespace.clone(), s.name.clone()))
            .collect()
    }

    /// The EndpointSlices known, by key (for a relist's deletions).
    pub fn slice_keys(&self) -> BTreeSet<(String, String)> {
        self.slices.keys().cloned().collect()
    }

    /// Forgets a Service by key (a relist did not deliver it).
    pub fn forget_service(&mut self, (namespace, name): (String, String)) -> Option<ServiceName> {
        self.delete_service_named(&ServiceName::new(namespace, name))
    }

    /// Forgets an EndpointSlice by key (a relist did not deliver it).
    pub fn forget_slice(&mut self, key: &(String, String)) -> Vec<ServiceName> {
        self.slices
            .remove(key)
            .map(|(o, _)| vec![o])
            .unwrap_or_default()
    }
}

/// What a watch event changed: each Service with its new addresses
/// (`None`: it does not exist), and whether both watches have now listed
/// for the first time.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Services whose addresses changed.
    pub services: Vec<(ServiceName, Option<BTreeSet<IpAddr>>)>,
    /// Both watches have listed once, just now.
    pub synced: bool,
}

/// The watch side: the index, the relists in progress (a key the index
/// holds that a relist did not deliver was deleted while the watch was
/// down) and the first sync of both watches.
#[derive(Debug, Default)]
pub struct ServiceNames {
    index: ServiceIndex,
    relist_services: Option<BTreeSet<(String, String)>>,
    relist_slices: Option<BTreeSet<(String, String)>>,
    services_listed: bool,
    slices_listed: bool,
    synced: bool,
}

impl ServiceNames {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn changes(&mut self, names: Vec<ServiceName>) -> Changes {
        let services = names
            .into_iter()
            .map(|n| {
                let a = self.index.addresses(&n);
                (n, a)
            })
            .collect();
        let synced = !self.synced && self.services_listed && self.slices_listed;
        self.synced |= synced;
        Changes { services, synced }
    }

    /// Applies one event of the Service watch.
    pub fn service_event(&mut self, event: Event<Service>) -> Changes {
        let mut changed = Vec::new();
        match event {
            Event::Init => self.relist_services = Some(BTreeSet::new()),
            Event::InitApply(svc) => {
                if let Some(k) = key(&svc.metadata) {
                    self.relist_services
                        .get_or_insert_with(BTreeSet::new)
                        .insert(k);
                }
                changed.extend(self.index.apply_service(&svc));
            }
            Event::InitDone => {
                let seen = self.relist_services.take().unwrap_or_default();
                for gone in self.index.service_keys().difference(&seen) {
                    changed.extend(self.index.forget_service(gone.clone()));
                }
                if !self.services_listed {
                    tracing::info!(services = seen.len(), "Services listed");
                }
                self.services_listed = true;
            }
            Event::Apply(svc) => changed.extend(self.index.apply_service(&svc)),
            Event::Delete(svc) => changed.extend(self.index.delete_service(&svc)),
        }
        self.changes(changed)
    }

    /// Applies one event of the EndpointSlice watch.
    pub fn slice_event(&mut self, event: Event<EndpointSlice>) -> Changes {
        let mut changed = Vec::new();
        match event {
            Event::Init => self.relist_slices = Some(BTreeSet::new()),
            Event::InitApply(slice) => {
                if let Some(k) = key(&slice.metadata) {
                    self.relist_slices
                        .get_or_insert_with(BTreeSet::new)
                        .insert(k);
                }
                changed.extend(self.index.apply_slice(&slice));
            }
            Event::InitDone => {
                let seen = self.relist_slices.take().unwrap_or_default();
                for gone in self.index.slice_keys().difference(&seen) {
                    changed.extend(self.index.forget_slice(gone));
                }
                if !self.slices_listed {
                    tracing::info!(endpointslices = seen.len(), "EndpointSlices listed");
                }
                self.slices_listed = true;
            }
            Event::Apply(slice) => changed.extend(self.index.apply_slice(&slice)),
            Event::Delete(slice) => changed.extend(self.index.delete_slice(&slice)),
        }
        changed.sort();
        changed.dedup();
        self.changes(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::Endpoint;

    fn service(ns: &str, name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": spec,
        }))
        .unwrap()
    }

    fn slice(
        ns: &str,
        name: &str,
        owner: Option<&str>,
        kind: &str,
        addrs: &[&str],
    ) -> EndpointSlice {
        let mut s = EndpointSlice {
            address_type: kind.into(),
            endpoints: Some(vec![Endpoint {
                addresses: addrs.iter().map(|a| a.to_string()).collect(),
                ..Endpoint::default()
            }]),
            ..EndpointSlice::default()
        };
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.metadata.labels = owner.map(|o| [(SERVICE_NAME_LABEL.to_string(), o.to_string())].into());
        s
    }

    fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn api() -> ServiceName {
        ServiceName::new("prod", "api")
    }

    #[test]
    fn a_dual_stack_service_has_both_cluster_ips_and_its_endpoints() {
        let mut ix = ServiceIndex::default();
        assert_eq!(ix.addresses(&api()), None, "absent");
        let svc = service(
            "prod",
            "api",
            serde_json::json!({"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "fd00::5"]}),
        );
        assert_eq!(ix.apply_service(&svc), Some(api()));
        assert_eq!(ix.apply_service(&svc), None, "unchanged");
        assert_eq!(ix.addresses(&api()), Some(ips(&["10.96.0.5", "fd00::5"])));
        let v4 = slice(
            "prod",
            "api-x1",
            Some("api"),
            "IPv4",
            &["10.244.1.7", "10.244.2.8"],
        );
        assert_eq!(ix.apply_slice(&v4), [api()]);
        assert_eq!(ix.apply_slice(&v4), [], "unchanged");
        let v6 = slice("prod", "api-x2", Some("api"), "IPv6", &["fd00:244::7"]);
        assert_eq!(ix.apply_slice(&v6), [api()]);
        assert_eq!(
            ix.addresses(&api()),
            Some(ips(&[
                "10.96.0.5",
                "fd00::5",
                "10.244.1.7",
                "10.244.2.8",
                "fd00:244::7"
            ]))
        );
        // An endpoint replaced.
        let v4b = slice(
            "prod",
            "api-x1",
            Some("api"),
            "IPv4",
            &["10.244.1.7", "10.244.3.9"],
        );
        assert_eq!(ix.apply_slice(&v4b), [api()]);
        assert!(ix
            .addresses(&api())
            .unwrap()
            .contains(&"10.244.3.9".parse().unwrap()));
        assert!(!ix
            .addresses(&api())
            .unwrap()
            .contains(&"10.244.2.8".parse().unwrap()));
        // Deleted: its slices no longer count, whatever is left of them.
        assert_eq!(ix.delete_service(&svc), Some(api()));
        assert_eq!(ix.addresses(&api()), None);
        assert_eq!(ix.delete_slice(&v6), [api()]);
    }

    #[test]
    fn headless_external_and_odd_slices() {
        let mut ix = ServiceIndex::default();
        let headless = service(
            "prod",
            "api",
            serde_json::json!({"clusterIP": "None", "clusterIPs": ["None"]}),
        );
        ix.apply_service(&headless);
        assert_eq!(
            ix.addresses(&api()),
            Some(BTreeSet::new()),
            "exists, no address yet"
        );
        ix.apply_slice(&slice(
            "prod",
            "api-1",
            Some("api"),
            "IPv4",
            &["10.244.1.7"],
        ));
        assert_eq!(ix.addresses(&api()), Some(ips(&["10.244.1.7"])));
        // FQDN slices carry names; a slice without the label is nobody's.
        ix.apply_slice(&slice(
            "prod",
            "api-2",
            Some("api"),
            "FQDN",
            &["db.example"],
        ));
        ix.apply_slice(&slice("prod", "stray", None, "IPv4", &["10.244.9.9"]));
        assert_eq!(ix.addresses(&api()), Some(ips(&["10.244.1.7"])));
        // Relabelled to another Service: both change.
        let moved = slice("prod", "api-1", Some("web"), "IPv4", &["10.244.1.7"]);
        assert_eq!(
            ix.apply_slice(&moved),
            [api(), ServiceName::new("prod", "web")]
        );
        // Label removed: its old owner changes.
        assert_eq!(
            ix.apply_slice(&slice("prod", "api-1", None, "IPv4", &["10.244.1.7"])),
            [ServiceName::new("prod", "web")]
        );
        let ext = service(
            "prod",
            "ext",
            serde_json::json!({"type": "ExternalName", "externalName": "db.example"}),
        );
        ix.apply_service(&ext);
        assert_eq!(
            ix.addresses(&ServiceName::new("prod", "ext")),
            Some(BTreeSet::new())
        );
    }

    #[test]
    fn relists_forget_by_key() {
        let mut ix = ServiceIndex::default();
        ix.apply_service(&service(
            "prod",
            "api",
            serde_json::json!({"clusterIP": "10.96.0.5"}),
        ));
        ix.apply_slice(&slice(
            "prod",
            "api-1",
            Some("api"),
            "IPv4",
            &["10.244.1.7"],
        ));
        assert_eq!(
            ix.service_keys(),
            [("prod".to_string(), "api".to_string())].into()
        );
        assert_eq!(ix.forget_slice(&("prod".into(), "api-1".into())), [api()]);
        assert_eq!(ix.addresses(&api()), Some(ips(&["10.96.0.5"])));
        assert_eq!(
            ix.forget_service(("prod".into(), "api".into())),
            Some(api())
        );
        assert!(ix.slice_keys().is_empty() && ix.service_keys().is_empty());
    }

    #[test]
    fn both_watches_listed_is_the_sync_and_a_relist_deletes_what_it_missed() {
        let mut n = ServiceNames::new();
        let svc = service("prod", "api", serde_json::json!({"clusterIP": "10.96.0.5"}));
        assert_eq!(n.service_event(Event::Init), Changes::default());
        let c = n.service_event(Event::InitApply(svc.clone()));
        assert_eq!(c.services, [(api(), Some(ips(&["10.96.0.5"])))]);
        assert!(
            !n.service_event(Event::InitDone).synced,
            "slices not listed yet"
        );
        n.slice_event(Event::Init);
        let c = n.slice_event(Event::InitApply(slice(
            "prod",
            "api-1",
            Some("api"),
            "IPv4",
            &["10.244.1.7"],
        )));
        assert_eq!(
            c.services,
            [(api(), Some(ips(&["10.96.0.5", "10.244.1.7"])))]
        );
        let c = n.slice_event(Event::InitDone);
        assert!(c.synced);
        assert!(!n.slice_event(Event::InitDone).synced, "only once");
        // A relist after the watch was down: the Service is gone.
        n.service_event(Event::Init);
        let c = n.service_event(Event::InitDone);
        assert_eq!(c.services, [(api(), None)]);
        assert_eq!(n.index.addresses(&api()), None);
    }
}
