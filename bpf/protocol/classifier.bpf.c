// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The application protocol classifier: one cgroup_skb/egress program for
 * every gated pod on the node.
 *
 * Per packet of a cgroup in proto_cgroups (every other packet passes after
 * that one lookup):
 *
 *   1. Parse L3/L4. The family comes from skb->protocol, never from the
 *      payload. IPv4 fragments, truncated headers and anything that is not
 *      IPv4/IPv6 have no flow: they are decided per packet, as
 *      unclassified. An IPv6 extension header, ICMP or any L4 other than
 *      TCP/UDP gets a port-less flow and is unclassified.
 *   2. A flow with a cached verdict is decided by the cache (a denied flow
 *      keeps being dropped); the verdict is recomputed from the cached
 *      classification, not reclassified, when userspace changed the rules
 *      since (proto_generation). A TCP SYN (without ACK) starts a new
 *      connection: it forgets the tuple's cached verdict first.
 *   3. A TCP packet without payload passes, its verdict deferred.
 *   4. Otherwise this is the flow's first data segment (TCP) or first
 *      datagram (UDP): classify it, compute the decision (explicit deny >
 *      explicit allow > default deny > pass), record it in proto_events
 *      when the set observes or the flow is refused, cache it in
 *      proto_flows, enforce it. Every
 *      decision is counted once per flow.
 *
 * Anything that cannot be parsed within this segment and the walk bounds
 * below is unclassified, never a guess, and passes unless the set
 * default-denies (or names unclassified in its rules). Payload is read with
 * bpf_skb_load_bytes, so non-linear skbs are read correctly.
 *
 * Verifier notes (5.10 and later): every loop has a constant bound, no
 * bpf_loop, no kfuncs, no direct packet access; helper sizes are constants
 * or restated bounds.
 */
#include "common.h"
#include "protocol.h"
#include <bpf/bpf_endian.h>

#define SKB_PASS 1
#define SKB_DROP 0

#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86dd
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define EEXIST_ 17

#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

/* Payload bytes the fixed-pattern matchers look at: at least the longest
 * pattern (the 24-byte HTTP/2 preface), and a power of two (see
 * helper_len). */
#define HEAD_LEN 32

/*
 * Walk bounds. Each is a constant loop bound; input that needs more steps
 * is unclassified.
 *
 * TLS_MAX_EXTENSIONS: ClientHello extensions stepped over before the ALPN
 * one. Browsers send 15-20 (GREASE included) in a shuffled order.
 */
#define TLS_MAX_EXTENSIONS 32
/* ALPN names in the list (all are validated; only the first is kept). */
#define ALPN_MAX_NAMES 8
/* Length bytes of a QNAME: a 255-byte name has at most 127 labels plus the
 * root, so this bound admits every legal name. */
#define DNS_MAX_LABELS 128
#define DNS_MAX_NAME 255

#define MAX_CGROUPS (1 << 14)
#define MAX_RULES (1 << 12)
#define MAX_FLOWS (1 << 16)
#define MAX_EVENTS (1 << 12)

/* cgroup id -> the rule set and flags that apply to its packets. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct krt_proto_gate);
} proto_cgroups SEC(".maps");

/* Rules: presence is the rule, the value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct krt_proto_key);
	__type(value, __u8);
} allowed_protos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct krt_proto_key);
	__type(value, __u8);
} banned_protos SEC(".maps");

/* Cached verdicts, one per flow; LRU, so the oldest flows are forgotten
 * first when the node has more live flows than this. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct krt_flow_key);
	__type(value, struct krt_flow_verdict);
} proto_flows SEC(".maps");

/* (cgroup, protocol, ALPN, decision) -> flows, for observing sets. Drained
 * (read and reset) by userspace; a full map counts events_lost. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_EVENTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct krt_proto_event_key);
	__type(value, __u64);
} proto_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct krt_proto_stats);
} proto_stats SEC(".maps");

/* Bumped by userspace after every rule or gate change; a cached verdict of
 * an older generation is recomputed (from its cached classification). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} proto_generation SEC(".maps");

/*
 * Whether bpf_get_current_cgroup_id may be called from a cgroup_skb
 * program (5.10 and 6.1 refuse it there). Userspace probes for the helper
 * and sets this before load; when false the verifier drops the call as
 * dead code. It only matters when the skb has no full socket, which real
 * egress never produces (the kernel runs inet egress programs for full
 * sockets only); it serves BPF_PROG_TEST_RUN on kernels whose test skb has
 * no socket cgroup.
 */
