//! What a Pod's status says about its containers: runtime and id, and
//! whether a running instance exists.

use crate::resolve::UnresolvedReason;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// The container runtime a `containerID` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// `containerd://`: containerd's CRI plugin.
    Containerd,
    /// `cri-o://`: CRI-O.
    CriO,
    /// `docker://`: dockershim or cri-dockerd.
    Docker,
}

/// Splits a `containerID` into its runtime and bare id.
///
/// All three runtimes generate ids of 64 lowercase hex digits for
/// Kubernetes. Anything else is either a runtime this crate does not know
/// or a status written by someone else, and since the id becomes part of a
/// path, it is refused rather than joined (no `/` or `..` can slip through).
pub(crate) fn parse_container_id(raw: &str) -> Result<(Runtime, &str), UnresolvedReason> {
    let (scheme, id) = raw
        .split_once("://")
        .ok_or(UnresolvedReason::MalformedContainerId)?;
    let runtime = match scheme {
        "containerd" => Runtime::Containerd,
        "cri-o" => Runtime::CriO,
        "docker" => Runtime::Docker,
        other => {
            return Err(UnresolvedReason::UnknownRuntime {
                scheme: other.to_string(),
            })
        }
    };
    let hex = id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if hex {
        Ok((runtime, id))
    } else {
        Err(UnresolvedReason::MalformedContainerId)
    }
}

/// What a container status says about the container's current instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Running: its cgroup exists.
    Running,
    /// Created but not started, or waiting to restart: the id (if any) may
    /// name an instance that is not running, and the next start either keeps
    /// it (created) or replaces it (restart).
    Waiting,
    /// Exited (a finished init container, a crashed container): its cgroup
    /// has been removed.
    Terminated,
    /// The status carries no state; resolution is attempted.
    Unknown,
}

impl State {
    fn of(status: &ContainerStatus) -> Self {
        match &status.state {
            Some(s) if s.running.is_some() => State::Running,
            Some(s) if s.terminated.is_some() => State::Terminated,
            Some(s) if s.waiting.is_some() => State::Waiting,
            _ => State::Unknown,
        }
    }

    fn tag(self) -> char {
        match self {
            State::Running => 'r',
            State::Waiting => 'w',
            State::Terminated => 't',
            State::Unknown => '-',
        }
    }
}

/// One container of the pod, from any of the three status lists.
pub(crate) struct Entry<'a> {
    pub(crate) name: &'a str,
    /// The `containerID`, `None` when absent or empty (not created yet).
    pub(crate) container_id: Option<&'a str>,
    pub(crate) state: State,
}

/// Init, regular and ephemeral container statuses, in that order.
pub(crate) fn entries(pod: &Pod) -> Vec<Entry<'_>> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    [
        &status.init_container_statuses,
        &status.container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .map(|s| Entry {
        name: &s.name,
        container_id: s.container_id.as_deref().filter(|id| !id.is_empty()),
        state: State::of(s),
    })
    .collect()
}

/// A stable key of everything resolution depends on in the pod's status:
/// the UID and each container's (name, containerID, state class).
///
/// Resolution is retried when this key changes and only then: a miss comes
/// from the node's facts, and those do not change until a container is
/// created, started or replaced. The state class is part of the key because
/// a created container keeps its id when it starts (waiting -> running).
/// The key is order-independent (statuses are sorted by name) and every
/// part is length-prefixed, so distinct inputs never collide.
pub fn container_ids_key(pod: &Pod) -> String {
    let mut parts: Vec<(&str, &str, char)> = entries(pod)
        .iter()
        .map(|e| (e.name, e.container_id.unwrap_or(""), e.state.tag()))
        .collect();
    parts.sort_unstable();
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let mut key = format!("{}:{uid}", uid.len());
    for (name, id, state) in parts {
        key.push_str(&format!(";{}:{name}{}:{id}{state}", name.len(), id.len()));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "bc90dc47c2388afbc45421a41977ef17d637ea36aeb7c285baa3eeeeed783a44";

    #[test]
    fn container_ids() {
        for (scheme, runtime) in [
            ("containerd", Runtime::Containerd),
            ("cri-o", Runtime::CriO),
            ("docker", Runtime::Docker),
        ] {
            assert_eq!(
                parse_container_id(&format!("{scheme}://{HEX}")),
                Ok((runtime, HEX))
            );
        }
        assert_eq!(
            parse_container_id(&format!("rkt://{HEX}")),
            Err(UnresolvedReason::UnknownRuntime {
                scheme: "rkt".into()
            })
        );
        for bad in [
            HEX.to_string(),
            "containerd://".into(),
            "containerd://../../etc".into(),
            format!("containerd://{}", HEX.to_uppercase()),
            format!("containerd://{HEX}0"),
            format!("cri-o://{}/x", &HEX[..62]),
        ] {
            assert_eq!(
                parse_container_id(&bad),
                Err(UnresolvedReason::MalformedContainerId),
                "{bad}"
            );
        }
    }
}
