//! Data sources (`resource.get`, `resource.list`, `http.get`) and the cost
//! model, through the public API the daemon and `policy check` use: which
//! calls compile and which are refused (with their field and argument),
//! what is bound where the calls stood, what a missing or failed fetch
//! does, and what an expression too expensive for its data gets: refused
//! when it compiles, or stopped by the run-time budget.

use kyverno_runtime_api::runtimepolicy::RuntimePolicySpec;
use kyverno_runtime_policy::cel::eval::RUNTIME_COST_BUDGET;
use kyverno_runtime_policy::compile::{CompiledPolicy, EvaluateError};
use kyverno_runtime_policy::sources::{
    http_value, object_value, DataFile, DataSet, DataSource, MAX_SOURCES,
};
use std::time::Instant;

fn spec(yaml: &str) -> RuntimePolicySpec {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("bad test spec: {e}"))
}

fn compile(yaml: &str) -> CompiledPolicy {
    CompiledPolicy::compile(&spec(yaml)).unwrap_or_else(|e| {
        panic!(
            "{}",
            e.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

fn refusals(yaml: &str) -> Vec<String> {
    match CompiledPolicy::compile(&spec(yaml)) {
        Ok(_) => panic!("expected the policy to be refused"),
        Err(errs) => errs.iter().map(ToString::to_string).collect(),
    }
}

fn configmap(name: &str) -> DataSource {
    DataSource::ResourceGet {
        api_version: "v1".into(),
        resource: "configmaps".into(),
        namespace: "policy-data".into(),
        name: name.into(),
    }
}

const FROM_CONFIGMAP: &str = r#"
evaluationInterval: 30s
behaviors:
  - network:
      deny:
        values: ["10.0.0.0/8"]
        expression: "resource.get('v1', 'configmaps', 'policy-data', 'deny').data.hosts.split(',')"
"#;

#[test]
fn a_resource_get_is_a_source_bound_where_the_call_stood() {
    let p = compile(FROM_CONFIGMAP);
    assert_eq!(p.sources(), [configmap("deny")]);
    assert_eq!(
        p.source_paths(0),
        ["spec.behaviors[0].network.deny.expression"]
    );
    let mut data = DataSet::new();
    data.insert(
        configmap("deny"),
        Ok(object_value(&serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "deny", "namespace": "policy-data", "generation": 3},
            "data": {"hosts": "a.example.com,b.example.com"}
        }))),
    );
    let r = p.evaluate_with(&data).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        r.behaviors[0].deny,
        ["10.0.0.0/8", "a.example.com", "b.example.com"]
    );
}

#[test]
fn without_data_the_expression_needs_live_data_and_says_so() {
    let p = compile(FROM_CONFIGMAP);
    let errs = p.evaluate().unwrap_err();
    assert!(errs.iter().all(EvaluateError::needs_data), "{errs:?}");
    assert_eq!(
        errs[0].to_string(),
        "spec.behaviors[0].network.deny.expression: needs live data: resource.get(\"v1\", \"configmaps\", \"policy-data\", \"deny\") (fetched by the daemon before each evaluation; `policy check --data FILE` supplies it offline)"
    );
}

#[test]
fn a_failed_fetch_is_an_evaluation_error_with_the_field_and_the_call() {
    let p = compile(FROM_CONFIGMAP);
    let mut data = DataSet::new();
    data.insert(configmap("deny"), Err("timed out after 10s".into()));
    let errs = p.evaluate_with(&data).unwrap_err();
    assert_eq!(
        errs[0].to_string(),
        "spec.behaviors[0].network.deny.expression: resource.get(\"v1\", \"configmaps\", \"policy-data\", \"deny\") failed: timed out after 10s"
    );
    // A missing object is null, as the Kyverno SDK has it: reading a field
    // of it is the expression's error.
    let mut data = DataSet::new();
    data.insert(configmap("deny"), Ok(cel::Value::Null));
    let errs = p.evaluate_with(&data).unwrap_err();
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec.behaviors[0].network.deny.expression: evaluation failed"),
        "{errs:?}"
    );
}

