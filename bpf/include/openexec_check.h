/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The maps and the decision of the open/exec objects, shared by the
 * BPF-LSM object (lsm.bpf.c) and the fmod_ret object (fmod_ret.bpf.c) so
 * the two backends cannot decide differently. Each object includes it
 * once; userspace pins the maps by name (oe_*), so a restarted daemon adopts them
 * whichever object it loads.
 */
#ifndef KRT_OPENEXEC_CHECK_H
#define KRT_OPENEXEC_CHECK_H

#include "common.h"
#include "openexec.h"

#define KRT_EPERM 1
#define KRT_EEXIST 17

/* Which dimensions one hook invocation decides. */
#define KRT_OE_WANT_OPEN (1u << KRT_OE_OPEN)
#define KRT_OE_WANT_EXEC (1u << KRT_OE_EXEC)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_OE_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, struct krt_oe_cgroup);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} oe_cgroups SEC(".maps");

/* Written by userspace only, so not preallocated: 64 policies of 1000
 * paths cost what they hold, not the capacity. */
#define KRT_OE_PATH_MAP(name)                                                  \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, KRT_OE_MAX_PATHS);                         \
		__type(key, char[KRT_OE_PATH_LEN]);                            \
		__type(value, struct krt_oe_rule);                             \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
	} name SEC(".maps")

KRT_OE_PATH_MAP(oe_open_paths);
KRT_OE_PATH_MAP(oe_exec_paths);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_oe_config);
} oe_config SEC(".maps");

/*
 * The pod directory fallback (see krt_oe_pod_cgroup). Not pinned: every
 * load starts it off and the daemon says whether it is on.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_oe_pod_fallback);
} oe_pod_fallback SEC(".maps");

/* Final components of every path with a rule (see openexec.h). The value
 * is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_OE_MAX_PATHS);
	__type(key, char[KRT_OE_NAME_LEN]);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} oe_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, char[KRT_OE_NAME_LEN]);
} oe_name_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, KRT_OE_DIMS * KRT_OE_SLOTS);
	__type(key, __u32);
	__type(value, struct krt_oe_owner);
} oe_owners SEC(".maps");

/* Written from the hooks: preallocated, so counting never allocates. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_OE_MAX_OBSERVATIONS);
	__type(key, struct krt_oe_event);
	__type(value, __u64);
} oe_observations SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_oe_event);
} oe_scratch SEC(".maps");

/*
 * fmod_ret only: the exec decision made where a file is opened for
 * execution (the one place bpf_d_path is allowed), keyed by the struct
 * file, until security_bprm_check consumes it for bprm->file. A file
 * opened for execution that no bprm_check is ever made for (the ELF
 * interpreter, ld.so) is never consumed and ages out of the LRU, so, as on
 * BPF-LSM, only the binary and a script's interpreter are execs.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_OE_MAX_PENDING);
	__type(key, __u64);
	__type(value, struct krt_oe_pending);
} oe_pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_oe_pending);
} oe_pending_scratch SEC(".maps");

/* Per-occurrence refusal records (struct krt_oe_denial). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, KRT_OE_DENIAL_RING_BYTES);
} oe_denials SEC(".maps");

/* The per-cgroup budget of denial records (see krt_oe_report_denial). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_OE_MAX_RATED);
	__type(key, __u64);
	__type(value, struct krt_oe_rate);
} oe_denial_rate SEC(".maps");

/* Exec paths for the exec tracer (struct krt_oe_resolved). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_OE_MAX_RESOLVED);
	__type(key, __u64);
	__type(value, struct krt_oe_resolved);
} oe_exec_resolved SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_oe_resolved);
} oe_resolved_scratch SEC(".maps");

/*
 * Hands the path of one exec check to the exec tracer, for a cgroup a
 * monitor policy observes: the first check of an exec writes the binary,
 * a second (a script's interpreter) the next slot.
 */
