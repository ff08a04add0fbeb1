// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The network egress filter: one cgroup_skb/egress program serving every
 * selected pod on the node.
 *
 * Unlike the Go original (one object per pod), ONE loaded object is
 * attached to many container cgroups. `cgroup_filters` maps the cgroup of
 * the packet's socket to the filter set that applies to it; the set's
 * host entries (IPv4 /32, IPv6 /128) live in one hash map, `egress_hosts`,
 * and its shorter prefixes in four LPM tries (allow/deny x IPv4/IPv6), all
 * shared by every set, each key carrying its set id. A cgroup absent from
 * cgroup_filters passes after that one lookup.
 *
 * Cost: a host entry is one hash lookup whatever the set's size; a trie
 * is walked only when the set has prefixes in it (the HOSTS_* and
 * DENY_* / ALLOW_* bits of the cgroup's flags say which), so a set of
 * host entries only never walks a trie.
 *
 * That full path runs for a socket's first packet to a destination (on
 * a CPU); the verdict is then cached for the socket (egress_cpu_cache, a
 * per-CPU slot its cookie picks) with the two generations of
 * egress_generation, and the socket's later packets to the same
 * destination read the generations (two inlined array reads) and the
 * slot instead of the gate, host and trie lookups. Userspace
 * writes a new policy generation after every change to cgroup_filters,
 * the hosts, the tries or the learned addresses, and the snooper adds to
 * the learned one when an answer teaches a set something new, so a cached
 * verdict never outlives a change that could alter it: the socket's next
 * packet decides again. A verdict a learned address took part in also
 * ends when that address expires. A socket's cgroup is fixed at its
 * creation, so the cgroup's set is covered by the policy generation.
 * Refusals (and everything, when observing) are still counted per packet
 * in `observations`, cached or not.
 *
 * Verdict, for a packet of a selected cgroup (1 = pass, 0 = drop):
 *
 *   1. a deny entry of the set matches the destination  -> drop
 *      (a host entry or a prefix: "matches" means either)
 *   2. else an allow entry matches                      -> pass
 *   3. else the set is default deny                     -> drop
 *   4. else                                             -> pass
 *
 * For a set with KRT_EGRESS_FLAG_DOMAINS, "an entry matches" includes an
 * unexpired address that a DNS answer for one of the set's domains taught
 * it (egress_learned, written by the snooper in bpf/dnssnoop/), on the
 * side (allow or deny) its name is on.
 *
 * An explicit deny beats an allow entry whatever their prefix lengths (a
 * /0 deny beats a /32 allow): the specification's multi-policy semantics
 * make a set the union of every matching policy's entries, so a deny that
 * some policy asserts must hold even when another policy allows a
 * narrower range. Longest-prefix matching happens within each trie only.
 *
 * Input the program cannot parse (skb->protocol says IPv4/IPv6 but the
 * header is truncated or malformed) passes unless the set is default deny:
 * every path through a program that cannot parse its input lets the
 * packet through unless the policy is a default deny that says otherwise.
 * Either way it is counted in `stats`.
 *
 * Kernel portability: CO-RE, no kernel-version #ifdefs, no bpf_loop or
 * kfuncs, and only helpers that cgroup_skb programs may call on 5.10
 * (bpf_skb_cgroup_id, bpf_skb_load_bytes, bpf_ktime_get_ns, map helpers);
 * the IP header is read in place through skb->data, which cgroup_skb
 * programs of a privileged loader may read since 5.0.
 */
#include "common.h"
#include <bpf/bpf_endian.h>
#include "egress.h"
#include "egress_maps.h"
#include "udp.h"

/* Not in vmlinux.h (they are macros in the kernel). */
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define EEXIST 17

/* cgroup_skb return values. */
#define SKB_PASS 1
#define SKB_DROP 0

/* cgroup_filters, egress_domains, egress_learned: see egress_maps.h. */

/*
 * The host entries of every set: (set, family, address) -> which lists
 * hold it. An address on both lists carries both bits (and is denied).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_HOSTS);
	__type(key, struct krt_egress_host_key);
	__type(value, struct krt_egress_host);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_hosts SEC(".maps");

/*
 * The four tries of prefixes shorter than a host (userspace puts a /32 or
 * /128 in egress_hosts instead). The value is unused (a trie needs one):
 * any entry present means "matches". The kernel refuses LPM tries without
 * BPF_F_NO_PREALLOC.
 */
#define KRT_EGRESS_TRIE(name, key_type)                                        \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);                           \
		__uint(max_entries, KRT_EGRESS_MAX_PREFIXES);                  \
		__type(key, key_type);                                         \
		__type(value, __u8);                                           \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
	} name SEC(".maps")

KRT_EGRESS_TRIE(allow_v4, struct krt_egress_v4_key);
KRT_EGRESS_TRIE(deny_v4, struct krt_egress_v4_key);
KRT_EGRESS_TRIE(allow_v6, struct krt_egress_v6_key);
KRT_EGRESS_TRIE(deny_v6, struct krt_egress_v6_key);

