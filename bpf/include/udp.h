/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Finding the UDP header of a packet a cgroup_skb program sees (skb->data
 * at the IP header), for the two DNS readers: the question observer
 * (bpf/dns/, egress) and the answer snooper (bpf/dnssnoop/, ingress).
 *
 *   - IPv4, any IHL; a non-first fragment carries no UDP header and is
 *     skipped (on ingress the stack has reassembled the datagram before
 *     the socket's cgroup program runs, so only egress sees fragments).
 *   - IPv6: up to IPV6_EXT_MAX hop-by-hop, routing, fragment (first
 *     fragment only) and destination-options headers are walked to reach
 *     UDP: a socket sets those with an ordinary setsockopt, and reading
 *     UDP only right after the fixed header would let a pod hide its DNS
 *     traffic that way. AH, ESP and longer chains are not walked.
 *
 * The family is the caller's to take from skb->protocol, never from the
 * payload. Both return 0 when no UDP header is reached (0 is never a valid
 * offset: the IP header comes first).
 */
#ifndef KRT_UDP_H
#define KRT_UDP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef ETH_P_IP
#define ETH_P_IP 0x0800
#endif
#ifndef ETH_P_IPV6
#define ETH_P_IPV6 0x86DD
#endif

/* The fragment offset bits of iphdr.frag_off (host order). */
#define KRT_IP_FRAG_OFFSET 0x1fff
/* The fragment offset bits of frag_hdr.frag_off (host order). */
#define KRT_IPV6_FRAG_OFFSET 0xfff8

/* IPv6 next-header values of the extension headers walked. */
#define KRT_NEXTHDR_HOP 0
#define KRT_NEXTHDR_ROUTING 43
#define KRT_NEXTHDR_FRAGMENT 44
#define KRT_NEXTHDR_DEST 60
/* Extension headers walked before giving up: a socket adds at most
 * hop-by-hop, destination options (twice, around routing), routing and a
 * fragment header; one more for slack. */
#define KRT_IPV6_EXT_MAX 6

/* Offset of the UDP header of an IPv6 packet, or 0 when none is reached. */
static __always_inline __u32 krt_ipv6_udp_offset(struct __sk_buff *skb)
{
	struct ipv6hdr ip6;
	__u32 off = sizeof(ip6);
	__u8 next;

	if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
		return 0;
	next = ip6.nexthdr;

#pragma clang loop unroll(full)
	for (int i = 0; i < KRT_IPV6_EXT_MAX; i++) {
		/* nexthdr, hdrlen (or reserved), fragment offset and flags. */
		__u8 ext[4];

		if (next == IPPROTO_UDP)
			return off;
		if (next != KRT_NEXTHDR_HOP && next != KRT_NEXTHDR_ROUTING &&
		    next != KRT_NEXTHDR_DEST && next != KRT_NEXTHDR_FRAGMENT)
			return 0;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			return 0;
		if (next == KRT_NEXTHDR_FRAGMENT) {
			/* A later fragment has no UDP header. */
			if (((ext[2] << 8) | ext[3]) & KRT_IPV6_FRAG_OFFSET)
				return 0;
			off += 8;
		} else {
			off += ((__u32)ext[1] + 1) * 8;
		}
		next = ext[0];
	}
	return next == IPPROTO_UDP ? off : 0;
}

/* Offset of the UDP header of an IPv4 packet, or 0 when it has none. */
static __always_inline __u32 krt_ipv4_udp_offset(struct __sk_buff *skb)
{
	struct iphdr ip;

	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
		return 0;
	if (ip.ihl < 5 || ip.protocol != IPPROTO_UDP)
		return 0;
	if (bpf_ntohs(ip.frag_off) & KRT_IP_FRAG_OFFSET)
		return 0;
	return (__u32)ip.ihl * 4;
}

/* Offset of the UDP header by skb->protocol, or 0. */
static __always_inline __u32 krt_udp_offset(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return krt_ipv4_udp_offset(skb);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return krt_ipv6_udp_offset(skb);
	return 0;
}

#endif /* KRT_UDP_H */
