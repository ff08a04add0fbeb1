//! The node half's API client: server-side apply, reads and deletes
//! through one current-thread runtime (the node half is synchronous; its
//! waits are loops over reads).

use anyhow::Context as _;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::api::{Api, DeleteParams, Patch, PatchParams, ValidationDirective};
use std::fmt::Debug;

/// The field manager of everything the node half writes.
pub const MANAGER: &str = "krt-conformance";

/// A client and the runtime that drives it.
pub struct Cluster {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Cluster {
    /// A client from `KUBECONFIG`.
    pub fn connect() -> anyhow::Result<Cluster> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a runtime")?;
        let client = rt
            .block_on(kube::Client::try_default())
            .context("a Kubernetes client from KUBECONFIG")?;
        Ok(Cluster { rt, client })
    }

    /// Runs a future to completion.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// A cluster-scoped API.
    pub fn all<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = ClusterResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// A namespaced resource across every namespace (list and watch).
    pub fn every_namespace<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// A namespaced API.
    pub fn ns<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Server-side apply with strict field validation: a field the schema
    /// does not know is refused by the server, not dropped.
    pub fn apply<K>(&self, api: &Api<K>, name: &str, value: serde_json::Value) -> anyhow::Result<K>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + Debug,
    {
        let mut params = PatchParams::apply(MANAGER).force();
        params.field_validation = Some(ValidationDirective::Strict);
        self.rt
            .block_on(api.patch(name, &params, &Patch::Apply(value)))
            .with_context(|| format!("applying {name}"))
    }

    /// A merge patch of the status subresource.
    pub fn patch_status<K>(
        &self,
        api: &Api<K>,
        name: &str,
        value: serde_json::Value,
    ) -> anyhow::Result<K>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
    {
        self.rt
            .block_on(api.patch_status(name, &PatchParams::default(), &Patch::Merge(value)))
            .with_context(|| format!("patching the status of {name}"))
    }

    /// The object, or `None` when it does not exist.
    pub fn get<K>(&self, api: &Api<K>, name: &str) -> anyhow::Result<Option<K>>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
    {
        self.rt
            .block_on(api.get_opt(name))
            .with_context(|| format!("reading {name}"))
    }

    /// Deletes the object at once (grace 0: no kubelet confirms a graceful
    /// delete here); a missing object is not an error.
    pub fn delete<K>(&self, api: &Api<K>, name: &str) -> anyhow::Result<()>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
    {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        match self.rt.block_on(api.delete(name, &params)) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting {name}")),
        }
    }
}