static __always_inline void krt_oe_hand_to_tracer(__u64 bprm, const char *path)
{
	__u64 tgid = bpf_get_current_pid_tgid() >> 32;
	struct krt_oe_resolved *r;
	__u32 zero = 0;

	r = bpf_map_lookup_elem(&oe_exec_resolved, &bprm);
	if (r && r->tgid == tgid && r->count == 1) {
		__builtin_memcpy(r->interpreter, path, KRT_OE_PATH_LEN);
		r->count = 2;
		return;
	}
	r = bpf_map_lookup_elem(&oe_resolved_scratch, &zero);
	if (!r)
		return;
	__builtin_memcpy(r->binary, path, KRT_OE_PATH_LEN);
	__builtin_memset(r->interpreter, 0, KRT_OE_PATH_LEN);
	r->at = bpf_ktime_get_ns();
	r->tgid = tgid;
	r->count = 1;
	bpf_map_update_elem(&oe_exec_resolved, &bprm, r, BPF_ANY);
}

/* Anchors the record's layout in the object's BTF (a ring buffer map has
 * no value type), so the skeleton generates its Rust type. */
struct krt_oe_denial krt_oe_denial_btf_anchor = {};

/* Plain increments: per-CPU, and these programs run with migration
 * disabled, so no atomic (a locked add per open is measurable). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_oe_stats);
} oe_stats SEC(".maps");

/*
 * bpf_d_path moves the path to the start of the buffer but leaves what it
 * built at the end, so the bytes after the NUL are garbage. The path is a
 * hash key: zero them (in 8-byte words: 32 constant-index stores).
 */
static __always_inline void krt_oe_zero_tail(char *path, long len)
{
#pragma unroll
	for (int i = 0; i < KRT_OE_PATH_LEN / 8; i++) {
		__u64 *word = (__u64 *)(path + i * 8);
		long start = i * 8;

		if (start >= len)
			*word = 0;
		else if (start + 8 > len)
			*word &= ((__u64)1 << ((len - start) * 8)) - 1;
	}
}

static __always_inline void krt_oe_observe(struct krt_oe_event *ev, struct krt_oe_stats *st)
{
	__u64 one = 1, *count;

	count = bpf_map_lookup_elem(&oe_observations, ev);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return;
	}
	if (bpf_map_update_elem(&oe_observations, ev, &one, BPF_NOEXIST) == 0)
		return;
	/* Another CPU created it meanwhile, or the map is full. */
	count = bpf_map_lookup_elem(&oe_observations, ev);
	if (count)
		__sync_fetch_and_add(count, 1);
	else
		st->observe_failed++;
}

/* What one hook invocation resolved: the cgroup's masks, the path. */
struct krt_oe_ctx {
	__u64 selected[KRT_OE_DIMS];
	struct krt_oe_config *cfg;
	struct krt_oe_stats *st;
	struct krt_oe_event *ev;
	/* The path is in ev->path, NUL-padded (else it could not be resolved:
	 * bpf_d_path failed or it is longer than the key). */
	int resolved;
};

/*
 * Whether the decision is "unmatched" for every selected dimension without
 * resolving the path: no bound policy is default deny or observing (both
 * need the path: the allow list, the finding), and the file's name is the
 * final component of no rule's path. A name too long for the key, one
 * that cannot be read, or a mount root takes the full path.
 */
