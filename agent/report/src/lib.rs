//! Findings, the redaction chokepoint, and the reporter that writes them as
//! OpenReports Reports.
//!
//! The monitor turns observations into [`Finding`]s: one policy, one
//! behavior, one pod, one target, whether the kernel refused it or monitor
//! mode would have, and how many times between two instants. This crate is
//! where findings leave the daemon:
//!
//! - [`sanitize`] and [`Finding::redact`] are the **redaction chokepoint**.
//!   Secret material must be structurally unable to reach a Report, a log
//!   line or the wire: a `Finding` is a closed struct of typed scalars (no
//!   label map, no free-form properties), `redact` passes every string
//!   field through `sanitize`, field by field from an exhaustive
//!   destructuring (a new field does not compile until it is decided), and
//!   a finding's `Debug` is its redaction. There is no option that weakens
//!   it; adding one is a reason to reject the change. Every other sink
//!   (the push stream, Kubernetes Events) sends `finding.redact()`.
//! - [`report_result`] builds a result from a finding's redaction with a
//!   closed set of property keys ([`property::ALL`]). Pod labels are never
//!   emitted.
//! - [`Reporter`] buffers findings by [`Fingerprint`] and flushes every
//!   10 s into one namespaced Report per pod, named by [`report_name`],
//!   owned by the pod (so it goes with it), merged with what is stored
//!   (counts add, the window widens), capped at 500 results with
//!   [`TRUNCATED_ANNOTATION`] counting what was cut, and not written at
//!   all when nothing changed. It flushes once more on shutdown, on its
//!   own deadline.
//! - **Controller roll-up** (Kyverno's autogen idea): a finding from a pod
//!   whose controller chain verifies through the API goes instead to one
//!   Report per controller ([`controller_report_name`], owned by the
//!   controller), whose results add up every pod's counts and list the
//!   pods they were seen on, when the policy's [`AUTOGEN_ANNOTATION`]
//!   ([`Autogen`]) allows that [`ControllerKind`]. A pod claiming an owner
//!   it does not have keeps its findings, marked
//!   [`property::OWNER_VERIFIED`] `false`. A deleted policy's results are
//!   removed from the Reports holding them.

mod autogen;
mod buffer;
mod error;
mod finding;
mod merge;
mod name;
mod owners;
mod policies;
mod reporter;
mod result;
mod sanitize;

pub use autogen::{Autogen, ControllerKind, AUTOGEN_ANNOTATION};
pub use error::{Error, Result};
pub use finding::{Behavior, Decision, Finding, Fingerprint, PodIdentity, Process};
pub use merge::{
    policy_label, MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL_PREFIX, TRUNCATED_ANNOTATION,
};
pub use name::{controller_report_name, report_name, MAX_REPORT_NAME_LEN, REPORT_NAME_PREFIX};
pub use reporter::{
    DropHook, DropReason, FlushHook, Flushed, PodOutcome, Reporter, ReporterHandle,
    ReporterOptions, WriteErrorHook, WriteHook, WriteResult,
};
pub use result::{outcome, pod_reference, property, report_result, MAX_PODS_LISTED, SOURCE};
/// The redaction table ([`redaction_cases::CASES`]): the secrets people
/// pass in argv and what each must read as, shared by the tests of every
/// output path (the `redaction-cases` feature).
#[cfg(any(test, feature = "redaction-cases"))]
pub use sanitize::cases as redaction_cases;
/// A finding for other crates' tests (the `fixtures` feature).
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub use sanitize::{sanitize, sanitize_argv, sanitize_with_argv, MASK, MAX_CHARS, PRE_CUT_CHARS};

#[cfg(test)]
mod chokepoint_tests;
