use super::*;
use crate::cel::eval::policy_context;
use crate::cel::Overload;
use crate::cel::Type;
use ::cel::extractors::This;
use std::sync::atomic::{AtomicUsize, Ordering};

fn spec(yaml: &str) -> RuntimePolicySpec {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("bad test spec: {e}"))
}

fn compile_errors(yaml: &str) -> Vec<String> {
    match CompiledPolicy::compile(&spec(yaml)) {
        Ok(_) => panic!("expected a compile error"),
        Err(errs) => errs.iter().map(ToString::to_string).collect(),
    }
}

fn evaluate(yaml: &str) -> Result<EvaluationResult, Vec<EvaluateError>> {
    let compiled = CompiledPolicy::compile(&spec(yaml)).unwrap_or_else(|e| panic!("{e:?}"));
    compiled.evaluate()
}

#[test]
fn literals_are_unioned_with_the_expression_and_variables() {
    let r = evaluate(
        r#"
variables:
  - {name: base, expression: "['10.0.0.0/8', '192.168.0.0/16']"}
  - {name: more, expression: "variables.base + ['172.16.0.0/12']"}
behaviors:
  - network:
      deny:
        values: ["10.0.0.0/8", "1.1.1.1"]
        expression: "variables.more"
"#,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let b = &r.behaviors[0];
    assert_eq!(b.kind, BehaviorKind::Network);
    assert_eq!(
        b.deny,
        ["10.0.0.0/8", "1.1.1.1", "192.168.0.0/16", "172.16.0.0/12"]
    );
    assert!(b.allow.is_empty());
    assert!(!b.default_deny);
}

#[test]
fn a_lone_star_in_deny_is_the_default_deny_sentinel() {
    let r = evaluate(
        r#"
behaviors:
  - exec:
      allow: {values: ["/bin/sh"]}
      deny: {expression: "['*']"}
"#,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(r.behaviors[0].default_deny);
    assert!(r.behaviors[0].deny.is_empty());
    assert_eq!(r.behaviors[0].allow, ["/bin/sh"]);
}

#[test]
fn a_star_from_an_expression_beside_literal_denies_keeps_them() {
    let r = evaluate(
        r#"
behaviors:
  - exec:
      deny: {values: ["/bin/sh"], expression: "['*']"}
"#,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(r.behaviors[0].default_deny);
    assert_eq!(r.behaviors[0].deny, ["/bin/sh"]);
}

#[test]
fn a_star_from_an_expression_in_allow_is_refused_with_its_path() {
    let errs = evaluate(
        r#"
behaviors:
  - exec:
      allow: {values: ["/bin/sh"], expression: "['*']"}
"#,
    )
    .unwrap_err();
    assert!(
        errs[0]
            .to_string()
            .contains("spec.behaviors[0].exec.allow.values[1]"),
        "{errs:?}"
    );
}

/// A misplaced "*" does not hide the list's other bad values: every "*"
/// out of place and every value the parser refuses is reported, in both
/// lists of the behavior (it is not programmed, so nothing else would).
#[test]
fn a_star_error_does_not_hide_the_other_bad_values() {
    let errs = evaluate(
        r#"
behaviors:
  - exec:
      allow: {values: ["/usr/bin/ok", "bin/rel"], expression: "['*']"}
      deny: {values: ["curl", "/etc/"], expression: "['*', '/bin/sh', '*x']"}
  - network:
      deny: {values: ["10.0.0.1"]}
"#,
    )
    .unwrap_err();
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    let want = [
        "spec.behaviors[0].exec.allow.values[2]: \"*\" is only meaningful in deny",
        "spec.behaviors[0].exec.allow.values[1]: \"bin/rel\" is not an absolute path",
        "spec.behaviors[0].exec.deny.values[0]: \"curl\" is not an absolute path",
        "spec.behaviors[0].exec.deny.values[1]: \"/etc/\" ends with /",
        "spec.behaviors[0].exec.deny.values[4]: \"*x\" contains *",
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g.starts_with(w), "{g} does not start with {w}");
    }
}

/// `"*"` beside explicit denies (literal or from an expression) makes the
/// behavior default deny and keeps every explicit deny; a second `"*"` is
/// folded. Only dns keeps `"*"` alone.
#[test]
fn a_star_beside_explicit_denies_keeps_them() {
    let result = evaluate(
        r#"
behaviors:
  - network:
      allow: {values: ["10.50.0.0/16"]}
      deny: {values: ["*", "10.50.0.9"], expression: "['*', 'fd00::9']"}
  - exec:
      deny: {values: ["/usr/bin/curl", "*"]}
"#,
    )
    .unwrap();
    let net = &result.behaviors[0];
    assert!(net.default_deny);
    assert_eq!(net.deny, ["10.50.0.9", "fd00::9"]);
    assert_eq!(net.allow, ["10.50.0.0/16"]);
    let exec = &result.behaviors[1];
    assert!(exec.default_deny);
    assert_eq!(exec.deny, ["/usr/bin/curl"]);
    let errs = evaluate(
        r#"
behaviors:
  - dns:
      deny: {values: ["*", "evil.example"]}
"#,
    )
    .unwrap_err();
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        ["spec.behaviors[0].dns.deny.values[0]: \"*\" in a dns deny list must be the only value: alone it reports every name"]
    );
}

#[test]
fn a_dyn_result_without_coercion_is_refused_with_the_field_path() {
    let errs = compile_errors(
        r#"
behaviors:
  - open: {}
  - network:
      deny: {expression: "json.unmarshal('[\"a\"]')"}
"#,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("spec.behaviors[1].network.deny.expression: "),
        "{errs:?}"
    );
    assert!(
        errs[0].contains("expression has type dyn; a behavior expression must be list(string): coerce with .map(x, string(x))"),
        "{errs:?}"
    );
}

#[test]
fn a_coerced_dyn_result_compiles_and_evaluates() {
    let r = evaluate(
        r#"
behaviors:
  - network:
      deny: {expression: "json.unmarshal('{\"hosts\": [\"a.com\", \"b.com\"]}').hosts.map(h, string(h))"}
"#,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].deny, ["a.com", "b.com"]);
}

/// A variable takes its expression's type (as the Go original's compiler
/// registers it, issue 30); the behavior that uses it must still be
/// `list(string)`, and is refused at its own field when it is not.
#[test]
fn a_variable_has_its_expressions_type_and_the_behavior_must_be_a_list() {
    let errs = compile_errors(
        r#"
variables:
  - {name: ok, expression: "['a']"}
  - {name: one, expression: "'a'"}
behaviors:
  - network: {deny: {expression: "variables.ok"}}
  - network: {deny: {expression: "variables.one"}}
"#,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with(
            "spec.behaviors[1].network.deny.expression: expression has type string; a behavior expression must be list(string)"
        ) && errs[0].contains("wrap a single value in a list"),
        "{errs:?}"
    );
}

/// The Go original's documented example `blocklist-from-json` (its
/// examples/dynamic-lists, verbatim): a variable holding a fetched JSON
/// document (dyn), converted where the behavior reads it. It compiles and
/// evaluates over the ConfigMap its README creates.
#[test]
fn the_go_originals_json_blocklist_example_compiles_and_evaluates() {
    let compiled = CompiledPolicy::compile(&spec(
        r#"
mode: monitor
evaluationInterval: 30s
podSelector:
  matchLabels:
    app: json-client
variables:
- name: blocklist
  expression: json.unmarshal(resource.get("v1", "configmaps", "default", "ip-blocklist-json").data["ips"])
behaviors:
- network:
    deny:
      expression: variables.blocklist["ips"].map(x, string(x))
"#,
    ))
    .unwrap_or_else(|e| panic!("{e:?}"));
    let file: crate::sources::DataFile = serde_yaml::from_str(
        r#"
resources:
- apiVersion: v1
  resource: configmaps
  namespace: default
  name: ip-blocklist-json
  object:
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: ip-blocklist-json, namespace: default}
    data:
      ips: '{"ips": ["10.244.0.8", "10.96.0.0/12"]}'
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let r = compiled
        .evaluate_with(&crate::sources::DataSet::from(&file))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.behaviors[0].deny, ["10.244.0.8", "10.96.0.0/12"]);
}

