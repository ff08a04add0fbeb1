// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Open/exec enforcement on BPF-LSM: one program per hook.
 *
 *   lsm/file_open             the open dimension, for every open (an exec
 *                             opens its binary and its ELF interpreter too,
 *                             so an open deny also refuses executing)
 *   lsm/bprm_check_security   the exec dimension, for each binary of an
 *                             exec (a script, then its interpreter)
 *
 * The decision is openexec_check.h's, shared with the fmod_ret object.
 * Needs bpf_d_path in LSM programs (Linux 5.11+); on a kernel that refuses
 * it this object fails to load with the verifier's reason, and the daemon
 * falls back to fmod_ret.
 */
#include "openexec_check.h"

SEC("lsm/file_open")
int BPF_PROG(krt_oe_lsm_file_open, struct file *file)
{
	struct krt_oe_ctx c = {};

	if (!krt_oe_prepare(file, KRT_OE_WANT_OPEN, &c))
		return 0;
	return krt_oe_errno(krt_oe_check_dim(&c, KRT_OE_OPEN));
}

SEC("lsm/bprm_check_security")
int BPF_PROG(krt_oe_lsm_bprm_check, struct linux_binprm *bprm)
{
	struct krt_oe_ctx c = {};

	int refused;

	if (!krt_oe_prepare(bprm->file, KRT_OE_WANT_EXEC, &c))
		return 0;
	refused = krt_oe_check_dim(&c, KRT_OE_EXEC);
	if (!refused && c.resolved && (c.cfg->observe[KRT_OE_EXEC] & c.selected[KRT_OE_EXEC]))
		krt_oe_hand_to_tracer((__u64)bprm, c.ev->path);
	return krt_oe_errno(refused);
}
