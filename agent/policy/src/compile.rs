//! A RuntimePolicy spec compiled and evaluated, as the specification's
//! "Compilation and evaluation pipeline" has it.
//!
//! [`CompiledPolicy::compile`] type-checks every expression once (variables
//! in order and `list(string)`, each behavior's allow and deny expressions
//! `list(string)`, each monitorFilter expression `bool`) and compiles the
//! selector pair, so a malformed policy is a compile failure naming every
//! offending field rather than an error each re-evaluation retries.
//! [`CompiledPolicy::evaluate`] runs the behavior expressions, evaluating a
//! variable only when an expression reaches it and at most once per
//! evaluation, unions each rule's literal values with its expression's
//! result, and reads a lone `"*"` in deny as the default-deny sentinel.
//!
//! Not here yet: `resource.get`/`resource.list`/`http.get` have no run-time
//! binding (an expression using them checks but fails to evaluate until the
//! data-source prefetch exists), and evaluation is bounded by nesting depth
//! (the checker's), `lists.range` ([`crate::cel::eval::MAX_RANGE`]) and result
//! size ([`crate::cel::eval::MAX_RESULT_UNITS`]), not by a cost model: the
//! `cel` crate's map and filter cost the square of their range, so a large
//! list from a data source is still slow to transform.

use crate::cel::eval::{evaluate, policy_context, EvalError};
use crate::cel::{check_for, CheckError, CheckedExpr, Env, Purpose};
use crate::selector::{PodTarget, SelectorError};
use crate::values::{check_star, BehaviorKind, FieldPath, RuleSide, ValueError, STAR};
use ::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use ::cel::objects::{Key, Map};
use ::cel::{Context, Value};
use kyverno_runtime_api::runtimepolicy::{PolicyBehavior, RuntimePolicyMode, RuntimePolicySpec};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Why a policy did not compile: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CompileError {
    /// An expression failed to check.
    #[error("{path}: {error}")]
    Expression {
        /// The expression's field (`spec.behaviors[2].network.deny.expression`).
        path: String,
        /// The checker's error.
        error: CheckError,
    },
    /// A selector did not compile.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// A combination of fields the compiler refuses.
    #[error("{path}: {message}")]
    Refused {
        /// The field.
        path: String,
        /// Why.
        message: &'static str,
    },
}

/// Why an evaluation failed, per field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EvaluateError {
    /// An expression (or a variable it uses) failed to evaluate.
    #[error("{path}: {error}")]
    Expression {
        /// The expression's field, or `spec.variables[i].expression`.
        path: String,
        /// What failed.
        error: EvalError,
    },
    /// An expression returned something other than a list of strings
    /// (only reachable through a checker bug; reported, not trusted).
    #[error("{path}: the result is not a list of strings")]
    NotAListOfStrings {
        /// The expression's field.
        path: String,
    },
    /// `"*"` stands where it may not in an evaluated list.
    #[error(transparent)]
    Star(#[from] ValueError),
}

/// One allow or deny rule: literal values and an optional expression.
#[derive(Clone, Debug)]
struct CompiledRule {
    literals: Vec<String>,
    expression: Option<CheckedExpr>,
    /// The variables the expression names (`variables.<name>`).
    uses: BTreeSet<String>,
}

#[derive(Clone, Debug)]
struct CompiledBehavior {
    index: usize,
    kind: BehaviorKind,
    allow: CompiledRule,
    deny: CompiledRule,
}

#[derive(Clone, Debug)]
struct CompiledVariable {
    name: String,
    expr: CheckedExpr,
    uses: BTreeSet<String>,
}

/// A compiled monitorFilter predicate.
#[derive(Clone, Debug)]
pub struct CompiledFilter {
    /// Its name (compile errors, conditions and the metric label).
    pub name: String,
    /// The checked `bool` expression over `event`.
    pub expr: CheckedExpr,
}

/// A RuntimePolicy spec, compiled.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    /// The policy's mode.
    pub mode: RuntimePolicyMode,
    /// Which pods it applies to.
    pub target: PodTarget,
    /// `evaluationInterval` as written (admission has validated it).
    pub evaluation_interval: Option<String>,
    /// The monitorFilter predicates, in order.
    pub monitor_filter: Vec<CompiledFilter>,
    variables: Vec<CompiledVariable>,
    behaviors: Vec<CompiledBehavior>,
}