const volatile bool krt_proto_use_current_cgroup = false;

/*
 * Tests only (issue 36): a test sets this before load to have the program
 * itself make, once, the update the daemon makes concurrently (raise the
 * cgroup's default deny, then bump the generation) between its read of
 * the generation and its read of the gate: the window a real update can
 * land in. False in every other load, so the verifier drops the call as
 * dead code.
 */
const volatile bool krt_proto_test_update_between_reads = false;
/* The hook above has run (it runs once per load). */
__u32 krt_proto_test_update_done = 0;

static __always_inline void test_update_between_reads(__u64 cgroup_id)
{
	struct krt_proto_gate *g, raised;
	__u32 zero = 0;
	__u64 *gen;

	if (krt_proto_test_update_done)
		return;
	krt_proto_test_update_done = 1;
	g = bpf_map_lookup_elem(&proto_cgroups, &cgroup_id);
	if (!g)
		return;
	raised = *g;
	raised.flags |= KRT_PROTO_F_DEFAULT_DENY;
	bpf_map_update_elem(&proto_cgroups, &cgroup_id, &raised, BPF_ANY);
	gen = bpf_map_lookup_elem(&proto_generation, &zero);
	if (gen)
		__sync_fetch_and_add(gen, 1);
}

/* Never used: put the enums into the object's BTF, so the skeleton
 * generates their constants for Rust. */
enum krt_proto_id krt_proto_id_btf_anchor;
enum krt_proto_decision krt_proto_decision_btf_anchor;
enum krt_proto_flag krt_proto_flag_btf_anchor;

/* What parse_headers found. */
enum parse_result {
	/* No flow key: the packet is decided alone, as unclassified. */
	PARSE_NO_FLOW = 0,
	/* A flow key without ports: an L4 this program does not classify. */
	PARSE_OTHER_L4 = 1,
	/* TCP or UDP with ports and a payload offset. */
	PARSE_TCP = 2,
	PARSE_UDP = 3,
};

struct packet {
	/* Offset and length of the L4 payload in the skb. */
	__u32 payload_off;
	__u32 payload_len;
	__u8 tcp_flags;
};

/*
 * `len`, which the caller has checked to be in [1, max] (`max` a power of
 * two), restated so that every verifier can bound the helper size it is
 * passed: 5.10 learns nothing from "len != 0", so the range is rebuilt
 * arithmetically on the register itself, behind a barrier the compiler
 * cannot see through (it would drop the mask as a no-op).
 */
static __always_inline __u64 helper_len(__u64 len, __u64 max)
{
	len -= 1;
	barrier_var(len);
	len &= max - 1;
	return len + 1;
}

static __always_inline __u16 be16_at(const __u8 *p)
{
	return ((__u16)p[0] << 8) | p[1];
}

/* The big-endian u8/u16 at skb offset `off`, which must lie below `end`.
 * Returns 0 on success. */
static __always_inline int load_u8(struct __sk_buff *skb, __u32 off, __u32 end, __u32 *out)
{
	__u8 b;

	if (off >= end || bpf_skb_load_bytes(skb, off, &b, 1))
		return -1;
	*out = b;
	return 0;
}

static __always_inline int load_u16(struct __sk_buff *skb, __u32 off, __u32 end, __u32 *out)
{
	__u8 b[2];

	if (off >= end || end - off < 2 || bpf_skb_load_bytes(skb, off, b, 2))
		return -1;
	*out = be16_at(b);
	return 0;
}

/*
 * L3 and L4 headers -> flow key and payload bounds. `*failed` is set when
 * the input is malformed (as opposed to merely unclassifiable).
 */
