//! Data sources: `resource.get`, `resource.list` and `http.get`.
//!
//! A policy does not reach the cluster or the network while it is
//! evaluated. When it compiles, every call to one of these functions is
//! found in its expressions and its arguments are computed ([`find`]); the
//! daemon fetches each distinct [`DataSource`] asynchronously before an
//! evaluation (on a spec change and on every `evaluationInterval`), and the
//! results, a [`DataSet`], are bound where the calls stood. `policy check
//! --data FILE` reads a [`DataFile`] instead.
//!
//! Supported shapes: the arguments of a call must be known before the
//! expression runs: string literals, any expression over literals
//! (`'https://lists.example/' + 'egress.json'`), and expressions reading
//! `variables.<name>` of variables that use no data source themselves
//! (`resource.get('v1', 'configmaps', variables.ns[0], 'allow')`). An
//! argument reading a macro's variable (`names.map(n, resource.get(..., n))`)
//! or another data source's result is refused when the policy compiles,
//! naming the field and the argument.
//!
//! Result shapes, as the Kyverno SDK has them:
//! - `resource.get(apiVersion, resource, namespace, name)`: the object
//!   (a map, integers as `int`), or `null` when it does not exist;
//! - `resource.list(apiVersion, resource, namespace)`: the list object
//!   (`apiVersion`, `kind`, `metadata`, `items`); namespace `""` lists
//!   every namespace;
//! - `http.get(url)`: `{"statusCode": int, "body": dyn}`, the body decoded
//!   as JSON (numbers as `double`, as `json.unmarshal` has them), `null`
//!   when it is not JSON. Redirects are not followed.
//!
//! `resource` is the lowercase plural resource name as in a URL path
//! (`configmaps`), and `apiVersion` is `v1` or `group/version`.

use crate::cel::eval::json_to_value;
use ::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use ::cel::objects::{Key, Map};
use ::cel::Value;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Most distinct data sources one policy may read.
pub const MAX_SOURCES: usize = 16;
/// Longest one fetch may take (connect, request and body).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body read (larger ones fail the fetch).
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Most items `resource.list` returns (a longer list fails the fetch
/// rather than being cut short).
pub const MAX_LIST_ITEMS: usize = 5000;

/// One data source a policy reads: a call and its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataSource {
    /// `resource.get(apiVersion, resource, namespace, name)`.
    ResourceGet {
        /// `v1` or `group/version`.
        api_version: String,
        /// The plural resource name.
        resource: String,
        /// The namespace (`""`: cluster-scoped).
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// `resource.list(apiVersion, resource, namespace)`.
    ResourceList {
        /// `v1` or `group/version`.
        api_version: String,
        /// The plural resource name.
        resource: String,
        /// The namespace (`""`: every namespace, or cluster-scoped).
        namespace: String,
    },
    /// `http.get(url)`.
    HttpGet {
        /// The URL.
        url: String,
    },
}

impl fmt::Display for DataSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSource::ResourceGet {
                api_version,
                resource,
                namespace,
                name,
            } => write!(
                f,
                "resource.get({api_version:?}, {resource:?}, {namespace:?}, {name:?})"
            ),
            DataSource::ResourceList {
                api_version,
                resource,
                namespace,
            } => write!(
                f,
                "resource.list({api_version:?}, {resource:?}, {namespace:?})"
            ),
            DataSource::HttpGet { url } => write!(f, "http.get({url:?})"),
        }
    }
}

impl DataSource {
    /// The API group and version of a resource source.
    pub fn group_version(&self) -> Option<(&str, &str)> {
        let api_version = match self {
            DataSource::ResourceGet { api_version, .. }
            | DataSource::ResourceList { api_version, .. } => api_version,
            DataSource::HttpGet { .. } => return None,
        };
        Some(match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version.as_str()),
        })
    }
}

/// Which data-source function a call is, if it is one.
fn source_function(e: &IdedExpr) -> Option<(&'static str, &[IdedExpr])> {
    let Expr::Call(c) = &e.expr else { return None };
    let Expr::Ident(ns) = &c.target.as_deref()?.expr else {
        return None;
    };
    let name = match (ns.as_str(), c.func_name.as_str(), c.args.len()) {
        ("resource", "get", 4) => "resource.get",
        ("resource", "list", 3) => "resource.list",
        ("http", "get", 1) => "http.get",
        _ => return None,
    };
    Some((name, &c.args))
}

