//! The plugin against a runtime's side of NRI played in this process (the
//! generated client of the plugin's service, a server of the runtime's,
//! NRI's multiplexer): registration, configure's event mask, a
//! synchronize, a start answered once the daemon's work ends, a start
//! answered at the bound when it does not, a stop, and a second
//! registration after the runtime dropped the connection. The real
//! runtime (containerd 2.x) is `ci/node-tier` and `ci/start-window`.

use async_trait::async_trait;
use futures::StreamExt;
use kyverno_runtime_nri::api::{self, ContainerState};
use kyverno_runtime_nri::mux::{self, PLUGIN_SERVICE, RUNTIME_SERVICE};
use kyverno_runtime_nri::{api_ttrpc, Config, Container, Containers, Registration};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use ttrpc::r#async::transport::{Listener, Socket};

/// What the plugin told the daemon, in order.
#[derive(Debug, PartialEq)]
enum Told {
    Synchronized(Vec<String>),
    Starting(String),
    Late(String),
    Stopped(String),
    Registered(String),
    Unregistered,
}

struct Daemon {
    told: mpsc::UnboundedSender<Told>,
    /// How long a start takes to program.
    work: Mutex<Duration>,
}

#[async_trait]
impl Containers for Daemon {
    fn synchronized(&self, containers: Vec<Container>) {
        let _ = self.told.send(Told::Synchronized(
            containers.into_iter().map(|c| c.id).collect(),
        ));
    }
    async fn starting(&self, c: Container) {
        let work = *self.work.lock().unwrap_or_else(|e| e.into_inner());
        tokio::time::sleep(work).await;
        let _ = self.told.send(Told::Starting(c.id));
    }
    fn answered(&self, c: &Container, _waited: Duration, late: bool) {
        if late {
            let _ = self.told.send(Told::Late(c.id.clone()));
        }
    }
    fn stopped(&self, c: Container) {
        let _ = self.told.send(Told::Stopped(c.id));
    }
    fn registration(&self, state: Registration) {
        let _ = self.told.send(match state {
            Registration::Registered { runtime } => Told::Registered(runtime),
            Registration::Unregistered { .. } => Told::Unregistered,
        });
    }
}

/// The runtime's service: registrations are sent on.
struct RuntimeService(mpsc::UnboundedSender<String>);

#[async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        let _ = self
            .0
            .send(format!("{}/{}", req.plugin_idx, req.plugin_name));
        Ok(api::Empty::default())
    }
}

fn pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "sandbox-1".into(),
        uid: "uid-1".into(),
        namespace: "ns".into(),
        name: "p".into(),
        ..Default::default()
    }
}

fn container(id: &str, state: ContainerState) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: "sandbox-1".into(),
        name: "main".into(),
        state: state.into(),
        ..Default::default()
    }
}

/// The next message, or `None` after 10 s (a message never sent fails
/// the test instead of hanging it).
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .ok()
        .flatten()
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64)
}

/// One accepted plugin connection: the client of its service, and the
/// server of ours (kept alive with it).
async fn accept(
    listener: &tokio::net::UnixListener,
    registered: mpsc::UnboundedSender<String>,
) -> Result<
    (
        api_ttrpc::PluginClient,
        ttrpc::r#async::Server,
        tokio::task::JoinSet<std::io::Result<()>>,
    ),
    String,
