//! Compile and evaluate the CEL differential corpus in Rust and in cel-go,
//! in one run, and print ns per expression per phase and the Rust/cel-go
//! ratio (issue 4, point 8).
//!
//! ```text
//! cargo bench -p kyverno-runtime-policy --bench cel_corpus
//! ```
//!
//! Both sides time the same cases: those that type-check in both, that
//! cel-go can plan, and that evaluate in Rust without tripping the panic
//! guard (a contained panic costs a backtrace capture, which is not what is
//! being measured). The
//! per-case environment (declaring the case's variables) is built outside
//! the timed loops on both sides. "compile" is parse + type-check + planning
//! the program (cel-go's `Program`, our `cel::program::Program`); "evaluate"
//! is binding the variables and running the program.
//!
//! Before and after, measured in the same run: the rows marked "before"
//! time what the policy pipeline did before the evaluator existed (compile
//! without planning; evaluate with the `cel` crate's own interpreter, the
//! variables bound into a child `cel::Context`), the others what it does
//! now (`cel::program`, library functions from the shared context).
//!
//! The Go oracle is `$KRT_CEL_ORACLE`, or built by `ci/cel-oracle build`
//! (which needs Go and the module proxy, or a warm module cache); without
//! one, only the Rust figures are printed. `KRT_BENCH_ITERS` sets the
//! iterations over the corpus (default 100), split into `KRT_BENCH_ROUNDS`
//! rounds (default 5); each round times every phase in Rust and then runs
//! the oracle, and each ratio printed is the median of the rounds' ratios,
//! so that the load of a shared machine, which changes from one second to
//! the next, weighs on both sides alike. `KRT_BENCH_TOP=N` also prints the
//! N cases the evaluator spends most time on.

#[path = "../tests/support/cel_harness.rs"]
mod harness;

use harness::{case_env, compile, eval, eval_cel_crate, load_corpus, load_golden, Case};
use kyverno_runtime_policy::cel::eval::{policy_context, shared_policy_context, EvalError};
use kyverno_runtime_policy::cel::{check, Env};
use kyverno_runtime_policy::compile::CompiledPolicy;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn oracle() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KRT_CEL_ORACLE") {
        return Some(PathBuf::from(p));
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(repo.join("ci/cel-oracle"))
        .arg("build")
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "cel_corpus: ci/cel-oracle build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()?
        .trim()
        .to_string();
    Some(PathBuf::from(path))
}