#[test]
fn arguments_may_be_computed_from_literals_and_data_free_variables() {
    let p = compile(
        r#"
variables:
  - {name: ns, expression: "['policy' + '-' + 'data']"}
  - {name: base, expression: "['https://lists.example']"}
behaviors:
  - network:
      deny: {expression: "resource.get('v1', 'configmaps', variables.ns[0], 'de' + 'ny').data.hosts.split(',')"}
      allow: {expression: "http.get(variables.base[0] + '/allow.json').body.cidrs.map(c, string(c))"}
"#,
    );
    // In the order first read: a behavior's allow before its deny.
    assert_eq!(
        p.sources(),
        [
            DataSource::HttpGet {
                url: "https://lists.example/allow.json".into()
            },
            configmap("deny"),
        ]
    );
    let mut data = DataSet::new();
    data.insert(
        configmap("deny"),
        Ok(object_value(
            &serde_json::json!({"data": {"hosts": "x.example"}}),
        )),
    );
    data.insert(
        DataSource::HttpGet {
            url: "https://lists.example/allow.json".into(),
        },
        Ok(http_value(
            200,
            br#"{"cidrs": ["10.1.0.0/16", "10.2.0.0/16"]}"#,
        )),
    );
    let r = p.evaluate_with(&data).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].allow, ["10.1.0.0/16", "10.2.0.0/16"]);
    assert_eq!(r.behaviors[0].deny, ["x.example"]);
}

#[test]
fn the_same_call_in_two_places_is_one_source_read_by_both() {
    let p = compile(
        r#"
variables:
  - {name: hosts, expression: "http.get('http://127.0.0.1:1/l').body.hosts.map(h, string(h))"}
behaviors:
  - dns: {allow: {expression: "variables.hosts"}}
  - network: {deny: {expression: "http.get('http://127.0.0.1:1/l').body.ips.map(h, string(h))"}}
"#,
    );
    assert_eq!(p.sources().len(), 1);
    assert_eq!(
        p.source_paths(0),
        [
            "spec.variables[0].expression",
            "spec.behaviors[1].network.deny.expression"
        ]
    );
    // The variable's failure is reported at the variable, which its user
    // inherits.
    let mut data = DataSet::new();
    data.insert(p.sources()[0].clone(), Err("connection refused".into()));
    let errs: Vec<String> = p
        .evaluate_with(&data)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errs,
        [
            "spec.variables[0].expression: http.get(\"http://127.0.0.1:1/l\") failed: connection refused",
            "spec.behaviors[1].network.deny.expression: http.get(\"http://127.0.0.1:1/l\") failed: connection refused"
        ]
    );
}

#[test]
fn http_get_returns_the_status_code_and_the_decoded_body() {
    let p = compile(
        r#"
behaviors:
  - exec:
      deny: {expression: "http.get('http://127.0.0.1:1/x').statusCode == 200 ? ['/ok'] : ['/status-' + string(http.get('http://127.0.0.1:1/x').statusCode)]"}
  - open:
      deny: {expression: "http.get('http://127.0.0.1:1/x').body == null ? ['/not-json'] : ['/json']"}
"#,
    );
    let mut data = DataSet::new();
    data.insert(
        p.sources()[0].clone(),
        Ok(http_value(503, b"<html>down</html>")),
    );
    let r = p.evaluate_with(&data).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].deny, ["/status-503"]);
    assert_eq!(r.behaviors[1].deny, ["/not-json"]);
}

