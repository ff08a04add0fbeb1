//! Registers with a runtime's NRI socket and prints what it announces:
//! `cargo run -p kyverno-runtime-nri --example nri-probe -- SOCKET`.
//! A way to see, on a node, that the runtime has NRI on and talks to
//! plugins (the daemon's plugin is the same code).

use async_trait::async_trait;
use kyverno_runtime_nri::{Config, Container, Containers, Registration};
use std::sync::Arc;
use std::time::Duration;

struct Print;

#[async_trait]
impl Containers for Print {
    fn synchronized(&self, containers: Vec<Container>) {
        println!("synchronized: {} containers", containers.len());
        for c in containers {
            println!("  {}/{} {} {}", c.pod_namespace, c.pod_name, c.name, c.id);
        }
    }
    async fn starting(&self, c: Container) {
        println!(
            "starting: {}/{} {} {} (uid {})",
            c.pod_namespace, c.pod_name, c.name, c.id, c.pod_uid
        );
    }
    fn answered(&self, c: &Container, waited: Duration, late: bool) {
        let late = if late { " (late)" } else { "" };
        println!("answered: {} after {waited:?}{late}", c.id);
    }
    fn stopped(&self, c: Container) {
        println!(
            "stopped: {}/{} {} {}",
            c.pod_namespace, c.pod_name, c.name, c.id
        );
    }
    fn registration(&self, state: Registration) {
        println!("registration: {state:?}");
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(socket) = std::env::args_os().nth(1) else {
        eprintln!("usage: nri-probe SOCKET");
        std::process::exit(2);
    };
    let mut config = Config::new(socket.into());
    config.name = "nri-probe".to_string();
    config.index = "99".to_string();
    kyverno_runtime_nri::run(config, Arc::new(Print)).await;
}
