// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The DNS answer snooper: a cgroup_skb/ingress program that learns, from
 * the answers to a pod's own DNS questions, the addresses of the domain
 * names its egress filter set names, so the egress filter
 * (bpf/egress/egress_filter.bpf.c) can allow or deny them.
 *
 * It runs when a datagram is queued to the receiving socket, before the
 * application can read the answer, so the address is learned before the
 * first connect to it: there is no race between the two.
 *
 * One loaded object serves every attachment; its maps cgroup_filters,
 * egress_domains, egress_learned, learned_share, learned_budget,
 * learned_released, dns_resolvers, dns_questions and snoop_stats are the
 * egress filter's own (see
 * egress_maps.h: the loader reuses the filter's fds). For a datagram:
 *
 *   1. gate: the socket's cgroup must be in cgroup_filters with
 *      KRT_EGRESS_FLAG_DOMAINS (its set names domains); otherwise pass
 *      after that one lookup;
 *   2. UDP from source port 53 (udp.h finds the header; no TCP, DoT or
 *      DoH), a DNS header with QR set (a response), RCODE 0, one question
 *      and at least one answer;
 *   3. the response answers a question the cgroup asked: from a declared
 *      resolver, for a pending question of the cgroup with the response's
 *      port and id, and the same question section (dnsquestion.h: the
 *      egress filter notes the questions); the question is consumed.
 *      Anything else is counted (untrusted_source, unsolicited,
 *      question_mismatch) and teaches nothing;
 *   4. the question's name, then each answer record (at most
 *      KRT_DNS_SNOOP_ANSWERS_MAX): a record of class IN is followed when
 *      its owner is the question's name or a name a CNAME of this
 *      response led to (at most KRT_DNS_SNOOP_CHAIN_MAX names); a CNAME
 *      adds its target to that chain; an A or AAAA record's address is
 *      learned for the set with the verdict bits of every chain name
 *      egress_domains holds for the set, until now + its TTL clamped to
 *      [KRT_DNS_TTL_MIN_S, KRT_DNS_TTL_MAX_S]. Names are compared in the
 *      normalised form of dnsname.h, compression pointers followed.
 *
 * An answer that teaches a set an address (or a verdict) it did not hold
 * adds to the learned generation (egress_generation), so sockets whose
 * cached verdicts it could change decide again (see the egress filter).
 *
 * Every path passes the packet (1) but one: the snooper learns, and every
 * response that cannot be read to its end is counted (struct
 * krt_dns_snoop_stats), with what was learned before kept. The one drop:
 * a set holds at most its share of egress_learned (learned_share), so no
 * pod's answers can push out another's; an address an enforced policy
 * denies by name that the set has no room for is not learned, and then
 * the response is dropped (answers_refused), since the pod could not be
 * stopped from reaching an address it was told. Allowed and observed
 * addresses without room are counted (over_share) and not learned.
 *
 * Verifier notes. The parser's state (offsets, the chain length, the
 * verdicts so far) lives in a per-CPU scratch map, not in registers: an
 * offset in a register that indexes memory is "precise" to the verifier,
 * so each distinct value would be a distinct state and the walk's paths
 * would never merge. The name reader and the chain comparison are global
 * functions, verified once each rather than at every call, which keeps
 * the oldest verifier (5.10) within its limits. Only helpers cgroup_skb
 * programs may call on 5.10 are used.
 */
#include "common.h"
#include <bpf/bpf_endian.h>
#include "dnsname.h"
#include "dnsquestion.h"
#include "dnssnoop.h"
#include "egress.h"
#include "egress_maps.h"
#include "udp.h"

#define PASS 1
#define DROP 0

#define DNS_PORT 53
#define DNS_HEADER_LEN 12
/* type, class, TTL and RDLENGTH after a record's owner name. */
#define DNS_RR_FIXED_LEN 10
#define DNS_CLASS_IN 1
#define DNS_TYPE_A 1
#define DNS_TYPE_CNAME 5
#define DNS_TYPE_AAAA 28

#define NS_PER_S 1000000000ULL

/* Name slots of the scratch space: the chain (0 .. CHAIN_MAX - 1), the
 * owner being compared (CHAIN_MAX), spares; a power of two, so a slot
 * index is bounded by a mask. */