/*
 * Per-destination counters (every refusal; everything for sets with
 * KRT_EGRESS_FLAG_OBSERVE), drained (read and reset) by userspace. Bounded: when full, the least recently
 * used key is evicted and its count lost; `observe_inserted` in stats lets
 * userspace tell how much.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_OBSERVATIONS);
	__type(key, struct krt_egress_obs_key);
	__type(value, __u64);
} observations SEC(".maps");

/*
 * Each set's share of `observations` (issue 37: one pod must not evict
 * its neighbours' counts). Userspace writes the share (new keys a set may
 * start per drain: the map's size over the sets in use, so the shares sum
 * to at most the map and the LRU never has to evict) and the drain epoch,
 * which it advances after each drain (that removed what it read).
 * Observations of a set past its share are not counted, and counted as
 * such in its budget. Not pinned: a new load starts afresh.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, KRT_EGRESS_OBS_SHARE_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} observe_share SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_CGROUPS);
	__type(key, __u32);
	__type(value, struct krt_egress_obs_budget);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} observe_budget SEC(".maps");

/* Outcome counters, one struct per CPU (no atomics needed). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_egress_stats);
} stats SEC(".maps");

/*
 * Sockets' cached verdicts (struct krt_egress_cpu_cache), per CPU, in a
 * slot the socket's cookie picks (its low bits: cookies are handed out in
 * sequence, so a burst of new sockets spreads over the slots). The
 * packets after a socket's first on a CPU pay for two generation reads
 * and this slot's instead of the cgroup, host and trie lookups, and no
 * socket ever pays for an allocation: socket storage cost an allocation
 * and a free per socket (measured 300 ns on its second packet against
 * 120 for the whole first, issue 27), which a one-shot socket (a DNS
 * question) paid for nothing. Another socket taking the slot, or the
 * socket's packets moving to another CPU, only costs a miss (the full
 * path), never a wrong verdict: a slot names its socket's cookie, and
 * cookies are not reused while the system runs. Not pinned: a restarted
 * daemon's program starts with an empty cache (a new map), so no entry
 * can outlive the generations it was checked against.
 */
#define KRT_EGRESS_CACHE_SLOTS 1024

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KRT_EGRESS_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct krt_egress_cpu_cache);
} egress_cpu_cache SEC(".maps");

/*
 * ---- Pinned state -------------------------------------------------------
 *
 * (Userspace-only layouts, kept here rather than in egress.h since the
 * program never reads them; Rust reads them from the skeleton's types as
 * it does egress.h's.)
 *
 * With a pin directory every map below (and every one above but the .bss)
 * is pinned, and each per-cgroup link too, so enforcement outlives the
 * daemon. The maps above hold per-cgroup *unions*; which policy asked for
 * which entry is lost in a union, so the daemon also keeps a *ledger* of
 * what each policy holds (its kind and flags, its prefixes, its bound
 * cgroups) in three hash maps the program never reads. A restarted daemon
 * rebuilds its per-policy state from the ledger and its per-cgroup mirror
 * from cgroup_filters and the tries.
 *
 * KRT_EGRESS_LAYOUT_VERSION names the layout of every pinned map (keys,
 * values, and what the ledger means). Bump it on any change: a daemon that
 * finds pins of another version discards them (removes the map pins and
 * rebuilds) instead of misreading them.
 */
enum krt_egress_layout {
	/* 2: egress_domains, egress_learned and egress_domain_rules; the
	 * learned counters in stats.
	 * 3: host entries in egress_hosts instead of the tries; the set's
	 * occupancy bits in cgroup_filters' flags.
	 * 4: the cache counters in stats.
	 * 5: egress_learned a hash map that never evicts (was an LRU), with
	 * each set's share kept in learned_budget and learned_released. */
	KRT_EGRESS_LAYOUT_VERSION = 5,
};

/* The single element of `egress_meta`. */
struct krt_egress_meta {
	__u32 layout_version; /* KRT_EGRESS_LAYOUT_VERSION of the writer */
	__u32 reserved; /* zero */
};

/* Ledger ceilings (hash maps without preallocation: ceilings only). */
#define KRT_EGRESS_MAX_POLICIES (1 << 12)
/* Prefixes over every policy: the tries' and egress_hosts' budget. */
#define KRT_EGRESS_MAX_LEDGER_RULES (1 << 20)
/* (policy, cgroup) bindings. */
#define KRT_EGRESS_MAX_BINDINGS (1 << 16)

/* A policy id (its UID, at most 63 bytes) NUL-padded. */
#define KRT_EGRESS_POLICY_ID_LEN 64

/* Kind of a ledger policy. 0 is never used. */
enum krt_egress_policy_kind {
	KRT_EGRESS_POLICY_ENFORCE = 1,
	KRT_EGRESS_POLICY_OBSERVE = 2,
};

/* Bits of krt_egress_policy.flags. */
enum krt_egress_policy_flag {
	KRT_EGRESS_POLICY_DEFAULT_DENY = 1 << 0,
};

/* Key of `egress_policies`. */
struct krt_egress_policy_key {
	__u8 id[KRT_EGRESS_POLICY_ID_LEN];
};

