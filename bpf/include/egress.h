/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Layouts shared by the egress filter (bpf/egress/egress_filter.bpf.c) and
 * its Rust handle (bpf/src/egress/).
 *
 * Rust never re-declares these: it reads them from the generated
 * skeleton's `types` module (field offsets via `core::mem::offset_of!`,
 * enum values via the generated constants), so changing a layout or a
 * value here changes the Rust side at the next build. Every struct is
 * padding-free, because hash and LPM keys are compared byte for byte and
 * a padding byte left uninitialised would make two equal keys differ.
 */
#ifndef KRT_EGRESS_H
#define KRT_EGRESS_H

#include "vmlinux.h"
#include "dnsname.h"

/*
 * Map sizes. The LPM tries and cgroup_filters are BPF_F_NO_PREALLOC, so
 * these are ceilings, not allocations: an empty trie costs nothing, and
 * each entry costs one small kernel allocation when userspace inserts it.
 *
 * One trie holds the prefixes of every filter set on the node, so its
 * ceiling is a node-wide budget: 2^18 leaves room for the 100,000-entry
 * benchmark set next to every other pod's sets.
 */
#define KRT_EGRESS_MAX_PREFIXES (1 << 18)
/*
 * Host entries (IPv4 /32, IPv6 /128) node-wide, allow and deny together,
 * in one hash map: one lookup whatever their number. Not preallocated
 * either, but a hash map's bucket array is allocated at creation: about
 * 4 MiB for 2^18.
 */
#define KRT_EGRESS_MAX_HOSTS (1 << 18)
/* Container cgroups on one node (pods x containers, with a wide margin). */
#define KRT_EGRESS_MAX_CGROUPS (1 << 14)
/*
 * Distinct (set, family, destination, decision) tuples counted between two
 * drains. The LRU map is preallocated (the kernel requires it for LRU), so
 * this one is real memory: about 2 MiB.
 */
#define KRT_EGRESS_MAX_OBSERVATIONS (1 << 14)
/* (set, domain name) entries node-wide: every set's policy-named domains. */
#define KRT_EGRESS_MAX_DOMAINS (1 << 14)
/*
 * (set, address) pairs learned from DNS answers node-wide. A hash map
 * that is not preallocated (memory only for what is held: about 100 bytes
 * an entry with the kernel's overhead) and never evicts: each set may hold
 * its share of it (learned_share, learned_budget in egress_maps.h), so
 * what one pod's answers teach can never push out what another's taught
 * (issue 37). Userspace removes expired entries.
 */
#define KRT_EGRESS_MAX_LEARNED (1 << 18)

/*
 * How long a learned address counts, from the TTL of the record that
 * taught it, clamped: at least KRT_DNS_TTL_MIN_S, so that the connect
 * right after a TTL-0 answer (which a resolver may give to say "do not
 * cache") still finds it, and at most KRT_DNS_TTL_MAX_S, so that an answer
 * with a TTL of days does not keep an address allowed for days.
 */
#define KRT_DNS_TTL_MIN_S 5
#define KRT_DNS_TTL_MAX_S 3600