/// One behavior's evaluated lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvaluatedBehavior {
    /// Its index in `spec.behaviors`.
    pub index: usize,
    /// Its kind.
    pub kind: BehaviorKind,
    /// Allowed values: literals then expression results, duplicates removed.
    pub allow: Vec<String>,
    /// Denied values, without the `"*"` sentinel.
    pub deny: Vec<String>,
    /// `deny` was exactly `["*"]`: deny everything not allowed (on dns:
    /// report every name).
    pub default_deny: bool,
}

/// What a policy evaluates to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvaluationResult {
    /// Every behavior, in spec order.
    pub behaviors: Vec<EvaluatedBehavior>,
}

fn behavior_kind(b: &PolicyBehavior) -> Option<(BehaviorKind, RuleParts, RuleParts)> {
    fn parts<'a>(
        allow: Option<(Vec<&'a str>, Option<&'a str>)>,
        deny: Option<(Vec<&'a str>, Option<&'a str>)>,
    ) -> (RuleParts, RuleParts) {
        let own = |r: Option<(Vec<&str>, Option<&str>)>| {
            r.map(|(v, e)| {
                (
                    v.into_iter().map(str::to_string).collect(),
                    e.map(str::to_string),
                )
            })
            .unwrap_or_default()
        };
        (own(allow), own(deny))
    }
    macro_rules! rule {
        ($r:expr) => {
            $r.as_ref()
                .map(|r| (r.literal_values().collect(), r.expression.as_deref()))
        };
    }
    if let Some(n) = &b.network {
        let (a, d) = parts(rule!(n.allow), rule!(n.deny));
        return Some((BehaviorKind::Network, a, d));
    }
    if let Some(n) = &b.exec {
        let (a, d) = parts(rule!(n.allow), rule!(n.deny));
        return Some((BehaviorKind::Exec, a, d));
    }
    if let Some(n) = &b.open {
        let (a, d) = parts(rule!(n.allow), rule!(n.deny));
        return Some((BehaviorKind::Open, a, d));
    }
    if let Some(n) = &b.protocol {
        let (a, d) = parts(rule!(n.allow), rule!(n.deny));
        return Some((BehaviorKind::Protocol, a, d));
    }
    if let Some(n) = &b.dns {
        let (a, d) = parts(rule!(n.allow), rule!(n.deny));
        return Some((BehaviorKind::Dns, a, d));
    }
    None
}

/// Literal values and the expression source of one rule.
type RuleParts = (Vec<String>, Option<String>);

/// The names `e` reads as `variables.<name>`. Over-approximate (a
/// comprehension variable named `variables` would count too), which only
/// costs evaluating a variable that is not needed.
fn variables_used(e: &IdedExpr, out: &mut BTreeSet<String>) {
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match &e.expr {
            Expr::Select(s) => {
                if matches!(&s.operand.expr, Expr::Ident(n) if n == "variables") {
                    out.insert(s.field.clone());
                }
                stack.push(&s.operand);
            }
            Expr::Call(c) => {
                stack.extend(c.target.as_deref());
                stack.extend(c.args.iter());
            }
            Expr::List(l) => stack.extend(l.elements.iter()),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        stack.push(&me.key);
                        stack.push(&me.value);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            stack.push(&me.key);
                            stack.push(&me.value);
                        }
                        EntryExpr::StructField(f) => stack.push(&f.value),
                    }
                }
            }
            Expr::Comprehension(c) => {
                stack.push(&c.iter_range);
                stack.push(&c.accu_init);
                stack.push(&c.loop_cond);
                stack.push(&c.loop_step);
                stack.push(&c.result);
            }
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

impl CompiledPolicy {
    /// Compiles `spec` in [`Env::policy`], returning every error found
    /// (each with its field).
    pub fn compile(spec: &RuntimePolicySpec) -> Result<Self, Vec<CompileError>> {
        Self::compile_with(spec, &Env::policy())
    }