#define SNOOP_SLOTS 8
#define SNOOP_OWNER_SLOT KRT_DNS_SNOOP_CHAIN_MAX
/* Steps of the name reader: a name holds at most 63 labels (each at
 * least two of DOMAIN_KEY_LEN - 1 bytes), plus the pointers it follows. */
#define SNOOP_NAME_STEPS 80

/* Memory the compiler must not cache in registers (see the notes). */
#define SNOOP_LOAD(x) (*(volatile typeof(x) *)&(x))
#define SNOOP_STORE(x, v) (*(volatile typeof(x) *)&(x) = (v))

/* A name slot: an egress_domains key, padded so that every slot's name
 * stays 8-byte aligned (the lowercasing and the comparison read words). */
struct snoop_slot {
	struct krt_egress_domain_key key;
	__u32 pad;
};

struct snoop_scratch {
	struct snoop_slot slots[SNOOP_SLOTS];
	/* A label is copied to a masked offset of its slot; the verifier
	 * bounds the copy by the mask and the label width, which may reach
	 * past the last slot: this is where. */
	__u8 slack[64];
	/* The name reader: where it reads, how much of the key it wrote,
	 * where the current run of labels started (a pointer must point
	 * before it), and where the name ends in the message. */
	__u32 pos;
	__u32 out;
	__u32 limit;
	__u32 end;
	/* The answer walk: the next record, the chain's length, and the
	 * verdicts and name id of the chain's policy-named names. */
	__u32 cursor;
	__u32 chain_len;
	__u32 verdicts;
	__u32 name_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct snoop_scratch);
} snoop_scratch SEC(".maps");

/* Outcome counters: snoop_stats, shared with the filter (egress_maps.h),
 * one struct per CPU (no atomics needed). */

/* The raw question of the response being read (dnsquestion.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_dns_question_scratch);
} snoop_question SEC(".maps");

static __always_inline void count(__u64 *counter)
{
	*counter += 1;
}

/*
 * Reads the (possibly compressed) name at offset `off` of the DNS message
 * starting at skb offset `base` into name slot `slot`, normalised
 * (dnsname.h) and zero padded, and records where it ends in the message
 * (after its root label, or after its first pointer) in scratch.end.
 * Returns an enum dns_name_status.
 *
 * A pointer must point before the run of labels it ends (scratch.limit):
 * the runs then start at strictly decreasing offsets, so the reader ends,
 * and a loop is refused (DNS_NAME_BAD_POINTER) rather than followed.
 * Labels are copied whole from the packet into the key.
 */