/* Value of `egress_policies`. */
struct krt_egress_policy {
	__u32 kind; /* enum krt_egress_policy_kind */
	__u32 flags; /* enum krt_egress_policy_flag bits */
};

/* Key of `egress_rules` (one prefix of one policy); the value is a __u8. */
struct krt_egress_rule_key {
	__u8 id[KRT_EGRESS_POLICY_ID_LEN];
	__u8 verdict; /* 1 allow, 2 deny */
	__u8 family; /* enum krt_egress_family */
	__u8 prefix_len; /* 0..32 or 0..128 */
	__u8 reserved; /* zero */
	__u8 addr[16]; /* network order, host bits zero; IPv4 in the first 4 */
};

/* Key of `egress_domain_rules` (one domain of one policy); value __u8. */
struct krt_egress_domain_rule_key {
	__u8 id[KRT_EGRESS_POLICY_ID_LEN];
	__u8 verdict; /* 1 allow, 2 deny */
	__u8 reserved[3]; /* zero */
	struct domain_key name;
};

/* Key of `egress_bindings` (one cgroup bound to one policy); value __u8. */
struct krt_egress_binding_key {
	__u8 id[KRT_EGRESS_POLICY_ID_LEN];
	__u64 cgroup_id;
};

/*
 * The ledger and its layout version (see above): userspace bookkeeping for
 * restarts, pinned with the maps above. The program never reads them.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_egress_meta);
} egress_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_POLICIES);
	__type(key, struct krt_egress_policy_key);
	__type(value, struct krt_egress_policy);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_LEDGER_RULES);
	__type(key, struct krt_egress_rule_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_DOMAINS);
	__type(key, struct krt_egress_domain_rule_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_domain_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_BINDINGS);
	__type(key, struct krt_egress_binding_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} egress_bindings SEC(".maps");

/*
 * Never used: they put the enums into the object's BTF, so the skeleton
 * generates their Rust constants (no map or global refers to them).
 */
enum krt_egress_flag krt_egress_flag_btf_anchor = 0;
enum krt_egress_decision krt_egress_decision_btf_anchor = 0;
enum krt_egress_family krt_egress_family_btf_anchor = 0;
enum krt_egress_layout krt_egress_layout_btf_anchor = 0;
enum krt_egress_policy_kind krt_egress_policy_kind_btf_anchor = 0;
enum krt_egress_policy_flag krt_egress_policy_flag_btf_anchor = 0;
enum krt_egress_domain_verdict krt_egress_domain_verdict_btf_anchor = 0;
enum krt_egress_generation_slot krt_egress_generation_slot_btf_anchor = 0;
struct krt_egress_cpu_cache krt_egress_cpu_cache_btf_anchor = {};
enum krt_egress_obs_share_slot krt_egress_obs_share_slot_btf_anchor = 0;

static __always_inline void count(__u64 *counter)
{
	/* Per-CPU value and the program cannot migrate: a plain add. */
	*counter += 1;
}

/*
 * A parsed destination: the family and the address as the keys hold it
 * (network byte order, an IPv4 address zero-padded to 16 bytes).
 */
struct destination {
	__u32 family; /* enum krt_egress_family */
	__u32 zero; /* keeps `addr` 8-byte aligned */
	union {
		__u8 addr[16];
		__u64 words[2];
	};
};

/*
 * Whether the set may start one more key in `observations` this drain
 * epoch (1, charged) or not (0; see observe_share). No share written: no
 * limit. A global function: verified once, so its branches do not
 * multiply the states of the verdict paths that reach observe().
 */
__attribute__((noinline)) int krt_observe_within_share(__u32 set_id)
{
	__u32 epoch_slot = KRT_EGRESS_OBS_EPOCH, share_slot = KRT_EGRESS_OBS_SHARE;
	struct krt_egress_obs_budget *b, fresh = {};
	__u64 *epoch, *share, e, limit;

	epoch = bpf_map_lookup_elem(&observe_share, &epoch_slot);
	share = bpf_map_lookup_elem(&observe_share, &share_slot);
	if (!epoch || !share)
		return 1;
	limit = *share;
	if (limit == 0)
		return 1;
	e = *epoch;
	b = bpf_map_lookup_elem(&observe_budget, &set_id);
	if (!b) {
		fresh.epoch = e;
		fresh.started = 1;
		bpf_map_update_elem(&observe_budget, &set_id, &fresh, BPF_ANY);
		return 1;
	}
	if (b->epoch != e) {
		b->epoch = e;
		b->started = 1;
		return 1;
	}
	if (b->started >= limit) {
		__sync_fetch_and_add(&b->over_share, 1);
		return 0;
	}
	__sync_fetch_and_add(&b->started, 1);
	return 1;
}

/*
 * Adds one to the (set, family, destination, decision) counter; the
 * destination's 16 bytes come as two words, as struct destination holds
 * them. Inlined at one place only (conclude(), which both paths end in).
 */