static __always_inline int krt_oe_unmatched_by_name(struct file *file, struct krt_oe_ctx *c)
{
	__u32 zero = 0;
	const unsigned char *name;
	struct dentry *dentry;
	__u64 *word;
	char *buf;
	__u32 len;

#pragma unroll
	for (int d = 0; d < KRT_OE_DIMS; d++)
		if ((c->cfg->default_deny[d] | c->cfg->observe[d]) & c->selected[d])
			return 0;
	buf = bpf_map_lookup_elem(&oe_name_scratch, &zero);
	if (!buf)
		return 0;
	/* The root of a mount (a file bind-mounted over another, as the
	 * kubelet mounts /etc/hosts and subPath volumes) is named by its
	 * mountpoint in the path, not by its own dentry: resolve it. */
	/* Direct loads through the hook's BTF pointers (CO-RE relocated by
	 * vmlinux.h's preserve_access_index): no helper call per field. */
	dentry = file->f_path.dentry;
	if (!dentry || dentry == file->f_path.mnt->mnt_root)
		return 0;
	len = dentry->d_name.len;
	name = dentry->d_name.name;
	if (len == 0 || len >= KRT_OE_NAME_LEN)
		return 0;
#pragma unroll
	for (int i = 0; i < KRT_OE_NAME_LEN / 8; i++) {
		word = (__u64 *)(buf + i * 8);
		*word = 0;
	}
	if (bpf_probe_read_kernel(buf, len & (KRT_OE_NAME_LEN - 1), name))
		return 0;
	return bpf_map_lookup_elem(&oe_names, buf) == 0;
}

/*
 * Looks the current cgroup up and, when a policy of a dimension in `want`
 * selects it, resolves the path. Returns 0 when there is nothing to decide:
 * a cgroup no such policy selects pays this one lookup, and its path is
 * never resolved.
 */
/*
 * Cgroups the fallback never decides for, though their parent is bound:
 * pod sandboxes (the pause process lives in a child of the pod's
 * directory too, and a policy of the pod's must never refuse it its
 * program). Written by userspace before it binds the pod's directory; not
 * pinned. The value is unused.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_OE_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} oe_pod_exempt SEC(".maps");

/*
 * A task whose own cgroup is not bound yet, in a directory whose parent
 * is: a container the runtime has just created, in a pod whose directory
 * the daemon has bound (where no runtime hook announces containers before
 * they start). The pod's binding decides for it until the container's
 * own arrives.
 *
 * krt_oe_fallback: the switch (and its count) while the daemon has the
 * fallback on, else NULL: one inlined array read.
 */
static __always_inline struct krt_oe_pod_fallback *krt_oe_fallback(void)
{
	struct krt_oe_pod_fallback *fb;
	__u32 zero = 0;

	fb = bpf_map_lookup_elem(&oe_pod_fallback, &zero);
	return fb && fb->on ? fb : 0;
}

/*
 * The current task's parent cgroup's id (0 for the root).
 * bpf_get_current_cgroup_id() is the default hierarchy's cgroup's kernfs
 * node id. The parent is reached through the cgroup's own css (a member of
 * struct cgroup every kernel has; kernfs_node's parent was renamed in
 * 6.15), then that cgroup's kernfs node.
 */
static __always_inline __u64 krt_oe_parent_cgroup_id(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct cgroup_subsys_state *css;
	struct cgroup *up;

	css = BPF_CORE_READ(task, cgroups, dfl_cgrp, self.parent);
	if (!css)
		return 0;
	up = (struct cgroup *)((void *)css - bpf_core_field_offset(struct cgroup, self));
	return BPF_CORE_READ(up, kn, id);
}

/* The parent's binding, if the fallback is on, the task's cgroup is not
 * exempt and the parent is bound; *cgid becomes the parent's, so what is
 * counted and reported names the pod. */
static __always_inline struct krt_oe_cgroup *krt_oe_pod_cgroup(__u64 *cgid)
{
	struct krt_oe_pod_fallback *fb;
	struct krt_oe_cgroup *cg;
	__u64 parent;

	fb = krt_oe_fallback();
	if (!fb)
		return 0;
	if (bpf_map_lookup_elem(&oe_pod_exempt, cgid))
		return 0;
	parent = krt_oe_parent_cgroup_id();
	if (!parent)
		return 0;
	cg = bpf_map_lookup_elem(&oe_cgroups, &parent);
	if (!cg)
		return 0;
	__sync_fetch_and_add(&fb->hits, 1);
	*cgid = parent;
	return cg;
}