/// A data-source call in an expression, its arguments not yet computed.
#[derive(Clone, Debug)]
pub(crate) struct Call<'a> {
    /// The call node's id (its result is bound under it).
    pub(crate) id: u64,
    /// `resource.get`, `resource.list` or `http.get`.
    pub(crate) function: &'static str,
    /// Its arguments as written.
    pub(crate) args: &'a [IdedExpr],
    /// Names of comprehension variables in scope at the call.
    pub(crate) locals: Vec<String>,
}

/// Every data-source call in `e` (outermost first), with the macro
/// variables in scope at each.
pub(crate) fn calls(e: &IdedExpr) -> Vec<Call<'_>> {
    fn walk<'a>(e: &'a IdedExpr, locals: &mut Vec<String>, out: &mut Vec<Call<'a>>) {
        if let Some((function, args)) = source_function(e) {
            out.push(Call {
                id: e.id,
                function,
                args,
                locals: locals.clone(),
            });
        }
        match &e.expr {
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    walk(t, locals, out);
                }
                for a in &c.args {
                    walk(a, locals, out);
                }
            }
            Expr::Select(s) => walk(&s.operand, locals, out),
            Expr::List(l) => {
                for x in &l.elements {
                    walk(x, locals, out);
                }
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        walk(&me.key, locals, out);
                        walk(&me.value, locals, out);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            walk(&me.key, locals, out);
                            walk(&me.value, locals, out);
                        }
                        EntryExpr::StructField(f) => walk(&f.value, locals, out),
                    }
                }
            }
            Expr::Comprehension(c) => {
                walk(&c.iter_range, locals, out);
                walk(&c.accu_init, locals, out);
                let depth = locals.len();
                locals.push(c.accu_var.clone());
                locals.push(c.iter_var.clone());
                locals.extend(c.iter_var2.clone());
                walk(&c.loop_cond, locals, out);
                walk(&c.loop_step, locals, out);
                locals.truncate(depth + 1);
                walk(&c.result, locals, out);
                locals.truncate(depth);
            }
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    let mut out = Vec::new();
    walk(e, &mut Vec::new(), &mut out);
    out
}

/// What keeps an argument from being computed before evaluation, if
/// anything: a macro variable, a data-source call, or a name other than
/// `variables` (`variables` itself is checked by the caller, which knows
/// which variables use data).
pub(crate) fn not_constant(arg: &IdedExpr, locals: &[String]) -> Option<String> {
    let mut stack = vec![arg];
    while let Some(e) = stack.pop() {
        if let Some((f, _)) = source_function(e) {
            return Some(format!("it reads another data source ({f})"));
        }
        match &e.expr {
            Expr::Ident(n) => {
                if locals.contains(n) {
                    return Some(format!("it uses the macro variable {n}"));
                }
            }
            Expr::Call(c) => {
                stack.extend(c.target.as_deref());
                stack.extend(c.args.iter());
            }
            Expr::Select(s) => stack.push(&s.operand),
            Expr::List(l) => stack.extend(l.elements.iter()),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        stack.push(&me.key);
                        stack.push(&me.value);
                    }
                }
            }
            Expr::Comprehension(c) => {
                // A macro over constants is constant; its own variables
                // are in scope inside it.
                let mut inner: Vec<String> = locals.to_vec();
                inner.push(c.accu_var.clone());
                inner.push(c.iter_var.clone());
                inner.extend(c.iter_var2.clone());
                for part in [&c.iter_range, &c.accu_init] {
                    if let Some(why) = not_constant(part, locals) {
                        return Some(why);
                    }
                }
                for part in [&c.loop_cond, &c.loop_step, &c.result] {
                    if let Some(why) = not_constant_except(part, locals, &inner) {
                        return Some(why);
                    }
                }
            }
            Expr::Literal(_) | Expr::Struct(_) | Expr::Unspecified => {}
        }
    }
    None
}

/// [`not_constant`] where the names in `own` (a macro's own variables)
/// are allowed even though they shadow `outer` ones.
fn not_constant_except(e: &IdedExpr, outer: &[String], own: &[String]) -> Option<String> {
    let outer_only: Vec<String> = outer
        .iter()
        .filter(|n| !own[outer.len()..].contains(n))
        .cloned()
        .collect();
    not_constant(e, &outer_only)
}

