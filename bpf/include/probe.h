/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared between the probe programs (bpf/probe/) and userspace.
 *
 * Rust never re-declares these: it reads them from the generated skeleton's
 * `types` module (field offsets via `core::mem::offset_of!`), so changing a
 * layout here changes the Rust side at the next build.
 */
#ifndef KRT_PROBE_H
#define KRT_PROBE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define KRT_TASK_COMM_LEN 16

/*
 * The tgid of the current task as the probing process numbers it: in the
 * PID namespace whose nsfs device and inode userspace read from
 * /proc/self/ns/pid (`dev`, `ino`), or 0 for a task of another namespace.
 * bpf_get_current_pid_tgid() gives the initial namespace's number, which is
 * not the prober's inside a node that runs in a PID namespace of its own
 * (issue 25: a hostPID pod on such a node saw its probes "never run").
 * `ino` 0 (not read): the initial namespace's number.
 */
static __always_inline __u32 krt_probe_tgid(__u64 dev, __u64 ino)
{
	struct bpf_pidns_info ns = {};

	if (ino == 0)
		return bpf_get_current_pid_tgid() >> 32;
	if (bpf_get_ns_current_pid_tgid(dev, ino, &ns, sizeof(ns)) != 0)
		return 0;
	return ns.tgid;
}

/* One record per exec seen by raw_tp/sched_process_exec. */
struct krt_exec_event {
	/* Thread-group id (what userspace calls the pid) of the exec'ing task,
	 * in the prober's PID namespace (0: another namespace's task). */
	__u32 pid;
	/* task->comm after exec, NUL-padded. */
	char comm[KRT_TASK_COMM_LEN];
};

/* LPM trie key sized for IPv6 (an IPv4 address fits as a v4-mapped one). */
struct krt_lpm_v6_key {
	/* Number of leading bits of `addr` that are significant. */
	__u32 prefixlen;
	/* Address in network byte order. */
	__u8 addr[16];
};

#endif /* KRT_PROBE_H */
