/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Included first by every kyverno-runtime BPF object.
 *
 * The bpf_*.h helper headers are not vendored: libbpf-cargo extracts the
 * copies bundled with libbpf-sys into a temporary directory and adds it to
 * clang's include path, so they always match the libbpf we link.
 */
#ifndef KRT_COMMON_H
#define KRT_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

/*
 * The kernel only lets GPL-compatible programs use the LSM, fmod_ret and
 * tracing attach points and GPL-only helpers (bpf_get_current_comm in
 * raw_tp, ...), so every object declares GPL.
 *
 * Each .bpf.c file is compiled into its own object (one object per probe
 * program, so one refusal cannot block another), so defining the section
 * here yields exactly one license per object. A future backend that links
 * several .c files into one object must move this into one of them.
 */
char LICENSE[] SEC("license") = "GPL";

#endif /* KRT_COMMON_H */
