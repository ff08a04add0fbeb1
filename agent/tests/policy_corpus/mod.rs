//! The corpus of the `policy check` differential test: every RuntimePolicy
//! manifest in the repository, and seeded mutations of them aimed at what
//! admission checks (typos in field names, wrong types, bounds, enum
//! values, rule violations, durations, variable names, duplicates, values
//! of every kind good and bad, metadata, the autogen annotation).

use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

/// One policy of the corpus.
pub struct Item {
    /// Where it comes from (a file, or `mutant-<n>: <what was done>`).
    pub origin: String,
    /// The object.
    pub object: Json,
}

/// splitmix64: a small deterministic generator (the corpus must be the
/// same on every run).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn yaml_documents(path: &Path) -> Vec<Json> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .filter_map(|v: serde_yaml::Value| serde_json::to_value(v).ok())
        .filter(|v: &Json| !v.is_null())
        .collect()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// A policy around a spec, as the conformance scenarios and the chart
/// check write them.
pub fn wrap(name: &str, spec: Json, annotations: Option<Json>) -> Json {
    let mut meta = json!({"name": name});
    if let Some(a) = annotations {
        meta["annotations"] = a;
    }
    json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1",
        "kind": "RuntimePolicy",
        "metadata": meta,
        "spec": spec,
    })
}

/// Every RuntimePolicy the repository holds: the API tier's admission
/// manifests, the examples, the policy-test example, the conformance
/// scenarios' policies and the chart check's annotation cases.
pub fn repository(root: &Path) -> Vec<Item> {
    let mut items = Vec::new();
    let mut files = yaml_files(&root.join("agent/api/tests/admission"));
    files.extend(yaml_files(&root.join("examples")));
    files.push(root.join("examples/policy-test/policies.yaml"));
    for file in files {
        for (i, object) in yaml_documents(&file).into_iter().enumerate() {
            items.push(Item {
                origin: format!(
                    "{}#{}",
                    file.strip_prefix(root).unwrap_or(&file).display(),
                    i + 1
                ),
                object,
            });
        }
    }
    for file in yaml_files(&root.join("conformance/scenarios")) {
        for scenario in yaml_documents(&file) {
            for p in scenario["policies"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap_or("unnamed");
                items.push(Item {
                    origin: format!(
                        "{}: {name}",
                        file.strip_prefix(root).unwrap_or(&file).display()
                    ),
                    object: wrap(name, p["spec"].clone(), None),
                });
            }
        }
    }
    // ci/chart-check's annotation values, refused and admitted.
    for (i, value) in [
        "Deployment,ReplicaSet",
        "deployment",
        "",
        "Pod",
        "all",
        "none",
        "StatefulSet",
        "Deployment, StatefulSet,DaemonSet,Job,CronJob",
    ]
    .iter()
    .enumerate()
    {
        items.push(Item {
            origin: format!("ci/chart-check autogen-controllers {value:?}"),
            object: wrap(
                &format!("chart-check-{i}"),
                json!({"mode": "monitor"}),
                Some(json!({"pod-policies.kyverno.io/autogen-controllers": value})),
            ),
        });
    }
    items
}

