// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Probe: does the kernel load, attach and run fmod_ret/security_file_open?
 *
 * This is the open/exec enforcement fallback when the BPF LSM is not active:
 * fmod_ret may override the return value of security_* functions. Returning
 * 0 keeps the original return value, so the probe never denies anything.
 * Like the LSM probe it counts invocations by one target process so
 * userspace can tell "attached" from "ran". It calls bpf_d_path, as the
 * real open/exec object does.
 */
#include "common.h"
#include "probe.h"

/* Thread-group id to count; set by userspace before load. 0 matches nothing. */
const volatile __u32 target_tgid = 0;
/* The prober's PID namespace (see krt_probe_tgid). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* Invocations of the hook by target_tgid. */
__u64 run_count = 0;

/* Where the probe resolves the path (only to prove it may). */
char probe_path[64] = {};

SEC("fmod_ret/security_file_open")
int BPF_PROG(krt_probe_fmod_ret_file_open, struct file *file)
{
	__u32 tgid = krt_probe_tgid(pidns_dev, pidns_ino);

	if (target_tgid != 0 && tgid == target_tgid) {
		__sync_fetch_and_add(&run_count, 1);
		bpf_d_path(&file->f_path, probe_path, sizeof(probe_path));
	}
	return 0;
}
