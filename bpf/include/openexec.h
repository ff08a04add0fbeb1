/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared by the open/exec objects (bpf/openexec/) and userspace.
 *
 * Rust reads these layouts from the skeleton's `types` module; it never
 * re-declares them.
 *
 * Model. Every RuntimePolicy with an open (exec) behavior on this node
 * holds one of KRT_OE_SLOTS slots of that dimension. Its state is bits, not
 * programs and not maps of its own:
 *
 *   oe_cgroups[cgid].slots[dim]   bit s set: slot s's policy selects the cgroup
 *   oe_<dim>_paths[path].deny     bit s set: slot s denies the path
 *   oe_<dim>_paths[path].allow    bit s set: slot s allows the path
 *   oe_config.default_deny[dim]   bit s set: slot s is default deny ("*")
 *   oe_config.observe[dim]        bit s set: slot s is a monitor-mode policy
 *
 * so the verdict over every policy bound to a cgroup is two lookups and
 * four ANDs, whatever the number of policies (the Go original walks an
 * array of per-policy maps: two 256-byte hash lookups per bound policy).
 *
 * oe_names holds the final component of every path that has a rule in
 * either dimension. Where no bound policy is default deny or observing, an
 * operation on a file whose name is not there cannot match any rule: it is
 * allowed without resolving the path (bpf_d_path is most of the cost).
 */
#ifndef KRT_OPENEXEC_H
#define KRT_OPENEXEC_H

#include "vmlinux.h"

/* Policy slots per dimension: one bit each in a __u64 mask. */
#define KRT_OE_SLOTS 64

/* A path key: the path as bpf_d_path resolves it, NUL-padded. */
#define KRT_OE_PATH_LEN 256

/* Longest policy id a slot records (userspace bookkeeping, NUL-padded). */
#define KRT_OE_OWNER_LEN 64

#define KRT_OE_MAX_CGROUPS 16384
#define KRT_OE_MAX_PATHS 131072
#define KRT_OE_MAX_OBSERVATIONS 16384
#define KRT_OE_MAX_PENDING 4096

/* A final path component as `oe_names` keys it, NUL-padded. */
#define KRT_OE_NAME_LEN 64

/* Bumped whenever a map layout or its meaning changes, so pinned maps of
 * another layout are never adopted. */
#define KRT_OE_LAYOUT_VERSION 2

/* Bytes of the `oe_denials` ring buffer: about 880 records. */
#define KRT_OE_DENIAL_RING_BYTES (256 * 1024)
/* Cgroups whose denial rate is tracked at once (an LRU: the least recently
 * refused cgroup's window is forgotten, which only resets its budget). */
#define KRT_OE_MAX_RATED 4096
#define KRT_OE_COMM_LEN 16

enum krt_oe_dim {
	KRT_OE_OPEN = 0,
	KRT_OE_EXEC = 1,
	KRT_OE_DIMS = 2,
};

enum krt_oe_decision {
	/* An explicit deny of a bound policy matched: refused. */
	KRT_OE_DENIED = 0,
	/* An explicit allow matched, no deny did: allowed. */
	KRT_OE_ALLOWED = 1,
	/* Nothing matched; a bound policy is default deny: refused. */
	KRT_OE_DEFAULT_DENIED = 2,
	/* Nothing matched, no default deny: allowed. */
	KRT_OE_UNMATCHED = 3,
	KRT_OE_DECISIONS = 4,
};

/* Value of `oe_cgroups`, keyed by the __u64 cgroup id. */
struct krt_oe_cgroup {
	__u64 slots[KRT_OE_DIMS];
};

/* Value of `oe_open_paths` and `oe_exec_paths`, keyed by char[KRT_OE_PATH_LEN]. */
struct krt_oe_rule {
	__u64 deny;
	__u64 allow;
};

