/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The questions a pod asked, so that the DNS answer snooper
 * (bpf/dnssnoop/snoop.bpf.c) learns only from answers to them.
 *
 * Without this the snooper would learn from any datagram from UDP port 53:
 * a pod could answer itself (`allowed.example A <any address>`) and open an
 * allow-by-domain default deny, or poison a neighbour's deny-by-domain
 * name. So:
 *
 *   - the egress filter (bpf/egress/egress_filter.bpf.c), which runs on
 *     every packet of a cgroup under a set, notes each DNS question a
 *     cgroup whose set names domains sends to a *declared resolver*
 *     (`dns_resolvers`, written by userspace: the cluster DNS Service
 *     addresses, node-local DNS, what the operator lists) in
 *     `dns_questions`, keyed by (cgroup, resolver address, the client's
 *     port, transaction id), with a hash of the question's name, its type
 *     and class, until now + KRT_DNS_QUESTION_TIMEOUT_S;
 *   - the snooper learns from a response only when its source address is
 *     a declared resolver and it answers a noted, unexpired question of
 *     the receiving socket's cgroup with the same name, type and class;
 *     the question is then consumed (a second answer learns nothing).
 *
 * What is left: a pod with CAP_NET_RAW can still forge the source address
 * of an answer to *its own* question (it knows its id and port) and so
 * fool its own filter; docs/threat-model.md says so and what removes it
 * (drop NET_RAW, as the restricted Pod Security level does). A third party
 * must guess the id and port of a pending question, as against any stub
 * resolver.
 *
 * A name is compared raw, as the question carried it (a resolver echoes
 * the question section byte for byte, 0x20 case randomisation included),
 * through a 64-bit hash of its first DOMAIN_KEY_LEN bytes zero padded: a
 * longer name is not noted (no policy can name it: see dnsname.h).
 */
#ifndef KRT_DNSQUESTION_H
#define KRT_DNSQUESTION_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "dnsname.h"
#include "egress.h"
#include "udp.h"

/* Pending questions on the node (an LRU: the oldest give way). */
#define KRT_DNS_QUESTIONS_MAX (1 << 14)
/* Declared resolver addresses. */
#define KRT_DNS_RESOLVERS_MAX 64
/* How long a question waits for its answer: glibc's default resolver
 * timeout is 5 s per try; two tries. */
#define KRT_DNS_QUESTION_TIMEOUT_S 10
/* Questions one cgroup may note per second: with the map's size and the
 * timeout, one pod can hold at most 512 * 10 / 16384 (under a third) of
 * the pending questions, so it cannot flush its neighbours' alone. */
#define KRT_DNS_QUESTIONS_PER_S 512

#define KRT_DNS_PORT 53
#define KRT_DNS_HEADER_LEN 12
#define KRT_NS_PER_S 1000000000ULL

/* Key of `dns_resolvers`; the value is a __u8 (1). */
struct krt_dns_resolver_key {
	__u32 family; /* enum krt_egress_family */
	/* Network byte order; an IPv4 address in the first 4 bytes. */
	__u8 addr[16];
};

/* Key of `dns_questions`. */
struct krt_dns_question_key {
	__u64 cgroup_id;
	__u32 family; /* enum krt_egress_family */
	/* The resolver asked, network byte order; IPv4 in the first 4. */
	__u8 resolver[16];
	__be16 port; /* the asking socket's UDP port */
	__u16 id; /* the transaction id, as on the wire */
};

/* Value of `dns_questions`. */
struct krt_dns_question {
	__u64 expires_ns; /* bpf_ktime_get_ns() after which it is stale */
	__u64 name_hash; /* krt_dns_name_hash of the raw name */
	__u32 type_class; /* QTYPE and QCLASS as on the wire */
	__u32 name_len; /* wire bytes of the name, root label included */
};

/* Value of `dns_question_budget` (per cgroup). */
struct krt_dns_question_budget {
	__u64 window_ns; /* start of the current one-second window */
	__u64 noted; /* questions noted in it */
};

/* A name read raw from a message: zero padded, so equal names hash
 * equal. Lives in a per-CPU array (too big for the stack beside the
 * callers' frames). */