#[test]
fn arguments_not_known_before_evaluation_are_refused_with_the_field() {
    let errs = refusals(
        r#"
variables:
  - {name: names, expression: "['a', 'b']"}
  - {name: fetched, expression: "[string(resource.get('v1', 'configmaps', 'd', 'ns').data.ns)]"}
behaviors:
  - open:
      deny: {expression: "variables.names.map(n, string(resource.get('v1', 'configmaps', 'd', n).data.path))"}
  - exec:
      deny: {expression: "resource.list('v1', 'configmaps', variables.fetched[0]).items.map(i, string(i.metadata.name))"}
  - network:
      deny: {expression: "http.get(http.get('http://127.0.0.1:1/u').body.next).body.map(x, string(x))"}
"#,
    );
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert_eq!(
        errs[0],
        "spec.behaviors[0].open.deny.expression: resource.get: argument 4 (`n`) is not known before evaluation: it uses the macro variable n; a data source's arguments must be known before the expression runs: literals, expressions over literals, or variables that read no data source"
    );
    assert!(
        errs[1].starts_with("spec.behaviors[1].exec.deny.expression: resource.list: argument 3 (`variables.fetched[0]`) is not known before evaluation: it reads variables.fetched, which reads a data source"),
        "{}",
        errs[1]
    );
    assert!(
        errs[2].starts_with("spec.behaviors[2].network.deny.expression: http.get: argument 1 (`http.get(\"http://127.0.0.1:1/u\").body.next`) is not known before evaluation: it reads another data source (http.get)"),
        "{}",
        errs[2]
    );
}

#[test]
fn unusable_sources_are_refused_naming_what_is_wrong() {
    let errs = refusals(
        r#"
behaviors:
  - open:
      deny: {expression: "resource.get('v1', 'ConfigMap', 'default', 'x').data.p.split(',')"}
  - exec:
      deny: {expression: "resource.get('apps/v1/x', 'deployments', 'default', 'x').data.p.split(',')"}
  - network:
      deny: {expression: "http.get('file:///etc/passwd').body.map(x, string(x))"}
  - dns:
      deny: {expression: "resource.get('v1', 'configmaps', 'default', 1 + 1).data.p.split(',')"}
"#,
    );
    assert_eq!(
        errs,
        [
            "spec.behaviors[0].open.deny.expression: resource.get: resource \"ConfigMap\" must be the lowercase plural name of the resource as in a URL path (for example \"configmaps\")",
            "spec.behaviors[1].exec.deny.expression: resource.get: apiVersion \"apps/v1/x\" is not \"version\" or \"group/version\" (for example \"v1\" or \"apps/v1\")",
            "spec.behaviors[2].network.deny.expression: http.get: url \"file:///etc/passwd\" is not an absolute http:// or https:// URL with a host",
        ]
        .into_iter()
        .chain(errs.get(3).map(String::as_str))
        .collect::<Vec<_>>()
    );
    // The last one is the checker's: an int where a string belongs.
    assert!(
        errs[3].contains("no overload of resource.get"),
        "{}",
        errs[3]
    );
}

#[test]
fn an_object_name_that_would_change_the_request_is_refused() {
    // Each would put a query, a fragment, an escape (`%2F`: a
    // subresource) or a path step into the GET the daemon sends.
    let names = [
        "x?watch=true",
        "x#frag",
        "x%2Fstatus",
        "x/status",
        "..",
        "a..b",
        "X",
        "x ",
        "-x",
    ];
    let behaviors: Vec<String> = names
        .iter()
        .map(|n| {
            format!(
                "  - open: {{deny: {{expression: \"resource.get('v1', 'configmaps', 'default', '{n}').data.p.split(',')\"}}}}"
            )
        })
        .collect();
    let errs = refusals(&format!("behaviors:\n{}\n", behaviors.join("\n")));
    assert_eq!(errs.len(), names.len(), "{errs:#?}");
    for (i, (e, n)) in errs.iter().zip(names).enumerate() {
        assert!(
            e.starts_with(&format!(
                "spec.behaviors[{i}].open.deny.expression: resource.get: name {n:?} is not an object name"
            )),
            "{e}"
        );
    }
    // Object names as Kubernetes has them, RBAC's colon included.
    compile(
        r#"
behaviors:
  - open: {deny: {expression: "resource.get('v1', 'configmaps', 'default', 'deny-list.v2').data.p.split(',')"}}
  - open: {deny: {expression: "resource.get('rbac.authorization.k8s.io/v1', 'clusterroles', '', 'system:node').rules.map(r, string(r))"}}
"#,
    );
}