static __always_inline int observe(__u32 set_id, __u32 family,
				      __u32 decision, __u64 addr0, __u64 addr1)
{
	struct krt_egress_obs_key key;
	struct krt_egress_stats *st;
	__u64 one = 1, *n;
	__u32 zero = 0;
	long err;

	__builtin_memset(&key, 0, sizeof(key));
	key.set_id = set_id;
	key.decision = decision;
	key.family = family;
	/* 16 bytes whatever the family: an IPv4 address is zero-padded. */
	__builtin_memcpy(key.addr, &addr0, 8);
	__builtin_memcpy(key.addr + 8, &addr1, 8);

	n = bpf_map_lookup_elem(&observations, &key);
	if (n) {
		/* Other CPUs add to the same key: atomic (result unused, so
		 * this is BPF_XADD, which every kernel has). */
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	st = bpf_map_lookup_elem(&stats, &zero);
	if (!st)
		return 0; /* cannot happen: a one-element array */
	if (!krt_observe_within_share(set_id))
		return 0;
	err = bpf_map_update_elem(&observations, &key, &one, BPF_NOEXIST);
	if (err == 0) {
		count(&st->observe_inserted);
		return 0;
	}
	if (err == -EEXIST) {
		/* Another CPU inserted it between our lookup and update. */
		n = bpf_map_lookup_elem(&observations, &key);
		if (n) {
			__sync_fetch_and_add(n, 1);
			return 0;
		}
	}
	count(&st->observe_failed);
	return 0;
}

/*
 * The verdict bits (enum krt_egress_domain_verdict) a DNS answer taught
 * the set for the destination, or 0: none, or expired. Only called for a
 * set naming domains. An unexpired entry's expiry goes to `*expires_ns`:
 * a cached verdict it took part in must not outlive it.
 */
static __always_inline __u32
learned_verdicts(struct krt_egress_stats *st,
		 const struct krt_egress_host_key *key, __u64 *expires_ns)
{
	struct krt_egress_learned *l;
	__u64 expires;

	/* The same layout (egress.h): the host key is the learned key. */
	l = bpf_map_lookup_elem(&egress_learned, key);
	if (!l)
		return 0;
	/* Read once: the snooper may refresh the entry concurrently. */
	expires = l->expires_ns;
	if (expires <= bpf_ktime_get_ns()) {
		count(&st->learned_expired);
		return 0;
	}
	count(&st->learned_hits);
	*expires_ns = expires;
	return l->verdicts;
}

/*
 * The lookups each family makes: its trie pair and the flag bits saying
 * whether the set has host entries or prefixes of that family.
 */
struct family_maps {
	void *deny;
	void *allow;
	__u32 hosts_flag;
	__u32 deny_flag;
	__u32 allow_flag;
};

_Static_assert(sizeof(struct krt_egress_host_key) ==
		       sizeof(struct krt_egress_learned_key),
	       "one key serves egress_hosts and egress_learned");
_Static_assert(__builtin_offsetof(struct krt_egress_host_key, addr) ==
		       __builtin_offsetof(struct krt_egress_learned_key, addr),
	       "one key serves egress_hosts and egress_learned");

/*
 * Steps 1-4 of the verdict for a parsed destination, given the set's host
 * key for it (`host`) and its trie key (`trie_key`), and the verdict bits
 * the set learned for it (`learned`): the decision (enum
 * krt_egress_decision). Every lookup the set cannot match is skipped: the
 * host map without host entries of the family, a trie without prefixes of
 * the set.
 */
static __always_inline __u32 decide(const struct family_maps *m,
				    const struct krt_egress_host_key *host,
				    const void *trie_key, __u32 flags,
				    __u32 verdicts)
{
	struct krt_egress_host *h;

	if (flags & m->hosts_flag) {
		h = bpf_map_lookup_elem(&egress_hosts, host);
		if (h)
			verdicts |= h->verdicts;
	}

	if ((verdicts & KRT_EGRESS_DOMAIN_DENY) ||
	    ((flags & m->deny_flag) && bpf_map_lookup_elem(m->deny, trie_key)))
		return KRT_EGRESS_DENIED;
	if ((verdicts & KRT_EGRESS_DOMAIN_ALLOW) ||
	    ((flags & m->allow_flag) && bpf_map_lookup_elem(m->allow, trie_key)))
		return KRT_EGRESS_ALLOWED;
	if (flags & KRT_EGRESS_FLAG_DEFAULT_DENY)
		return KRT_EGRESS_DEFAULT_DENIED;
	return KRT_EGRESS_UNMATCHED;
}

/*
 * The decision of the set (`set_id`, `flags`) for a destination (`family`
 * and its 16 bytes as two words), given the verdict bits the set learned
 * for it, both in `family_learned`: the family in the low 8 bits, the
 * verdict bits above.
 *
 * Global, like observe(), so the verifier checks the lookups once and
 * not once per path of the caller; it takes scalars only (5.10).
 */
__attribute__((noinline)) int decide_destination(__u32 set_id, __u32 flags,
						 __u32 family_learned,
						 __u64 addr0, __u64 addr1)
{
	__u32 family = family_learned & 0xff, learned = family_learned >> 8;
	struct krt_egress_host_key host = {};

	host.set_id = set_id;
	host.family = family;
	__builtin_memcpy(host.addr, &addr0, 8);
	__builtin_memcpy(host.addr + 8, &addr1, 8);
	if (family == KRT_EGRESS_IPV4) {
		const struct family_maps v4_maps = {
			.deny = &deny_v4,
			.allow = &allow_v4,
			.hosts_flag = KRT_EGRESS_FLAG_HOSTS_V4,
			.deny_flag = KRT_EGRESS_FLAG_DENY_V4,
			.allow_flag = KRT_EGRESS_FLAG_ALLOW_V4,
		};
		struct krt_egress_v4_key key = {};

		key.prefixlen = 32 + 32;
		key.set_id = bpf_htonl(set_id);
		__builtin_memcpy(key.addr, host.addr, sizeof(key.addr));
		return decide(&v4_maps, &host, &key, flags, learned);
	} else {
		const struct family_maps v6_maps = {
			.deny = &deny_v6,
			.allow = &allow_v6,
			.hosts_flag = KRT_EGRESS_FLAG_HOSTS_V6,
			.deny_flag = KRT_EGRESS_FLAG_DENY_V6,
			.allow_flag = KRT_EGRESS_FLAG_ALLOW_V6,
		};
		struct krt_egress_v6_key key = {};

		key.prefixlen = 32 + 128;
		key.set_id = bpf_htonl(set_id);
		__builtin_memcpy(key.addr, host.addr, sizeof(key.addr));
		return decide(&v6_maps, &host, &key, flags, learned);
	}
}

/*
 * Counts a decision (and observes it: every refusal, and everything for
 * a set observing) and returns its verdict. Both paths end here, the
 * cached one included, so a cached verdict is counted and observed
 * exactly like the one it repeats.
 */
static __always_inline int conclude(struct krt_egress_stats *st, __u32 set_id,
				    __u32 flags, const struct destination *dst,
				    __u32 decision)
{
	int verdict;

	switch (decision) {
	case KRT_EGRESS_DENIED:
		count(&st->denied);
		verdict = SKB_DROP;
		break;
	case KRT_EGRESS_ALLOWED:
		count(&st->allowed);
		verdict = SKB_PASS;
		break;
	case KRT_EGRESS_DEFAULT_DENIED:
		count(&st->default_denied);
		verdict = SKB_DROP;
		break;
	default:
		decision = KRT_EGRESS_UNMATCHED;
		count(&st->unmatched);
		verdict = SKB_PASS;
		break;
	}

	/*
	 * A refusal is always counted, so an enforce-only pod's denials
	 * become findings too; an allowed packet only when observing. The
	 * only cost when it is off: this test.
	 */
	if ((flags & KRT_EGRESS_FLAG_OBSERVE) || verdict == SKB_DROP)
		observe(set_id, dst->family, decision, dst->words[0],
			dst->words[1]);
	return verdict;
}

/* A header skb->protocol promised but the bytes do not hold. */
static __always_inline int malformed(struct krt_egress_stats *st, __u32 flags)
{
	if (flags & KRT_EGRESS_FLAG_DEFAULT_DENY) {
		count(&st->malformed_dropped);
		return SKB_DROP;
	}
	count(&st->malformed_passed);
	return SKB_PASS;
}

/*
 * The fixed IP header (`len` bytes), or NULL when the packet is shorter.
 *
 * In a cgroup_skb program skb->data starts at the IP header. When the
 * skb's linear data holds the header (on real egress it always does: the
 * stack writes the header there) it is read in place, with no helper call;
 * otherwise it is copied into `copy` with bpf_skb_load_bytes, which also
 * reads a non-linear skb and fails (instead of reading past the end) when
 * the packet is shorter than asked: that is how a truncated header is
 * detected. (Reading skb->data needs a privileged loader, which the
 * daemon is, on every kernel this supports.)
 */
static __always_inline const void *ip_header(struct __sk_buff *skb,
					     void *copy, __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (data + len <= data_end)
		return data;
	if (bpf_skb_load_bytes(skb, 0, copy, len) < 0)
		return NULL;
	return copy;
}

/*
 * The question side of DNS learning (dnsquestion.h): this program sees
 * every packet a filtered cgroup sends, so it notes the DNS questions of
 * cgroups whose sets name domains for the snooper to match answers to.
 */

/* Questions noted per cgroup in the current second (see
 * KRT_DNS_QUESTIONS_PER_S). An LRU: a cgroup gone is forgotten. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KRT_EGRESS_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, struct krt_dns_question_budget);
} dns_question_budget SEC(".maps");

/* The raw question being noted. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_dns_question_scratch);
} question_scratch SEC(".maps");

/* Whether the cgroup may note one more question this second (and if so,
 * charges it). Concurrent CPUs may both pass at the edge: a budget, not a
 * count. */
static __always_inline bool question_budget(__u64 cgroup_id)
{
	struct krt_dns_question_budget *b, fresh;
	__u64 now = bpf_ktime_get_ns();

	b = bpf_map_lookup_elem(&dns_question_budget, &cgroup_id);
	if (!b) {
		fresh.window_ns = now;
		fresh.noted = 1;
		bpf_map_update_elem(&dns_question_budget, &cgroup_id, &fresh,
				    BPF_ANY);
		return true;
	}
	if (now - b->window_ns >= KRT_NS_PER_S) {
		b->window_ns = now;
		b->noted = 1;
		return true;
	}
	if (b->noted >= KRT_DNS_QUESTIONS_PER_S)
		return false;
	b->noted += 1;
	return true;
}

/*
 * Notes the packet in `dns_questions` if it is a DNS question (UDP to port
 * 53, QR clear, a standard query of one question) of a cgroup whose set
 * names domains, sent to a declared resolver. Never changes the verdict.
 * A global function: verified once, off the verdict path's stack.
 */
__attribute__((noinline)) int krt_note_question(struct __sk_buff *skb)
{
	struct krt_dns_question_scratch *qs;
	struct krt_dns_resolver_key resolver;
	struct krt_dns_question_key key;
	struct krt_dns_question value;
	struct krt_egress_filter *filter;
	struct krt_dns_snoop_stats *st;
	struct udphdr udp;
	__u8 hdr[KRT_DNS_HEADER_LEN];
	__u32 zero = 0, family = 0, off;
	__u64 cgroup_id = bpf_skb_cgroup_id(skb);

	filter = bpf_map_lookup_elem(&cgroup_filters, &cgroup_id);
	if (!filter || !(filter->flags & KRT_EGRESS_FLAG_DOMAINS))
		return 0;
	off = krt_udp_offset(skb);
	if (off == 0)
		return 0;
	if (bpf_skb_load_bytes(skb, off, &udp, sizeof(udp)) < 0)
		return 0;
	if (udp.dest != bpf_htons(KRT_DNS_PORT))
		return 0;
	st = bpf_map_lookup_elem(&snoop_stats, &zero);
	qs = bpf_map_lookup_elem(&question_scratch, &zero);
	if (!st || !qs)
		return 0; /* cannot happen: one-element arrays */
	if (bpf_skb_load_bytes(skb, off + sizeof(udp), hdr, sizeof(hdr)) < 0) {
		count(&st->questions_unreadable);
		return 0;
	}
	/* QR set: an answer from a server in the pod, not a question. */
	if (hdr[2] & 0x80)
		return 0;
	/* OPCODE QUERY (0) and one question. */
	if ((hdr[2] & 0x78) != 0 || hdr[4] != 0 || hdr[5] != 1) {
		count(&st->questions_unreadable);
		return 0;
	}

	__builtin_memset(&resolver, 0, sizeof(resolver));
	if (krt_packet_addr(skb, false, &family, resolver.addr) < 0)
		return 0;
	resolver.family = family;
	if (!bpf_map_lookup_elem(&dns_resolvers, &resolver)) {
		count(&st->questions_undeclared);
		return 0;
	}
	if (krt_dns_read_question(skb, off + sizeof(udp), qs) !=
	    KRT_DNS_QUESTION_OK) {
		count(&st->questions_unreadable);
		return 0;
	}
	if (!question_budget(cgroup_id)) {
		count(&st->questions_over_budget);
		return 0;
	}

	__builtin_memset(&key, 0, sizeof(key));
	key.cgroup_id = cgroup_id;
	key.family = family;
	__builtin_memcpy(key.resolver, resolver.addr, sizeof(key.resolver));
	key.port = udp.source;
	__builtin_memcpy(&key.id, hdr, sizeof(key.id));
	value.expires_ns = bpf_ktime_get_ns() +
			   (__u64)KRT_DNS_QUESTION_TIMEOUT_S * KRT_NS_PER_S;
	value.name_hash = krt_dns_name_hash(qs);
	value.type_class = qs->type_class;
	value.name_len = qs->len;
	if (bpf_map_update_elem(&dns_questions, &key, &value, BPF_ANY) != 0)
		count(&st->questions_unreadable);
	else
		count(&st->questions_noted);
	return 0;
}

/* What parse() found. */
enum parsed {
	PARSED_IP = 0,
	/* skb->protocol says IPv4 or IPv6 but the header is not one. */
	PARSED_MALFORMED = 1,
	/* Neither IPv4 nor IPv6. */
	PARSED_OTHER = 2,
};

/*
 * The destination of the packet. The family comes from skb->protocol,
 * never from payload bytes, so an IPv4 packet cannot be parsed as IPv6 or
 * the other way round.
 */
static __always_inline enum parsed parse(struct __sk_buff *skb,
					 struct destination *dst, __u32 *next)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		const struct iphdr *ip;
		struct iphdr copy;
		__u8 version_ihl;

		ip = ip_header(skb, &copy, sizeof(copy));
		if (!ip)
			return PARSED_MALFORMED;
		/* The first byte, not the bitfields: their layout is
		 * endian-bound. */
		version_ihl = *(const __u8 *)ip;
		if ((version_ihl >> 4) != 4 || (version_ihl & 0xf) < 5)
			return PARSED_MALFORMED;
		/*
		 * The destination is judged, not the route: with a
		 * source-route option (LSRR/SSRR) the header holds the first
		 * hop of the route and later hops are in the options. Linux
		 * hosts refuse to forward source-routed packets by default,
		 * and like any IP-layer filter this one judges the address
		 * the packet is sent to.
		 */
		dst->family = KRT_EGRESS_IPV4;
		__builtin_memcpy(dst->addr, &ip->daddr, 4);
		*next = ip->protocol;
		return PARSED_IP;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6hdr *ip6;
		struct ipv6hdr copy;

		ip6 = ip_header(skb, &copy, sizeof(copy));
		if (!ip6)
			return PARSED_MALFORMED;
		if ((*(const __u8 *)ip6 >> 4) != 6)
			return PARSED_MALFORMED;
		/*
		 * Extension headers (hop-by-hop, destination options,
		 * fragment, ...) follow the fixed header and do not move the
		 * destination address, which is always at the same offset of
		 * the fixed header: no chain walk is needed. The one header
		 * that matters is a routing header: then the fixed header's
		 * destination is the next segment and the final one is in the
		 * routing header. As for IPv4 source routes, the address the
		 * packet is sent to is judged (Linux drops type 0 routing
		 * headers and processes SRv6 only where enabled).
		 *
		 * An IPv6 socket talking to an IPv4-mapped address
		 * (::ffff:a.b.c.d) sends IPv4 packets, which are parsed as
		 * IPv4 above: IPv4 destinations belong in the IPv4 tries
		 * only.
		 */
		dst->family = KRT_EGRESS_IPV6;
		__builtin_memcpy(dst->addr, &ip6->daddr, 16);
		*next = ip6->nexthdr;
		return PARSED_IP;
	}
	return PARSED_OTHER;
}

