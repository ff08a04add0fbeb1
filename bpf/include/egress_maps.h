/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The maps the egress filter (bpf/egress/egress_filter.bpf.c) shares with
 * the DNS answer snooper (bpf/dnssnoop/snoop.bpf.c). Both objects declare
 * them from here, so the declarations cannot drift; at load the snooper's
 * copies are replaced by the filter's (libbpf reuses the filter's fds), so
 * there is one map of each on the node and the snooper writes exactly what
 * the filter reads.
 */
#ifndef KRT_EGRESS_MAPS_H
#define KRT_EGRESS_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "egress.h"
#include "dnsquestion.h"
#include "dnssnoop.h"

/*
 * cgroup id (bpf_skb_cgroup_id) -> the set and flags that apply. Written
 * by userspace only, so it need not be preallocated. The snooper's gate.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, struct krt_egress_filter);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cgroup_filters SEC(".maps");

/* (name, set) -> the verdicts the set's policies give the name. Written
 * by userspace; read by the snooper. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_DOMAINS);
	__type(key, struct krt_egress_domain_key);
	__type(value, struct krt_egress_domain);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_domains SEC(".maps");

/* (set, address) -> what a DNS answer taught the set about it, until
 * when. Written by the snooper, within the set's share (learned_share);
 * read by the filter; userspace removes expired entries, the entries of a
 * set it frees and of a name a set stops naming. Never full while every
 * set keeps to its share, so nothing is ever evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_LEARNED);
	__type(key, struct krt_egress_learned_key);
	__type(value, struct krt_egress_learned);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_learned SEC(".maps");

/* The entries of egress_learned each set may hold (key 0; 0: no limit).
 * Userspace writes it whenever the number of sets in use changes: the
 * map's size over the sets, less a margin for the CPUs that may insert at
 * once, so the shares never sum past the map. Not pinned: written at
 * every load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} learned_share SEC(".maps");

/* Set id -> the entries the snooper added and the records and answers it
 * refused (struct krt_egress_learned_budget). Written by the snooper;
 * userspace removes a set's entry with everything the set learned. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_CGROUPS);
	__type(key, __u32);
	__type(value, struct krt_egress_learned_budget);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} learned_budget SEC(".maps");

/* Set id -> the entries of egress_learned userspace removed (expired,
 * forgotten) since the set id was last freed, less any it added itself.
 * Written by userspace only, so it needs no atomics; the snooper reads it
 * beside learned_budget. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_CGROUPS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} learned_released SEC(".maps");

/* The generations of every cached verdict (enum
 * krt_egress_generation_slot): userspace writes one slot, the snooper adds
 * to the other, the filter reads both. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, KRT_EGRESS_GEN_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} egress_generation SEC(".maps");

/* The resolvers whose answers the snooper may learn from (see
 * dnsquestion.h). Written by userspace only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_DNS_RESOLVERS_MAX);
	__type(key, struct krt_dns_resolver_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} dns_resolvers SEC(".maps");

/* The questions pods asked declared resolvers, awaiting their answers
 * (see dnsquestion.h). Written by the filter, read and consumed by the
 * snooper. Not pinned: a new load starts with none (an answer in flight
 * across a restart is not learned; the pod's next question is). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_DNS_QUESTIONS_MAX);
	__type(key, struct krt_dns_question_key);
	__type(value, struct krt_dns_question);
} dns_questions SEC(".maps");

/* The snooper's counters (struct krt_dns_snoop_stats), one per CPU; the
 * filter adds the question side. Not pinned: counters since load. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_dns_snoop_stats);
} snoop_stats SEC(".maps");

#endif /* KRT_EGRESS_MAPS_H */