#[test]
fn monitor_filter_expressions_must_be_bool_and_name_known_event_fields() {
    let errs = compile_errors(
        r#"
monitorFilter:
  expressions:
    - {name: kind, expression: "event.kind"}
    - {name: typo, expression: "event.exec.filenme == '/bin/sh'"}
"#,
    );
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].starts_with("spec.monitorFilter.expressions[0].expression: kind: expression has type string; a monitorFilter expression must be bool"), "{errs:?}");
    assert!(
        errs[1].contains("event.exec has no field filenme; valid fields: argv, filename"),
        "{errs:?}"
    );
}

#[test]
fn a_bool_monitor_filter_compiles() {
    let c = CompiledPolicy::compile(&spec(
        r#"
monitorFilter:
  expressions:
    - {name: not-shell, expression: "!has(event.exec) || event.exec.filename != '/bin/sh'"}
"#,
    ))
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(c.monitor_filter.len(), 1);
    assert_eq!(c.monitor_filter[0].name, "not-shell");
}

/// A monitorFilter of the Go original's own expressions over every `event`
/// field (its `pkg/compiler/monitorfilter_test.go`,
/// `TestMonitorFilterFieldCoverage`), on a policy shaped like its shadow-AI
/// examples: a Go user's filter compiles here unchanged.
#[test]
fn the_go_originals_monitor_filter_over_every_event_field_compiles() {
    let c = CompiledPolicy::compile(&spec(
        r#"
mode: monitor
behaviors:
  - exec:
      deny:
        values: ["*"]
monitorFilter:
  expressions:
    - name: kind
      expression: 'event.kind == "net"'
    - name: time
      expression: 'event.time == timestamp("2024-03-01T12:00:00Z")'
    - name: process
      expression: 'event.comm == "curl" && event.pid == 17 && event.count == 3'
    - name: deny-flags
      expression: 'event.kernelDenied && event.wouldDeny'
    - name: pod
      expression: >-
        event.pod.namespace == "team-a" && event.pod.name == "agent-0" &&
        event.pod.uid == "uid-1" && event.pod.container == "agent" &&
        event.pod.containerID == "containerd://abc" &&
        event.pod.ownerKind == "Deployment" && event.pod.ownerName == "agent" &&
        event.pod.nodeName == "node-1" && event.pod.serviceAccount == "agent-sa" &&
        event.pod.labels["app"] == "ai"
    - name: facts
      expression: >-
        has(event.net) && event.net.destIP == "10.0.0.5" &&
        event.net.domain == "api.example.com"
"#,
    ))
    .unwrap_or_else(|e| panic!("{e:?}"));
    let names: Vec<&str> = c.monitor_filter.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["kind", "time", "process", "deny-flags", "pod", "facts"]
    );
}

