// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The exec tracer: one ring buffer record per exec of a gated cgroup, with
 * pid, parent, comm, filename and up to KRT_ET_ARGV arguments.
 *
 * raw_tp/sched_process_exec fires once the new program image is in place
 * (current->mm is the new one, comm is the new name), and only for an exec
 * that succeeded: a refused exec never reaches it, which is why refusals
 * are reported by the enforcing programs themselves (openexec_check.h).
 *
 * It observes and never decides. Anything it cannot read is recorded as a
 * flag on the record and counted; a cgroup outside the gate costs one hash
 * lookup and nothing is read.
 */
#include "common.h"
#include "exectrace.h"
#include "openexec.h"

/*
 * The open/exec object's `oe_exec_resolved` (userspace hands this object
 * that map's descriptor, so both programs see one map): the paths the exec
 * dimension resolved for an exec, keyed by its struct linux_binprm. The
 * definition must match openexec_check.h's for the reuse to be accepted.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_OE_MAX_RESOLVED);
	__type(key, __u64);
	__type(value, struct krt_oe_resolved);
} oe_exec_resolved SEC(".maps");

/* An entry older than this was left by an exec that failed after its
 * check: not this exec's. */
#define KRT_ET_RESOLVED_MAX_AGE_NS (2ULL * 1000000000ULL)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_ET_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} krt_et_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, KRT_ET_RING_BYTES);
} krt_et_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_et_stats);
} krt_et_stats SEC(".maps");

/* A ring buffer map carries no value type: this anchors the record's
 * layout in the object's BTF so the skeleton generates its Rust type. */
struct krt_exec_record krt_exec_record_btf_anchor = {};

/*
 * Skips the rest of an argument whose first KRT_ET_ARG_LEN - 1 bytes filled
 * its slot: reads on in slot-sized chunks until the NUL. Returns the
 * address after the argument, or 0 when it is longer than the bound (the
 * remaining arguments are then not recorded).
 */
static __always_inline unsigned long krt_et_skip_rest(unsigned long p, int *was_longer)
{
	char chunk[KRT_ET_ARG_LEN];
	long n;

#pragma unroll
	for (int j = 0; j < 8; j++) {
		n = bpf_probe_read_user_str(chunk, sizeof(chunk), (const void *)p);
		if (n <= 0)
			return 0;
		if (n < KRT_ET_ARG_LEN) {
			/* n == 1 on the first chunk: the argument ended exactly
			 * at the slot's end. */
			if (j > 0 || n > 1)
				*was_longer = 1;
			return p + n;
		}
		*was_longer = 1;
		p += KRT_ET_ARG_LEN - 1;
	}
	return 0;
}

/*
 * Zeroes a reserved record. Ring buffer memory is recycled and mapped into
 * userspace, so an unzeroed tail would hand one pod's argv to the reader of
 * another's record. In two pieces: clang inlines a memset of at most 128
 * stores (1 KiB of 8-byte words), and the record is larger.
 */
static __always_inline void krt_et_zero(struct krt_exec_record *r)
{
	char *bytes = (char *)r;

	__builtin_memset(bytes, 0, 1024);
	/* Keeps the optimizer from merging the pieces back into one. */
	asm volatile("" ::: "memory");
	__builtin_memset(bytes + 1024, 0, sizeof(*r) - 1024);
}

SEC("raw_tp/sched_process_exec")
int krt_exec_trace(struct bpf_raw_tracepoint_args *ctx)
{
	struct linux_binprm *bprm = (struct linux_binprm *)ctx->args[2];
	__u64 cgid = bpf_get_current_cgroup_id();
	struct task_struct *task;
	struct krt_exec_record *r;
	struct krt_et_stats *st;
	unsigned long p, end;
	const char *filename;
	__u32 zero = 0;
	long n;

	if (!bpf_map_lookup_elem(&krt_et_cgroups, &cgid))
		return 0;
	st = bpf_map_lookup_elem(&krt_et_stats, &zero);
	if (!st)
		return 0;
	r = bpf_ringbuf_reserve(&krt_et_events, sizeof(*r), 0);
	if (!r) {
		st->ringbuf_full++;
		return 0;
	}
	krt_et_zero(r);

	task = (struct task_struct *)bpf_get_current_task();
	r->cgroup_id = cgid;
	r->pid = bpf_get_current_pid_tgid() >> 32;
	r->ppid = BPF_CORE_READ(task, real_parent, tgid);
	bpf_get_current_comm(r->comm, sizeof(r->comm));

	filename = BPF_CORE_READ(bprm, filename);
	n = bpf_probe_read_kernel_str(r->filename, sizeof(r->filename), filename);
	if (n <= 0 || n == sizeof(r->filename))
		r->flags |= KRT_ET_FILENAME_TRUNCATED;

	r->argc = BPF_CORE_READ(bprm, argc);
	p = BPF_CORE_READ(task, mm, arg_start);
	end = BPF_CORE_READ(task, mm, arg_end);
#pragma unroll
	for (int i = 0; i < KRT_ET_ARGV; i++) {
		int longer = 0;

		if (i >= r->argc || p >= end)
			break;
		n = bpf_probe_read_user_str(r->argv[i], KRT_ET_ARG_LEN, (const void *)p);
		if (n <= 0) {
			r->flags |= KRT_ET_ARGV_UNREADABLE;
			break;
		}
		r->recorded = i + 1;
		if (n < KRT_ET_ARG_LEN) {
			p += n;
			continue;
		}
		/* The slot is full: find where the next argument starts. */
		p = krt_et_skip_rest(p + KRT_ET_ARG_LEN - 1, &longer);
		if (longer)
			r->flags |= KRT_ET_ARG_TRUNCATED;
		if (!p) {
			r->flags |= KRT_ET_ARGV_TRUNCATED;
			break;
		}
	}
	if (r->argc > KRT_ET_ARGV)
		r->flags |= KRT_ET_ARGV_TRUNCATED;

	{
		__u64 key = (__u64)bprm;
		struct krt_oe_resolved *res = bpf_map_lookup_elem(&oe_exec_resolved, &key);

		if (res) {
			if (res->tgid == r->pid &&
			    bpf_ktime_get_ns() - res->at < KRT_ET_RESOLVED_MAX_AGE_NS &&
			    res->count >= 1 && res->count <= KRT_ET_RESOLVED) {
				__builtin_memcpy(r->resolved[0], res->binary, KRT_ET_FILENAME_LEN);
				if (res->count == 2)
					__builtin_memcpy(r->resolved[1], res->interpreter,
							 KRT_ET_FILENAME_LEN);
				r->resolved_count = res->count;
			}
			bpf_map_delete_elem(&oe_exec_resolved, &key);
		}
	}
	if (r->flags & (KRT_ET_ARGV_TRUNCATED | KRT_ET_ARG_TRUNCATED))
		st->argv_truncated++;
	if (r->flags & KRT_ET_ARGV_UNREADABLE)
		st->argv_unreadable++;
	bpf_ringbuf_submit(r, 0);
	return 0;
}