    /// Compiles `spec` with `base` as the environment of variable and
    /// behavior expressions (for a caller that declares more functions,
    /// and binds them in the context it evaluates in).
    pub fn compile_with(spec: &RuntimePolicySpec, base: &Env) -> Result<Self, Vec<CompileError>> {
        let root = FieldPath::spec();
        let mut errors = Vec::new();
        let mode = spec.mode.unwrap_or_default();
        let target = match PodTarget::compile(
            spec.pod_selector.as_ref(),
            spec.namespace_selector.as_ref(),
            &root,
        ) {
            Ok(t) => t,
            Err(e) => {
                errors.push(CompileError::Selector(e));
                PodTarget::nothing()
            }
        };

        // Variables: checked in order, each seeing the ones before it.
        let var_specs = spec.variables.as_deref().unwrap_or_default();
        let var_path = |i: usize| {
            root.field("variables")
                .index(i)
                .field("expression")
                .as_str()
                .to_string()
        };
        let (env, variables) = match crate::cel::check_variables(
            var_specs
                .iter()
                .map(|v| (v.name.as_str(), v.expression.as_str())),
            base,
        ) {
            Ok(checked) => {
                let vars = checked
                    .variables
                    .into_iter()
                    .map(|(name, expr)| {
                        let mut uses = BTreeSet::new();
                        variables_used(&expr.ast, &mut uses);
                        CompiledVariable { name, expr, uses }
                    })
                    .collect();
                (checked.env, vars)
            }
            Err(errs) => {
                for error in errs {
                    let name = error
                        .origin
                        .as_deref()
                        .and_then(|o| o.strip_prefix("variables."))
                        .unwrap_or_default()
                        .to_string();
                    let i = var_specs.iter().position(|v| v.name == name).unwrap_or(0);
                    errors.push(CompileError::Expression {
                        path: var_path(i),
                        error,
                    });
                }
                // Keep checking the behaviors, with every variable unknown,
                // so one compile reports everything.
                (base.clone(), Vec::new())
            }
        };

        let mut behaviors = Vec::new();
        for (index, b) in spec.behaviors.iter().flatten().enumerate() {
            let Some((kind, allow, deny)) = behavior_kind(b) else {
                continue;
            };
            let at = root.field("behaviors").index(index).field(kind.as_str());
            if kind == BehaviorKind::Dns && mode == RuntimePolicyMode::Enforce {
                errors.push(CompileError::Refused {
                    path: at.as_str().to_string(),
                    message: "a dns behavior is observation only: use mode: monitor for it, and the network behavior to enforce egress to a domain",
                });
            }
            let mut rule = |side: RuleSide, (literals, source): RuleParts| {
                let path = at.field(side.as_str()).field("expression");
                let expression =
                    source.and_then(|src| match check_for(&src, &env, Purpose::Behavior) {
                        Ok(c) => Some(c),
                        Err(errs) => {
                            errors.extend(errs.into_iter().map(|error| CompileError::Expression {
                                path: path.as_str().to_string(),
                                error,
                            }));
                            None
                        }
                    });
                let mut uses = BTreeSet::new();
                if let Some(c) = &expression {
                    variables_used(&c.ast, &mut uses);
                }
                CompiledRule {
                    literals,
                    expression,
                    uses,
                }
            };
            let allow = rule(RuleSide::Allow, allow);
            let deny = rule(RuleSide::Deny, deny);
            behaviors.push(CompiledBehavior {
                index,
                kind,
                allow,
                deny,
            });
        }

        let mut monitor_filter = Vec::new();
        if let Some(mf) = &spec.monitor_filter {
            let at = root.field("monitorFilter");
            if mode == RuntimePolicyMode::Enforce {
                errors.push(CompileError::Refused {
                    path: at.as_str().to_string(),
                    message: "monitorFilter narrows monitor findings and is refused with mode: enforce, whose findings are the record of what the kernel blocked",
                });
            }
            let filter_env = Env::monitor_filter();
            for (i, ne) in mf.expressions.iter().enumerate() {
                let path = at.field("expressions").index(i).field("expression");
                match check_for(&ne.expression, &filter_env, Purpose::MonitorFilter) {
                    Ok(expr) => monitor_filter.push(CompiledFilter {
                        name: ne.name.clone(),
                        expr,
                    }),
                    Err(errs) => errors.extend(errs.into_iter().map(|mut error| {
                        error.origin = Some(ne.name.clone());
                        CompileError::Expression {
                            path: path.as_str().to_string(),
                            error,
                        }
                    })),
                }
            }
        }

        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(CompiledPolicy {
            mode,
            target,
            evaluation_interval: spec.evaluation_interval.clone(),
            monitor_filter,
            variables,
            behaviors,
        })
    }

    /// Evaluates every behavior in a fresh [`policy_context`].
    pub fn evaluate(&self) -> Result<EvaluationResult, Vec<EvaluateError>> {
        self.evaluate_in(&policy_context())
    }

