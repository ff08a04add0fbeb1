//! A RuntimePolicy spec compiled and evaluated, as the specification's
//! "Compilation and evaluation pipeline" has it.
//!
//! [`CompiledPolicy::compile`] type-checks every expression once (variables
//! in order and `list(string)`, each behavior's allow and deny expressions
//! `list(string)`, each monitorFilter expression `bool`), finds the data
//! sources they read and computes their arguments ([`crate::sources`]),
//! compiles each expression into a [`Program`] and estimates its cost
//! ([`crate::cel::cost`]), and compiles the selector pair, so a malformed
//! policy is a compile failure naming every offending field rather than an
//! error each re-evaluation retries.
//!
//! [`CompiledPolicy::evaluate_with`] runs the behavior expressions over the
//! data fetched for it, evaluating a variable only when an expression
//! reaches it and at most once per evaluation, all within one cost budget
//! ([`RUNTIME_COST_BUDGET`]); unions each rule's literal values with its
//! expression's result; and reads a lone `"*"` in deny as the default-deny
//! sentinel. Besides the budget, evaluation is bounded by nesting depth
//! (the checker's), `lists.range` ([`crate::cel::eval::MAX_RANGE`]) and
//! result size ([`crate::cel::eval::MAX_RESULT_UNITS`]).

use crate::cel::cost::{self, Inputs, Size};
use crate::cel::eval::{shared_policy_context, EvalError, RUNTIME_COST_BUDGET};
use crate::cel::program::{Budget, Program};
use crate::cel::{check_for, CheckError, CheckedExpr, Env, Purpose, Type};
use crate::selector::{PodTarget, SelectorError};
use crate::sources::{self, DataSet, DataSource, SourceUses, MAX_SOURCES};
use crate::values::{
    check_value, misplaced_stars, BehaviorKind, FieldPath, RuleSide, ValueError, STAR,
};
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
    /// A data-source call whose arguments cannot be known before the
    /// expression runs, or name no usable source; or too many sources.
    #[error("{path}: {message}")]
    DataSource {
        /// The expression's field.
        path: String,
        /// What is wrong, naming the call and argument.
        message: String,
    },
    /// An expression whose estimated cost is refused ([`cost::refusal`]).
    #[error("{path}: {message} (in `{expr}`)")]
    Cost {
        /// The expression's field.
        path: String,
        /// The estimate and why it is refused.
        message: String,
        /// The expression, shortened.
        expr: String,
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
    /// An expression reads a data source for which no data was supplied.
    #[error("{path}: needs live data: {call} (fetched by the daemon before each evaluation; `policy check --data FILE` supplies it offline)")]
    NeedsData {
        /// The expression's field.
        path: String,
        /// The call.
        call: Box<DataSource>,
    },
    /// Fetching a data source an expression reads failed.
    #[error("{path}: {call} failed: {error}")]
    Data {
        /// The expression's field.
        path: String,
        /// The call.
        call: Box<DataSource>,
        /// Why.
        error: String,
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
    /// A value the behavior's parser refuses, in a behavior that a
    /// misplaced `"*"` keeps from being programmed: nothing downstream
    /// parses that behavior's values, so they are checked here, and the
    /// `"*"` error does not hide them.
    #[error("{0}")]
    Value(ValueError),
}

impl EvaluateError {
    /// Whether this is only missing data (not a fault of the policy).
    pub fn needs_data(&self) -> bool {
        matches!(self, EvaluateError::NeedsData { .. })
    }
}

/// An expression compiled: checked, its program, what it reads.
#[derive(Clone, Debug)]
struct CompiledExpr {
    program: Program,
    /// The variables it names (`variables.<name>`).
    uses: BTreeSet<String>,
    /// The estimated cost, in `n` (fetched data size).
    cost: cost::Poly,
}

/// One allow or deny rule: literal values and an optional expression.
#[derive(Clone, Debug)]
struct CompiledRule {
    literals: Vec<String>,
    expression: Option<CompiledExpr>,
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
    expr: CompiledExpr,
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
    sources: SourceUses,
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
    /// Explicitly denied values, without the `"*"` sentinel.
    pub deny: Vec<String>,
    /// `deny` held `"*"`: deny everything not allowed, except what the
    /// explicit denies refuse anyway (on dns, where `"*"` stands alone:
    /// report every name).
    pub default_deny: bool,
}

/// What a policy evaluates to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvaluationResult {
    /// Every behavior, in spec order.
    pub behaviors: Vec<EvaluatedBehavior>,
}