__attribute__((noinline)) int krt_snoop_read_name(struct __sk_buff *skb,
						  __u32 base, __u32 off,
						  __u32 slot)
{
	struct snoop_scratch *s;
	struct domain_key *key;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&snoop_scratch, &zero);
	if (!s)
		return DNS_NAME_TRUNCATED;
	key = &s->slots[slot & (SNOOP_SLOTS - 1)].key.name;
	__builtin_memset(key, 0, sizeof(*key));
	SNOOP_STORE(s->pos, off);
	SNOOP_STORE(s->out, 0);
	SNOOP_STORE(s->limit, off);
	SNOOP_STORE(s->end, 0);

	for (__u32 i = 0; i < SNOOP_NAME_STEPS; i++) {
		__u32 pos = SNOOP_LOAD(s->pos);
		__u32 out = SNOOP_LOAD(s->out);
		__u32 o, ptr;
		__u64 n;
		__u8 c[2];

		if (bpf_skb_load_bytes(skb, base + pos, c, 1) < 0)
			return DNS_NAME_TRUNCATED;
		if (c[0] == 0) {
			if (SNOOP_LOAD(s->end) == 0)
				SNOOP_STORE(s->end, pos + 1);
			dns_key_lowercase(key);
			return DNS_NAME_OK;
		}
		if ((c[0] & DNS_LABEL_TYPE_MASK) == DNS_LABEL_POINTER) {
			if (bpf_skb_load_bytes(skb, base + pos + 1, &c[1], 1) < 0)
				return DNS_NAME_TRUNCATED;
			ptr = ((__u32)(c[0] & ~DNS_LABEL_TYPE_MASK) << 8) | c[1];
			if (SNOOP_LOAD(s->end) == 0)
				SNOOP_STORE(s->end, pos + 2);
			if (ptr >= SNOOP_LOAD(s->limit))
				return DNS_NAME_BAD_POINTER;
			SNOOP_STORE(s->limit, ptr);
			SNOOP_STORE(s->pos, ptr);
			continue;
		}
		if (c[0] > DNS_LABEL_MAX)
			return DNS_NAME_BAD_LABEL;
		/* The length byte, the label and the root label must fit. */
		if (out + c[0] + 2 > DOMAIN_KEY_LEN)
			return DNS_NAME_TOO_LONG;
		o = out & (DOMAIN_KEY_LEN - 1);
		key->name[o] = c[0];
		/* c[0] is 1..63; the mask bounds the size register itself for
		 * the helper, and the barrier keeps clang from dropping it
		 * (see dns_read_name). */
		n = c[0] - 1;
		barrier_var(n);
		n = (n & DNS_LABEL_MAX) + 1;
		if (bpf_skb_load_bytes(skb, base + pos + 1,
				       &key->name[(o + 1) & (DOMAIN_KEY_LEN - 1)],
				       n) < 0)
			return DNS_NAME_TRUNCATED;
		SNOOP_STORE(s->out, out + 1 + c[0]);
		SNOOP_STORE(s->pos, pos + 1 + c[0]);
	}
	return DNS_NAME_BAD_POINTER;
}

/* Whether the owner slot holds one of the first `chain_len` slots' names
 * (1) or none (0). */
__attribute__((noinline)) int krt_snoop_owner_in_chain(__u32 chain_len)
{
	struct snoop_scratch *s;
	__u64 *owner;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&snoop_scratch, &zero);
	if (!s)
		return 0;
	owner = (__u64 *)s->slots[SNOOP_OWNER_SLOT].key.name.name;

#pragma clang loop unroll(full)
	for (int k = 0; k < KRT_DNS_SNOOP_CHAIN_MAX; k++) {
		__u64 *name = (__u64 *)s->slots[k].key.name.name;
		__u64 diff = 0;

		if (k >= chain_len)
			break;
#pragma clang loop unroll(full)
		for (int j = 0; j < DOMAIN_KEY_LEN / 8; j++)
			diff |= owner[j] ^ name[j];
		if (diff == 0)
			return 1;
	}
	return 0;
}

/* What krt_snoop_match_question found for a response. */
enum snoop_match {
	SNOOP_MATCHED = 0,
	/* Not from a declared resolver. */
	SNOOP_UNTRUSTED = 1,
	/* No pending, unexpired question of the cgroup for its resolver,
	 * port and id. */
	SNOOP_UNSOLICITED = 2,
	/* A pending question, but another name, type or class. */
	SNOOP_MISMATCH = 3,
	/* Headers or the question section cannot be read. */
	SNOOP_UNREADABLE = 4,
};

/*
 * Whether the response whose UDP header is at `udp_off` answers a question
 * the receiving socket's cgroup asked a declared resolver (dnsquestion.h);
 * a match consumes the question. A global function: verified once, and
 * its stack is its own.
 */
