/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Layouts shared by the exec tracer (bpf/exectrace/exec_trace.bpf.c) and
 * its Rust handle (bpf/src/exectrace/). Rust reads them from the skeleton.
 *
 * One ring buffer record per exec of a gated cgroup: who (pid, ppid, comm,
 * cgroup), what (the filename the exec was asked for) and how (up to
 * KRT_ET_ARGV slots of argv, each at most KRT_ET_ARG_LEN bytes with its
 * NUL). The record is a payload, not a key: argv is unbounded user data,
 * so it rides a ring buffer rather than a counter map.
 */
#ifndef KRT_EXECTRACE_H
#define KRT_EXECTRACE_H

#include "vmlinux.h"

#define KRT_ET_COMM_LEN 16
#define KRT_ET_FILENAME_LEN 256
#define KRT_ET_ARGV 8
#define KRT_ET_ARG_LEN 128
/* Resolved paths handed over by the open/exec programs (openexec.h's
 * KRT_OE_RESOLVED_PATHS). */
#define KRT_ET_RESOLVED 2
/* Cgroups the gate can admit (pods x containers, with a margin). */
#define KRT_ET_MAX_CGROUPS (1 << 14)
/* Bytes of the ring buffer: about 280 records of 1.8 KiB. */
#define KRT_ET_RING_BYTES (512 * 1024)

/* Bits of krt_exec_record.flags. */
enum krt_et_flag {
	/* More than KRT_ET_ARGV arguments: the rest are not in the record. */
	KRT_ET_ARGV_TRUNCATED = 1 << 0,
	/* An argument longer than its slot: the slot holds its prefix. */
	KRT_ET_ARG_TRUNCATED = 1 << 1,
	/* The argument area could not be read (argc says how many there were). */
	KRT_ET_ARGV_UNREADABLE = 1 << 2,
	/* The filename could not be read or did not fit. */
	KRT_ET_FILENAME_TRUNCATED = 1 << 3,
};

/* One ring buffer record. Zeroed before it is filled: ring buffer memory is
 * recycled and mapped into userspace, so an unzeroed tail would hand one
 * pod's argv to the reader of another's record. */
struct krt_exec_record {
	__u64 cgroup_id;
	/* Thread-group id of the task that exec'ed, and of its parent. */
	__u32 pid;
	__u32 ppid;
	/* Arguments the exec was given (bprm->argc), whatever was recorded. */
	__u32 argc;
	/* enum krt_et_flag bits. */
	__u32 flags;
	/* argv slots filled, in order (an argument may be empty, so the slots
	 * themselves cannot tell). */
	__u32 recorded;
	/* Paths in `resolved`: the exec's binary and a script's interpreter as
	 * the open/exec programs resolved them (0 when they did not see it). */
	__u32 resolved_count;
	char comm[KRT_ET_COMM_LEN];
	char filename[KRT_ET_FILENAME_LEN];
	char argv[KRT_ET_ARGV][KRT_ET_ARG_LEN];
	char resolved[KRT_ET_RESOLVED][KRT_ET_FILENAME_LEN];
};

/* Per-CPU loss counters (the one entry of krt_et_stats), cumulative. */
struct krt_et_stats {
	/* A gated exec whose record the ring buffer could not hold. */
	__u64 ringbuf_full;
	/* Records sent with KRT_ET_ARGV_TRUNCATED or KRT_ET_ARG_TRUNCATED. */
	__u64 argv_truncated;
	/* Records sent with KRT_ET_ARGV_UNREADABLE. */
	__u64 argv_unreadable;
};

#endif /* KRT_EXECTRACE_H */
