//! The NRI plugin's side in the daemon: each container the runtime starts
//! is programmed before its process runs (issue 35).
//!
//! The plugin ([`kyverno_runtime_nri`]) bounds each answer; here a start
//! takes the engine's lock off the runtime's task (the engine is a
//! blocking mutex a relist may hold for a while), and a start whose pod the
//! watch has not delivered yet waits for it, polling, within the bound: the
//! pod's arrival programs it with the runtime's container merged in.

use super::watches::{lock, SharedEngine};
use async_trait::async_trait;
use kyverno_runtime_metrics::{ContainerStartOutcome, Metrics};
use kyverno_runtime_nri::{Container, Containers, Registration};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// The metric's and the log's name for this hook.
const HOOK: &str = "nri";
/// How often a start whose pod is not known yet looks again.
const POD_POLL: Duration = Duration::from_millis(5);

/// The daemon's [`Containers`].
pub struct NriContainers {
    engine: SharedEngine,
    metrics: Arc<Metrics>,
    /// Namespaces whose starts are never held (the daemon's own, the
    /// cluster's control pods): enforce policies never enforce there, and a
    /// hook that waits on the daemon must not wait for the daemon's own pod
    /// (cilium/tetragon#2402).
    not_held: BTreeSet<String>,
}

impl NriContainers {
    /// Starts announced to `engine`; `not_held`: namespaces never waited on.
    pub fn new(engine: SharedEngine, metrics: Arc<Metrics>, not_held: BTreeSet<String>) -> Self {
        metrics.set_container_start_hook(HOOK, false);
        Self {
            engine,
            metrics,
            not_held,
        }
    }

    /// Runs `work` on the engine off the async runtime.
    async fn with_engine<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut super::engine::Engine) -> T + Send + 'static,
    ) -> Option<T> {
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || work(&mut lock(&engine)))
            .await
            .ok()
    }
}

#[async_trait]
impl Containers for NriContainers {
    fn synchronized(&self, containers: Vec<Container>) {
        tracing::info!(
            containers = containers.len(),
            "NRI: the runtime's running containers taken"
        );
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || lock(&engine).runtime_synchronized(&containers));
    }

    async fn starting(&self, container: Container) {
        let held = !self.not_held.contains(&container.pod_namespace);
        let uid = container.pod_uid.clone();
        let engine = self.engine.clone();
        let c = container.clone();
        // Not cancelled with the answer: a late start is still programmed.
        let started = tokio::task::spawn_blocking(move || lock(&engine).container_started(&c));
        if !held {
            self.metrics
                .container_start(ContainerStartOutcome::not_held);
            return;
        }
        if started.await.ok() != Some(true) {
            // The watch has not delivered the pod: its arrival programs
            // the container; wait for that (the plugin bounds the wait).
            loop {
                tokio::time::sleep(POD_POLL).await;
                let uid = uid.clone();
                if self.with_engine(move |e| e.pod_known(&uid)).await == Some(true) {
                    break;
                }
            }
        }
        self.metrics
            .container_start(ContainerStartOutcome::enforced);
    }

    fn answered(&self, container: &Container, waited: Duration, late: bool) {
        self.metrics.container_start_answered(waited);
        if !late {
            return;
        }
        self.metrics.container_start(ContainerStartOutcome::late);
        tracing::warn!(
            pod = %format!("{}/{}", container.pod_namespace, container.pod_name),
            container = %container.name,
            waited_ms = waited.as_millis() as u64,
            "NRI: a container start was answered before the daemon had programmed it; it ran unenforced until then"
        );
    }

    fn stopped(&self, container: Container) {
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || lock(&engine).container_stopped(&container));
    }

    fn registration(&self, state: Registration) {
        match state {
            Registration::Registered { runtime } => {
                self.metrics.set_container_start_hook(HOOK, true);
                tracing::info!(%runtime, "NRI: registered; containers are programmed before they start");
            }
            Registration::Unregistered { reason } => {
                self.metrics.set_container_start_hook(HOOK, false);
                tracing::warn!(%reason, "NRI: not registered; containers are programmed once their Pod's status names them (after they start)");
                let engine = self.engine.clone();
                tokio::task::spawn_blocking(move || lock(&engine).runtime_disconnected());
            }
        }
    }
}