/* The current value of a generation slot (0 if the map says nothing,
 * which an array of this size never does). */
static __always_inline __u64 generation(__u32 slot)
{
	__u64 *g = bpf_map_lookup_elem(&egress_generation, &slot);

	/* One 8-byte load: the snooper's atomic adds are never torn. */
	return g ? *(volatile __u64 *)g : 0;
}

/*
 * Whether `c` was taken at the current generations and no learned address
 * in it has expired since: whatever its destination, it is current.
 */
static __always_inline bool cache_current(const struct krt_egress_sock_cache *c,
					  __u64 policy_gen, __u64 learned_gen)
{
	__u64 expires;

	if (c->policy_gen != policy_gen || c->learned_gen != learned_gen)
		return false;
	expires = c->expires_ns;
	return expires == 0 || bpf_ktime_get_ns() < expires;
}

/* Whether `c` holds the verdict for `dst` (given that it is current). */
static __always_inline bool cache_for(const struct krt_egress_sock_cache *c,
				      const struct destination *dst)
{
	const __u64 *addr = (const __u64 *)c->addr;

	return c->family == dst->family && addr[0] == dst->words[0] &&
	       addr[1] == dst->words[1];
}

/* Keeps the compiler from moving memory accesses across it. */
#define krt_barrier() asm volatile("" ::: "memory")

