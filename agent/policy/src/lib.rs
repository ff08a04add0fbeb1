//! RuntimePolicy compilation.
//!
//! [`values`] holds the one parser per behavior kind that turns a
//! RuntimePolicy value string into a typed target, shared by the admission
//! agreement tests, the code that programs the kernel and the monitor-mode
//! matchers, so that what a value means is decided in exactly one place:
//!
//! | kind       | parser                      | target                     |
//! |------------|-----------------------------|----------------------------|
//! | `network`  | [`values::parse_network`]   | [`values::NetworkTarget`]  |
//! | `dns`      | [`values::parse_dns`]       | [`values::DnsPattern`]     |
//! | `protocol` | [`values::parse_protocol`]  | [`values::ProtocolTarget`] |
//! | `exec`, `open` | [`values::parse_path`]  | [`values::PathTarget`]     |
//!
//! Every parser takes the value and its [`values::FieldPath`] and fails with
//! a [`values::ValueError`] naming the path, the value and a typed
//! [`values::Reason`]. `"*"` parses as the `Any` target of every kind; where
//! it may stand is a property of the whole list, checked by
//! [`values::check_star`] (or both at once by [`values::parse_values`]).
//!
//! [`compile`] turns a RuntimePolicy spec into a [`compile::CompiledPolicy`]
//! (every expression type-checked, the selectors compiled) and evaluates it
//! into allow and deny lists per behavior.
//!
//! [`sources`] finds the data sources (`resource.get`, `resource.list`,
//! `http.get`) a policy reads and binds their prefetched results.
//!
//! [`admission`] answers, offline, what the API server answers to applying
//! a RuntimePolicy: the generated CRD's schema and validation rules,
//! interpreted generically, and the chart's admission policy.
//!
//! [`rule`] is the specification's decision rule (explicit deny > explicit
//! allow > default deny > allowed, unioned over policies) and the merge of
//! one policy's behaviors of a kind, used by every layer that decides.
//!
//! [`selector`] compiles a policy's `podSelector` and `namespaceSelector`
//! into the [`selector::PodTarget`] that decides which pods it applies to.

pub mod admission;
pub mod cel;
pub mod compile;
pub mod rule;
pub mod selector;
pub mod sources;
pub mod values;
