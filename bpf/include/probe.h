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

#define KRT_TASK_COMM_LEN 16

/* One record per exec seen by raw_tp/sched_process_exec. */
struct krt_exec_event {
	/* Thread-group id (what userspace calls the pid) of the exec'ing task. */
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
