//! The plugin: connects to the runtime's NRI socket, registers, and hands
//! the daemon each container the runtime starts or stops; reconnects (and
//! so re-registers) whenever the runtime goes away.

use crate::api::{self, ContainerState, Event};
use crate::api_ttrpc;
use crate::mux::{self, PLUGIN_SERVICE, RUNTIME_SERVICE};
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::TtrpcContext;

/// The default bound on a start's wait: half the runtime's own limit (2 s,
/// NRI's default request timeout, past which it drops the plugin). On the
/// build machine's emulated guest a debug build programs a container in
/// 5 to 250 ms; a real node takes a few ms.
pub const DEFAULT_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// The longest bound [`Config::answer_within`] may be: the runtime drops a
/// plugin that has not answered in 2 s.
pub const MAX_ANSWER_WITHIN: Duration = Duration::from_millis(1500);

/// How the plugin connects and how long a start may wait on the daemon.
#[derive(Clone, Debug)]
pub struct Config {
    /// The runtime's NRI socket (containerd's default:
    /// `/var/run/nri/nri.sock`).
    pub socket: PathBuf,
    /// The plugin's name, as the runtime logs it.
    pub name: String,
    /// The plugin's index: two digits, the order among plugins.
    pub index: String,
    /// The longest a container's start waits for the daemon to program
    /// it; past this the plugin answers anyway (the start proceeds,
    /// enforced once programming ends) and says so ([`Containers::late`]).
    /// The runtime's own limit is 2 s (NRI's default request timeout),
    /// after which it drops the plugin.
    pub answer_within: Duration,
    /// The wait between connection attempts while the runtime is away
    /// (a dropped registration is retried at once).
    pub retry: Duration,
}

impl Config {
    /// The daemon's plugin at `socket`, answering within
    /// [`DEFAULT_ANSWER_WITHIN`].
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            name: "kyverno-runtime".to_string(),
            index: "05".to_string(),
            answer_within: DEFAULT_ANSWER_WITHIN,
            retry: Duration::from_secs(1),
        }
    }
}

/// One container as the runtime describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// The runtime's name (`containerd`, `cri-o`), the scheme of the
    /// container's id in the Pod's status.
    pub runtime: String,
    /// The Pod's UID.
    pub pod_uid: String,
    /// The Pod's namespace.
    pub pod_namespace: String,
    /// The Pod's name.
    pub pod_name: String,
    /// The container's name in the Pod's spec.
    pub name: String,
    /// The container's id (bare, without the runtime's scheme).
    pub id: String,
}

/// The plugin's state with the runtime, for the log, a metric and
/// `/healthz` detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Registered and synchronized: every start is announced from now on.
    Registered {
        /// The runtime's name and version, as it said in its configure.
        runtime: String,
    },
    /// Not connected (the socket is absent, refused, or the runtime left):
    /// starts are not announced; the daemon learns containers from the
    /// Pod's status only.
    Unregistered {
        /// Why, in words.
        reason: String,
    },
}

/// What the daemon does with the runtime's containers.
#[async_trait]
pub trait Containers: Send + Sync + 'static {
    /// The runtime's containers when the plugin (re)registers: this
    /// replaces whatever the plugin said before (events may have been
    /// missed while it was away).
    fn synchronized(&self, containers: Vec<Container>);
    /// `container`'s cgroup exists and its process has not run: return
    /// once it is enforced. Bounded by [`Config::answer_within`].
    async fn starting(&self, container: Container);
    /// A start was answered after `waited`; `late`: at the bound, before
    /// [`Containers::starting`] returned.
    fn answered(&self, container: &Container, waited: Duration, late: bool);
    /// `container` stopped or was removed.
    fn stopped(&self, container: Container);
    /// The plugin's state changed.
    fn registration(&self, state: Registration);
}

