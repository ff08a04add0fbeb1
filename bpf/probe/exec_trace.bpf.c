// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Probe: does raw_tp/sched_process_exec run and deliver records through a
 * BPF ring buffer? Userspace spawns a child and waits for its record.
 */
#include "common.h"
#include "probe.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	/* Bytes; a power-of-two multiple of the page size. Every exec on the
	 * host lands here while the probe runs, so leave room for a burst. */
	__uint(max_entries, 64 * 1024);
} krt_exec_events SEC(".maps");

/*
 * Never used: makes struct krt_exec_event part of the object's BTF, so the
 * skeleton generates its Rust type (a ring buffer map carries no value type).
 */
struct krt_exec_event krt_exec_event_btf_anchor = {};

/* The prober's PID namespace (see krt_probe_tgid). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

SEC("raw_tp/sched_process_exec")
int krt_probe_exec_trace(struct bpf_raw_tracepoint_args *ctx)
{
	struct krt_exec_event *e;

	e = bpf_ringbuf_reserve(&krt_exec_events, sizeof(*e), 0);
	if (!e)
		return 0; /* ring full: the record is dropped, userspace times out */

	/* Ring buffer memory is not zeroed: never leak stale kernel bytes
	 * (padding, the comm tail) to userspace. */
	__builtin_memset(e, 0, sizeof(*e));
	e->pid = krt_probe_tgid(pidns_dev, pidns_ino);
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	bpf_ringbuf_submit(e, 0);
	return 0;
}