__attribute__((noinline)) int krt_snoop_match_question(struct __sk_buff *skb,
						       __u32 udp_off)
{
	struct krt_dns_question_scratch *qs;
	struct krt_dns_resolver_key resolver;
	struct krt_dns_question_key key;
	struct krt_dns_question *q;
	struct udphdr udp;
	__u32 zero = 0, family = 0;
	__u16 id;

	__builtin_memset(&resolver, 0, sizeof(resolver));
	if (krt_packet_addr(skb, true, &family, resolver.addr) < 0)
		return SNOOP_UNREADABLE;
	resolver.family = family;
	if (!bpf_map_lookup_elem(&dns_resolvers, &resolver))
		return SNOOP_UNTRUSTED;
	if (bpf_skb_load_bytes(skb, udp_off, &udp, sizeof(udp)) < 0 ||
	    bpf_skb_load_bytes(skb, udp_off + sizeof(udp), &id, sizeof(id)) < 0)
		return SNOOP_UNREADABLE;

	__builtin_memset(&key, 0, sizeof(key));
	key.cgroup_id = bpf_skb_cgroup_id(skb);
	key.family = family;
	__builtin_memcpy(key.resolver, resolver.addr, sizeof(key.resolver));
	key.port = udp.dest;
	key.id = id;
	q = bpf_map_lookup_elem(&dns_questions, &key);
	if (!q)
		return SNOOP_UNSOLICITED;
	if (q->expires_ns < bpf_ktime_get_ns()) {
		bpf_map_delete_elem(&dns_questions, &key);
		return SNOOP_UNSOLICITED;
	}

	qs = bpf_map_lookup_elem(&snoop_question, &zero);
	if (!qs)
		return SNOOP_UNREADABLE;
	if (krt_dns_read_question(skb, udp_off + sizeof(udp), qs) !=
	    KRT_DNS_QUESTION_OK)
		return SNOOP_UNREADABLE;
	/* A forged answer with the right id but another question leaves the
	 * question pending for the real one. */
	if (qs->len != q->name_len || qs->type_class != q->type_class ||
	    krt_dns_name_hash(qs) != q->name_hash)
		return SNOOP_MISMATCH;
	bpf_map_delete_elem(&dns_questions, &key);
	return SNOOP_MATCHED;
}

/* Counts a name the reader refused; the walk stops there. */
static __always_inline void count_name_failure(struct krt_dns_snoop_stats *st,
					       int status)
{
	if (status == DNS_NAME_TOO_LONG)
		count(&st->name_too_long);
	else
		count(&st->malformed);
}

/* Adds what egress_domains holds for the set and the name in `slot` to
 * the chain's verdicts. */
static __always_inline void add_name_verdicts(struct snoop_scratch *s,
					      __u32 slot, __u32 set_id)
{
	struct krt_egress_domain_key *key;
	struct krt_egress_domain *d;
	__u32 verdicts;

	key = &s->slots[slot & (SNOOP_SLOTS - 1)].key;
	key->set_id = set_id;
	d = bpf_map_lookup_elem(&egress_domains, key);
	if (!d)
		return;
	verdicts = SNOOP_LOAD(s->verdicts);
	if (verdicts == 0)
		SNOOP_STORE(s->name_id, d->name_id);
	SNOOP_STORE(s->verdicts, verdicts | d->verdicts);
}

/* See KRT_EGRESS_GEN_LEARNED (egress.h). */
static __always_inline void bump_learned_generation(void)
{
	__u32 slot = KRT_EGRESS_GEN_LEARNED;
	__u64 *g = bpf_map_lookup_elem(&egress_generation, &slot);

	/* Result unused: BPF_XADD, which every kernel has. */
	if (g)
		__sync_fetch_and_add(g, 1);
}

/*
 * Whether set `set_id` may add one more key to egress_learned: it holds
 * fewer than its share (learned_share; none written: no limit). What it
 * holds is what the snooper added (learned_budget) less what userspace
 * removed (learned_released); read without a lock, so CPUs inserting at
 * once may pass together (userspace leaves a margin for them). A global
 * function: verified once, so its branches do not multiply the states of
 * the answer walk.
 */
__attribute__((noinline)) int krt_learn_within_share(__u32 set_id)
{
	struct krt_egress_learned_budget *b, fresh = {};
	__u64 *share, *released, live;
	__u32 zero = 0;

	share = bpf_map_lookup_elem(&learned_share, &zero);
	if (!share || *share == 0)
		return 1;
	b = bpf_map_lookup_elem(&learned_budget, &set_id);
	if (!b) {
		bpf_map_update_elem(&learned_budget, &set_id, &fresh,
				    BPF_NOEXIST);
		b = bpf_map_lookup_elem(&learned_budget, &set_id);
		if (!b)
			return 1; /* the budget map is full: no limit known */
	}
	released = bpf_map_lookup_elem(&learned_released, &set_id);
	live = b->inserted - (released ? *released : 0);
	/* Signed: userspace's own insertions count as negative releases. */
	if ((__s64)live >= (__s64)*share) {
		__sync_fetch_and_add(&b->over_share, 1);
		return 0;
	}
	return 1;
}

