// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Probe: can the kernel create the map types the backends rely on?
 *
 * Userspace switches off auto-creation of every map but the one it probes,
 * so that one refused map type cannot hide the others.
 */
#include "common.h"
#include "probe.h"

/* Egress allow/deny lists: longest-prefix match on IPv6-sized keys. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16);
	__type(key, struct krt_lpm_v6_key);
	__type(value, __u32);
	/* The kernel refuses LPM tries without BPF_F_NO_PREALLOC. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
} krt_probe_lpm SEC(".maps");

/*
 * Inner map type of krt_probe_outer. Declared as a named map too, so that
 * userspace inserts a map created from this very definition: the kernel
 * only accepts inner maps whose type, key/value size, flags and
 * max_entries equal the template's.
 */
struct krt_probe_inner_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u32);
};

struct krt_probe_inner_map krt_probe_inner SEC(".maps");

/* Per-policy (or per-cgroup) tables: one inner hash per key. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, 8);
	__type(key, __u32);
	__array(values, struct krt_probe_inner_map);
} krt_probe_outer SEC(".maps");

/* Event transport of the exec tracer and the monitors. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} krt_probe_ringbuf SEC(".maps");