/*
 * The slot's verdict for `cookie` into `out`, when the slot holds one
 * read whole (no write began or ended during the reads).
 */
static __always_inline bool cache_read(struct krt_egress_cpu_cache *slot,
				       __u64 cookie,
				       struct krt_egress_sock_cache *out)
{
	__u32 seq = *(volatile __u32 *)&slot->seq;

	if (seq & 1)
		return false;
	krt_barrier();
	if (slot->cookie != cookie)
		return false;
	__builtin_memcpy(out, &slot->c, sizeof(*out));
	krt_barrier();
	return *(volatile __u32 *)&slot->seq == seq;
}

/*
 * Caches `fresh` for the socket `cookie` in its slot, unless the slot
 * holds a current verdict of the same socket for another destination (a
 * UDP socket sending to many keeps its first destination fast, without
 * one write per packet for a cache that never hits) or a write is in
 * progress beneath this run.
 */
static __always_inline void cache_verdict(struct krt_egress_stats *st,
					  struct krt_egress_cpu_cache *slot,
					  __u64 cookie, bool current,
					  const struct krt_egress_sock_cache *fresh)
{
	__u32 seq = *(volatile __u32 *)&slot->seq;

	if (seq & 1) {
		count(&st->cache_failed);
		return;
	}
	if (current && slot->cookie == cookie)
		return;
	*(volatile __u32 *)&slot->seq = seq + 1;
	krt_barrier();
	slot->cookie = cookie;
	__builtin_memcpy(&slot->c, fresh, sizeof(*fresh));
	krt_barrier();
	*(volatile __u32 *)&slot->seq = seq + 2;
}