static __always_inline enum parse_result parse_headers(struct __sk_buff *skb,
						       struct krt_flow_key *key,
						       struct packet *pkt, bool *failed)
{
	__u32 len = skb->len;
	__u32 end, l4off;
	__u8 l4proto;

	if (skb->protocol == bpf_htons(ETH_P_IP_)) {
		__u8 h[20];
		__u32 ihl, tot, frag;

		if (len < sizeof(h) || bpf_skb_load_bytes(skb, 0, h, sizeof(h)))
			goto malformed;
		if ((h[0] >> 4) != 4)
			goto malformed;
		ihl = (h[0] & 0x0f) * 4;
		tot = be16_at(&h[2]);
		end = len;
		/* tot_len 0: a GSO packet over 64 KiB (BIG TCP); trust skb->len. */
		if (tot) {
			if (tot < end)
				end = tot;
		}
		if (ihl < sizeof(h) || ihl > end)
			goto malformed;
		/* MF or a fragment offset: no L4 header, or not all of it. */
		frag = be16_at(&h[6]) & 0x3fff;
		if (frag)
			goto malformed;
		key->saddr[10] = 0xff;
		key->saddr[11] = 0xff;
		__builtin_memcpy(&key->saddr[12], &h[12], 4);
		key->daddr[10] = 0xff;
		key->daddr[11] = 0xff;
		__builtin_memcpy(&key->daddr[12], &h[16], 4);
		key->family = 4;
		l4proto = h[9];
		l4off = ihl;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6_)) {
		__u8 h[40];
		__u32 plen;

		if (len < sizeof(h) || bpf_skb_load_bytes(skb, 0, h, sizeof(h)))
			goto malformed;
		if ((h[0] >> 4) != 6)
			goto malformed;
		plen = be16_at(&h[4]);
		end = len;
		/* payload_len 0: a jumbogram / BIG TCP GSO packet. */
		if (plen && plen < len - sizeof(h))
			end = plen + sizeof(h);
		__builtin_memcpy(key->saddr, &h[8], 16);
		__builtin_memcpy(key->daddr, &h[24], 16);
		key->family = 6;
		/* Any extension header lands here too: not walked. */
		l4proto = h[6];
		l4off = sizeof(h);
	} else {
		goto malformed;
	}
	key->l4proto = l4proto;

	if (l4proto == IPPROTO_TCP_) {
		__u8 t[20];
		__u32 doff;

		if (l4off > end || end - l4off < sizeof(t) ||
		    bpf_skb_load_bytes(skb, l4off, t, sizeof(t)))
			goto malformed;
		doff = (t[12] >> 4) * 4;
		if (doff < sizeof(t) || doff > end - l4off)
			goto malformed;
		__builtin_memcpy(&key->sport, &t[0], 2);
		__builtin_memcpy(&key->dport, &t[2], 2);
		pkt->tcp_flags = t[13];
		pkt->payload_off = l4off + doff;
		pkt->payload_len = end - pkt->payload_off;
		return PARSE_TCP;
	}
	if (l4proto == IPPROTO_UDP_) {
		__u8 u[8];

		if (l4off > end || end - l4off < sizeof(u) ||
		    bpf_skb_load_bytes(skb, l4off, u, sizeof(u)))
			goto malformed;
		__builtin_memcpy(&key->sport, &u[0], 2);
		__builtin_memcpy(&key->dport, &u[2], 2);
		pkt->payload_off = l4off + sizeof(u);
		pkt->payload_len = end - pkt->payload_off;
		return PARSE_UDP;
	}
	return PARSE_OTHER_L4;

malformed:
	*failed = true;
	return PARSE_NO_FLOW;
}

/*
 * The first min(payload_len, HEAD_LEN) payload bytes into `head` (zeroed by
 * the caller); returns how many, 0 when there is no payload or it cannot be
 * read (then `*failed`).
 */
static __always_inline __u32 load_head(struct __sk_buff *skb, const struct packet *pkt,
				       __u8 *head, bool *failed)
{
	__u64 n = pkt->payload_len;

	if (n == 0)
		return 0;
	if (n > HEAD_LEN)
		n = HEAD_LEN;
	n = helper_len(n, HEAD_LEN);
	if (bpf_skb_load_bytes(skb, pkt->payload_off, head, n)) {
		*failed = true;
		return 0;
	}
	return n;
}