    /// Evaluates every behavior in `ctx` (a [`policy_context`], perhaps
    /// with data bound into it), returning every failure.
    pub fn evaluate_in(&self, ctx: &Context<'_>) -> Result<EvaluationResult, Vec<EvaluateError>> {
        let vars = LazyVariables {
            policy: self,
            ctx,
            memo: RefCell::new(HashMap::new()),
        };
        let mut errors = Vec::new();
        let mut behaviors = Vec::new();
        for b in &self.behaviors {
            let at = FieldPath::spec()
                .field("behaviors")
                .index(b.index)
                .field(b.kind.as_str());
            let allow = vars.rule(&b.allow, &at.field("allow"));
            let deny = vars.rule(&b.deny, &at.field("deny"));
            let (allow, deny) = match (allow, deny) {
                (Ok(a), Ok(d)) => (a, d),
                (a, d) => {
                    errors.extend(a.err().into_iter().chain(d.err()));
                    continue;
                }
            };
            let values = |side: RuleSide| FieldPath::values(b.index, b.kind, side);
            let mut bad = false;
            for (list, side) in [(&allow, RuleSide::Allow), (&deny, RuleSide::Deny)] {
                if let Err(e) = check_star(list, &values(side), side) {
                    errors.push(EvaluateError::Star(e));
                    bad = true;
                }
            }
            if bad {
                continue;
            }
            let default_deny = deny.len() == 1 && deny[0] == STAR;
            behaviors.push(EvaluatedBehavior {
                index: b.index,
                kind: b.kind,
                allow,
                deny: if default_deny { Vec::new() } else { deny },
                default_deny,
            });
        }
        if errors.is_empty() {
            Ok(EvaluationResult { behaviors })
        } else {
            Err(errors)
        }
    }
}

/// The variables of one evaluation: each computed on first use and kept
/// for the rest of the evaluation (what `lazy.MapValue` does in the
/// reference implementation).
struct LazyVariables<'p, 'c> {
    policy: &'p CompiledPolicy,
    ctx: &'p Context<'c>,
    memo: RefCell<HashMap<String, Result<Value, EvaluateError>>>,
}

impl LazyVariables<'_, '_> {
    /// The value of variable `name`, computing it (and what it uses) once.
    /// Variables use only earlier ones, so this recursion is at most
    /// `MAX_VARIABLES` deep and cannot cycle.
    fn get(&self, name: &str) -> Option<Result<Value, EvaluateError>> {
        if let Some(v) = self.memo.borrow().get(name) {
            return Some(v.clone());
        }
        let (i, var) = self
            .policy
            .variables
            .iter()
            .enumerate()
            .find(|(_, v)| v.name == name)?;
        let result = self.bind(&var.uses).and_then(|scope| {
            self.eval_in(&scope, &var.expr, || {
                FieldPath::spec()
                    .field("variables")
                    .index(i)
                    .field("expression")
                    .as_str()
                    .to_string()
            })
        });
        self.memo
            .borrow_mut()
            .insert(name.to_string(), result.clone());
        Some(result)
    }

    /// A child scope of the context with `variables` bound to the named
    /// variables' values.
    fn bind(&self, uses: &BTreeSet<String>) -> Result<Context<'_>, EvaluateError> {
        let mut map = HashMap::new();
        for name in uses {
            // A name that is not a variable was refused by the checker
            // (or is a comprehension variable's field): nothing to bind.
            if let Some(v) = self.get(name) {
                map.insert(Key::String(Arc::new(name.clone())), v?);
            }
        }
        let mut scope = self.ctx.new_inner_scope();
        scope.add_variable_from_value("variables", Value::Map(Map { map: Arc::new(map) }));
        Ok(scope)
    }

    fn eval_in(
        &self,
        scope: &Context<'_>,
        expr: &CheckedExpr,
        path: impl Fn() -> String,
    ) -> Result<Value, EvaluateError> {
        evaluate(expr, scope).map_err(|error| EvaluateError::Expression {
            path: path(),
            error,
        })
    }

    /// A rule's literal values followed by its expression's strings, each
    /// value once.
    fn rule(&self, rule: &CompiledRule, at: &FieldPath) -> Result<Vec<String>, EvaluateError> {
        let mut out: Vec<String> = Vec::new();
        let mut seen = BTreeSet::new();
        let mut push = |s: String, out: &mut Vec<String>| {
            if seen.insert(s.clone()) {
                out.push(s);
            }
        };
        for l in &rule.literals {
            push(l.clone(), &mut out);
        }
        let Some(expr) = &rule.expression else {
            return Ok(out);
        };
        let path = || at.field("expression").as_str().to_string();
        let scope = self.bind(&rule.uses)?;
        let value = self.eval_in(&scope, expr, path)?;
        let Value::List(items) = value else {
            return Err(EvaluateError::NotAListOfStrings { path: path() });
        };
        for item in items.iter() {
            match item {
                Value::String(s) => push(s.to_string(), &mut out),
                _ => return Err(EvaluateError::NotAListOfStrings { path: path() }),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