struct krt_dns_question_scratch {
	__u8 name[DOMAIN_KEY_LEN];
	__u32 len;
	__u32 type_class;
};

/* What krt_dns_read_question found. */
enum krt_dns_question_read {
	KRT_DNS_QUESTION_OK = 0,
	/* The message ends inside the question. */
	KRT_DNS_QUESTION_TRUNCATED = 1,
	/* A compression pointer or reserved label type in the question, or
	 * a name of DOMAIN_KEY_LEN bytes or more. */
	KRT_DNS_QUESTION_UNREADABLE = 2,
};

/*
 * Reads the question section (one question, right after the header) of
 * the DNS message at skb offset `base` into `qs`: the raw name, zero
 * padded, its length and the type and class.
 */
static __always_inline int krt_dns_read_question(struct __sk_buff *skb,
						 __u32 base,
						 struct krt_dns_question_scratch *qs)
{
	__u32 pos = 0, len;
	__u64 n;
	__u8 c = 1;

	__builtin_memset(qs->name, 0, sizeof(qs->name));
	/* At most one label per two bytes of the name. */
	for (int i = 0; i < DOMAIN_KEY_LEN / 2; i++) {
		if (bpf_skb_load_bytes(skb, base + KRT_DNS_HEADER_LEN + pos,
				       &c, 1) < 0)
			return KRT_DNS_QUESTION_TRUNCATED;
		if (c == 0)
			break;
		if (c > DNS_LABEL_MAX)
			return KRT_DNS_QUESTION_UNREADABLE;
		pos += 1 + c;
		if (pos >= DOMAIN_KEY_LEN)
			return KRT_DNS_QUESTION_UNREADABLE;
	}
	if (c != 0)
		return KRT_DNS_QUESTION_UNREADABLE;
	len = pos + 1; /* the root label */
	/* len is 1..DOMAIN_KEY_LEN; the mask bounds the size register for
	 * the helper, the barrier keeps clang from dropping it. */
	n = len - 1;
	barrier_var(n);
	n = (n & (DOMAIN_KEY_LEN - 1)) + 1;
	if (bpf_skb_load_bytes(skb, base + KRT_DNS_HEADER_LEN, qs->name, n) < 0)
		return KRT_DNS_QUESTION_TRUNCATED;
	if (bpf_skb_load_bytes(skb, base + KRT_DNS_HEADER_LEN + len,
			       &qs->type_class, 4) < 0)
		return KRT_DNS_QUESTION_TRUNCATED;
	qs->len = len;
	return KRT_DNS_QUESTION_OK;
}

/* A 64-bit hash (FNV-1a over words, then a final mix) of the name in
 * `qs`. Not a secret: what keeps a third party out is the id and port. */
static __always_inline __u64 krt_dns_name_hash(const struct krt_dns_question_scratch *qs)
{
	const __u64 *w = (const __u64 *)qs->name;
	__u64 h = 0xcbf29ce484222325ULL;

#pragma clang loop unroll(full)
	for (int i = 0; i < DOMAIN_KEY_LEN / 8; i++) {
		h ^= w[i];
		h *= 0x100000001b3ULL;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	h ^= h >> 32;
	return h;
}

/*
 * The source (`source` true) or destination address of the packet into
 * `family` and `addr` (16 bytes, IPv4 in the first 4, the rest zero).
 * 0, or -1 when the header cannot be read or is neither IPv4 nor IPv6.
 */
static __always_inline int krt_packet_addr(struct __sk_buff *skb, bool source,
					   __u32 *family, __u8 *addr)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		*family = KRT_EGRESS_IPV4;
		/* saddr at 12, daddr at 16 of struct iphdr. */
		return bpf_skb_load_bytes(skb, source ? 12 : 16, addr, 4) < 0 ? -1 : 0;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		*family = KRT_EGRESS_IPV6;
		/* saddr at 8, daddr at 24 of struct ipv6hdr. */
		return bpf_skb_load_bytes(skb, source ? 8 : 24, addr, 16) < 0 ? -1 : 0;
	}
	return -1;
}

#endif /* KRT_DNSQUESTION_H */