> {
    let (conn, _) = listener.accept().await.map_err(|e| e.to_string())?;
    let (mut conns, tasks) = mux::split(conn, &[PLUGIN_SERVICE, RUNTIME_SERVICE]);
    let (Some(runtime_conn), Some(plugin_conn)) = (conns.pop(), conns.pop()) else {
        return Err("no connections".into());
    };
    let incoming =
        futures::stream::once(async move { Ok(runtime_conn) }).chain(futures::stream::pending());
    let mut server = ttrpc::r#async::Server::new()
        .register_service(api_ttrpc::create_runtime(Arc::new(RuntimeService(
            registered,
        ))))
        .add_listener(Listener::new(incoming));
    server.start().await.map_err(|e| e.to_string())?;
    let client =
        api_ttrpc::PluginClient::new(ttrpc::r#async::Client::new(Socket::new(plugin_conn)));
    Ok((client, server, tasks))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_registers_answers_starts_within_its_bound_and_registers_again(
) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let socket = dir.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| e.to_string())?;
    let (told_tx, mut told) = mpsc::unbounded_channel();
    let daemon = Arc::new(Daemon {
        told: told_tx,
        work: Mutex::new(Duration::from_millis(20)),
    });
    let mut config = Config::new(socket.clone());
    config.answer_within = Duration::from_millis(200);
    config.retry = Duration::from_millis(50);
    let plugin = tokio::spawn(kyverno_runtime_nri::run(config, daemon.clone()));
    let (reg_tx, mut registered) = mpsc::unbounded_channel();

    let (client, server, tasks) = accept(&listener, reg_tx.clone()).await?;
    assert_eq!(
        next(&mut registered).await.as_deref(),
        Some("05/kyverno-runtime")
    );
    let configured = client
        .configure(
            ctx(),
            &api::ConfigureRequest {
                runtime_name: "containerd".into(),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    // START_CONTAINER, STOP_CONTAINER, REMOVE_CONTAINER.
    assert_eq!(configured.events, (1 << 5) | (1 << 9) | (1 << 10));
    // A synchronize in two parts: the created and running containers.
    client
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                pods: vec![pod()],
                containers: vec![container("a", ContainerState::CONTAINER_RUNNING)],
                more: true,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    client
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                containers: vec![
                    container("b", ContainerState::CONTAINER_STOPPED),
                    container("c", ContainerState::CONTAINER_CREATED),
                ],
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(
        next(&mut told).await,
        Some(Told::Synchronized(vec!["a".into(), "c".into()]))
    );
    assert_eq!(
        next(&mut told).await,
        Some(Told::Registered("containerd".into()))
    );

    // A start is answered after the daemon's work.
    let began = Instant::now();
    let start = api::StartContainerRequest {
        pod: Some(pod()).into(),
        container: Some(container("d", ContainerState::CONTAINER_CREATED)).into(),
        ..Default::default()
    };
    client
        .start_container(ctx(), &start)
        .await
        .map_err(|e| e.to_string())?;
    assert!(began.elapsed() >= Duration::from_millis(20));
    assert_eq!(next(&mut told).await, Some(Told::Starting("d".into())));

    // Work past the bound: answered at it, and said.
    *daemon.work.lock().unwrap_or_else(|e| e.into_inner()) = Duration::from_secs(3);
    let began = Instant::now();
    client
        .start_container(ctx(), &start)
        .await
        .map_err(|e| e.to_string())?;
    let waited = began.elapsed();
    // Answered before the work ended (3 s), not before the bound.
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(next(&mut told).await, Some(Told::Late("d".into())));

    // A stop, through the dedicated call and through a state change.
    let stop = api::StopContainerRequest {
        pod: Some(pod()).into(),
        container: Some(container("d", ContainerState::CONTAINER_STOPPED)).into(),
        ..Default::default()
    };
    client
        .stop_container(ctx(), &stop)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(next(&mut told).await, Some(Told::Stopped("d".into())));
    let event = api::StateChangeEvent {
        event: api::Event::REMOVE_CONTAINER.into(),
        pod: Some(pod()).into(),
        container: Some(container("a", ContainerState::CONTAINER_STOPPED)).into(),
        ..Default::default()
    };
    client
        .state_change(ctx(), &event)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(next(&mut told).await, Some(Told::Stopped("a".into())));

    // The runtime goes away (a restart), twice for the same reason: each
    // time the plugin says so (a registration lost is never silent) and
    // registers again.
    let mut connection = (client, server, tasks);
    for _ in 0..2 {
        let (client, mut server, tasks) = connection;
        drop(client);
        drop(tasks);
        server.shutdown().await.map_err(|e| e.to_string())?;
        assert_eq!(next(&mut told).await, Some(Told::Unregistered));
        connection = accept(&listener, reg_tx.clone()).await?;
        assert_eq!(
            next(&mut registered).await.as_deref(),
            Some("05/kyverno-runtime")
        );
    }
    plugin.abort();
    Ok(())
}

/// The startup gate, as the runtime that launched it sees it: it
/// registers under its own name, subscribes to creations only, refuses a
/// creation outside its namespaces while the ready file is absent (with a
/// reason the kubelet shows, not an error that would make the runtime drop
/// it), lets one in a namespace it never holds through, counts what it
/// held, and lets everything through once the ready file is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_holds_creations_until_the_ready_file_and_counts_them() -> Result<(), String> {
    use kyverno_runtime_nri::gate::{self, GateConfig};
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let socket = dir.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| e.to_string())?;
    // The runtime hands a launched plugin a connected socket; here, one
    // end of a connection to this test's listener.
    let connection = std::os::unix::net::UnixStream::connect(&socket).map_err(|e| e.to_string())?;
    let plugin = tokio::spawn(gate::run(connection));
    let (reg_tx, mut registered) = mpsc::unbounded_channel();
    let (client, _server, _tasks) = accept(&listener, reg_tx).await?;
    assert_eq!(
        next(&mut registered).await.as_deref(),
        Some("00/kyverno-runtime-gate")
    );
    let ready = dir.path().join("run/kyverno-runtime/startup-gate.ready");
    let config = GateConfig {
        installed_by: gate::INSTALLED_BY.into(),
        ready_file: ready.clone(),
        not_held_namespaces: ["kube-system".to_string()].into(),
        hold_at_most_seconds: 600,
    };
    let configured = client
        .configure(
            ctx(),
            &api::ConfigureRequest {
                runtime_name: "containerd".into(),
                config: serde_json::to_string(&config).map_err(|e| e.to_string())?,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    // CREATE_CONTAINER only.
    assert_eq!(configured.events, 1 << 3);
    client
        .synchronize(ctx(), &api::SynchronizeRequest::default())
        .await
        .map_err(|e| e.to_string())?;
    let create = |namespace: &str| api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            namespace: namespace.into(),
            ..pod()
        })
        .into(),
        container: Some(container("a", ContainerState::CONTAINER_CREATED)).into(),
        ..Default::default()
    };
    match client.create_container(ctx(), &create("shop")).await {
        Err(ttrpc::Error::RpcStatus(status)) => {
            assert_eq!(status.code(), ttrpc::Code::UNAVAILABLE);
            assert!(
                status.message().contains("startup gate"),
                "{}",
                status.message()
            );
        }
        other => return Err(format!("a creation before the ready file: {other:?}")),
    }
    client
        .create_container(ctx(), &create("kube-system"))
        .await
        .map_err(|e| format!("kube-system is never held: {e}"))?;
    let held = std::fs::read_to_string(config.held_file()).map_err(|e| e.to_string())?;
    assert_eq!(held.trim(), "1");
    std::fs::write(&ready, "").map_err(|e| e.to_string())?;
    client
        .create_container(ctx(), &create("shop"))
        .await
        .map_err(|e| format!("a creation after the ready file: {e}"))?;
    plugin.abort();
    Ok(())
}
