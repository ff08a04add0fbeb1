// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Probe: does the kernel load, attach AND RUN an lsm/file_open program?
 *
 * An LSM program loads and attaches even when "bpf" is missing from the
 * active LSM list; it then never runs. So the program counts its own
 * invocations for one target process and userspace checks the counter after
 * opening a file. It always returns 0: a probe must never deny anything.
 *
 * Kept minimal for the oldest supported verifier (5.10): only
 * bpf_get_current_pid_tgid and an atomic add on global data.
 */
#include "common.h"

/* Thread-group id to count; set by userspace before load. 0 matches nothing. */
const volatile __u32 target_tgid = 0;

/* Invocations of the hook by target_tgid. */
__u64 run_count = 0;

SEC("lsm/file_open")
int BPF_PROG(krt_probe_lsm_file_open, struct file *file)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (target_tgid != 0 && tgid == target_tgid)
		__sync_fetch_and_add(&run_count, 1);
	return 0;
}