/* Whether `head` (of `n` valid bytes) starts with the `len` bytes of `lit`.
 * `lit` and `len` are constants at every call site, so the loop unrolls
 * into immediate compares. */
static __always_inline bool starts_with(const __u8 *head, __u32 n, const char *lit, __u32 len)
{
	if (n < len)
		return false;
#pragma clang loop unroll(full)
	for (__u32 i = 0; i < HEAD_LEN; i++) {
		if (i >= len)
			break;
		if (head[i] != (__u8)lit[i])
			return false;
	}
	return true;
}

/* An HTTP/1 request's method token followed by a space. */
static __always_inline bool is_http1(const __u8 *head, __u32 n)
{
	switch (head[0]) {
	case 'G':
		return starts_with(head, n, "GET ", 4);
	case 'P':
		return starts_with(head, n, "POST ", 5) || starts_with(head, n, "PUT ", 4) ||
		       starts_with(head, n, "PATCH ", 6);
	case 'H':
		return starts_with(head, n, "HEAD ", 5);
	case 'D':
		return starts_with(head, n, "DELETE ", 7);
	case 'O':
		return starts_with(head, n, "OPTIONS ", 8);
	case 'C':
		return starts_with(head, n, "CONNECT ", 8);
	case 'T':
		return starts_with(head, n, "TRACE ", 6);
	default:
		return false;
	}
}

/*
 * The ALPN extension's body at [off, off + len): the first protocol name
 * into `alpn` (zeroed by the caller). The whole list is validated; a list
 * of more than ALPN_MAX_NAMES names, a name over KRT_ALPN_LEN bytes (it
 * would not fit a key: truncating it would be a guess) or one holding a NUL
 * byte fails. Returns 0 on success.
 */
static __always_inline int read_alpn(struct __sk_buff *skb, __u32 off, __u32 len, char *alpn)
{
	__u32 end = off + len;
	__u32 list_len, first, at, list_end;

	/* A 2-byte list length, then at least one non-empty name. */
	if (load_u16(skb, off, end, &list_len) || list_len < 2 || list_len + 2 != len)
		return -1;
	at = off + 2;
	list_end = end;
	if (load_u8(skb, at, list_end, &first))
		return -1;
	if (first < 1 || first > KRT_ALPN_LEN || first > list_len - 1)
		return -1;
	if (bpf_skb_load_bytes(skb, at + 1, alpn, helper_len(first, KRT_ALPN_LEN)))
		return -1;
#pragma clang loop unroll(full)
	for (__u32 i = 0; i < KRT_ALPN_LEN; i++) {
		if (i < first && alpn[i] == 0)
			return -1;
	}

	for (__u32 i = 0; i < ALPN_MAX_NAMES; i++) {
		__u32 name_len;

		if (at == list_end)
			return 0;
		if (load_u8(skb, at, list_end, &name_len) || name_len == 0)
			return -1;
		at += 1 + name_len;
		if (at > list_end)
			return -1;
	}
	return at == list_end ? 0 : -1;
}

/*
 * A TLS record whose first byte is 22 (handshake): a ClientHello, walked up
 * to its first offered ALPN name. The whole ClientHello must be in this
 * segment, in this one record.
 */
