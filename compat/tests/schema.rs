//! Pins the `probe --json` schema: every JSON path and its type, against
//! `golden/probe-json-paths.txt`, and every path documented in
//! `docs/probe-json.md`. A rename or removal fails here; an addition fails
//! until the golden file and the document are updated on purpose
//! (`KRT_BLESS=1 cargo test -p kyverno-runtime-compat --test schema`
//! rewrites the golden file; the document is edited by hand).

// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use kyverno_runtime_compat::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A report in which every optional field is present, so every path shows.
fn full_report() -> ProbeReport {
    let failure = ProbeFailure {
        stage: "load".into(),
        errno: Some(1),
        errno_name: Some("EPERM".into()),
        message: "load refused: EPERM (Operation not permitted)".into(),
        verifier_log: Some("libbpf: prog 'probe': failed to load: -1".into()),
    };
    let outcome = Outcome {
        loads: false,
        attaches: false,
        runs: Some(false),
        failure: Some(failure),
    };
    let measurements = Measurements {
        bpf_objects_built: true,
        kernel: KernelFacts {
            release: "6.1.0-37-cloud-amd64".into(),
            btf: true,
            lsm: LsmFacts {
                active: Some(vec!["lockdown".into(), "bpf".into()]),
                bpf_active: true,
                mounted_securityfs: true,
                error: Some("example".into()),
            },
            lockdown: Some("none".into()),
            cgroup: CgroupFacts {
                layout: CgroupLayout::Unified,
                v2_mount: Some("/sys/fs/cgroup".into()),
            },
            bpffs: BpffsFacts {
                mounted: true,
                path: Some("/sys/fs/bpf".into()),
            },
        },
        programs: ProgramId::ALL
            .into_iter()
            .map(|id| (id, outcome.clone()))
            .collect(),
        maps: MapId::ALL
            .into_iter()
            .map(|id| (id, outcome.clone()))
            .collect(),
    };
    ProbeReport::new(measurements, &Overrides::default())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn collect(prefix: &str, v: &Value, out: &mut BTreeMap<String, &'static str>) {
    out.insert(prefix.to_string(), kind(v));
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                collect(&format!("{prefix}.{k}"), child, out);
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                collect(&format!("{prefix}[]"), first, out);
            }
        }
        _ => {}
    }
}

fn paths() -> BTreeMap<String, &'static str> {
    let value = serde_json::to_value(full_report()).unwrap();
    let mut out = BTreeMap::new();
    collect("$", &value, &mut out);
    out
}

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn json_paths_match_the_golden_file() {
    let rendered: String = paths().iter().map(|(p, k)| format!("{p}: {k}\n")).collect();
    let golden = repo("tests/golden/probe-json-paths.txt");
    if std::env::var_os("KRT_BLESS").is_some() {
        std::fs::write(&golden, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&golden).unwrap();
    assert_eq!(
        rendered, expected,
        "the probe --json schema changed; bump SCHEMA_VERSION if it is incompatible, then bless"
    );
}

#[test]
fn schema_version_is_one() {
    assert_eq!(SCHEMA_VERSION, 1);
    assert_eq!(
        serde_json::to_value(full_report()).unwrap()["schemaVersion"],
        1
    );
}

/// The keys of `programs`, `maps` and `plan` are ids listed in their own
/// tables of the document; their fields are documented once, generically.
fn generic_path(path: &str) -> String {
    let mut segments: Vec<String> = path.split('.').map(str::to_string).collect();
    for (container, placeholder) in [
        ("programs", "<program>"),
        ("maps", "<map>"),
        ("plan", "<behavior>"),
    ] {
        if segments.first().map(String::as_str) == Some(container) && segments.len() > 1 {
            segments[1] = placeholder.to_string();
        }
    }
    segments.join(".")
}

#[test]
fn every_id_is_documented() {
    let doc = std::fs::read_to_string(repo("../docs/probe-json.md")).unwrap();
    let value = serde_json::to_value(full_report()).unwrap();
    for container in ["programs", "maps", "plan"] {
        for id in value[container].as_object().unwrap().keys() {
            assert!(
                doc.contains(&format!("`{id}`")),
                "docs/probe-json.md does not list {container} id {id}"
            );
        }
    }
    for backend in [
        "bpf_lsm",
        "fmod_ret",
        "cgroup_skb_egress",
        "cgroup_skb_classifier",
        "cgroup_skb_dns",
        "raw_tp_exec",
        "none",
    ] {
        assert!(
            doc.contains(&format!("`{backend}`")),
            "backend {backend} undocumented"
        );
    }
}

#[test]
fn every_path_is_documented() {
    let doc = std::fs::read_to_string(repo("../docs/probe-json.md")).unwrap();
    let mut missing: Vec<String> = paths()
        .keys()
        .filter(|p| *p != "$")
        .map(|p| generic_path(p.trim_start_matches("$.")))
        .filter(|p| !doc.contains(&format!("`{p}`")))
        .collect();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/probe-json.md does not document: {missing:#?}"
    );
}

#[test]
fn a_report_round_trips_and_recorded_reports_still_parse() {
    let report = full_report();
    let text = serde_json::to_string(&report).unwrap();
    let back: ProbeReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back, report);
}