/* Adds one to set `set_id`'s `inserted` (a key it added). Global for the
 * same reason as krt_learn_within_share. */
__attribute__((noinline)) int krt_learn_charge(__u32 set_id)
{
	struct krt_egress_learned_budget *b, fresh = {};

	b = bpf_map_lookup_elem(&learned_budget, &set_id);
	if (!b) {
		/* No share was written when the check passed: count anyway,
		 * so what the set holds is right once one is. */
		fresh.inserted = 1;
		if (bpf_map_update_elem(&learned_budget, &set_id, &fresh,
					BPF_NOEXIST) == 0)
			return 0;
		b = bpf_map_lookup_elem(&learned_budget, &set_id);
	}
	if (b)
		__sync_fetch_and_add(&b->inserted, 1);
	return 0;
}

/* Adds one to set `set_id`'s `answers_refused`. */
__attribute__((noinline)) int krt_learn_refused(__u32 set_id)
{
	struct krt_egress_learned_budget *b;

	b = bpf_map_lookup_elem(&learned_budget, &set_id);
	if (b)
		__sync_fetch_and_add(&b->answers_refused, 1);
	return 0;
}

/* krt_snoop_learn(): the response must be dropped (see krt_dns_snoop_stats
 * answers_refused). */
#define LEARN_REFUSE 1

/*
 * Learns the address of an A (`v6` 0) or AAAA record whose data starts at
 * packet offset `at`, for the set, with the chain's verdicts (scratch).
 * An unexpired entry keeps its verdicts (or-ed in) and the later expiry.
 * A new key needs room in the set's share; without it the record is not
 * learned (counted), and if the chain's verdicts deny, LEARN_REFUSE: the
 * response must not reach the pod. A global function (verified once):
 * inlined, its branches spilled the answer walk's bounded values past what
 * the 5.10 verifier tracks.
 */
__attribute__((noinline)) int krt_snoop_learn(struct __sk_buff *skb,
					      __u32 set_id, __u32 at, __u32 v6,
					      __u32 ttl)
{
	struct krt_egress_learned_key key;
	struct krt_egress_learned value, *old;
	struct krt_dns_snoop_stats *st;
	struct snoop_scratch *s;
	__u32 held = 0; /* the verdicts of the unexpired entry, if any */
	__u32 zero = 0;
	__u64 now, expires;
	int loaded;

	st = bpf_map_lookup_elem(&snoop_stats, &zero);
	s = bpf_map_lookup_elem(&snoop_scratch, &zero);
	if (!st || !s)
		return -1; /* cannot happen: one-element arrays */
	__builtin_memset(&key, 0, sizeof(key));
	key.set_id = set_id;
	if (v6) {
		key.family = KRT_EGRESS_IPV6;
		loaded = bpf_skb_load_bytes(skb, at, key.addr, 16);
	} else {
		key.family = KRT_EGRESS_IPV4;
		loaded = bpf_skb_load_bytes(skb, at, key.addr, 4);
	}
	if (loaded < 0) {
		count(&st->malformed);
		return -1;
	}
	if (ttl < KRT_DNS_TTL_MIN_S)
		ttl = KRT_DNS_TTL_MIN_S;
	if (ttl > KRT_DNS_TTL_MAX_S)
		ttl = KRT_DNS_TTL_MAX_S;
	now = bpf_ktime_get_ns();
	expires = now + (__u64)ttl * NS_PER_S;

	__builtin_memset(&value, 0, sizeof(value));
	value.verdicts = SNOOP_LOAD(s->verdicts);
	value.name_id = SNOOP_LOAD(s->name_id);
	old = bpf_map_lookup_elem(&egress_learned, &key);
	if (old) {
		__u64 old_expires = old->expires_ns;

		if (old_expires > now) {
			held = old->verdicts;
			value.verdicts |= held;
			if (old_expires > expires)
				expires = old_expires;
		}
	}
	value.expires_ns = expires;
	if (old) {
		/* A key the set holds: no room needed. */
		if (bpf_map_update_elem(&egress_learned, &key, &value,
					BPF_ANY) != 0) {
			count(&st->learn_failed);
			return 0;
		}
	} else {
		if (!krt_learn_within_share(set_id)) {
			count(&st->over_share);
			if (value.verdicts & KRT_EGRESS_DOMAIN_DENY)
				return LEARN_REFUSE;
			return 0;
		}
		if (bpf_map_update_elem(&egress_learned, &key, &value,
					BPF_NOEXIST) == 0) {
			krt_learn_charge(set_id);
		} else if (bpf_map_update_elem(&egress_learned, &key, &value,
					       BPF_EXIST) != 0) {
			/* Neither new nor there: the map is full. */
			count(&st->learn_failed);
			if (value.verdicts & KRT_EGRESS_DOMAIN_DENY)
				return LEARN_REFUSE;
			return 0;
		}
	}
	count(&st->learned);
	/*
	 * A verdict the set did not hold (a new address, an expired one
	 * back, or a new bit) may change what sockets cached: a new learned
	 * generation makes them decide again. A refresh of what was held
	 * changes nothing cached (a cached verdict that a learned address
	 * took part in expires with it and is then decided again).
	 */
	if (value.verdicts & ~held)
		bump_learned_generation();
	return 0;
}