/* The one entry of `oe_config`. */
struct krt_oe_config {
	__u64 default_deny[KRT_OE_DIMS];
	__u64 observe[KRT_OE_DIMS];
	/* KRT_OE_LAYOUT_VERSION once userspace has initialised the maps. */
	__u32 layout_version;
	/* Per-occurrence denial records each cgroup may send per second; 0
	 * sends none (every refusal is then only counted). */
	__u32 denials_per_sec;
};

/* The one entry of `oe_pod_fallback`: whether a task in an unbound
 * cgroup is decided by its parent's binding (its pod's directory), and how
 * many decisions were taken that way. */
struct krt_oe_pod_fallback {
	__u32 on;
	__u32 _pad;
	__u64 hits;
};

/* Entry of `oe_owners` (index dim * KRT_OE_SLOTS + slot): which policy
 * holds a slot. Never read by the programs; pinned with the other maps so
 * a restarted daemon can adopt the slots. An all-zero id is a free slot. */
struct krt_oe_owner {
	char policy[KRT_OE_OWNER_LEN];
};

/* Key of `oe_observations` and the per-CPU scratch the path is resolved into
 * (so the path is written once and used as both keys). */
struct krt_oe_event {
	__u64 cgroup;
	__u32 dim;
	__u32 decision;
	char path[KRT_OE_PATH_LEN];
};

/* Value of `oe_pending` (fmod_ret): an exec decided at open time. */
struct krt_oe_pending {
	struct krt_oe_event ev;
	__u64 selected;
	__u32 resolved;
	__u32 _pad;
};

/* Per-CPU outcome counters (the one entry of `oe_stats`), cumulative. */
struct krt_oe_stats {
	/* Decisions on resolved paths of bound cgroups. */
	__u64 decisions[KRT_OE_DIMS][KRT_OE_DECISIONS];
	/* bpf_d_path failed or the path is longer than the key: allowed... */
	__u64 unresolved_passed[KRT_OE_DIMS];
	/* ...or refused, because a bound policy is default deny. */
	__u64 unresolved_denied[KRT_OE_DIMS];
	/* An observation the full map could not count. */
	__u64 observe_failed;
	/* Refusals sent as a per-occurrence record (`oe_denials`); every other
	 * refusal is counted in `oe_observations` instead, so each refusal is
	 * reported exactly once. */
	__u64 denials_sent;
	/* Refusals not sent as a record because their cgroup had used its
	 * budget for the second (counted in `oe_observations`). */
	__u64 denials_rate_limited;
	/* ... or because the ring buffer was full (counted likewise). */
	__u64 denials_ringbuf_full;
};

/* One refused operation, sent to the `oe_denials` ring buffer by the
 * program that refused it: what (`ev`: cgroup, dimension, decision, path;
 * the path is empty when it could not be resolved) and who (pid, comm of
 * the refused task). Zeroed before it is filled. */
struct krt_oe_denial {
	struct krt_oe_event ev;
	/* Thread-group id of the refused task. */
	__u32 pid;
	__u32 _pad;
	char comm[KRT_OE_COMM_LEN];
};

/*
 * Value of `oe_exec_resolved`, keyed by the exec's struct linux_binprm
 * address: the paths the exec dimension decided for one exec of a cgroup a
 * monitor policy observes, as bpf_d_path resolved them (the binary, then a
 * script's interpreter), so the exec tracer, which may not call bpf_d_path,
 * reports the same paths the enforcing programs judge. `tgid` and `at` let
 * the tracer refuse an entry a failed exec left behind.
 */
#define KRT_OE_MAX_RESOLVED 1024
struct krt_oe_resolved {
	/* The binary, then a script's interpreter (two fields, not a 2-D
	 * array: the skeleton generator cannot derive Default for one). */
	char binary[KRT_OE_PATH_LEN];
	char interpreter[KRT_OE_PATH_LEN];
	__u64 at;
	__u32 tgid;
	/* Paths filled: 1 or 2. */
	__u32 count;
};

/* Value of `oe_denial_rate`, keyed by cgroup id: how many records the
 * cgroup sent in the current one-second window. */
struct krt_oe_rate {
	__u64 window;
	__u64 sent;
};

#endif /* KRT_OPENEXEC_H */