/*
 * The cgroup_filters entry of the packet's socket's cgroup, or NULL (the
 * cgroup is not selected).
 *
 * The kernel runs inet egress programs only for packets of full sockets
 * (request sockets map to their listener), so the cgroup id is never 0 on
 * real egress; in BPF_PROG_TEST_RUN the kernel supplies a socket carrying
 * the test process's cgroup. A 0 would miss the lookup (userspace never
 * registers 0) and pass, like any unselected cgroup.
 *
 * There is deliberately no fallback to bpf_get_current_cgroup_id(): 5.10
 * refuses that helper in cgroup_skb programs (one call would make the
 * object unloadable there), and egress also runs in softirq context (TCP
 * retransmits, ACKs), where "current" is whatever task was interrupted.
 */
static __always_inline struct krt_egress_filter *
cgroup_filter(struct __sk_buff *skb)
{
	__u64 cgroup_id = bpf_skb_cgroup_id(skb);

	return bpf_map_lookup_elem(&cgroup_filters, &cgroup_id);
}

/*
 * A packet parse() could not take a destination from: malformed (by the
 * set's flags) or not IP (passed). Counted for a selected cgroup only.
 */
static __attribute__((noinline)) int
unparsed(struct __sk_buff *skb, struct krt_egress_stats *st, enum parsed parsed)
{
	struct krt_egress_filter *filter = cgroup_filter(skb);

	if (!filter)
		return SKB_PASS;
	if (parsed == PARSED_MALFORMED)
		return malformed(st, filter->flags);
	/*
	 * Not IP. The inet egress hook runs from ip_finish_output and
	 * ip6_finish_output, so real traffic never gets here (a test run
	 * can); a network policy speaks about IP destinations only, so this
	 * passes even under default deny.
	 */
	count(&st->other_protocol);
	return SKB_PASS;
}