/// An evaluation that kept what did evaluate
/// ([`CompiledPolicy::evaluate_partial`]).
#[derive(Clone, Debug)]
pub struct Partial {
    /// The behaviors whose rules evaluated.
    pub result: EvaluationResult,
    /// The failures of the others, each with its field.
    pub errors: Vec<EvaluateError>,
    /// The cost units the evaluation spent.
    pub cost: u64,
}

/// The global a data source's result is bound to.
fn data_global(i: usize) -> String {
    format!("@data{i}")
}

/// Budget for computing data-source arguments while compiling.
const ARGUMENT_BUDGET: u64 = 100_000;

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

/// The state of one compile: errors so far, the sources found, and what
/// the variables compiled so far are.
struct Compiler<'a> {
    env: &'a Env,
    errors: Vec<CompileError>,
    sources: SourceUses,
    variables: Vec<CompiledVariable>,
    /// The variables that read a data source (directly or through another).
    reads_data: BTreeSet<String>,
    /// Their estimated result sizes.
    sizes: HashMap<String, Size>,
    /// Values of data-free variables, computed for data-source arguments.
    values: HashMap<String, Result<Value, String>>,
}

impl Compiler<'_> {
    /// Compiles one checked expression at `path`: its data-source calls,
    /// program and cost estimate. `None` (errors recorded) if any part is
    /// refused.
    fn expression(&mut self, checked: CheckedExpr, path: &str) -> Option<(CompiledExpr, Size)> {
        let mut uses = BTreeSet::new();
        variables_used(&checked.ast, &mut uses);
        let mut substitutions = HashMap::new();
        let mut ok = true;
        for call in sources::calls(&checked.ast) {
            match self.call_source(&call) {
                Ok(source) => {
                    let i = match self.sources.sources.iter().position(|s| *s == source) {
                        Some(i) => i,
                        None => {
                            self.sources.sources.push(source);
                            self.sources.sources.len() - 1
                        }
                    };
                    let paths = self.sources.paths.entry(i).or_default();
                    if !paths.iter().any(|p| p == path) {
                        paths.push(path.to_string());
                    }
                    substitutions.insert(call.id, data_global(i));
                }
                Err(message) => {
                    self.errors.push(CompileError::DataSource {
                        path: path.to_string(),
                        message,
                    });
                    ok = false;
                }
            }
        }
        if !ok {
            return None;
        }
        let program = Program::new(&checked, self.env, &substitutions);
        let estimate = cost::estimate(
            &program,
            &Inputs {
                variables: &self.sizes,
            },
        );
        if let Some(message) = cost::refusal(&estimate.cost) {
            self.errors.push(CompileError::Cost {
                path: path.to_string(),
                message,
                expr: checked.source.chars().take(120).collect(),
            });
            return None;
        }
        Some((
            CompiledExpr {
                program,
                uses,
                cost: estimate.cost,
            },
            estimate.size,
        ))
    }

    /// The source a call names, its arguments computed; or why it cannot
    /// be known before evaluation.
    fn call_source(&mut self, call: &sources::Call<'_>) -> Result<DataSource, String> {
        let mut args = Vec::with_capacity(call.args.len());
        for (i, arg) in call.args.iter().enumerate() {
            let what = || {
                format!(
                    "{}: argument {} (`{}`)",
                    call.function,
                    i + 1,
                    crate::cel::render_expr(arg)
                )
            };
            let rule = "a data source's arguments must be known before the expression runs: literals, expressions over literals, or variables that read no data source";
            if let Some(why) = sources::not_constant(arg, &call.locals) {
                return Err(format!(
                    "{} is not known before evaluation: {why}; {rule}",
                    what()
                ));
            }
            let mut used = BTreeSet::new();
            variables_used(arg, &mut used);
            if let Some(v) = used.iter().find(|v| self.reads_data.contains(*v)) {
                return Err(format!(
                    "{} is not known before evaluation: it reads variables.{v}, which reads a data source; {rule}",
                    what()
                ));
            }
            if let Some(s) = sources::literal_string(arg) {
                args.push(s.to_string());
                continue;
            }
            match self.constant(arg, &used) {
                Ok(Value::String(s)) => args.push(s.to_string()),
                Ok(other) => {
                    return Err(format!(
                        "{} is {}, not a string",
                        what(),
                        crate::cel::eval::type_name(&other)
                    ))
                }
                Err(e) => return Err(format!("{} could not be computed: {e}", what())),
            }
        }
        sources::source(call.function, &args).map_err(|e| format!("{}: {e}", call.function))
    }

    /// Evaluates a data-free argument now.
    fn constant(&mut self, arg: &IdedExpr, uses: &BTreeSet<String>) -> Result<Value, String> {
        let checked = CheckedExpr {
            source: String::new(),
            ast: arg.clone(),
            ty: Type::String,
        };
        let program = Program::new(&checked, self.env, &HashMap::new());
        let mut vars = HashMap::new();
        for name in uses {
            vars.insert(Key::String(Arc::new(name.clone())), self.value_of(name)?);
        }
        let globals: Vec<Option<Value>> = program
            .globals()
            .iter()
            .map(|g| {
                (g == "variables").then(|| {
                    Value::Map(Map {
                        map: Arc::new(vars.clone()),
                    })
                })
            })
            .collect();
        program
            .run(
                &globals,
                shared_policy_context(),
                &mut Budget::new(ARGUMENT_BUDGET),
            )
            .map_err(|e| e.to_string())
    }

    /// The value of a data-free variable compiled so far.
    fn value_of(&mut self, name: &str) -> Result<Value, String> {
        if let Some(v) = self.values.get(name) {
            return v.clone();
        }
        let Some(var) = self.variables.iter().find(|v| v.name == name).cloned() else {
            return Err(format!("variables.{name} is not available"));
        };
        let mut vars = HashMap::new();
        for used in &var.expr.uses {
            vars.insert(Key::String(Arc::new(used.clone())), self.value_of(used)?);
        }
        let globals: Vec<Option<Value>> = var
            .expr
            .program
            .globals()
            .iter()
            .map(|g| {
                (g == "variables").then(|| {
                    Value::Map(Map {
                        map: Arc::new(vars.clone()),
                    })
                })
            })
            .collect();
        let v = var
            .expr
            .program
            .run(
                &globals,
                shared_policy_context(),
                &mut Budget::new(ARGUMENT_BUDGET),
            )
            .map_err(|e| format!("variables.{name}: {e}"));
        self.values.insert(name.to_string(), v.clone());
        v
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
        let (env, checked_vars) = match crate::cel::check_variables(
            var_specs
                .iter()
                .map(|v| (v.name.as_str(), v.expression.as_str())),
            base,
        ) {
            Ok(checked) => (checked.env, checked.variables),
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
        let mut c = Compiler {
            env: &env,
            errors,
            sources: SourceUses::default(),
            variables: Vec::new(),
            reads_data: BTreeSet::new(),
            sizes: HashMap::new(),
            values: HashMap::new(),
        };
        for (name, checked) in checked_vars {
            let i = var_specs.iter().position(|v| v.name == name).unwrap_or(0);
            let direct = !sources::calls(&checked.ast).is_empty();
            let Some((expr, size)) = c.expression(checked, &var_path(i)) else {
                continue;
            };
            if direct || expr.uses.iter().any(|u| c.reads_data.contains(u)) {
                c.reads_data.insert(name.clone());
            }
            c.sizes.insert(name.clone(), size);
            c.variables.push(CompiledVariable { name, expr });
        }

        let mut behaviors = Vec::new();
        for (index, b) in spec.behaviors.iter().flatten().enumerate() {
            let Some((kind, allow, deny)) = behavior_kind(b) else {
                continue;
            };
            let at = root.field("behaviors").index(index).field(kind.as_str());
            if kind == BehaviorKind::Dns && mode == RuntimePolicyMode::Enforce {
                c.errors.push(CompileError::Refused {
                    path: at.as_str().to_string(),
                    message: kyverno_runtime_api::runtimepolicy::messages::DNS_IN_ENFORCE,
                });
            }
            let mut rule = |side: RuleSide, (literals, source): RuleParts| {
                let path = at.field(side.as_str()).field("expression");
                let path = path.as_str();
                let expression =
                    source.and_then(|src| match check_for(&src, &env, Purpose::Behavior) {
                        Ok(checked) => c.expression(checked, path).map(|(e, _)| e),
                        Err(errs) => {
                            c.errors.extend(errs.into_iter().map(|error| {
                                CompileError::Expression {
                                    path: path.to_string(),
                                    error,
                                }
                            }));
                            None
                        }
                    });
                CompiledRule {
                    literals,
                    expression,
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
        if c.sources.sources.len() > MAX_SOURCES {
            c.errors.push(CompileError::DataSource {
                path: root.as_str().to_string(),
                message: format!(
                    "the policy reads {} distinct data sources; at most {MAX_SOURCES} are fetched per evaluation",
                    c.sources.sources.len()
                ),
            });
        }

        let mut monitor_filter = Vec::new();
        if let Some(mf) = &spec.monitor_filter {
            let at = root.field("monitorFilter");
            if mode == RuntimePolicyMode::Enforce {
                c.errors.push(CompileError::Refused {
                    path: at.as_str().to_string(),
                    message:
                        kyverno_runtime_api::runtimepolicy::messages::MONITOR_FILTER_IN_ENFORCE,
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
                    Err(errs) => c.errors.extend(errs.into_iter().map(|mut error| {
                        error.origin = Some(ne.name.clone());
                        CompileError::Expression {
                            path: path.as_str().to_string(),
                            error,
                        }
                    })),
                }
            }
        }

        if !c.errors.is_empty() {
            return Err(c.errors);
        }
        Ok(CompiledPolicy {
            mode,
            target,
            evaluation_interval: spec.evaluation_interval.clone(),
            monitor_filter,
            variables: c.variables,
            behaviors,
            sources: c.sources,
        })
    }

    /// Each behavior's index in `spec.behaviors` and kind, in order: what
    /// an evaluation yields lists for (a behavior that fails to evaluate
    /// is missing from its result).
    pub fn behavior_kinds(&self) -> impl Iterator<Item = (usize, BehaviorKind)> + '_ {
        self.behaviors.iter().map(|b| (b.index, b.kind))
    }

    /// The data sources the policy reads, each once, in the order first
    /// read: what must be fetched before [`CompiledPolicy::evaluate_with`].
    pub fn sources(&self) -> &[DataSource] {
        &self.sources.sources
    }

    /// Every value the spec writes as a literal (`values:`), on any side
    /// of any behavior: what its author wrote, as opposed to what an
    /// expression computed.
    pub fn literal_values(&self) -> BTreeSet<&str> {
        self.behaviors
            .iter()
            .flat_map(|b| b.allow.literals.iter().chain(&b.deny.literals))
            .map(String::as_str)
            .collect()
    }

    /// The expression fields that read `sources()[i]`.
    pub fn source_paths(&self, i: usize) -> &[String] {
        self.sources
            .paths
            .get(&i)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Each expression's estimated cost (`n`: fetched data size), by field.
    pub fn estimated_costs(&self) -> Vec<(String, cost::Poly)> {
        let mut out = Vec::new();
        for (i, v) in self.variables.iter().enumerate() {
            let path = FieldPath::spec()
                .field("variables")
                .index(i)
                .field("expression");
            out.push((path.as_str().to_string(), v.expr.cost));
        }
        for b in &self.behaviors {
            for (side, rule) in [(RuleSide::Allow, &b.allow), (RuleSide::Deny, &b.deny)] {
                if let Some(e) = &rule.expression {
                    let path = FieldPath::spec()
                        .field("behaviors")
                        .index(b.index)
                        .field(b.kind.as_str())
                        .field(side.as_str())
                        .field("expression");
                    out.push((path.as_str().to_string(), e.cost));
                }
            }
        }
        out
    }

    /// Evaluates every behavior with no fetched data (an expression
    /// reading a data source fails with [`EvaluateError::NeedsData`]).
    pub fn evaluate(&self) -> Result<EvaluationResult, Vec<EvaluateError>> {
        self.evaluate_full(
            shared_policy_context(),
            &DataSet::new(),
            RUNTIME_COST_BUDGET,
        )
    }

    /// Evaluates every behavior over `data` (the policy's
    /// [`CompiledPolicy::sources`], fetched).
    pub fn evaluate_with(&self, data: &DataSet) -> Result<EvaluationResult, Vec<EvaluateError>> {
        self.evaluate_full(shared_policy_context(), data, RUNTIME_COST_BUDGET)
    }

    /// Evaluates every behavior with library functions from `ctx` (a
    /// [`crate::cel::eval::policy_context`], perhaps with more functions).
    pub fn evaluate_in(&self, ctx: &Context<'_>) -> Result<EvaluationResult, Vec<EvaluateError>> {
        self.evaluate_full(ctx, &DataSet::new(), RUNTIME_COST_BUDGET)
    }

    /// Evaluates every behavior: library functions from `ctx`, data-source
    /// results from `data`, all of it within `budget` cost units. Returns
    /// every failure, each with its field (after the budget is spent, only
    /// the expression that spent it is named).
    pub fn evaluate_full(
        &self,
        ctx: &Context<'_>,
        data: &DataSet,
        budget: u64,
    ) -> Result<EvaluationResult, Vec<EvaluateError>> {
        let p = self.evaluate_partial(ctx, data, budget);
        if p.errors.is_empty() {
            Ok(p.result)
        } else {
            Err(p.errors)
        }
    }

    /// [`CompiledPolicy::evaluate_with`], and the cost units it spent.
    pub fn evaluate_costed(
        &self,
        data: &DataSet,
    ) -> (Result<EvaluationResult, Vec<EvaluateError>>, u64) {
        let p = self.evaluate_partial(shared_policy_context(), data, RUNTIME_COST_BUDGET);
        let result = if p.errors.is_empty() {
            Ok(p.result)
        } else {
            Err(p.errors)
        };
        (result, p.cost)
    }

    /// [`CompiledPolicy::evaluate_full`], keeping what did evaluate: the
    /// behaviors whose rules evaluated, and the failures of the others
    /// (what `policy check` shows when some data is missing).
    pub fn evaluate_partial(&self, ctx: &Context<'_>, data: &DataSet, budget: u64) -> Partial {
        let run = Evaluation {
            policy: self,
            ctx,
            data,
            memo: RefCell::new(HashMap::new()),
            budget: RefCell::new(Budget::new(budget)),
        };
        let mut errors = Vec::new();
        let mut behaviors = Vec::new();
        for b in &self.behaviors {
            if run.spent() {
                break;
            }
            let at = FieldPath::spec()
                .field("behaviors")
                .index(b.index)
                .field(b.kind.as_str());
            let allow = run.rule(&b.allow, &at.field("allow"));
            let deny = run.rule(&b.deny, &at.field("deny"));
            let (allow, deny) = match (allow, deny) {
                (Ok(a), Ok(d)) => (a, d),
                (a, d) => {
                    errors.extend(a.err().into_iter().chain(d.err()));
                    continue;
                }
            };
            let values = |side: RuleSide| FieldPath::values(b.index, b.kind, side);
            let sides = [(&allow, RuleSide::Allow), (&deny, RuleSide::Deny)];
            let stars: Vec<ValueError> = sides
                .iter()
                .flat_map(|(list, side)| misplaced_stars(b.kind, list, &values(*side), *side))
                .collect();
            if !stars.is_empty() {
                // Every misplaced "*", then every other value that would be
                // refused: the behavior is not programmed, so this is the
                // only place its values are looked at.
                errors.extend(stars.into_iter().map(EvaluateError::Star));
                for (list, side) in sides {
                    for (i, v) in list.iter().enumerate() {
                        if v == STAR {
                            continue;
                        }
                        if let Err(e) = check_value(b.kind, v, &values(side).index(i)) {
                            errors.push(EvaluateError::Value(e));
                        }
                    }
                }
                continue;
            }
            // "*" makes the behavior default deny; the explicit denies
            // beside it are kept (they win over any allow).
            let default_deny = deny.iter().any(|v| v == STAR);
            let mut deny = deny;
            deny.retain(|v| v != STAR);
            behaviors.push(EvaluatedBehavior {
                index: b.index,
                kind: b.kind,
                allow,
                deny,
                default_deny,
            });
        }
        let cost = run.budget.borrow().spent();
        Partial {
            result: EvaluationResult { behaviors },
            errors,
            cost,
        }
    }
}

/// One evaluation: the variables, each computed on first use and kept for
/// the rest of the evaluation (what `lazy.MapValue` does in the reference
/// implementation), and the budget every expression draws on.
struct Evaluation<'p, 'c> {
    policy: &'p CompiledPolicy,
    ctx: &'p Context<'c>,
    data: &'p DataSet,
    memo: RefCell<HashMap<String, Result<Value, EvaluateError>>>,
    budget: RefCell<Budget>,
}

impl Evaluation<'_, '_> {
    fn spent(&self) -> bool {
        let b = self.budget.borrow();
        b.spent() > b.limit()
    }

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
        let path = FieldPath::spec()
            .field("variables")
            .index(i)
            .field("expression")
            .as_str()
            .to_string();
        let result = self.run(&var.expr, &path);
        self.memo
            .borrow_mut()
            .insert(name.to_string(), result.clone());
        Some(result)
    }

    /// Runs an expression: its names bound (the variables it uses, the data
    /// it reads), charged to the evaluation's budget.
    fn run(&self, expr: &CompiledExpr, path: &str) -> Result<Value, EvaluateError> {
        let mut globals = Vec::with_capacity(expr.program.globals().len());
        for g in expr.program.globals() {
            if g == "variables" {
                let mut map = HashMap::new();
                for name in &expr.uses {
                    // A name that is not a variable was refused by the
                    // checker (or is a comprehension variable's field).
                    if let Some(v) = self.get(name) {
                        map.insert(Key::String(Arc::new(name.clone())), v?);
                    }
                }
                globals.push(Some(Value::Map(Map { map: Arc::new(map) })));
            } else if let Some(i) = g
                .strip_prefix("@data")
                .and_then(|i| i.parse::<usize>().ok())
            {
                let Some(source) = self.policy.sources.sources.get(i) else {
                    globals.push(None);
                    continue;
                };
                match self.data.get(source) {
                    None => {
                        return Err(EvaluateError::NeedsData {
                            path: path.to_string(),
                            call: Box::new(source.clone()),
                        })
                    }
                    Some(Err(error)) => {
                        return Err(EvaluateError::Data {
                            path: path.to_string(),
                            call: Box::new(source.clone()),
                            error: error.clone(),
                        })
                    }
                    Some(Ok(v)) => globals.push(Some(v.clone())),
                }
            } else {
                globals.push(None);
            }
        }
        let mut budget = self.budget.borrow_mut();
        expr.program
            .run(&globals, self.ctx, &mut budget)
            .map_err(|error| EvaluateError::Expression {
                path: path.to_string(),
                error,
            })
    }

    /// A rule's literal values followed by its expression's strings, each
    /// value once.
    fn rule(&self, rule: &CompiledRule, at: &FieldPath) -> Result<Vec<String>, EvaluateError> {
        let mut out: Vec<String> = Vec::new();
        let mut seen = BTreeSet::new();
        let mut push = |s: &str, out: &mut Vec<String>| {
            if seen.insert(s.to_string()) {
                out.push(s.to_string());
            }
        };
        for l in &rule.literals {
            push(l, &mut out);
        }
        let Some(expr) = &rule.expression else {
            return Ok(out);
        };
        let path = at.field("expression").as_str().to_string();
        let value = self.run(expr, &path)?;
        let Value::List(items) = value else {
            return Err(EvaluateError::NotAListOfStrings { path });
        };
        for item in items.iter() {
            match item {
                Value::String(s) => push(s, &mut out),
                _ => return Err(EvaluateError::NotAListOfStrings { path }),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