/* Bits of krt_egress_filter.flags. */
enum krt_egress_flag {
	/* Drop what no entry of the set allows (and what cannot be parsed). */
	KRT_EGRESS_FLAG_DEFAULT_DENY = 1 << 0,
	/*
	 * Count every parsed packet in `observations`. Only counts: it never
	 * changes a verdict. Without it, the program does no per-destination
	 * work at all.
	 */
	KRT_EGRESS_FLAG_OBSERVE = 1 << 1,
	/*
	 * The set names domains: the DNS answer snooper (bpf/dnssnoop/) reads
	 * the cgroup's DNS answers, and the filter consults the addresses it
	 * learned. Without it neither does any work for the cgroup.
	 */
	KRT_EGRESS_FLAG_DOMAINS = 1 << 2,
	/*
	 * What the set holds, so the program skips a lookup that cannot
	 * match: it has IPv4 (IPv6) host entries in egress_hosts, prefixes
	 * in deny_v4, allow_v4, deny_v6, allow_v6. Never chosen by a
	 * caller: the Rust handle keeps them current in every cgroup_filters
	 * entry of the set as its entries come and go (see egress/mod.rs).
	 */
	KRT_EGRESS_FLAG_HOSTS_V4 = 1 << 3,
	KRT_EGRESS_FLAG_HOSTS_V6 = 1 << 4,
	KRT_EGRESS_FLAG_DENY_V4 = 1 << 5,
	KRT_EGRESS_FLAG_ALLOW_V4 = 1 << 6,
	KRT_EGRESS_FLAG_DENY_V6 = 1 << 7,
	KRT_EGRESS_FLAG_ALLOW_V6 = 1 << 8,
};

/*
 * Bits of krt_egress_domain.verdicts, krt_egress_learned.verdicts and
 * krt_egress_host.verdicts.
 */
enum krt_egress_domain_verdict {
	/* Addresses answered for the name pass (like an allow entry). */
	KRT_EGRESS_DOMAIN_ALLOW = 1 << 0,
	/* Addresses answered for the name drop (like a deny entry). */
	KRT_EGRESS_DOMAIN_DENY = 1 << 1,
	/*
	 * A monitor policy names the name: the snooper learns what is
	 * answered for it, so userspace can say which name a counted
	 * destination was known under. The filter ignores the bit: it never
	 * changes a verdict. Never set in egress_hosts.
	 */
	KRT_EGRESS_DOMAIN_OBSERVE = 1 << 2,
};

/*
 * Key of `egress_domains`: one policy-named domain of one set, in the
 * normalised wire form of dnsname.h. The name comes first so that a name
 * in the snooper's scratch space, which is laid out as these keys, sits at
 * an 8-byte-aligned offset.
 */
struct krt_egress_domain_key {
	struct domain_key name;
	__u32 set_id; /* host byte order */
};

/* Value of `egress_domains`. */
struct krt_egress_domain {
	__u32 verdicts; /* enum krt_egress_domain_verdict bits, never 0 */
	/* Userspace's number for the name (the same for every set naming
	 * it), copied into what the name teaches, so a learned address says
	 * which name it came from. */
	__u32 name_id;
};

/* Key of `egress_learned`: an address a set learned. */
struct krt_egress_learned_key {
	__u32 set_id; /* host byte order */
	__u32 family; /* enum krt_egress_family */
	/* Network byte order; an IPv4 address in the first 4 bytes, the rest
	 * zero. */
	__u8 addr[16];
};

/* Value of `egress_learned`. */
struct krt_egress_learned {
	/* bpf_ktime_get_ns() (CLOCK_MONOTONIC) after which the entry no
	 * longer counts. */
	__u64 expires_ns;
	/* The verdict bits of the names the answers reached it through: an
	 * answer or-s its bits into an unexpired entry's (so an address any
	 * denied name gave stays denied) and keeps the later expiry. */
	__u32 verdicts;
	/* name_id (see krt_egress_domain) of the first policy-named name of
	 * the latest answer that taught it. */
	__u32 name_id;
};

/* Value of cgroup_filters, keyed by cgroup id (__u64). */
struct krt_egress_filter {
	/* The filter set (of the four tries) that applies to the cgroup. */
	__u32 set_id;
	/* enum krt_egress_flag bits; unknown bits are ignored. */
	__u32 flags;
};

/*
 * Key of `egress_hosts`: a host entry (IPv4 /32, IPv6 /128) of a set. The
 * layout of krt_egress_learned_key, so one key serves both lookups.
 */
struct krt_egress_host_key {
	__u32 set_id; /* host byte order */
	__u32 family; /* enum krt_egress_family */
	/* Network byte order; an IPv4 address in the first 4 bytes, the rest
	 * zero. */
	__u8 addr[16];
};

