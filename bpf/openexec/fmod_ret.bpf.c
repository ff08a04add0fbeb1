// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Open/exec enforcement without BPF-LSM: fmod_ret programs on
 * security_file_open and security_bprm_check (fmod_ret may attach to any
 * security_* function, so no boot parameter is needed).
 *
 * bpf_d_path is allowed on security_file_open but refused on
 * security_bprm_check, so an exec is decided in two steps:
 *
 *   1. security_file_open: every open is decided for the open dimension.
 *      An open for execution (do_open_execat and open_exec set
 *      __FMODE_EXEC, which the kernel keeps in f_flags) is also decided
 *      for the exec dimension, and that decision is stashed in
 *      `oe_pending` under its struct file.
 *   2. security_bprm_check: the stashed decision for bprm->file is
 *      counted and enforced.
 *
 * So exactly the files BPF-LSM's bprm_check_security sees are execs here
 * (the binary, a script's interpreter) and an ELF interpreter (ld.so),
 * opened with the same flag but never passed to bprm_check, is not: the
 * two backends refuse the same operations. The Go original decided an
 * exec at open time on the exec dimension only (a Known Gap it documents:
 * an open deny did not refuse executing the file, and ld.so counted as an
 * exec).
 */
#include "openexec_check.h"

/* include/linux/fcntl.h: a macro, so not in vmlinux.h. */
#define KRT___FMODE_EXEC 0x20

SEC("fmod_ret/security_file_open")
int BPF_PROG(krt_oe_fmod_ret_file_open, struct file *file, int ret)
{
	struct krt_oe_ctx c = {};
	__u64 key = (__u64)file;
	int exec, refused = 0;

	/* An earlier fmod_ret program already refused: keep its answer. */
	if (ret)
		return ret;
	exec = (file->f_flags & KRT___FMODE_EXEC) != 0;
	/* A stale stash for a recycled struct file must never be consumed. */
	if (exec)
		bpf_map_delete_elem(&oe_pending, &key);
	if (!krt_oe_prepare(file, KRT_OE_WANT_OPEN | (exec ? KRT_OE_WANT_EXEC : 0), &c))
		return 0;
	if (c.selected[KRT_OE_OPEN])
		refused = krt_oe_check_dim(&c, KRT_OE_OPEN);
	if (exec && c.selected[KRT_OE_EXEC]) {
		struct krt_oe_pending *p;
		__u32 zero = 0;

		/* The stash is built in place: a 300-byte struct does not fit
		 * the stack beside the context. */
		c.ev->dim = KRT_OE_EXEC;
		c.ev->decision = krt_oe_decide(&c, KRT_OE_EXEC);
		p = bpf_map_lookup_elem(&oe_pending_scratch, &zero);
		if (p) {
			__builtin_memcpy(&p->ev, c.ev, sizeof(p->ev));
			p->selected = c.selected[KRT_OE_EXEC];
			p->resolved = c.resolved;
			if (bpf_map_update_elem(&oe_pending, &key, p, BPF_ANY))
				/* Cannot stash: decide the exec now rather
				 * than let it through unchecked. */
				refused |= krt_oe_account(c.ev, c.selected[KRT_OE_EXEC],
							  c.resolved, c.cfg, c.st);
		}
	}
	return krt_oe_errno(refused);
}

SEC("fmod_ret/security_bprm_check")
int BPF_PROG(krt_oe_fmod_ret_bprm_check, struct linux_binprm *bprm, int ret)
{
	__u64 key = (__u64)bprm->file;
	struct krt_oe_pending *p;
	struct krt_oe_config *cfg;
	struct krt_oe_stats *st;
	__u32 zero = 0;
	int refused;

	if (ret)
		return ret;
	p = bpf_map_lookup_elem(&oe_pending, &key);
	if (!p)
		return 0;
	cfg = bpf_map_lookup_elem(&oe_config, &zero);
	st = bpf_map_lookup_elem(&oe_stats, &zero);
	/* The stash is this task's: decided for its cgroup, or for its
	 * pod's directory through the fallback. */
	if (!cfg || !st ||
	    (p->ev.cgroup != bpf_get_current_cgroup_id() &&
	     !(krt_oe_fallback() && p->ev.cgroup == krt_oe_parent_cgroup_id()))) {
		bpf_map_delete_elem(&oe_pending, &key);
		return 0;
	}
	refused = krt_oe_account(&p->ev, p->selected, p->resolved, cfg, st);
	if (!refused && p->resolved && (cfg->observe[KRT_OE_EXEC] & p->selected))
		krt_oe_hand_to_tracer((__u64)bprm, p->ev.path);
	bpf_map_delete_elem(&oe_pending, &key);
	return krt_oe_errno(refused);
}