const NETWORK: &[&str] = &[
    "10.0.0.1",
    "10.0.0.300",
    "::1",
    "fd00::/64",
    "fd00::/129",
    "10.0.0.0/8",
    "10.0.0.0/33",
    "10.0.0.1/8",
    "example.com",
    "-bad.example.com",
    "a_b.example.com",
    "api.prod.svc",
    "*.example.com",
    "0x7f.0.0.1",
    "1.2.3",
    "example.com.",
    "EXAMPLE.com",
    "",
    " 10.0.0.1",
];
const PATHS: &[&str] = &[
    "/bin/sh",
    "bin/sh",
    "/a/../b",
    "/a//b",
    "/a/",
    "/",
    "/a*",
    "/usr/bin/nc",
    "/a/./b",
    "/a/..",
    "/proc/self/exe",
    "/tmp/x y",
    "",
];
const PROTOCOLS: &[&str] = &[
    "ssh",
    "tls",
    "tls/h2",
    "tls/abcdefghijklmnopq",
    "tls/",
    "http/1.1",
    "http/2",
    "http/3",
    "quic",
    "dns",
    "SSH",
    "tls/a b",
];
const DNS: &[&str] = &[
    "example.com",
    "*.example.com",
    "a.*.com",
    "*example.com",
    "10.0.0.1",
    "::1",
    "_srv.example.com",
    "*",
    "x.",
    "",
    "-a.com",
];
const DURATIONS: &[&str] = &[
    "-5s",
    "0s",
    "banana",
    "1ns",
    "1s",
    "999ms",
    "1.5s",
    "5m",
    "1h30m",
    "1µs",
    "1e3s",
    "",
    " 5s",
    "0.5s",
    "1000ms",
    "10us",
    "1000000000ns",
    "2h",
    "1.s",
    ".5s",
    "5",
    "1d",
];
const VARIABLE_NAMES: &[&str] = &[
    "a-b",
    "1a",
    "_ok",
    "a b",
    "",
    "valid_name",
    "x.y",
    "é",
    "shells",
];
const TYPOS: &[(&str, &str)] = &[
    ("podSelector", "podSelecter"),
    ("behaviors", "behaviours"),
    ("namespaceSelector", "namespaceselector"),
    ("evaluationInterval", "evaluationinterval"),
    ("values", "value"),
    ("expression", "expresion"),
    ("matchLabels", "matchlabels"),
    ("deny", "denny"),
    ("allow", "alow"),
    ("network", "netwrok"),
    ("exec", "exe"),
    ("mode", "Mode"),
    ("variables", "vars"),
    ("monitorFilter", "monitorfilter"),
    ("name", "nme"),
];
const KINDS: &[&str] = &["network", "exec", "open", "protocol", "dns"];

fn values_for(kind: &str) -> &'static [&'static str] {
    match kind {
        "network" => NETWORK,
        "protocol" => PROTOCOLS,
        "dns" => DNS,
        _ => PATHS,
    }
}

fn wrong_type(rng: &mut Rng) -> Json {
    match rng.below(7) {
        0 => json!(3),
        1 => json!(true),
        2 => json!(["x"]),
        3 => json!({"x": 1}),
        4 => Json::Null,
        5 => json!(1.5),
        _ => json!({}),
    }
}