static __always_inline __u32 classify_tls(struct __sk_buff *skb, const struct packet *pkt,
					  const __u8 *head, __u32 n, char *alpn, bool *failed)
{
	__u32 rec_len, hs_len, off, end, v;

	/* Record header (5) and handshake header (4). */
	if (n < 9)
		goto truncated;
	/* Version 3.x (SSL 3.0 to TLS 1.3's legacy values) and a ClientHello;
	 * anything else is not the start of a TLS client's flow. */
	if (head[1] != 3 || head[2] > 4 || head[5] != 1)
		return KRT_PROTO_UNCLASSIFIED;
	rec_len = be16_at(&head[3]);
	hs_len = ((__u32)head[6] << 16) | ((__u32)head[7] << 8) | head[8];
	/* The ClientHello spans records, or the record spans segments. */
	if (rec_len < 4 || hs_len > rec_len - 4 || rec_len > pkt->payload_len - 5)
		goto truncated;

	off = pkt->payload_off + 9;
	end = off + hs_len;
	/* legacy_version (2) and random (32). */
	off += 34;
	/* legacy_session_id. */
	if (load_u8(skb, off, end, &v) || v > 32)
		goto truncated;
	off += 1 + v;
	/* cipher_suites: a non-empty list of 2-byte ids. */
	if (load_u16(skb, off, end, &v) || v < 2 || (v & 1))
		goto truncated;
	off += 2 + v;
	/* legacy_compression_methods: at least "null". */
	if (load_u8(skb, off, end, &v) || v < 1)
		goto truncated;
	off += 1 + v;
	if (off == end)
		return KRT_PROTO_TLS; /* no extensions, so no ALPN */
	if (load_u16(skb, off, end, &v))
		goto truncated;
	off += 2;
	if (off > end || v != end - off)
		goto truncated;

	for (__u32 i = 0; i < TLS_MAX_EXTENSIONS; i++) {
		__u8 ext[4];
		__u32 type, len;

		if (off == end)
			return KRT_PROTO_TLS; /* walked every extension: no ALPN */
		if (off > end || end - off < sizeof(ext) ||
		    bpf_skb_load_bytes(skb, off, ext, sizeof(ext)))
			goto truncated;
		type = be16_at(&ext[0]);
		len = be16_at(&ext[2]);
		off += sizeof(ext);
		if (len > end - off)
			goto truncated;
		if (type == 16) { /* application_layer_protocol_negotiation */
			if (read_alpn(skb, off, len, alpn))
				goto truncated;
			return KRT_PROTO_TLS;
		}
		off += len;
	}
	if (off == end)
		return KRT_PROTO_TLS;
	/* More extensions than the walk: whether ALPN follows is unknown. */

truncated:
	*failed = true;
	/* A partial name must not leak into the unclassified verdict. */
	__builtin_memset(alpn, 0, KRT_ALPN_LEN);
	return KRT_PROTO_UNCLASSIFIED;
}

static __always_inline __u32 classify_tcp(struct __sk_buff *skb, const struct packet *pkt,
					  char *alpn, bool *failed)
{
	__u8 head[HEAD_LEN] = {};
	__u32 n = load_head(skb, pkt, head, failed);

	if (n == 0)
		return KRT_PROTO_UNCLASSIFIED;
	if (head[0] == 22)
		return classify_tls(skb, pkt, head, n, alpn, failed);
	if (starts_with(head, n, "SSH-", 4))
		return KRT_PROTO_SSH;
	if (starts_with(head, n, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24))
		return KRT_PROTO_HTTP2;
	if (is_http1(head, n))
		return KRT_PROTO_HTTP1;
	return KRT_PROTO_UNCLASSIFIED;
}

/* QUIC v1 long header: form and fixed bits set, version 1, connection id
 * lengths within v1's limit of 20. */
static __always_inline __u32 classify_quic(struct __sk_buff *skb, const struct packet *pkt,
					   const __u8 *head, __u32 n, bool *failed)
{
	__u32 dcid_len, scid_len;

	if (n < 6) {
		*failed = true;
		return KRT_PROTO_UNCLASSIFIED;
	}
	dcid_len = head[5];
	if (dcid_len > 20 ||
	    load_u8(skb, pkt->payload_off + 6 + dcid_len, pkt->payload_off + pkt->payload_len,
		    &scid_len) ||
	    scid_len > 20) {
		*failed = true;
		return KRT_PROTO_UNCLASSIFIED;
	}
	return KRT_PROTO_QUIC;
}

/* A DNS query: QR 0, opcode 0 (QUERY), at least one question, and the first
 * QNAME a well-formed uncompressed name followed by QTYPE and QCLASS. */
