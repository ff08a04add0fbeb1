// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The DNS question observer: a cgroup_skb/egress program that reads the
 * QNAME of every UDP datagram a gated cgroup sends to port 53 and submits
 * one ring buffer record per question (struct dns_query_event).
 *
 * Every path returns 1 (pass): a question this program cannot parse must
 * still leave the pod. It observes, it never enforces.
 *
 * One loaded object serves every attachment: cgroup_skb programs attach per
 * cgroup, so observing N pods means N links to this one program, one ring
 * buffer, one reader, and one cgids gate that every attachment shares.
 *
 * What is read:
 *   - IPv4 and IPv6, the family taken from skb->protocol, the UDP header
 *     found as bpf/include/udp.h describes (IPv6 extension headers
 *     walked). Datagrams whose UDP header is not reached are not observed
 *     (and not counted, since they are not known to be DNS).
 *   - UDP to destination port 53 only (no TCP/53, DoT, DoH).
 *   - The first question of a message whose header says it has one: the
 *     DNS header is 12 bytes, so the QNAME starts at a fixed offset and is
 *     never compressed. A datagram with an empty payload, or a header with
 *     QDCOUNT 0, asked nothing: it is passed without a record or a count.
 *     A payload too short for the header is a truncated question:
 *     name_unreadable.
 */
#include "common.h"
#include "dns.h"
#include "udp.h"
#include <bpf/bpf_endian.h>

#define PASS 1

#define DNS_PORT 53
#define DNS_HEADER_LEN 12

/* Container cgroups whose questions are observed: the gate. The value is
 * unused (1). Sized for every container of a dense node. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, __u8);
} krt_dns_cgids SEC(".maps");

/* Questions. 64 KiB holds about 450 records of 136 bytes (plus the ring's
 * 8-byte record header); a reader that falls behind loses the newest
 * questions to ringbuf_full. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} krt_dns_events SEC(".maps");

/* Loss counters: one struct dns_stats per CPU at key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dns_stats);
} krt_dns_stats SEC(".maps");

/*
 * Whether bpf_get_current_cgroup_id may be called from a cgroup_skb
 * program. Linux 5.10 and 6.1 refuse the helper there ("unknown func"), so
 * userspace probes for it and sets this before load; when false the
 * verifier removes the call as dead code. It only matters for an skb
 * without a full socket, which egress from a container does not produce in
 * practice.
 */
const volatile bool krt_dns_use_current_cgroup = false;

/* Never used: puts struct dns_query_event into the object's BTF, so the
 * skeleton generates its Rust type (a ring buffer map has no value type). */
struct dns_query_event krt_dns_query_event_btf_anchor = {};

static __always_inline void count_unreadable(void)
{
	__u32 zero = 0;
	struct dns_stats *s = bpf_map_lookup_elem(&krt_dns_stats, &zero);

	if (s)
		__sync_fetch_and_add(&s->name_unreadable, 1);
}

static __always_inline void count_ringbuf_full(void)
{
	__u32 zero = 0;
	struct dns_stats *s = bpf_map_lookup_elem(&krt_dns_stats, &zero);

	if (s)
		__sync_fetch_and_add(&s->ringbuf_full, 1);
}

SEC("cgroup_skb/egress")
int krt_dns_egress(struct __sk_buff *skb)
{
	struct dns_query_event *e;
	struct udphdr udp;
	__u8 dns[DNS_HEADER_LEN];
	__u64 cgid;
	__u32 off;

	/* The gate comes first: an unselected pod pays this lookup only.
	 * The socket's cgroup stays right when the skb is transmitted from
	 * softirq context; the current task's is the fallback for an skb
	 * without a socket (a question is sent from process context). */
	cgid = bpf_skb_cgroup_id(skb);
	if (cgid == 0 && krt_dns_use_current_cgroup)
		cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&krt_dns_cgids, &cgid))
		return PASS;

	off = krt_udp_offset(skb);
	if (off == 0)
		return PASS;

	if (bpf_skb_load_bytes(skb, off, &udp, sizeof(udp)) < 0)
		return PASS;
	if (udp.dest != bpf_htons(DNS_PORT))
		return PASS;
	off += sizeof(udp);
	/* An empty datagram asked nothing. */
	if (off >= skb->len)
		return PASS;
	if (bpf_skb_load_bytes(skb, off, dns, sizeof(dns)) < 0) {
		count_unreadable();
		return PASS;
	}
	/* QDCOUNT (bytes 4-5): a message without a question has no QNAME. */
	if (dns[4] == 0 && dns[5] == 0)
		return PASS;
	off += DNS_HEADER_LEN;

	/* Reserved before the name is known to be readable: the name is read
	 * straight into the record (see dnsname.h), and an unreadable one is
	 * discarded. */
	e = bpf_ringbuf_reserve(&krt_dns_events, sizeof(*e), 0);
	if (!e) {
		count_ringbuf_full();
		return PASS;
	}
	/* Ring buffer memory is recycled and mapped into userspace: without
	 * this a short name would hand the reader the previous record's tail
	 * (another pod's question). */
	__builtin_memset(e, 0, sizeof(*e));
	e->cgroup_id = cgid;
	if (dns_read_name(skb, off, &e->qname) != DNS_NAME_OK) {
		bpf_ringbuf_discard(e, 0);
		count_unreadable();
		return PASS;
	}
	bpf_ringbuf_submit(e, 0);
	return PASS;
}
