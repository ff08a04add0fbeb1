// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Probe: does the kernel load, attach AND RUN an lsm/file_open program?
 *
 * An LSM program loads and attaches even when "bpf" is missing from the
 * active LSM list; it then never runs. So the program counts its own
 * invocations for one target process and userspace checks the counter after
 * opening a file. It always returns 0: a probe must never deny anything.
 *
 * It resolves the opened file's path with bpf_d_path, as the real open/exec
 * object (bpf/openexec/) must: LSM programs may call it only from Linux
 * 5.11, so on 5.10 this probe is refused with the verifier's reason and the
 * plan falls back to fmod_ret, as the daemon would have to.
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

SEC("lsm/file_open")
int BPF_PROG(krt_probe_lsm_file_open, struct file *file)
{
	__u32 tgid = krt_probe_tgid(pidns_dev, pidns_ino);

	if (target_tgid != 0 && tgid == target_tgid) {
		__sync_fetch_and_add(&run_count, 1);
		bpf_d_path(&file->f_path, probe_path, sizeof(probe_path));
	}
	return 0;
}