/// Whether `e` is a string literal (for messages that quote a value).
pub(crate) fn literal_string(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// Builds the source a call names from its computed arguments, or says
/// which argument is unusable.
pub(crate) fn source(function: &str, args: &[String]) -> Result<DataSource, String> {
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    match function {
        "http.get" => {
            let url = arg(0);
            check_url(&url)?;
            Ok(DataSource::HttpGet { url })
        }
        "resource.get" | "resource.list" => {
            let (api_version, resource, namespace) = (arg(0), arg(1), arg(2));
            check_api_version(&api_version)?;
            if !is_dns_label(&resource) {
                return Err(format!(
                    "resource {resource:?} must be the lowercase plural name of the resource as in a URL path (for example \"configmaps\")"
                ));
            }
            if !namespace.is_empty() && !is_dns_label(&namespace) {
                return Err(format!(
                    "namespace {namespace:?} is not a namespace name (use \"\" for a cluster-scoped resource)"
                ));
            }
            if function == "resource.list" {
                return Ok(DataSource::ResourceList {
                    api_version,
                    resource,
                    namespace,
                });
            }
            let name = arg(3);
            if !is_object_name(&name) {
                return Err(format!(
                    "name {name:?} is not an object name (lowercase letters, digits, '-', '.' \
                     and ':', at most 253, starting and ending with a letter or digit): it \
                     goes into the request path"
                ));
            }
            Ok(DataSource::ResourceGet {
                api_version,
                resource,
                namespace,
                name,
            })
        }
        other => Err(format!("{other} is not a data source")),
    }
}

/// A DNS-1123 subdomain (what most objects are named), or with `:` as
/// RBAC objects' names have (`system:node`). Nothing that could change the
/// request the name is put into: no `/`, `?`, `#`, `%` (an escape), space
/// or `..`.
fn is_object_name(s: &str) -> bool {
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b':')
        })
        && edge(s.bytes().next())
        && edge(s.bytes().last())
        && !s.contains("..")
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn check_api_version(v: &str) -> Result<(), String> {
    let version_ok = |v: &str| is_dns_label(v) && v.starts_with('v');
    let ok = match v.split_once('/') {
        None => version_ok(v),
        Some((group, version)) => {
            !group.is_empty()
                && group.len() <= 253
                && group.split('.').all(is_dns_label)
                && version_ok(version)
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "apiVersion {v:?} is not \"version\" or \"group/version\" (for example \"v1\" or \"apps/v1\")"
        ))
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(h) if !h.is_empty() && !url.chars().any(char::is_whitespace) && url.len() <= 2048 => {
            Ok(())
        }
        _ => Err(format!(
            "url {url:?} is not an absolute http:// or https:// URL with a host"
        )),
    }
}

/// What a fetch of a source gave: its value, or why there is none.
pub type Fetched = Result<Value, String>;

/// Fetched data, by source: what an evaluation binds where the calls
/// stood.
#[derive(Clone, Debug, Default)]
pub struct DataSet {
    results: HashMap<DataSource, Fetched>,
}

impl DataSet {
    /// No data.
    pub fn new() -> Self {
        DataSet::default()
    }

    /// Records what fetching `source` gave.
    pub fn insert(&mut self, source: DataSource, fetched: Fetched) {
        self.results.insert(source, fetched);
    }

    /// What fetching `source` gave, if it was fetched.
    pub fn get(&self, source: &DataSource) -> Option<&Fetched> {
        self.results.get(source)
    }

    /// How many sources it holds.
    pub fn len(&self) -> usize {
        self.results.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }
}

/// A Kubernetes object (or list) as a CEL value, as the Kyverno SDK hands
/// it over: integers stay `int` (unstructured JSON keeps them as int64),
/// other numbers are `double`.
pub fn object_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::Array(xs) => {
            Value::List(Arc::new(xs.iter().map(object_value).collect()))
        }
        serde_json::Value::Object(m) => {
            let map: HashMap<Key, Value> = m
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), object_value(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
        other => json_to_value(other),
    }
}

/// An HTTP response as `http.get` returns it: `{"statusCode": int,
/// "body": dyn}`, the body decoded as JSON (`null` if it is not JSON).
pub fn http_value(status: u16, body: &[u8]) -> Value {
    let body = serde_json::from_slice::<serde_json::Value>(body)
        .map(|j| json_to_value(&j))
        .unwrap_or(Value::Null);
    http_response(i64::from(status), body)
}