#[test]
fn enforce_refuses_a_monitor_filter_and_a_dns_behavior() {
    let errs = compile_errors(
        r#"
mode: enforce
behaviors:
  - dns: {deny: {values: ["*"]}}
monitorFilter:
  expressions:
    - {name: t, expression: "true"}
"#,
    );
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].starts_with("spec.behaviors[0].dns: a dns behavior reports the names a workload resolves, it does not block them"));
    assert!(errs[1].starts_with(
        "spec.monitorFilter: a monitorFilter narrows what a monitor-mode policy reports"
    ));
}

#[test]
fn a_bad_selector_is_a_compile_error() {
    let errs = compile_errors(
        r#"
podSelector:
  matchExpressions:
    - {key: app, operator: Bogus}
"#,
    );
    assert!(errs[0].contains("spec.podSelector"), "{errs:?}");
}

#[test]
fn an_evaluation_error_names_the_variable_field() {
    let errs = evaluate(
        r#"
variables:
  - {name: a, expression: "[['x'][5]]"}
behaviors:
  - open: {deny: {expression: "variables.a"}}
"#,
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec.variables[0].expression: evaluation failed: Index out of bounds"),
        "{errs:?}"
    );
}

#[test]
fn an_unused_variable_is_not_evaluated() {
    // Lazy: the failing variable is never reached, so nothing fails.
    let r = evaluate(
        r#"
variables:
  - {name: broken, expression: "['x'].map(s, string(1 / 0))"}
behaviors:
  - open: {deny: {values: ["/etc/shadow"]}}
"#,
    );
    assert!(r.is_ok(), "{r:?}");
}