/* Value of `egress_hosts`. */
struct krt_egress_host {
	/* enum krt_egress_domain_verdict bits: the address is on the set's
	 * allow list, its deny list, or both (never 0: no bit, no entry). */
	__u32 verdicts;
};

/*
 * LPM trie keys (prefixes shorter than a host: /0../31, /0../127).
 * `prefixlen` counts the 32 bits of `set_id` plus the address prefix, so
 * every entry and every lookup pins the whole set id:
 * one trie holds every set and a lookup never matches another set's entry.
 * The kernel compares the bytes after `prefixlen` as one big-endian bit
 * string, so `set_id` is stored big-endian too (for an exact 32-bit match
 * any order would do; this one keeps dumps readable). `addr` is in network
 * byte order, as on the wire.
 */
struct krt_egress_v4_key {
	__u32 prefixlen; /* 32 + 0..32 */
	__be32 set_id;
	__u8 addr[4];
};

struct krt_egress_v6_key {
	__u32 prefixlen; /* 32 + 0..128 */
	__be32 set_id;
	__u8 addr[16];
};

/* What the program decided for one parsed packet. 0 is never used. */
enum krt_egress_decision {
	/* A deny entry of the set matched: dropped (beats any allow entry). */
	KRT_EGRESS_DENIED = 1,
	/* An allow entry matched and no deny entry did: passed. */
	KRT_EGRESS_ALLOWED = 2,
	/* No entry matched and the set is default deny: dropped. */
	KRT_EGRESS_DEFAULT_DENIED = 3,
	/* No entry matched and the set is not default deny: passed. */
	KRT_EGRESS_UNMATCHED = 4,
};

/* IP family of an observation: the IP version number. */
enum krt_egress_family {
	KRT_EGRESS_IPV4 = 4,
	KRT_EGRESS_IPV6 = 6,
};

/* Key of `observations`; the value is a __u64 packet count. */
struct krt_egress_obs_key {
	__u32 set_id; /* host byte order */
	__u32 decision; /* enum krt_egress_decision */
	__u32 family; /* enum krt_egress_family */
	/* Destination in network byte order; an IPv4 one in the first 4
	 * bytes, the rest zero. */
	__u8 addr[16];
};

/*
 * The single element of the per-CPU `stats` array: packets of selected
 * cgroups by outcome. Every packet of a cgroup in cgroup_filters adds one
 * to exactly one of the first seven counters (packets of other cgroups are
 * not counted: they cost one lookup and nothing else).
 */
struct krt_egress_stats {
	/* Dropped: a deny entry matched. */
	__u64 denied;
	/* Passed: an allow entry matched. */
	__u64 allowed;
	/* Dropped: nothing matched under default deny. */
	__u64 default_denied;
	/* Passed: nothing matched, no default deny. */
	__u64 unmatched;
	/* skb->protocol said IPv4 or IPv6 but the header was truncated or
	 * malformed; passed (no default deny) ... */
	__u64 malformed_passed;
	/* ... or dropped (default deny). */
	__u64 malformed_dropped;
	/* Neither IPv4 nor IPv6 (skb->protocol): passed, whatever the flags. */
	__u64 other_protocol;
	/* Observations that started a new key in `observations` (minus what
	 * the last drains returned, this bounds what LRU eviction lost). */
	__u64 observe_inserted;
	/* Observations that could not be counted (map update failed). */
	__u64 observe_failed;
	/* Packets of sets naming domains whose destination a DNS answer
	 * taught the set and whose entry had not expired ... */
	__u64 learned_hits;
	/* ... or had expired (it then decides nothing). */
	__u64 learned_expired;
	/* Packets decided by their socket's cached verdict (counted in one
	 * of the first four counters too): no map but the generations was
	 * read for them. */
	__u64 cached;
	/* Verdicts that could not be cached for their socket (a write to its
	 * slot was in progress beneath this run, on this CPU): the next
	 * packet of the socket takes the full path again. */
	__u64 cache_failed;
};