/*
 * One answer record at scratch.cursor: follows it as the file comment
 * says and moves the cursor past it. 0 to go on with the next record, -1
 * to stop (counted), LEARN_REFUSE to drop the response (see krt_snoop_learn()).
 */
static __always_inline int walk_answer(struct __sk_buff *skb,
				       struct krt_dns_snoop_stats *st,
				       struct snoop_scratch *s, __u32 set_id,
				       __u32 base)
{
	__u8 rr[DNS_RR_FIXED_LEN];
	__u32 type, class, ttl, rdlen, rdata, chain;
	int status;

	status = krt_snoop_read_name(skb, base, SNOOP_LOAD(s->cursor),
				     SNOOP_OWNER_SLOT);
	if (status != DNS_NAME_OK) {
		count_name_failure(st, status);
		return -1;
	}
	rdata = SNOOP_LOAD(s->end);
	if (bpf_skb_load_bytes(skb, base + rdata, rr, sizeof(rr)) < 0) {
		count(&st->malformed);
		return -1;
	}
	type = ((__u32)rr[0] << 8) | rr[1];
	class = ((__u32)rr[2] << 8) | rr[3];
	ttl = ((__u32)rr[4] << 24) | ((__u32)rr[5] << 16) |
	      ((__u32)rr[6] << 8) | rr[7];
	rdlen = ((__u32)rr[8] << 8) | rr[9];
	rdata += DNS_RR_FIXED_LEN;
	SNOOP_STORE(s->cursor, rdata + rdlen);

	if (class != DNS_CLASS_IN)
		return 0;
	if (type != DNS_TYPE_A && type != DNS_TYPE_AAAA &&
	    type != DNS_TYPE_CNAME)
		return 0;
	if (!krt_snoop_owner_in_chain(SNOOP_LOAD(s->chain_len))) {
		count(&st->unchained);
		return 0;
	}
	if (type == DNS_TYPE_CNAME) {
		chain = SNOOP_LOAD(s->chain_len);
		if (chain >= KRT_DNS_SNOOP_CHAIN_MAX) {
			count(&st->walk_limit);
			return 0;
		}
		status = krt_snoop_read_name(skb, base, rdata, chain);
		if (status != DNS_NAME_OK) {
			count_name_failure(st, status);
			return -1;
		}
		/* Read again, not `chain`: the compiler knows it is below
		 * CHAIN_MAX and drops the slot mask, but may spill it before
		 * the check, and the 5.10 verifier does not carry a bound to a
		 * spilled copy. Unknown to the compiler, the mask stays. */
		add_name_verdicts(s, SNOOP_LOAD(s->chain_len), set_id);
		SNOOP_STORE(s->chain_len, chain + 1);
		return 0;
	}
	if (rdlen != (type == DNS_TYPE_A ? 4 : 16)) {
		count(&st->malformed);
		return -1;
	}
	if (SNOOP_LOAD(s->verdicts) == 0) {
		count(&st->unnamed);
		return 0;
	}
	return krt_snoop_learn(skb, set_id, base + rdata,
			       type == DNS_TYPE_AAAA, ttl);
}