fn http_response(status: i64, body: Value) -> Value {
    let map: HashMap<Key, Value> = [
        (
            Key::String(Arc::new("statusCode".into())),
            Value::Int(status),
        ),
        (Key::String(Arc::new("body".into())), body),
    ]
    .into_iter()
    .collect();
    Value::Map(Map { map: Arc::new(map) })
}

/// A `resource.list` result from its items (what `policy check --data`
/// reads): a list object of kind `List`.
pub fn list_value(api_version: &str, items: &[serde_json::Value]) -> Value {
    object_value(&serde_json::json!({
        "apiVersion": api_version,
        "kind": "List",
        "metadata": {},
        "items": items,
    }))
}

/// Offline data for `policy check --data FILE` (YAML or JSON): what each
/// data source would return.
///
/// ```yaml
/// resources:
///   - apiVersion: v1          # resource.get: with a name
///     resource: configmaps
///     namespace: default
///     name: egress-allow
///     object: {data: {hosts: "a.example.com,b.example.com"}}   # omitted or null: not found
///   - apiVersion: v1          # resource.list: without one
///     resource: configmaps
///     namespace: default
///     items: [{metadata: {name: a}}]
/// http:
///   - url: https://lists.example/egress.json
///     statusCode: 200         # the default
///     body: {cidrs: ["10.1.0.0/16"]}
///   - url: https://lists.example/down.json
///     error: connection refused   # a failed fetch
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFile {
    /// `resource.get` and `resource.list` results.
    #[serde(default)]
    pub resources: Vec<ResourceEntry>,
    /// `http.get` results.
    #[serde(default)]
    pub http: Vec<HttpEntry>,
}

/// One resource result of a [`DataFile`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourceEntry {
    /// `v1` or `group/version`.
    pub api_version: String,
    /// The plural resource name.
    pub resource: String,
    /// The namespace (`""` when omitted).
    #[serde(default)]
    pub namespace: String,
    /// The object's name: a `resource.get` result; without it, a
    /// `resource.list` result.
    #[serde(default)]
    pub name: Option<String>,
    /// The object `resource.get` returns (omitted or null: not found).
    #[serde(default)]
    pub object: Option<serde_json::Value>,
    /// The items `resource.list` returns.
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
    /// The fetch fails with this message instead.
    #[serde(default)]
    pub error: Option<String>,
}

/// One `http.get` result of a [`DataFile`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpEntry {
    /// The URL.
    pub url: String,
    /// The status code (200 when omitted).
    #[serde(default = "ok")]
    pub status_code: u16,
    /// The decoded body.
    #[serde(default)]
    pub body: serde_json::Value,
    /// The fetch fails with this message instead.
    #[serde(default)]
    pub error: Option<String>,
}

fn ok() -> u16 {
    200
}

impl From<&DataFile> for DataSet {
    fn from(file: &DataFile) -> Self {
        let mut set = DataSet::new();
        for r in &file.resources {
            let (source, value) = match &r.name {
                Some(name) => (
                    DataSource::ResourceGet {
                        api_version: r.api_version.clone(),
                        resource: r.resource.clone(),
                        namespace: r.namespace.clone(),
                        name: name.clone(),
                    },
                    r.object.as_ref().map_or(Value::Null, object_value),
                ),
                None => (
                    DataSource::ResourceList {
                        api_version: r.api_version.clone(),
                        resource: r.resource.clone(),
                        namespace: r.namespace.clone(),
                    },
                    list_value(&r.api_version, &r.items),
                ),
            };
            set.insert(source, r.error.clone().map_or(Ok(value), Err));
        }
        for h in &file.http {
            let value = http_response(i64::from(h.status_code), json_to_value(&h.body));
            set.insert(
                DataSource::HttpGet { url: h.url.clone() },
                h.error.clone().map_or(Ok(value), Err),
            );
        }
        set
    }
}

/// The sources of a compiled policy and where each is read, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceUses {
    /// Each distinct source, in the order first read.
    pub sources: Vec<DataSource>,
    /// The expression fields reading each (by index into `sources`).
    pub paths: BTreeMap<usize, Vec<String>>,
}