/// Runs the plugin for ever: connects, registers, serves; when the runtime
/// goes away (or is not there yet), says so and tries again every
/// [`Config::retry`].
pub async fn run(config: Config, containers: Arc<dyn Containers>) {
    let mut said: Option<String> = None;
    loop {
        match session(&config, containers.clone()).await {
            Ok(ended) => {
                // Registered, then dropped (the runtime restarted, or
                // closed the plugin over a late answer): said every time,
                // and a new connection at once, since starts are not held
                // meanwhile.
                containers.registration(Registration::Unregistered { reason: ended });
                said = None;
            }
            Err(reason) => {
                // Never registered: one line per distinct reason (a node
                // without NRI would otherwise say the same every retry).
                if said.as_deref() != Some(reason.as_str()) {
                    containers.registration(Registration::Unregistered {
                        reason: reason.clone(),
                    });
                    said = Some(reason);
                }
                tokio::time::sleep(config.retry).await;
            }
        }
    }
}

/// One connection, until it ends: `Ok` with why it ended once registered,
/// `Err` with why it never registered.
async fn session(config: &Config, containers: Arc<dyn Containers>) -> Result<String, String> {
    let trunk = tokio::net::UnixStream::connect(&config.socket)
        .await
        .map_err(|e| format!("connecting to {}: {e}", config.socket.display()))?;
    let service = Arc::new(Service {
        containers,
        answer_within: config.answer_within,
        state: Mutex::new(SessionState::default()),
    });
    serve(trunk, &config.name, &config.index, service).await
}

/// Serves `service` as the plugin `index`-`name` over `trunk`, a
/// connection to the runtime (one the plugin opened, or the one a runtime
/// that launched the plugin handed it): registers and serves until the
/// connection ends. `Ok` with why it ended once registered, `Err` with why
/// it never registered.
pub(crate) async fn serve(
    trunk: tokio::net::UnixStream,
    name: &str,
    index: &str,
    service: Arc<dyn api_ttrpc::Plugin + Send + Sync>,
) -> Result<String, String> {
    let (mut conns, mut tasks) = mux::split(trunk, &[PLUGIN_SERVICE, RUNTIME_SERVICE]);
    let (Some(runtime_conn), Some(plugin_conn)) = (conns.pop(), conns.pop()) else {
        return Err("the multiplexer opened no connections".to_string());
    };
    let incoming =
        futures::stream::once(async move { Ok(plugin_conn) }).chain(futures::stream::pending());
    let mut server = ttrpc::r#async::Server::new()
        .register_service(api_ttrpc::create_plugin(service))
        .add_listener(Listener::new(incoming));
    server
        .start()
        .await
        .map_err(|e| format!("serving the plugin: {e}"))?;
    let client =
        api_ttrpc::RuntimeClient::new(ttrpc::r#async::Client::new(Socket::new(runtime_conn)));
    let request = api::RegisterPluginRequest {
        plugin_name: name.to_string(),
        plugin_idx: index.to_string(),
        ..Default::default()
    };
    let registered = client
        .register_plugin(
            ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64),
            &request,
        )
        .await
        .map_err(|e| format!("registering with the runtime: {e}"));
    let ended = match registered {
        Ok(_) => Ok(match tasks.join_next().await {
            Some(Ok(Err(e))) => format!("the NRI connection failed: {e}"),
            _ => "the runtime closed the NRI connection".to_string(),
        }),
        Err(e) => Err(e),
    };
    tasks.abort_all();
    server.shutdown().await.ok();
    ended
}

/// What one connection learned: the runtime's name, and a synchronize
/// split over several requests.
#[derive(Default)]
struct SessionState {
    runtime: String,
    pods: BTreeMap<String, api::PodSandbox>,
    containers: Vec<api::Container>,
}

/// The plugin's ttRPC service.
struct Service {
    containers: Arc<dyn Containers>,
    answer_within: Duration,
    state: Mutex<SessionState>,
}

/// The events the plugin subscribes to.
fn subscribed_events() -> i32 {
    event_mask(&[
        Event::START_CONTAINER,
        Event::STOP_CONTAINER,
        Event::REMOVE_CONTAINER,
    ])
}

