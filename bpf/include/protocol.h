/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared between the protocol classifier (bpf/protocol/) and
 * userspace (bpf/src/protocol/).
 *
 * Rust never re-declares these layouts: it encodes keys at the offsets the
 * generated skeleton's `types` module gives (`core::mem::offset_of!`), and
 * its tests check the sizes, so a layout change here shows up at the next
 * build. Every struct is padding-free and is zeroed before it is filled:
 * hash maps compare keys byte for byte.
 */
#ifndef KRT_PROTOCOL_H
#define KRT_PROTOCOL_H

#include "vmlinux.h"

/* Bytes of an ALPN protocol name in a key; shorter names are NUL-padded. */
#define KRT_ALPN_LEN 16

/*
 * Protocol ids (struct krt_proto_key.proto_id). 0 is never written, so a
 * zeroed value cannot be mistaken for a protocol.
 */
enum krt_proto_id {
	/* No protocol evidence, or evidence that could not be parsed. */
	KRT_PROTO_UNCLASSIFIED = 1,
	/* "SSH-" banner (TCP). */
	KRT_PROTO_SSH = 2,
	/* TLS handshake record carrying a ClientHello (TCP). */
	KRT_PROTO_TLS = 3,
	/* The 24-byte HTTP/2 cleartext connection preface (TCP). */
	KRT_PROTO_HTTP2 = 4,
	/* An HTTP/1 request line's method token and space (TCP). */
	KRT_PROTO_HTTP1 = 5,
	/* A QUIC version 1 long header (UDP). */
	KRT_PROTO_QUIC = 6,
	/* A cleartext DNS query (UDP). */
	KRT_PROTO_DNS = 7,
	/* One past the largest id: length of krt_proto_stats.classified. */
	KRT_PROTO_COUNT = 8,
};

/*
 * What the classifier decided for a flow, in the precedence order
 * explicit deny > explicit allow > default deny > pass.
 */
enum krt_proto_decision {
	/* No rule matched and the set does not default-deny: passed. */
	KRT_DECISION_PASS = 1,
	/* An allowed_protos entry matched: passed. */
	KRT_DECISION_ALLOW = 2,
	/* A banned_protos entry matched: dropped. */
	KRT_DECISION_DENY = 3,
	/* No rule matched and the set default-denies: dropped. */
	KRT_DECISION_DEFAULT_DENY = 4,
};

/* struct krt_proto_gate.flags bits. */
enum krt_proto_flag {
	/* Drop what no allowed_protos entry allows. */
	KRT_PROTO_F_DEFAULT_DENY = 1 << 0,
	/* Count each allowed flow's decision in proto_events too (a refused
	 * flow is always counted). */
	KRT_PROTO_F_OBSERVE = 1 << 1,
};

/* proto_cgroups value: which rule set governs a cgroup, and how. */
struct krt_proto_gate {
	/* Rule set id: the set_id of this cgroup's allowed/banned keys. */
	__u32 set_id;
	/* enum krt_proto_flag bits. */
	__u32 flags;
};

/*
 * allowed_protos / banned_protos key. An all-zero alpn means "this protocol
 * with any ALPN (or none)"; a non-empty one matches exactly that first
 * offered ALPN protocol name.
 */
struct krt_proto_key {
	__u32 set_id;
	/* enum krt_proto_id. */
	__u32 proto_id;
	/* First offered ALPN name, NUL-padded (not NUL-terminated at 16). */
	char alpn[KRT_ALPN_LEN];
};

/* proto_flows key: one flow of one cgroup. */
struct krt_flow_key {
	/* Cgroup v2 id of the sender (loopback tuples repeat across pods). */
	__u64 cgroup_id;
	/* Addresses; IPv4 as v4-mapped IPv6 (::ffff:a.b.c.d). */
	__u8 saddr[16];
	__u8 daddr[16];
	/* Network byte order; 0 for an L4 that was not parsed. */
	__u16 sport;
	__u16 dport;
	/* IPPROTO_TCP, IPPROTO_UDP, or the unparsed protocol / next header. */
	__u8 l4proto;
	/* 4 or 6. */
	__u8 family;
	__u8 pad[2];
};

/* proto_flows value: what a flow was classified as, and the verdict. */
struct krt_flow_verdict {
	/* proto_generation when `decision` was computed. */
	__u64 generation;
	/* enum krt_proto_id. */
	__u32 proto_id;
	/* enum krt_proto_decision. */
	__u32 decision;
	/* First offered ALPN name (TLS), NUL-padded. */
	char alpn[KRT_ALPN_LEN];
};

/* proto_events key; the value is a __u64 count of flows. */
struct krt_proto_event_key {
	__u64 cgroup_id;
	/* enum krt_proto_id. */
	__u32 proto_id;
	/* enum krt_proto_decision. */
	__u32 decision;
	char alpn[KRT_ALPN_LEN];
};

/* proto_stats value (a one-slot per-CPU array). */
struct krt_proto_stats {
	/* Packets of gated cgroups (a cgroup in proto_cgroups). */
	__u64 packets;
	/* TCP packets without payload before the flow had a verdict. */
	__u64 deferred;
	/* Packets decided by a cached flow verdict. */
	__u64 cached;
	/* Decisions per enum krt_proto_id (index UNCLASSIFIED included):
	 * once per flow, or per packet when no flow key could be parsed. */
	__u64 classified[KRT_PROTO_COUNT];
	/* Inputs that could not be parsed: truncated or fragmented headers,
	 * unreadable bytes, a ClientHello or QUIC header that does not parse
	 * within this segment and the walk bounds. */
	__u64 parse_failures;
	/* Packets dropped (denied flows, including later packets of a flow). */
	__u64 drops;
	/* Decisions not counted because proto_events was full. */
	__u64 events_lost;
	/* Verdicts not cached because proto_flows refused the insert. */
	__u64 flows_lost;
};

#endif /* KRT_PROTOCOL_H */