/// Paths (as key lists) of every value in `v`, for picking one at random.
fn all_paths(v: &Json, at: &mut Vec<Json>, out: &mut Vec<Vec<Json>>) {
    out.push(at.clone());
    match v {
        Json::Object(m) => {
            for (k, v) in m {
                at.push(json!(k));
                all_paths(v, at, out);
                at.pop();
            }
        }
        Json::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                at.push(json!(i));
                all_paths(v, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Json, path: &[Json]) -> Option<&'a mut Json> {
    let mut cur = v;
    for k in path {
        cur = match k {
            Json::String(k) => cur.get_mut(k.as_str())?,
            Json::Number(i) => cur.get_mut(i.as_u64()? as usize)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn spec(p: &mut Json) -> &mut serde_json::Map<String, Json> {
    if !p["spec"].is_object() {
        p["spec"] = json!({});
    }
    p["spec"].as_object_mut().unwrap_or_else(|| unreachable!())
}

fn behaviors(p: &mut Json) -> &mut Vec<Json> {
    let s = spec(p);
    if !s.get("behaviors").is_some_and(Json::is_array) {
        s.insert("behaviors".into(), json!([]));
    }
    s.get_mut("behaviors")
        .and_then(Json::as_array_mut)
        .unwrap_or_else(|| unreachable!())
}

fn values(rng: &mut Rng, kind: &str, n: usize) -> Vec<Json> {
    (0..n).map(|_| json!(rng.pick(values_for(kind)))).collect()
}

/// One mutation, described.
fn mutate(p: &mut Json, rng: &mut Rng) -> String {
    match rng.below(24) {
        0 => {
            // A typo in a field name, wherever it occurs.
            let (from, to) = *rng.pick(TYPOS);
            let mut paths = Vec::new();
            all_paths(p, &mut Vec::new(), &mut paths);
            for path in paths.iter().rev() {
                if let Some(Json::Object(m)) = at_mut(p, path) {
                    if let Some(v) = m.remove(from) {
                        m.insert(to.into(), v);
                        return format!("typo {from} -> {to}");
                    }
                }
            }
            spec(p).insert(to.into(), json!({}));
            format!("unknown field {to}")
        }
        1 | 2 => {
            // A value of the wrong type anywhere.
            let mut paths = Vec::new();
            all_paths(p, &mut Vec::new(), &mut paths);
            let path = rng.pick(&paths[1..]).clone();
            let v = wrong_type(rng);
            if let Some(slot) = at_mut(p, &path) {
                *slot = v.clone();
            }
            format!("{path:?} = {v}")
        }
        3 => {
            let m = *rng.pick(&["monitor", "enforce", "Enforce", "audit", "", "MONITOR"]);
            spec(p).insert("mode".into(), json!(m));
            format!("mode {m:?}")
        }
        4 | 5 => {
            let d = *rng.pick(DURATIONS);
            spec(p).insert("evaluationInterval".into(), json!(d));
            format!("evaluationInterval {d:?}")
        }
        6 => {
            let n = *rng.pick(VARIABLE_NAMES);
            let long = "v".repeat(64);
            let name = if rng.chance(10) { long.as_str() } else { n };
            spec(p).insert(
                "variables".into(),
                json!([{"name": name, "expression": "['/bin/sh']"}]),
            );
            format!("variable name {name:?}")
        }
        7 => {
            // Two kinds in one behavior, or none.
            let b = behaviors(p);
            if b.is_empty() || rng.chance(30) {
                b.push(json!({}));
                "an empty behavior".into()
            } else {
                let i = rng.below(b.len());
                let k = *rng.pick(KINDS);
                b[i][k] = json!({"deny": {"values": []}});
                format!("behavior {i} also {k}")
            }
        }
        8 => {
            let s = spec(p);
            s.insert("mode".into(), json!("enforce"));
            s.remove("podSelector");
            s.remove("namespaceSelector");
            "enforce with no selector".into()
        }
        9 | 10 => {
            // A list of n values of one kind.
            let kind = *rng.pick(KINDS);
            let n = *rng.pick(&[0usize, 1, 2, 63, 64, 65, 100]);
            let side = *rng.pick(&["allow", "deny"]);
            let vs = values(rng, kind, n);
            behaviors(p).push(json!({kind: {side: {"values": vs}}}));
            format!("{n} {kind} {side} values")
        }
        11 | 12 => {
            // A few values of one kind, good and bad.
            let kind = *rng.pick(KINDS);
            let side = *rng.pick(&["allow", "deny"]);
            let n = 1 + rng.below(3);
            let vs = values(rng, kind, n);
            behaviors(p).push(json!({kind: {side: {"values": vs}}}));
            format!("{kind} {side} {vs:?}")
        }
        13 => {
            let kind = *rng.pick(KINDS);
            let v = if rng.chance(50) {
                json!({"allow": {"values": ["*"]}})
            } else {
                json!({"deny": {"values": ["*", values_for(kind)[0]]}})
            };
            behaviors(p).push(json!({kind: v}));
            format!("{kind} with a misplaced *")
        }
        14 => {
            spec(p).insert(
                "variables".into(),
                json!([{"name": "a", "expression": "['x']"}, {"name": "a", "expression": "['y']"}]),
            );
            "duplicate variable".into()
        }
        15 => {
            let n = *rng.pick(&[0usize, 1, 64, 65]);
            let exprs: Vec<Json> = (0..n)
                .map(|i| json!({"name": format!("f{i}"), "expression": "true"}))
                .collect();
            spec(p).insert("monitorFilter".into(), json!({"expressions": exprs}));
            format!("monitorFilter with {n} expressions")
        }
        16 => {
            let what = rng.below(4);
            let v = match what {
                0 => json!({"expressions": [{"name": "f"}]}),
                1 => json!({"expressions": [{"expression": "true"}]}),
                2 => json!({"expressions": [{"name": "n".repeat(64), "expression": "true"}]}),
                _ => json!({"expressions": [{"name": "f", "expression": ""}]}),
            };
            spec(p).insert("monitorFilter".into(), v.clone());
            format!("monitorFilter {v}")
        }
        17 => {
            let len = *rng.pick(&[0usize, 10_240, 10_241]);
            let e = format!("[{}]", "'/'".repeat(len / 3))
                .chars()
                .take(len.max(2))
                .collect::<String>();
            let e = if len == 0 {
                String::new()
            } else {
                format!("{e:<len$}")
            };
            behaviors(p).push(json!({"exec": {"deny": {"expression": e}}}));
            format!("expression of {len} characters")
        }
        18 => {
            let m = metadata(p);
            let what = rng.below(6);
            match what {
                0 => {
                    m["name"] = json!(*rng.pick(&[
                        "Bad_Name",
                        "a".repeat(254).as_str(),
                        "ok-name",
                        "-x",
                        "a.b"
                    ]))
                }
                1 => {
                    m["labels"] = json!({*rng.pick(&["a b", "app", "x/y/z", "k8s.io/app"]): *rng.pick(&["web", "a b", ""])})
                }
                2 => m["foo"] = json!(1),
                3 => m["labels"] = json!({"app": 1}),
                4 => {
                    if let Some(o) = m.as_object_mut() {
                        o.remove("name");
                    }
                }
                _ => m["annotations"] = json!({"a b/c": "x"}),
            }
            format!("metadata mutation {what}")
        }
        19 => {
            let v = *rng.pick(&[
                "Deployment",
                "ReplicaSet",
                "all",
                "none",
                "Job, CronJob",
                "Pod",
                "",
                "deployment,StatefulSet",
            ]);
            metadata(p)["annotations"] = json!({"pod-policies.kyverno.io/autogen-controllers": v});
            format!("autogen-controllers {v:?}")
        }
        20 => {
            if rng.chance(50) {
                p["kind"] = json!(*rng.pick(&["RuntimePolicyy", "runtimepolicy", "Policy"]));
                "wrong kind".into()
            } else {
                p["apiVersion"] = json!(*rng.pick(&[
                    "runtime.nirmata.io/v1",
                    "v1",
                    "runtime.nirmata.io/v1beta1"
                ]));
                "wrong apiVersion".into()
            }
        }
        21 => {
            let s = spec(p);
            let v = rng
                .pick(&[
                    json!({"matchLabels": {"app": 1}}),
                    json!({"matchExpressions": [{"key": "a"}]}),
                    json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}),
                    json!({}),
                    Json::Null,
                ])
                .clone();
            let k = *rng.pick(&["podSelector", "namespaceSelector"]);
            s.insert(k.into(), v.clone());
            format!("{k} {v}")
        }
        22 => {
            // A null at a random place.
            let mut paths = Vec::new();
            all_paths(p, &mut Vec::new(), &mut paths);
            let path = rng.pick(&paths[1..]).clone();
            if let Some(slot) = at_mut(p, &path) {
                *slot = Json::Null;
            }
            format!("{path:?} = null")
        }
        _ => {
            // A dns behavior under enforce, or monitorFilter under enforce.
            let s = spec(p);
            s.insert("mode".into(), json!("enforce"));
            s.insert("podSelector".into(), json!({}));
            if rng.chance(50) {
                behaviors(p).push(json!({"dns": {"deny": {"values": ["example.com"]}}}));
                "dns under enforce".into()
            } else {
                spec(p).insert(
                    "monitorFilter".into(),
                    json!({"expressions": [{"name": "f", "expression": "true"}]}),
                );
                "monitorFilter under enforce".into()
            }
        }
    }
}

/// The policy's metadata, made an object again if an earlier mutation
/// replaced it with another type (indexing a non-object would panic).
fn metadata(p: &mut Json) -> &mut Json {
    if !p["metadata"].is_object() {
        p["metadata"] = json!({});
    }
    &mut p["metadata"]
}

/// `n` mutants of `bases`, from `seed`.
pub fn mutants(bases: &[Item], n: usize, seed: u64) -> Vec<Item> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let base = rng.pick(bases);
            let mut object = base.object.clone();
            object["metadata"]["name"] = json!(format!("mutant-{i}"));
            let steps = 1 + rng.below(3);
            let done: Vec<String> = (0..steps).map(|_| mutate(&mut object, &mut rng)).collect();
            Item {
                origin: format!("mutant-{i} of {}: {}", base.origin, done.join("; ")),
                object,
            }
        })
        .collect()
}
