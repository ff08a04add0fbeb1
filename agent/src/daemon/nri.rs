//! The NRI plugin's side in the daemon: each container the runtime starts
//! is programmed before its process runs (issue 35).
//!
//! The plugin ([`kyverno_runtime_nri`]) runs on its own thread and bounds
//! each answer. What it reports reaches the engine through one queue, in
//! the order the runtime said it, applied by one worker thread: the engine
//! is a mutex a relist may hold for seconds, the bound's timer must keep
//! running meanwhile, and a synchronize or a lost registration must not
//! overtake (or be overtaken by) the start after it. A start whose pod the
//! watch has not delivered yet waits for it, polling, within the bound:
//! the pod's arrival programs it with the runtime's container merged in.

use super::watches::{lock, SharedEngine};
use async_trait::async_trait;
use kyverno_runtime_metrics::{ContainerStartOutcome, Metrics};
use kyverno_runtime_nri::{Container, Containers, Registration};
use std::collections::BTreeSet;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The metric's and the log's name for this hook.
const HOOK: &str = "nri";
/// How often a start whose pod is not known yet looks again.
const POD_POLL: Duration = Duration::from_millis(5);

/// What the plugin asks of the engine, in the runtime's order.
enum Command {
    /// The runtime's containers at a (re)registration.
    Synchronize(Vec<Container>),
    /// A start: says whether the pod was known (and so programmed).
    Start(Container, oneshot::Sender<bool>),
    /// A stop or removal.
    Stop(Container),
    /// The registration was lost.
    Disconnected,
    /// Whether the pod (by UID) is known yet.
    Known(String, oneshot::Sender<bool>),
}

/// The daemon's [`Containers`].
pub struct NriContainers {
    commands: mpsc::Sender<Command>,
    metrics: Arc<Metrics>,
    /// Namespaces whose starts are never held (the daemon's own, the
    /// cluster's control pods): enforce policies never enforce there, and a
    /// hook that waits on the daemon must not wait for the daemon's own pod
    /// (cilium/tetragon#2402).
    not_held: BTreeSet<String>,
    /// Whether the plugin is registered now (the startup gate opens only
    /// once it has been: a container started before would not wait).
    registered: tokio::sync::watch::Sender<bool>,
}

impl NriContainers {
    /// Starts announced to `engine`; `not_held`: namespaces never waited
    /// on. Starts the worker that applies them.
    pub fn new(
        engine: SharedEngine,
        metrics: Arc<Metrics>,
        not_held: BTreeSet<String>,
    ) -> std::io::Result<Self> {
        metrics.set_container_start_hook(HOOK, false);
        let (commands, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("nri-engine".into())
            .spawn(move || {
                // Ends when the plugin (every sender) is gone.
                while let Ok(command) = queue.recv() {
                    apply(&engine, command);
                }
            })?;
        Ok(Self {
            commands,
            metrics,
            not_held,
            registered: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Follows whether the plugin is registered with the runtime.
    pub fn registered(&self) -> tokio::sync::watch::Receiver<bool> {
        self.registered.subscribe()
    }

    /// Queues `command`; a worker that is gone answers nothing (its
    /// waiters see their channel closed).
    fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }

    /// Asks the worker, and waits for its answer (false if it is gone).
    async fn ask(&self, command: impl FnOnce(oneshot::Sender<bool>) -> Command) -> bool {
        let (tx, rx) = oneshot::channel();
        self.send(command(tx));
        rx.await.unwrap_or(false)
    }
}

fn apply(engine: &SharedEngine, command: Command) {
    match command {
        Command::Synchronize(containers) => lock(engine).runtime_synchronized(&containers),
        Command::Start(container, known) => {
            let _ = known.send(lock(engine).container_started(&container));
        }
        Command::Stop(container) => lock(engine).container_stopped(&container),
        Command::Disconnected => lock(engine).runtime_disconnected(),
        Command::Known(uid, known) => {
            let _ = known.send(lock(engine).pod_known(&uid));
        }
    }
}

#[async_trait]
impl Containers for NriContainers {
    fn synchronized(&self, containers: Vec<Container>) {
        tracing::info!(
            containers = containers.len(),
            "NRI: the runtime's running containers taken"
        );
        self.send(Command::Synchronize(containers));
    }

    async fn starting(&self, container: Container) {
        let held = !self.not_held.contains(&container.pod_namespace);
        let uid = container.pod_uid.clone();
        let (tx, known) = oneshot::channel();
        // Queued whatever happens to the answer: a late start is still
        // programmed.
        self.send(Command::Start(container, tx));
        if !held {
            self.metrics
                .container_start(ContainerStartOutcome::not_held);
            return;
        }
        if known.await != Ok(true) {
            // The watch has not delivered the pod: its arrival programs
            // the container; wait for that (the plugin bounds the wait).
            loop {
                tokio::time::sleep(POD_POLL).await;
                let uid = uid.clone();
                if self.ask(move |tx| Command::Known(uid, tx)).await {
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
        self.send(Command::Stop(container));
    }

    fn registration(&self, state: Registration) {
        match state {
            Registration::Registered { runtime } => {
                self.metrics.set_container_start_hook(HOOK, true);
                self.registered.send_replace(true);
                tracing::info!(%runtime, "NRI: registered; containers are programmed before they start");
            }
            Registration::Unregistered { reason } => {
                self.metrics.set_container_start_hook(HOOK, false);
                self.registered.send_replace(false);
                tracing::warn!(%reason, "NRI: not registered; containers are programmed once their Pod's status names them (after they start)");
                self.send(Command::Disconnected);
            }
        }
    }
}