static __always_inline __u32 classify_dns(struct __sk_buff *skb, const struct packet *pkt,
					  const __u8 *head, __u32 n)
{
	__u32 off = pkt->payload_off + 12;
	__u32 end = pkt->payload_off + pkt->payload_len;
	__u32 name_len = 0;

	if (n < 12)
		return KRT_PROTO_UNCLASSIFIED;
	if ((head[2] & 0x80) || ((head[2] >> 3) & 0x0f) || be16_at(&head[4]) == 0)
		return KRT_PROTO_UNCLASSIFIED;

	for (__u32 i = 0; i < DNS_MAX_LABELS; i++) {
		__u32 label;

		if (load_u8(skb, off, end, &label))
			return KRT_PROTO_UNCLASSIFIED;
		off += 1;
		name_len += 1 + label;
		if (label == 0)
			/* QTYPE and QCLASS follow the name. */
			return off <= end && end - off >= 4 ? KRT_PROTO_DNS : KRT_PROTO_UNCLASSIFIED;
		/* Compression pointers and reserved label types. */
		if (label > 63 || name_len > DNS_MAX_NAME)
			return KRT_PROTO_UNCLASSIFIED;
		off += label;
	}
	return KRT_PROTO_UNCLASSIFIED;
}

static __always_inline __u32 classify_udp(struct __sk_buff *skb, const struct packet *pkt,
					  bool *failed)
{
	__u8 head[HEAD_LEN] = {};
	__u32 n = load_head(skb, pkt, head, failed);

	if (n == 0)
		return KRT_PROTO_UNCLASSIFIED;
	if ((head[0] & 0xc0) == 0xc0 && n >= 5 && head[1] == 0 && head[2] == 0 && head[3] == 0 &&
	    head[4] == 1)
		return classify_quic(skb, pkt, head, n, failed);
	return classify_dns(skb, pkt, head, n);
}

/* The decision of rule set `gate` for (proto, alpn). */
static __always_inline __u32 decide(const struct krt_proto_gate *gate, __u32 proto,
				    const char *alpn)
{
	struct krt_proto_key any, exact;
	bool has_alpn = alpn[0] != 0;

	__builtin_memset(&any, 0, sizeof(any));
	any.set_id = gate->set_id;
	any.proto_id = proto;
	exact = any;
	__builtin_memcpy(exact.alpn, alpn, KRT_ALPN_LEN);

	if (bpf_map_lookup_elem(&banned_protos, &any))
		return KRT_DECISION_DENY;
	if (has_alpn && bpf_map_lookup_elem(&banned_protos, &exact))
		return KRT_DECISION_DENY;
	if (bpf_map_lookup_elem(&allowed_protos, &any))
		return KRT_DECISION_ALLOW;
	if (has_alpn && bpf_map_lookup_elem(&allowed_protos, &exact))
		return KRT_DECISION_ALLOW;
	if (gate->flags & KRT_PROTO_F_DEFAULT_DENY)
		return KRT_DECISION_DEFAULT_DENY;
	return KRT_DECISION_PASS;
}

static __always_inline void record(__u64 cgroup_id, __u32 proto, const char *alpn,
				   __u32 decision, struct krt_proto_stats *st)
{
	struct krt_proto_event_key ek;
	__u64 one = 1, *count;
	long err;

	__builtin_memset(&ek, 0, sizeof(ek));
	ek.cgroup_id = cgroup_id;
	ek.proto_id = proto;
	ek.decision = decision;
	__builtin_memcpy(ek.alpn, alpn, KRT_ALPN_LEN);

	count = bpf_map_lookup_elem(&proto_events, &ek);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return;
	}
	err = bpf_map_update_elem(&proto_events, &ek, &one, BPF_NOEXIST);
	if (err == 0)
		return;
	if (err == -EEXIST_) {
		/* Another CPU created it meanwhile. */
		count = bpf_map_lookup_elem(&proto_events, &ek);
		if (count) {
			__sync_fetch_and_add(count, 1);
			return;
		}
	}
	st->events_lost++;
}

static __always_inline int enforce(__u32 decision, struct krt_proto_stats *st)
{
	if (decision == KRT_DECISION_DENY || decision == KRT_DECISION_DEFAULT_DENY) {
		st->drops++;
		return SKB_DROP;
	}
	return SKB_PASS;
}

