//! The Kubernetes API of kyverno-runtime.
//!
//! - [`runtimepolicy`]: `RuntimePolicy` (`runtime.nirmata.io/v1alpha1`,
//!   cluster-scoped, short name `rpol`), field for field as the Go
//!   original, with admission-time validation that goes further than it.
//! - [`openreports`]: the OpenReports `Report` and `ClusterReport` types
//!   (`openreports.io/v1alpha1`) the reporter writes.
//! - [`crd`]: the CRD manifests generated from those types, as committed
//!   under `charts/kyverno-runtime/crds/`.

pub mod crd;
pub mod openreports;
pub mod runtimepolicy;