#[test]
fn more_sources_than_the_limit_are_refused() {
    let many: Vec<String> = (0..=MAX_SOURCES)
        .map(|i| format!("- open: {{deny: {{expression: \"http.get('http://127.0.0.1:1/{i}').body.map(x, string(x))\"}}}}"))
        .collect();
    let errs = refusals(&format!("behaviors:\n{}\n", many.join("\n")));
    assert_eq!(
        errs,
        ["spec: the policy reads 17 distinct data sources; at most 16 are fetched per evaluation"]
    );
}

#[test]
fn a_data_file_supplies_offline_data() {
    let file: DataFile = serde_yaml::from_str(
        r#"
resources:
  - {apiVersion: v1, resource: configmaps, namespace: policy-data, name: deny, object: {data: {hosts: "f.example"}}}
  - {apiVersion: v1, resource: configmaps, namespace: policy-data, items: [{metadata: {name: one}}, {metadata: {name: two}}]}
http:
  - {url: "http://127.0.0.1:1/x", body: [1, 2]}
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let data = DataSet::from(&file);
    let p = compile(
        r#"
behaviors:
  - network: {deny: {expression: "resource.get('v1', 'configmaps', 'policy-data', 'deny').data.hosts.split(',')"}}
  - open: {deny: {expression: "resource.list('v1', 'configmaps', 'policy-data').items.map(i, '/' + i.metadata.name)"}}
  - exec: {deny: {expression: "http.get('http://127.0.0.1:1/x').body.map(x, '/' + string(int(x)))"}}
"#,
    );
    let r = p.evaluate_with(&data).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].deny, ["f.example"]);
    assert_eq!(r.behaviors[1].deny, ["/one", "/two"]);
    assert_eq!(r.behaviors[2].deny, ["/1", "/2"]);
}

// ---- cost -------------------------------------------------------------------------

#[test]
fn linear_expressions_over_fetched_data_compile() {
    // A transform per element, a split of each element, a filter, a
    // membership test against a constant list, a nested loop over each
    // element's own parts: all linear in the data's size.
    let p = compile(
        r#"
variables:
  - {name: items, expression: "resource.list('v1', 'configmaps', 'd').items.map(i, string(i.metadata.name))"}
behaviors:
  - network:
      deny: {expression: "http.get('http://127.0.0.1:1/l').body.ips.map(x, string(x))"}
      allow: {expression: "resource.list('v1', 'configmaps', 'd').items.map(i, string(i.data.hosts).split(',')).flatten()"}
  - exec:
      deny: {expression: "variables.items.filter(n, n in ['a', 'b', 'c']).map(n, '/bin/' + n)"}
  - open:
      deny: {expression: "resource.list('v1', 'configmaps', 'd').items.filter(i, i.metadata.labels.exists(k, k == 'deny')).map(i, '/' + string(i.metadata.name))"}
  - protocol:
      deny: {expression: "http.get('http://127.0.0.1:1/p').body.map(x, string(x)).distinct()"}
"#,
    );
    for (path, cost) in p.estimated_costs() {
        assert!(!cost.superlinear(), "{path}: {cost}");
        println!("{path}: {cost}");
    }
}

#[test]
fn an_expression_quadratic_in_fetched_data_is_refused_when_it_compiles() {
    let errs = refusals(
        r#"
variables:
  - {name: ips, expression: "http.get('http://127.0.0.1:1/ips').body.map(x, string(x))"}
behaviors:
  - network:
      deny: {expression: "variables.ips.filter(ip, variables.ips.exists(o, o != ip && o.startsWith(ip)))"}
  - exec:
      deny: {expression: "http.get('http://127.0.0.1:1/ips').body.map(x, string(x)).filter(p, p in variables.ips)"}
"#,
    );
    assert_eq!(errs.len(), 2, "{errs:#?}");
    for (e, field) in errs.iter().zip([
        "spec.behaviors[0].network.deny.expression",
        "spec.behaviors[1].exec.deny.expression",
    ]) {
        assert!(
            e.starts_with(&format!("{field}: its estimated cost ("))
                && e.contains("n²")
                && e.contains("grows faster than the data"),
            "{e}"
        );
    }
    println!("{}", errs[0]);
}