static TICKS: AtomicUsize = AtomicUsize::new(0);

fn tick(This(v): This<Value>) -> ::cel::ResolveResult {
    TICKS.fetch_add(1, Ordering::SeqCst);
    Ok(v)
}

#[test]
fn a_variable_used_many_times_is_evaluated_once_per_evaluation() {
    let mut env = Env::policy();
    env.add_overload(
        "tick",
        Overload {
            receiver: false,
            params: vec![Type::list(Type::String)],
            result: Type::list(Type::String),
        },
    );
    let compiled = CompiledPolicy::compile_with(
        &spec(
            r#"
variables:
  - {name: a, expression: "tick(['/a'])"}
  - {name: b, expression: "variables.a + variables.a"}
behaviors:
  - open: {deny: {expression: "variables.a + variables.b"}}
  - exec: {allow: {expression: "variables.b"}, deny: {expression: "variables.a"}}
"#,
        ),
        &env,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let mut ctx = policy_context();
    ctx.add_function("tick", tick);
    let before = TICKS.load(Ordering::SeqCst);
    let r = compiled
        .evaluate_in(&ctx)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(TICKS.load(Ordering::SeqCst) - before, 1);
    assert_eq!(r.behaviors[0].deny, ["/a"]);
    // A second evaluation evaluates again (data may have changed).
    compiled
        .evaluate_in(&ctx)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(TICKS.load(Ordering::SeqCst) - before, 2);
}

#[test]
fn an_integer_overflow_is_an_evaluation_error_with_its_field() {
    // cel-go's semantics: checked, never a wrapped value or a crash.
    let errs = evaluate(
        r#"
behaviors:
  - open: {deny: {expression: "[string(-(-9223372036854775807 - 1))]"}}
  - exec: {deny: {expression: "[string([9223372036854775807, 1].sum())]"}}
"#,
    )
    .unwrap_err();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec.behaviors[0].open.deny.expression: evaluation failed:")
            && errs[0].to_string().contains("Overflow"),
        "{errs:?}"
    );
    assert!(
        errs[1]
            .to_string()
            .starts_with("spec.behaviors[1].exec.deny.expression:")
            && errs[1].to_string().contains("Overflow"),
        "{errs:?}"
    );
}

fn big() -> ::cel::ResolveResult {
    let items = (0..70_000).map(|i| Value::String(Arc::new(format!("/p{i}"))));
    Ok(Value::List(Arc::new(items.collect())))
}

#[test]
fn an_oversized_result_is_refused() {
    // What a data source could hand back: more values than any kernel map
    // or report should take.
    let mut env = Env::policy();
    env.add_overload(
        "big",
        Overload {
            receiver: false,
            params: vec![],
            result: Type::list(Type::String),
        },
    );
    let compiled = CompiledPolicy::compile_with(
        &spec("behaviors:\n  - open: {deny: {expression: \"big()\"}}\n"),
        &env,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let mut ctx = policy_context();
    ctx.add_function("big", big);
    let errs = compiled.evaluate_in(&ctx).unwrap_err();
    assert!(
        errs[0].to_string().contains("the result is too large"),
        "{errs:?}"
    );
}

#[test]
fn a_huge_range_is_refused_before_it_is_allocated() {
    let errs = evaluate(
        r#"
behaviors:
  - open: {deny: {expression: "lists.range(1000000000000).map(i, string(i))"}}
"#,
    )
    .unwrap_err();
    assert!(
        errs[0]
            .to_string()
            .contains("lists.range(1000000000000) is refused: at most 4096 elements"),
        "{errs:?}"
    );
}
