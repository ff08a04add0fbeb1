//! A generated case as a conformance scenario (`conformance/scenarios/`
//! format), so a disagreement the differential finds is replayed end to
//! end on a real node: `cargo run -p conformance -- --replay FILE --host`
//! (or `--config 6.12-bpf`). The expectations are the model's.
//!
//! What a scenario cannot express is left out and listed in its
//! description: a flow the harness cannot send (only ssh, TLS with an ALPN
//! and unclassified text are), and Service values (the cluster's
//! Services would need the addresses the conformance harness gives them).

use crate::model::{self, Cluster, Decision, Event, Kind, Policy};
use crate::userspace::spec;
use std::fmt::Write as _;
use std::path::Path;

/// Where exec and open targets are staged on the node: the model decides
/// by exact path, so a case's paths are renamed into this directory (each
/// distinct path its own file, a directory path a directory).
const STAGE: &str = "/opt/krt-conformance/differential";

/// The staged name of a universe path: `/etc/shadow` ->
/// `/opt/krt-conformance/differential/etc_shadow`.
fn staged(path: &str) -> String {
    let name = path.trim_start_matches('/').replace('/', "_");
    format!("{STAGE}/{}", if name.is_empty() { "root" } else { &name })
}

fn rename_paths(p: &Policy) -> Policy {
    let mut p = p.clone();
    for b in &mut p.behaviors {
        if matches!(b.kind, Kind::Open | Kind::Exec) {
            for v in b.allow.iter_mut().chain(b.deny.iter_mut()) {
                if v != "*" {
                    *v = staged(v);
                }
            }
        }
    }
    p
}

fn flow(protocol: &str, alpn: Option<&str>) -> Option<serde_json::Value> {
    match (protocol, alpn) {
        ("ssh", None) => Some(serde_json::json!({"send": "ssh"})),
        ("tls", Some(a)) => Some(serde_json::json!({"send": "tls", "alpn": a})),
        ("unclassified", None) => Some(serde_json::json!({"send": "text"})),
        _ => None,
    }
}

/// The scenario `name` for `policies` and `events`, the model's outcomes
/// as its expectations; `None` when nothing of it can be expressed.
pub fn scenario(
    name: &str,
    why: &str,
    cluster: &Cluster,
    policies: &[Policy],
    events: &[Event],
) -> Option<serde_json::Value> {
    let mut left_out = Vec::new();
    if policies
        .iter()
        .flat_map(|p| &p.behaviors)
        .flat_map(|b| b.allow.iter().chain(&b.deny))
        .any(|v| v.ends_with(".svc") || v.ends_with(".svc.cluster.local"))
    {
        left_out.push("Service values (matched nothing here: no Service exists)".to_owned());
    }
    // The model without Services, as the scenario's cluster has none.
    let none = Cluster::default();
    let cluster = if left_out.is_empty() { cluster } else { &none };
    let renamed: Vec<Policy> = policies.iter().map(rename_paths).collect();
    let mut programs = Vec::new();
    let mut files = Vec::new();
    let mut steps = Vec::new();
    for e in events {
        let outcome = model::decide_in(cluster, policies, e);
        let action = match e {
            Event::Connect(addr) => {
                let to = std::net::SocketAddr::new(*addr, 8080).to_string();
                serde_json::json!({
                    "connect": {"pod": "web", "to": to, "transport": "udp"},
                    "expect": if outcome.refused { "dropped" } else { "delivered" },
                })
            }
            Event::Open(p) => {
                files.push(staged(p));
                serde_json::json!({
                    "open": {"pod": "web", "path": staged(p)},
                    "expect": if outcome.refused { "refused" } else { "allowed" },
                    "when": "capable",
                })
            }
            Event::Exec(p) => {
                programs.push(staged(p));
                serde_json::json!({
                    "exec": {"pod": "web", "path": staged(p)},
                    "expect": if outcome.refused { "refused" } else { "allowed" },
                    "when": "capable",
                })
            }
            Event::Protocol { protocol, alpn } => match flow(protocol, *alpn) {
                Some(mut send) => {
                    if let Some(o) = send.as_object_mut() {
                        o.insert("pod".into(), "web".into());
                        o.insert("to".into(), "127.0.41.1:2222".into());
                    }
                    serde_json::json!({
                        "connect": send,
                        "expect": if outcome.refused { "dropped" } else { "delivered" },
                    })
                }
                None => {
                    left_out.push(format!("the flow {}", e_target(e)));
                    continue;
                }
            },
            Event::Dns(_) => {
                left_out.push(format!("the question {}", e_target(e)));
                continue;
            }
        };
        steps.push(action);
        for f in &outcome.findings {
            let target = match e {
                Event::Open(p) | Event::Exec(p) => staged(p),
                other => e_target(other),
            };
            let mut properties = serde_json::Map::new();
            match f.decision.reported() {
                Decision::Denied => {
                    properties.insert("decision".into(), "denied".into());
                }
                Decision::DefaultDenied => {
                    properties.insert("decision".into(), "default-denied".into());
                }
                _ => {}
            }
            let mut check = serde_json::json!({
                "report": {
                    "pod": "web",
                    "policy": format!("{name}-{}", f.policy),
                    "behavior": f.kind.as_str(),
                    "target": target,
                    "enforced": f.enforced,
                    "minCount": 1,
                    "properties": properties,
                },
            });
            if matches!(f.kind, Kind::Open | Kind::Exec) {
                if let Some(o) = check.as_object_mut() {
                    o.insert("when".into(), "capable".into());
                }
            }
            steps.push(check);
        }
    }
    if steps.is_empty() {
        return None;
    }
    programs.sort();
    programs.dedup();
    files.sort();
    files.dedup();
    files.retain(|f| !programs.contains(f));
    let mut description = format!("Generated by the differential (issue 32): {why}");
    if !left_out.is_empty() {
        let _ = write!(description, " Left out: {}.", left_out.join("; "));
    }
    let policies: Vec<serde_json::Value> = renamed
        .iter()
        .map(|p| {
            let mut s = spec(p);
            if let Some(sel) = s.pointer_mut("/podSelector/matchLabels/app") {
                *sel = if p.selects { "web" } else { "nobody" }.into();
            }
            serde_json::json!({"name": format!("{name}-{}", p.name), "spec": s})
        })
        .collect();
    Some(serde_json::json!({
        "name": name,
        "description": description,
        "namespaces": [{"name": name}],
        "pods": [{"name": "web", "labels": {"app": "web"}}],
        "setup": {"programs": programs, "files": files},
        "policies": policies,
        "steps": steps,
    }))
}

fn e_target(e: &Event) -> String {
    match e {
        Event::Connect(a) => a.to_string(),
        Event::Open(p) | Event::Exec(p) => p.clone(),
        Event::Protocol { protocol, alpn } => match alpn {
            Some(a) => format!("{protocol}/{a}"),
            None => (*protocol).to_owned(),
        },
        Event::Dns(q) => q.clone(),
    }
}

/// Writes `scenario` as `dir/<name>.yaml`; returns the path.
pub fn write(dir: &Path, scenario: &serde_json::Value) -> Result<std::path::PathBuf, String> {
    let name = scenario
        .get("name")
        .and_then(|n| n.as_str())
        .ok_or("a scenario without a name")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.yaml"));
    let text = serde_yaml::to_string(scenario).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}
