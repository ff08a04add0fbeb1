//! x
#[allow(missing_docs)]
pub mod wire {
    tonic::include_proto!("kyverno_runtime.push.v1");
}