SEC("cgroup_skb/ingress")
int krt_dns_snoop(struct __sk_buff *skb)
{
	struct krt_egress_filter *filter;
	struct krt_dns_snoop_stats *st;
	struct snoop_scratch *s;
	struct udphdr udp;
	__u8 hdr[DNS_HEADER_LEN];
	__u32 zero = 0, set_id, off, base, an;
	__u64 cgid;
	int status;

	/* The gate: the receiving socket's cgroup (the kernel sets skb->sk
	 * to it for the program's run), and only sets naming domains. */
	cgid = bpf_skb_cgroup_id(skb);
	filter = bpf_map_lookup_elem(&cgroup_filters, &cgid);
	if (!filter)
		return PASS;
	if (!(filter->flags & KRT_EGRESS_FLAG_DOMAINS))
		return PASS;
	set_id = filter->set_id;

	off = krt_udp_offset(skb);
	if (off == 0)
		return PASS;
	if (bpf_skb_load_bytes(skb, off, &udp, sizeof(udp)) < 0)
		return PASS;
	if (udp.source != bpf_htons(DNS_PORT))
		return PASS;
	base = off + sizeof(udp);
	/* An empty datagram answered nothing. */
	if (base >= skb->len)
		return PASS;

	st = bpf_map_lookup_elem(&snoop_stats, &zero);
	s = bpf_map_lookup_elem(&snoop_scratch, &zero);
	if (!st || !s)
		return PASS; /* cannot happen: one-element arrays */

	if (bpf_skb_load_bytes(skb, base, hdr, sizeof(hdr)) < 0) {
		count(&st->malformed);
		return PASS;
	}
	/* QR clear: a question to a server in this pod, not an answer. */
	if (!(hdr[2] & 0x80))
		return PASS;
	count(&st->responses);
	/* RCODE other than NOERROR, or no answer: nothing to learn. */
	an = ((__u32)hdr[6] << 8) | hdr[7];
	if ((hdr[3] & 0x0f) != 0 || an == 0)
		return PASS;
	if (hdr[4] != 0 || hdr[5] != 1) {
		count(&st->unsupported);
		return PASS;
	}
	switch (krt_snoop_match_question(skb, off)) {
	case SNOOP_MATCHED:
		break;
	case SNOOP_UNTRUSTED:
		count(&st->untrusted_source);
		return PASS;
	case SNOOP_UNSOLICITED:
		count(&st->unsolicited);
		return PASS;
	case SNOOP_MISMATCH:
		count(&st->question_mismatch);
		return PASS;
	default:
		count(&st->malformed);
		return PASS;
	}

	status = krt_snoop_read_name(skb, base, DNS_HEADER_LEN, 0);
	if (status != DNS_NAME_OK) {
		count_name_failure(st, status);
		return PASS;
	}
	SNOOP_STORE(s->verdicts, 0);
	SNOOP_STORE(s->name_id, 0);
	add_name_verdicts(s, 0, set_id);
	/* Past the question's QTYPE and QCLASS. */
	SNOOP_STORE(s->cursor, SNOOP_LOAD(s->end) + 4);
	SNOOP_STORE(s->chain_len, 1);

	for (__u32 i = 0; i < KRT_DNS_SNOOP_ANSWERS_MAX; i++) {
		if (i >= an)
			return PASS;
		status = walk_answer(skb, st, s, set_id, base);
		if (status == LEARN_REFUSE) {
			count(&st->answers_refused);
			krt_learn_refused(set_id);
			return DROP;
		}
		if (status < 0)
			return PASS;
	}
	if (an > KRT_DNS_SNOOP_ANSWERS_MAX)
		count(&st->walk_limit);
	return PASS;
}

/* Never used: puts the stats struct into the object's BTF for the
 * skeleton's types (the map declares it too; this keeps it there if the
 * map ever changes). */
struct krt_dns_snoop_stats krt_dns_snoop_stats_btf_anchor = {};
