//! The errors of a Report write.

/// Why a pod's Report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request (or could not be reached).
    #[error("Report {namespace}/{name}: {source}")]
    Api {
        /// The Report's namespace (the pod's).
        namespace: String,
        /// The Report's name.
        name: String,
        /// What the client reported.
        source: kube::Error,
    },
    /// The Report is about another pod of the same name, and the pod the
    /// findings are about is not the live one: a late write for a pod that
    /// was replaced (a StatefulSet's pod recreated under its name) never
    /// takes the live pod's Report. Its findings have no Report to go to.
    #[error(
        "Report {namespace}/{name} is pod {current}'s; pod {uid} is not the live pod of that name"
    )]
    Superseded {
        /// The Report's namespace (the pod's).
        namespace: String,
        /// The Report's name.
        name: String,
        /// The uid of the pod the findings are about.
        uid: String,
        /// The uid of the pod the Report is about.
        current: String,
    },
    /// Every attempt lost a write race to another writer.
    #[error("Report {namespace}/{name}: still conflicting after {attempts} attempts")]
    Conflicts {
        /// The Report's namespace (the pod's).
        namespace: String,
        /// The Report's name.
        name: String,
        /// How many writes were tried.
        attempts: u32,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short stable name for metric labels and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Conflicts { .. } => "conflicts",
            Error::Superseded { .. } => "superseded",
        }
    }

    /// Whether the same write may succeed later, so the findings are kept
    /// for the next flush: conflicts, throttling, server errors and
    /// transport failures. A refusal that repeating cannot change (the
    /// namespace is gone or terminating, the object is invalid, the daemon
    /// is not allowed to write it) is not: retrying it every flush would
    /// only hold memory and load the API server for findings that cannot
    /// land, so they are dropped and counted instead.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Conflicts { .. } => true,
            Error::Api { source, .. } => is_retryable(source),
            Error::Superseded { .. } => false,
        }
    }
}

/// Whether a request that failed with `e` may succeed if repeated: not a
/// refusal that repeating cannot change (see [`Error::is_retryable`]).
pub(crate) fn is_retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => {
            !matches!(status.code, 400 | 403 | 404 | 405 | 410 | 413 | 415 | 422)
        }
        _ => true,
    }
}