/// NRI's subscription mask of `events`: bit `event - 1`.
pub(crate) fn event_mask(events: &[Event]) -> i32 {
    events
        .iter()
        .fold(0, |mask, e| mask | (1 << (*e as i32 - 1)))
}

impl Service {
    fn runtime(&self) -> String {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .runtime
            .clone()
    }

    /// The container as the daemon takes it; `None` without a pod UID or a
    /// container id (nothing to attribute it to).
    fn container(
        &self,
        pod: Option<&api::PodSandbox>,
        c: Option<&api::Container>,
    ) -> Option<Container> {
        let (pod, c) = (pod?, c?);
        if pod.uid.is_empty() || c.id.is_empty() {
            return None;
        }
        Some(Container {
            runtime: self.runtime(),
            pod_uid: pod.uid.clone(),
            pod_namespace: pod.namespace.clone(),
            pod_name: pod.name.clone(),
            name: c.name.clone(),
            id: c.id.clone(),
        })
    }

    async fn start(&self, container: Option<Container>) {
        let Some(container) = container else {
            return;
        };
        let began = Instant::now();
        let work = self.containers.starting(container.clone());
        let late = tokio::time::timeout(self.answer_within, work)
            .await
            .is_err();
        self.containers.answered(&container, began.elapsed(), late);
    }

    fn stop(&self, container: Option<Container>) {
        if let Some(container) = container {
            self.containers.stopped(container);
        }
    }
}

#[async_trait]
impl api_ttrpc::Plugin for Service {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        *state = SessionState {
            runtime: req.runtime_name.clone(),
            ..Default::default()
        };
        tracing::debug!(runtime = %req.runtime_name, version = %req.runtime_version, "NRI: configured by the runtime");
        Ok(api::ConfigureResponse {
            events: subscribed_events(),
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let done = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            for pod in req.pods {
                state.pods.insert(pod.id.clone(), pod);
            }
            state.containers.extend(req.containers);
            if req.more {
                None
            } else {
                let pods = std::mem::take(&mut state.pods);
                let containers = std::mem::take(&mut state.containers);
                Some((pods, containers, state.runtime.clone()))
            }
        };
        if let Some((pods, containers, runtime)) = done {
            let live: Vec<Container> = containers
                .iter()
                .filter(|c| {
                    matches!(
                        c.state.enum_value(),
                        Ok(ContainerState::CONTAINER_CREATED | ContainerState::CONTAINER_RUNNING)
                    )
                })
                .filter_map(|c| self.container(pods.get(&c.pod_sandbox_id), Some(c)))
                .collect();
            self.containers.synchronized(live);
            self.containers
                .registration(Registration::Registered { runtime });
        }
        Ok(api::SynchronizeResponse {
            more: req.more,
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        Ok(api::Empty::default())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        self.start(self.container(req.pod.as_ref(), req.container.as_ref()))
            .await;
        Ok(api::StartContainerResponse::default())
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        self.stop(self.container(req.pod.as_ref(), req.container.as_ref()));
        Ok(api::StopContainerResponse::default())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        self.stop(self.container(req.pod.as_ref(), req.container.as_ref()));
        Ok(api::RemoveContainerResponse::default())
    }

    /// Runtimes before the dedicated calls (NRI before 0.10, containerd
    /// 1.7) send every event here.
    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let container = self.container(req.pod.as_ref(), req.container.as_ref());
        match req.event.enum_value() {
            Ok(Event::START_CONTAINER) => self.start(container).await,
            Ok(Event::STOP_CONTAINER | Event::REMOVE_CONTAINER) => self.stop(container),
            _ => {}
        }
        Ok(api::Empty::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_subscribes_to_starts_stops_and_removals() {
        // START_CONTAINER = 6, STOP_CONTAINER = 10, REMOVE_CONTAINER = 11.
        assert_eq!(subscribed_events(), (1 << 5) | (1 << 9) | (1 << 10));
    }
}