static __always_inline int krt_oe_prepare(struct file *file, __u32 want, struct krt_oe_ctx *c)
{
	__u32 zero = 0;
	__u64 cgid = bpf_get_current_cgroup_id();
	struct krt_oe_cgroup *cg;
	long len;

	cg = bpf_map_lookup_elem(&oe_cgroups, &cgid);
	if (!cg)
		cg = krt_oe_pod_cgroup(&cgid);
	if (!cg)
		return 0;
	c->selected[KRT_OE_OPEN] = (want & KRT_OE_WANT_OPEN) ? cg->slots[KRT_OE_OPEN] : 0;
	c->selected[KRT_OE_EXEC] = (want & KRT_OE_WANT_EXEC) ? cg->slots[KRT_OE_EXEC] : 0;
	if (!c->selected[KRT_OE_OPEN] && !c->selected[KRT_OE_EXEC])
		return 0;
	c->cfg = bpf_map_lookup_elem(&oe_config, &zero);
	c->st = bpf_map_lookup_elem(&oe_stats, &zero);
	c->ev = bpf_map_lookup_elem(&oe_scratch, &zero);
	if (!c->cfg || !c->st || !c->ev)
		return 0;
	if (krt_oe_unmatched_by_name(file, c)) {
		if (c->selected[KRT_OE_OPEN])
			c->st->decisions[KRT_OE_OPEN][KRT_OE_UNMATCHED]++;
		if (c->selected[KRT_OE_EXEC])
			c->st->decisions[KRT_OE_EXEC][KRT_OE_UNMATCHED]++;
		return 0;
	}
	len = bpf_d_path(&file->f_path, c->ev->path, sizeof(c->ev->path));
	c->resolved = len > 0 && len <= KRT_OE_PATH_LEN;
	if (c->resolved)
		krt_oe_zero_tail(c->ev->path, len);
	else
		c->ev->path[0] = 0;
	c->ev->cgroup = cgid;
	return 1;
}

/*
 * The decision of one dimension over every bound policy: explicit deny >
 * explicit allow > default deny > allowed. An unresolved path matches no
 * entry, so only a default deny refuses it.
 */
static __always_inline __u32 krt_oe_decide(struct krt_oe_ctx *c, __u32 dim)
{
	__u64 selected = c->selected[dim & 1];
	struct krt_oe_rule *rule = 0;

	if (c->resolved) {
		if (dim == KRT_OE_OPEN)
			rule = bpf_map_lookup_elem(&oe_open_paths, c->ev->path);
		else
			rule = bpf_map_lookup_elem(&oe_exec_paths, c->ev->path);
	}
	if (rule && (rule->deny & selected))
		return KRT_OE_DENIED;
	if (rule && (rule->allow & selected))
		return KRT_OE_ALLOWED;
	if (c->cfg->default_deny[dim & 1] & selected)
		return KRT_OE_DEFAULT_DENIED;
	return KRT_OE_UNMATCHED;
}

static __always_inline int krt_oe_refused(__u32 decision)
{
	return decision == KRT_OE_DENIED || decision == KRT_OE_DEFAULT_DENIED;
}

/*
 * Sends one refusal as a per-occurrence record, within its cgroup's budget
 * of cfg->denials_per_sec records per second (so a storm of refusals costs
 * the reader a bounded number of records). Returns whether it was sent; a
 * refusal that was not is counted by the caller instead, so every refusal
 * is reported exactly once, with or without its pid and comm.
 */
static __always_inline int krt_oe_report_denial(struct krt_oe_event *ev, int resolved,
						struct krt_oe_config *cfg,
						struct krt_oe_stats *st)
{
	struct krt_oe_rate fresh = {}, *rate;
	struct krt_oe_denial *d;
	__u64 window;