#[test]
fn an_expression_too_expensive_without_any_data_is_refused() {
    let errs = refusals(
        r#"
behaviors:
  - open:
      deny: {expression: "lists.range(4096).map(i, lists.range(4096).map(j, i * j)).map(l, string(l.size()))"}
"#,
    );
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("spec.behaviors[0].open.deny.expression: its estimated cost (")
            && errs[0].contains("exceeds the limit of 10000000 even without any fetched data"),
        "{}",
        errs[0]
    );
}

#[test]
fn a_linear_expression_over_too_much_data_is_stopped_by_the_budget() {
    // Linear, so it compiles; over 300,000 fetched elements it spends more
    // than the budget and is stopped, with the field, in bounded time.
    let p = compile(
        r#"
behaviors:
  - network:
      deny: {expression: "http.get('http://127.0.0.1:1/big').body.map(x, [x, x + 1.0, x + 2.0, x + 3.0].map(y, y * 2.0).size()).map(s, string(s))"}
"#,
    );
    let body: Vec<f64> = (0..300_000).map(f64::from).collect();
    let mut data = DataSet::new();
    data.insert(
        p.sources()[0].clone(),
        Ok(http_value(
            200,
            &serde_json::to_vec(&body).unwrap_or_else(|e| panic!("{e}")),
        )),
    );
    let start = Instant::now();
    let errs = p.evaluate_with(&data).unwrap_err();
    let took = start.elapsed();
    println!("stopped after {took:?}: {}", errs[0]);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        format!("spec.behaviors[0].network.deny.expression: evaluation stopped: it spent its cost budget of {RUNTIME_COST_BUDGET} units (see the cost model in the policy reference)")
    );
    // The same expression over a tenth of the data fits.
    let mut small = DataSet::new();
    small.insert(
        p.sources()[0].clone(),
        Ok(http_value(
            200,
            &serde_json::to_vec(&body[..30_000]).unwrap_or_else(|e| panic!("{e}")),
        )),
    );
    let (r, cost) = p.evaluate_costed(&small);
    let r = r.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].deny, ["4"]);
    assert!(cost > 1_000_000 && cost < RUNTIME_COST_BUDGET, "{cost}");
}

#[test]
fn a_quadratic_library_call_on_large_data_is_stopped_before_it_runs() {
    // distinct() runs in linear time on strings, ints and bools; on doubles
    // kube-cel compares every pair, so the call is charged the square of
    // the length before it runs: 10,000 elements (10^8 units) are stopped
    // at once rather than run.
    let p = compile(
        r#"
behaviors:
  - network:
      deny: {expression: "http.get('http://127.0.0.1:1/d').body.map(x, x * 1.0).distinct().map(x, string(x))"}
"#,
    );
    let body: Vec<f64> = (0..10_000).map(f64::from).collect();
    let mut data = DataSet::new();
    data.insert(
        p.sources()[0].clone(),
        Ok(http_value(
            200,
            &serde_json::to_vec(&body).unwrap_or_else(|e| panic!("{e}")),
        )),
    );
    let start = Instant::now();
    let errs = p.evaluate_with(&data).unwrap_err();
    println!("stopped after {:?}: {}", start.elapsed(), errs[0]);
    assert!(
        errs[0]
            .to_string()
            .contains("evaluation stopped: it spent its cost budget"),
        "{errs:?}"
    );
    // On strings it is linear and runs.
    let p = compile(
        r#"
behaviors:
  - network:
      deny: {expression: "http.get('http://127.0.0.1:1/d').body.map(x, string(int(x) % 100)).distinct()"}
"#,
    );
    let mut data = DataSet::new();
    data.insert(
        p.sources()[0].clone(),
        Ok(http_value(
            200,
            &serde_json::to_vec(&body).unwrap_or_else(|e| panic!("{e}")),
        )),
    );
    let r = p.evaluate_with(&data).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].deny.len(), 100);
}