SEC("cgroup_skb/egress")
int krt_protocol(struct __sk_buff *skb)
{
	struct krt_proto_gate *gate_ptr, gate;
	struct krt_proto_stats *st;
	struct krt_flow_verdict *cached, verdict;
	struct krt_flow_key key;
	struct packet pkt = {};
	char alpn[KRT_ALPN_LEN] = {};
	enum parse_result parsed;
	bool failed = false;
	__u64 cgroup_id, generation = 0, *gen;
	__u32 zero = 0, proto, decision;

	/*
	 * The generation before the gate, as the egress filter reads its
	 * generations before any lookup: the daemon rewrites a gate (or a
	 * rule) and then bumps the generation, so a gate read after the
	 * generation is never older than it, and a verdict cached with it is
	 * recomputed at the flow's next packet when an update landed in
	 * between. Read the other way round, an update landing between the
	 * reads cached the old gate's verdict under the new generation for
	 * the flow's lifetime. An ungated pod pays this array read and the
	 * gate lookup.
	 */
	gen = bpf_map_lookup_elem(&proto_generation, &zero);
	if (gen)
		generation = *gen;
	cgroup_id = bpf_skb_cgroup_id(skb);
	if (cgroup_id == 0 && krt_proto_use_current_cgroup)
		cgroup_id = bpf_get_current_cgroup_id();
	if (krt_proto_test_update_between_reads)
		test_update_between_reads(cgroup_id);
	gate_ptr = bpf_map_lookup_elem(&proto_cgroups, &cgroup_id);
	if (!gate_ptr)
		return SKB_PASS;
	/* Read once: userspace may rewrite the entry concurrently. */
	gate = *gate_ptr;

	st = bpf_map_lookup_elem(&proto_stats, &zero);
	if (!st)
		return SKB_PASS; /* cannot happen: a one-slot array */
	st->packets++;

	__builtin_memset(&key, 0, sizeof(key));
	key.cgroup_id = cgroup_id;
	parsed = parse_headers(skb, &key, &pkt, &failed);

	if (parsed != PARSE_NO_FLOW) {
		if (parsed == PARSE_TCP &&
		    (pkt.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
			/* A new connection on this tuple: the old verdict is not its. */
			bpf_map_delete_elem(&proto_flows, &key);
		} else {
			cached = bpf_map_lookup_elem(&proto_flows, &key);
			if (cached) {
				st->cached++;
				decision = cached->decision;
				if (cached->generation != generation) {
					decision = decide(&gate, cached->proto_id, cached->alpn);
					cached->decision = decision;
					cached->generation = generation;
				}
				return enforce(decision, st);
			}
		}
		if (parsed == PARSE_TCP && pkt.payload_len == 0) {
			st->deferred++;
			return SKB_PASS;
		}
	}

	proto = KRT_PROTO_UNCLASSIFIED;
	if (parsed == PARSE_TCP)
		proto = classify_tcp(skb, &pkt, alpn, &failed);
	else if (parsed == PARSE_UDP)
		proto = classify_udp(skb, &pkt, &failed);

	if (failed)
		st->parse_failures++;
	if (proto < KRT_PROTO_COUNT)
		st->classified[proto]++;

	/*
	 * Decide, record, cache, enforce: in this order. A refusal is always
	 * recorded, so a pod only enforce policies select still gets a finding
	 * for each flow its policy refused (as the egress filter does); an
	 * allowed flow only when the set observes.
	 */
	decision = decide(&gate, proto, alpn);
	if ((gate.flags & KRT_PROTO_F_OBSERVE) || decision == KRT_DECISION_DENY ||
	    decision == KRT_DECISION_DEFAULT_DENY)
		record(cgroup_id, proto, alpn, decision, st);
	if (parsed != PARSE_NO_FLOW) {
		__builtin_memset(&verdict, 0, sizeof(verdict));
		verdict.generation = generation;
		verdict.proto_id = proto;
		verdict.decision = decision;
		__builtin_memcpy(verdict.alpn, alpn, KRT_ALPN_LEN);
		if (bpf_map_update_elem(&proto_flows, &key, &verdict, BPF_ANY))
			st->flows_lost++;
	}
	return enforce(decision, st);
}