	if (!cfg->denials_per_sec)
		return 0;
	window = bpf_ktime_get_ns() / 1000000000ULL;
	rate = bpf_map_lookup_elem(&oe_denial_rate, &ev->cgroup);
	if (!rate) {
		fresh.window = window;
		bpf_map_update_elem(&oe_denial_rate, &ev->cgroup, &fresh, BPF_NOEXIST);
		rate = bpf_map_lookup_elem(&oe_denial_rate, &ev->cgroup);
		if (!rate) {
			st->denials_rate_limited++;
			return 0;
		}
	}
	/* Racy across CPUs by design: the budget is approximate, never the
	 * count (what the budget refuses is counted). */
	if (rate->window != window) {
		rate->window = window;
		rate->sent = 0;
	}
	if (rate->sent >= cfg->denials_per_sec) {
		st->denials_rate_limited++;
		return 0;
	}
	__sync_fetch_and_add(&rate->sent, 1);
	d = bpf_ringbuf_reserve(&oe_denials, sizeof(*d), 0);
	if (!d) {
		st->denials_ringbuf_full++;
		return 0;
	}
	/* Ring buffer memory is recycled and mapped into userspace: nothing of
	 * an earlier record may survive into this one. */
	__builtin_memset(d, 0, sizeof(*d));
	d->ev.cgroup = ev->cgroup;
	d->ev.dim = ev->dim;
	d->ev.decision = ev->decision;
	/* An unresolved path is empty; the scratch behind it holds another
	 * operation's path, which must not leak. */
	if (resolved)
		__builtin_memcpy(d->ev.path, ev->path, sizeof(d->ev.path));
	d->pid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(d->comm, sizeof(d->comm));
	bpf_ringbuf_submit(d, 0);
	st->denials_sent++;
	return 1;
}

/*
 * Counts one decision of `ev` (whose dim and decision are set) and returns
 * whether it refuses. A refusal is reported whatever the mode: as a
 * per-occurrence record when its cgroup's budget allows, else counted in
 * `oe_observations`. Everything else is counted only for a cgroup a
 * monitor-mode policy selects, so enforce-only cgroups pay nothing for
 * observation (the original counts always).
 */
static __always_inline int krt_oe_account(struct krt_oe_event *ev, __u64 selected, int resolved,
					  struct krt_oe_config *cfg, struct krt_oe_stats *st)
{
	__u32 dim = ev->dim & 1;
	int refused = krt_oe_refused(ev->decision);

	if (!resolved) {
		if (refused) {
			st->unresolved_denied[dim]++;
			krt_oe_report_denial(ev, 0, cfg, st);
		} else {
			st->unresolved_passed[dim]++;
		}
		return refused;
	}
	st->decisions[dim][ev->decision & 3]++;
	if (refused) {
		if (!krt_oe_report_denial(ev, 1, cfg, st))
			krt_oe_observe(ev, st);
	} else if (cfg->observe[dim] & selected) {
		krt_oe_observe(ev, st);
	}
	return refused;
}

/*
 * 0 or -EPERM, from a flag. LSM programs must provably return a value in
 * [-4095, 0], and the verifier cannot bound the -(x & 1) clang folds a
 * plain ternary into; the empty asm keeps the two returns on two paths.
 */
static __always_inline int krt_oe_errno(int refused)
{
	if (refused) {
		asm volatile("" ::: "memory");
		return -KRT_EPERM;
	}
	return 0;
}

/* Decides and counts one dimension of a prepared invocation. */
static __always_inline int krt_oe_check_dim(struct krt_oe_ctx *c, __u32 dim)
{
	c->ev->dim = dim;
	c->ev->decision = krt_oe_decide(c, dim);
	return krt_oe_account(c->ev, c->selected[dim & 1], c->resolved, c->cfg, c->st);
}

#endif /* KRT_OPENEXEC_CHECK_H */