/* Slots of `observe_share` (egress_filter.bpf.c). */
enum krt_egress_obs_share_slot {
	/* The drain epoch: userspace advances it after every drain. */
	KRT_EGRESS_OBS_EPOCH = 0,
	/* New `observations` keys a set may start per epoch; 0: no limit. */
	KRT_EGRESS_OBS_SHARE = 1,
	KRT_EGRESS_OBS_SHARE_SLOTS = 2,
};

/*
 * Value of `learned_budget`, by set id: written by the snooper only.
 * The set holds `inserted` minus userspace's `learned_released` entries
 * of `egress_learned` (both cumulative since the set id was last freed).
 */
struct krt_egress_learned_budget {
	/* New (set, address) keys the snooper added. */
	__u64 inserted;
	/* A or AAAA records not learned because the set held its share. */
	__u64 over_share;
	/* Responses refused (dropped) because an address an enforced
	 * policy denies by name could not be learned: the set held its
	 * share. The pod never sees an address it could not be stopped
	 * from reaching. */
	__u64 answers_refused;
};

/* Value of `observe_budget`, by set id. */
struct krt_egress_obs_budget {
	__u64 epoch; /* the drain epoch `started` counts in */
	__u64 started; /* keys the set started in that epoch */
	/* Observations not counted because the set was past its share,
	 * since the entry was made (cumulative). */
	__u64 over_share;
};

/*
 * Slots of `egress_generation`. Every cached verdict holds the values of
 * both as they were read before the lookups that produced it; a value
 * differing from the current one means the verdict may be stale.
 */
enum krt_egress_generation_slot {
	/* Written by userspace after every change to cgroup_filters, the
	 * host map, the tries or the learned addresses: a fresh value that
	 * never repeats (not a counter, so that no value read while it is
	 * being written can equal an older one). */
	KRT_EGRESS_GEN_POLICY = 0,
	/* Added to (atomically) by the DNS answer snooper whenever an
	 * answer teaches a set an address, or a verdict, it did not hold. */
	KRT_EGRESS_GEN_LEARNED = 1,
	KRT_EGRESS_GEN_SLOTS = 2,
};

/*
 * A socket's cached verdict: what the full path decided for the socket's
 * last destination, in a slot of `egress_cpu_cache` (struct
 * krt_egress_cpu_cache).
 */
struct krt_egress_sock_cache {
	__u64 policy_gen; /* egress_generation[KRT_EGRESS_GEN_POLICY] */
	__u64 learned_gen; /* egress_generation[KRT_EGRESS_GEN_LEARNED] */
	/* bpf_ktime_get_ns() after which a learned address that took part
	 * in the verdict has expired; 0 when none did. */
	__u64 expires_ns;
	__u32 set_id;
	__u32 flags; /* the cgroup's krt_egress_filter.flags */
	__u32 decision; /* enum krt_egress_decision */
	__u32 family; /* enum krt_egress_family */
	/* The destination, network byte order; IPv4 in the first 4 bytes. */
	__u8 addr[16];
};

/*
 * One slot of the per-CPU verdict cache `egress_cpu_cache`: the socket
 * (its cookie, never reused while the system runs) and its verdict.
 * Written in place, so guarded by a sequence count as the kernel's
 * seqcount: odd while a write is in progress. Only this CPU writes or
 * reads the slot, but a program run in process context can be
 * interrupted by one run from a softirq (a TCP ACK, a retransmit) on the
 * same CPU: a reader that finds the count odd, or changed across its
 * reads, misses; a writer that finds it odd leaves the slot alone.
 */
struct krt_egress_cpu_cache {
	__u32 seq;
	__u32 _pad;
	__u64 cookie;
	struct krt_egress_sock_cache c;
};

#endif /* KRT_EGRESS_H */