SEC("cgroup_skb/egress")
int krt_egress(struct __sk_buff *skb)
{
	struct krt_egress_sock_cache c, fresh;
	struct krt_egress_cpu_cache *slot = NULL;
	struct krt_egress_filter *filter;
	struct krt_egress_stats *st;
	struct destination dst = {};
	__u64 policy_gen, learned_gen, expires_ns = 0;
	__u32 set_id, flags, decision, learned = 0, zero = 0, next = 0, index;
	__u64 cookie = 0;
	struct bpf_sock *sk;
	enum parsed parsed;
	bool current = false;

	st = bpf_map_lookup_elem(&stats, &zero);
	if (!st)
		return SKB_PASS; /* cannot happen: a one-element array */

	/*
	 * Read before any lookup, so a verdict cached below is checked
	 * against generations no newer than the maps it was taken from.
	 */
	policy_gen = generation(KRT_EGRESS_GEN_POLICY);
	learned_gen = generation(KRT_EGRESS_GEN_LEARNED);

	parsed = parse(skb, &dst, &next);
	if (parsed != PARSED_IP)
		return unparsed(skb, st, parsed);
	/*
	 * A UDP datagram may be a DNS question to note (before the cached
	 * verdict: the resolver's socket is decided from its cache). TCP,
	 * the bulk, costs this one comparison; IPv6 extension headers are
	 * walked by the noter.
	 */
	if (next == IPPROTO_UDP ||
	    (dst.family == KRT_EGRESS_IPV6 &&
	     (next == KRT_NEXTHDR_HOP || next == KRT_NEXTHDR_ROUTING ||
	      next == KRT_NEXTHDR_DEST || next == KRT_NEXTHDR_FRAGMENT)))
		krt_note_question(skb);

	/*
	 * The socket's cached verdict. The kernel runs inet egress programs
	 * for packets of full sockets (request and timewait sockets, which
	 * send SYN-ACKs and RSTs, take the full path). A socket's cgroup is
	 * fixed when it is created, so the cgroup's set is what the policy
	 * generation covers.
	 */
	sk = skb->sk;
	if (sk)
		sk = bpf_sk_fullsock(sk);
	if (sk)
		cookie = bpf_get_socket_cookie(skb);
	if (cookie) {
		index = cookie & (KRT_EGRESS_CACHE_SLOTS - 1);
		slot = bpf_map_lookup_elem(&egress_cpu_cache, &index);
	}
	if (slot && cache_read(slot, cookie, &c)) {
		/* Decided once: cache_verdict() needs it on a miss too. */
		current = cache_current(&c, policy_gen, learned_gen);
		if (current && cache_for(&c, &dst)) {
			count(&st->cached);
			set_id = c.set_id;
			flags = c.flags;
			decision = c.decision;
			goto decided;
		}
	}

	filter = cgroup_filter(skb);
	if (!filter)
		return SKB_PASS;
	/* Read once: userspace may rewrite the entry concurrently. */
	set_id = filter->set_id;
	flags = filter->flags;

	if (flags & KRT_EGRESS_FLAG_DOMAINS) {
		/* The same layout (egress.h): the host key is the learned key. */
		struct krt_egress_host_key learned_key = {};

		learned_key.set_id = set_id;
		learned_key.family = dst.family;
		__builtin_memcpy(learned_key.addr, dst.addr, 16);
		learned = learned_verdicts(st, &learned_key, &expires_ns);
	}
	decision = decide_destination(set_id, flags,
				      dst.family | (learned << 8),
				      dst.words[0], dst.words[1]);
	if (slot) {
		__builtin_memset(&fresh, 0, sizeof(fresh));
		fresh.policy_gen = policy_gen;
		fresh.learned_gen = learned_gen;
		fresh.expires_ns = expires_ns;
		fresh.set_id = set_id;
		fresh.flags = flags;
		fresh.decision = decision;
		fresh.family = dst.family;
		__builtin_memcpy(fresh.addr, dst.addr, 16);
		cache_verdict(st, slot, cookie, current, &fresh);
	}
decided:
	return conclude(st, set_id, flags, &dst, decision);
}