fn main() {
    let iters: usize = std::env::var("KRT_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let base = Env::policy();
    let ctx = shared_policy_context();
    let old_ctx = policy_context();
    let golden = load_golden();

    // The common set.
    let mut cases: Vec<(Case, Env)> = Vec::new();
    for case in load_corpus() {
        // cel-go must check it and plan it (a literal bad regex fails
        // planning, and the oracle's benchmark skips such a case).
        let go_checks = golden
            .get(&case.name)
            .is_some_and(|g| g.check_error.is_none() && g.eval_error.as_deref() != Some("program"));
        let env = case_env(&base, &case);
        let Ok(c) = compile(&env, &case) else {
            continue;
        };
        if !go_checks
            || matches!(eval(ctx, &c), Err(EvalError::Panicked))
            || matches!(eval_cel_crate(&old_ctx, &c), Err(EvalError::Panicked))
        {
            continue;
        }
        cases.push((case, env));
    }
    let n = cases.len();

    let compiled: Vec<_> = cases
        .iter()
        .filter_map(|(case, env)| compile(env, case).ok())
        .collect();
    let oracle = oracle();
    let corpus_file = std::env::temp_dir().join(format!("cel-bench-{}.yaml", std::process::id()));
    let list: Vec<&Case> = cases.iter().map(|(c, _)| c).collect();
    if let Ok(text) = serde_yaml::to_string(&list) {
        let _ = std::fs::write(&corpus_file, text);
    }

    // Rounds, each timing every phase on both sides one after the other,
    // so that a change of load on the shared machine hits both; the ratio
    // reported is the median of the rounds' ratios.
    let rounds: usize = std::env::var("KRT_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let per_round = iters.div_ceil(rounds).max(1);
    let phases = [
        "compile, before (no plan)",
        "compile",
        "evaluate, before (cel)",
        "evaluate",
    ];
    let mut rust: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    let mut go: Vec<Vec<f64>> = vec![Vec::new(); 2];
    let mut go_count = None;
    for _ in 0..rounds {
        let time = |f: &mut dyn FnMut()| {
            let start = Instant::now();
            for _ in 0..per_round {
                f();
            }
            start.elapsed().as_nanos() as f64 / (per_round * n) as f64
        };
        rust[0].push(time(&mut || {
            for (case, env) in &cases {
                let _ = black_box(check(&case.expr, env));
            }
        }));
        rust[1].push(time(&mut || {
            for (case, env) in &cases {
                let _ = black_box(compile(env, case));
            }
        }));
        rust[2].push(time(&mut || {
            for c in &compiled {
                let _ = black_box(eval_cel_crate(&old_ctx, c));
            }
        }));
        rust[3].push(time(&mut || {
            for c in &compiled {
                let _ = black_box(eval(ctx, c));
            }
        }));
        if let Some(g) = oracle
            .as_ref()
            .and_then(|bin| run_oracle(bin, &corpus_file, per_round))
        {
            go_count = g.get("expressions").and_then(serde_json::Value::as_u64);
            for (i, k) in ["compile_ns_per_expr", "eval_ns_per_expr"]
                .iter()
                .enumerate()
            {
                if let Some(x) = g.get(*k).and_then(serde_json::Value::as_f64) {
                    go[i].push(x);
                }
            }
        }
    }
    let _ = std::fs::remove_file(&corpus_file);
    if let Some(top) = std::env::var("KRT_BENCH_TOP")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        slowest(&cases, &compiled, ctx, top, iters);
    }

    println!(
        "cel corpus benchmark: {n} expressions x {per_round} iterations x {rounds} rounds (medians)"
    );
    println!(
        "{:<26} {:>14} {:>14} {:>12}",
        "phase", "rust ns/expr", "cel-go ns/expr", "rust/cel-go"
    );
    for (i, phase) in phases.iter().enumerate() {
        let g = &go[if i < 2 { 0 } else { 1 }];
        let r = median(&rust[i]);
        if g.len() == rust[i].len() {
            let ratios: Vec<f64> = rust[i].iter().zip(g).map(|(r, g)| r / g).collect();
            println!(
                "{phase:<26} {r:>14.0} {:>14.0} {:>12.2}",
                median(g),
                median(&ratios)
            );
        } else {
            println!("{phase:<26} {r:>14.0} {:>14} {:>12}", "-", "-");
        }
    }
    policies(iters);
    if go_count.is_some_and(|c| c != n as u64) {
        println!("note: cel-go timed {go_count:?} expressions");
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One benchmark run of the Go oracle over the corpus file.
fn run_oracle(bin: &PathBuf, corpus: &PathBuf, iters: usize) -> Option<serde_json::Value> {
    let out = Command::new(bin)
        .arg("-bench")
        .arg(iters.to_string())
        .arg(corpus)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "cel_corpus: oracle failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    serde_json::from_slice::<serde_json::Value>(&out.stdout).ok()
}

/// Prints the `top` cases the evaluator spends most time on (where to
/// look first), with the `cel` crate's time beside each.
fn slowest(
    cases: &[(Case, Env)],
    compiled: &[harness::Compiled],
    ctx: &cel::Context<'_>,
    top: usize,
    iters: usize,
) {
    let old_ctx = policy_context();
    let mut times: Vec<(f64, f64, &str)> = cases
        .iter()
        .zip(compiled)
        .map(|((case, _), c)| {
            let start = Instant::now();
            for _ in 0..iters {
                let _ = black_box(eval(ctx, c));
            }
            let new = start.elapsed().as_nanos() as f64 / iters as f64;
            let start = Instant::now();
            for _ in 0..iters {
                let _ = black_box(eval_cel_crate(&old_ctx, c));
            }
            let old = start.elapsed().as_nanos() as f64 / iters as f64;
            (new, old, case.name.as_str())
        })
        .collect();
    times.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = times.iter().map(|t| t.0).sum();
    println!("slowest cases (evaluate ns, before ns), of {total:.0} ns in all:");
    for (new, old, name) in times.iter().take(top) {
        println!("  {new:>9.0} {old:>9.0}  {name}");
    }
}

/// A representative policy: variables, literal values unioned with
/// expressions, a json.unmarshal data document, a default deny, a
/// monitorFilter. Rust only: the Go oracle evaluates expressions, not
/// policies.
const POLICY: &str = r#"
variables:
  - {name: registries, expression: "['10.0.0.0/8', '192.168.0.0/16']"}
  - {name: hosts, expression: "json.unmarshal('{\"hosts\": [\"a.example.com\", \"b.example.com\"]}').hosts.map(h, string(h))"}
  - {name: all, expression: "(variables.registries + variables.hosts).distinct()"}
behaviors:
  - network:
      allow: {values: ["1.1.1.1"], expression: "variables.all"}
      deny: {values: ["*"]}
  - exec:
      deny: {expression: "['/bin/sh', '/bin/bash'].filter(p, p.startsWith('/bin/'))"}
  - dns:
      allow: {expression: "variables.hosts.map(h, '*.' + h)"}
monitorFilter:
  expressions:
    - {name: not-shell, expression: "!has(event.exec) || event.exec.filename != '/bin/sh'"}
"#;

fn policies(iters: usize) {
    let spec = match serde_yaml::from_str(POLICY) {
        Ok(s) => s,
        Err(e) => return eprintln!("cel_corpus: bad POLICY: {e}"),
    };
    let start = Instant::now();
    for _ in 0..iters {
        let _ = black_box(CompiledPolicy::compile(&spec));
    }
    let compile_ns = start.elapsed().as_nanos() as f64 / iters as f64;
    let Ok(compiled) = CompiledPolicy::compile(&spec) else {
        return eprintln!("cel_corpus: POLICY does not compile");
    };
    let start = Instant::now();
    for _ in 0..iters {
        let _ = black_box(compiled.evaluate());
    }
    let eval_ns = start.elapsed().as_nanos() as f64 / iters as f64;
    println!("representative policy (rust): compile {compile_ns:.0} ns, evaluate {eval_ns:.0} ns");
}
