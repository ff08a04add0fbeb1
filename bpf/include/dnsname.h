/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Domain names as the kernel side keys and records them: struct domain_key
 * and the one reader that fills it from a packet.
 *
 * The encoding is the DNS wire form, normalised so that equal names are
 * equal bytes:
 *
 *   - length-prefixed labels, each 1..63 bytes, in wire order
 *     ("\3www\7example\3com" for www.example.com);
 *   - ASCII letters lowercased (A-Z only; every other byte is kept as is,
 *     DNS labels may carry any octet);
 *   - the terminating zero-length root label, then zero padding up to
 *     DOMAIN_KEY_LEN. The root name itself is all zeroes.
 *
 * One width for every user: the DNS question observer (bpf/dns/) records a
 * question in this form, and the egress filter's DNS answer snooper
 * (bpf/dnssnoop/) matches answered names against policy-named domains in a
 * map keyed on struct domain_key, with no re-encoding on either side. It
 * also means the width that bounds a decodable question is the width that
 * bounds a policy value: a name this cannot hold is a name no policy could
 * have named. The Rust side (kyverno_runtime_bpf::dns::name) encodes and
 * decodes the same form.
 */
#ifndef KRT_DNSNAME_H
#define KRT_DNSNAME_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* Bytes of a struct domain_key, terminating root label included: the
 * labels of a name may take at most DOMAIN_KEY_LEN - 1 bytes. */
#define DOMAIN_KEY_LEN 128

/* Longest label (RFC 1035 2.3.4); a length byte above it is either a
 * compression pointer (top two bits set) or a reserved label type. */
#define DNS_LABEL_MAX 63
#define DNS_LABEL_TYPE_MASK 0xc0
#define DNS_LABEL_POINTER 0xc0

/* A domain name in the normalised wire form described above. */
struct domain_key {
	__u8 name[DOMAIN_KEY_LEN];
};

/* What dns_read_name found. Every value but DNS_NAME_OK means the key holds
 * no usable name and must be discarded. */
enum dns_name_status {
	DNS_NAME_OK = 0,
	/* The packet ends before the name does. */
	DNS_NAME_TRUNCATED = 1,
	/* A compression pointer (never expected in a question, which starts
	 * right after the header; a resolver does not compress it). */
	DNS_NAME_COMPRESSED = 2,
	/* A length byte of a reserved label type (0x40, 0x80). */
	DNS_NAME_BAD_LABEL = 3,
	/* No terminating root label within DOMAIN_KEY_LEN bytes. */
	DNS_NAME_TOO_LONG = 4,
	/* A compression pointer that does not point before the labels it
	 * ends (a forward pointer, or a loop), or more pointers than a name
	 * reader follows. Only readers that follow pointers return it. */
	DNS_NAME_BAD_POINTER = 5,
};

/*
 * Lowercases the ASCII letters of eight bytes at once; every other byte
 * (digits, '-', '_', length bytes, which are 0..63, and bytes from 0x80
 * up) is kept. h is each byte's low seven bits; h + 0x3f sets a byte's
 * top bit when h >= 'A', h + 0x25 when h > 'Z', and neither sum carries
 * into the next byte (h <= 0x7f). A letter is then 0x20 away from its
 * lowercase form.
 */
static __always_inline __u64 dns_ascii_lower64(__u64 w)
{
	__u64 h = w & 0x7f7f7f7f7f7f7f7fULL;
	__u64 ge_a = h + 0x3f3f3f3f3f3f3f3fULL;
	__u64 gt_z = h + 0x2525252525252525ULL;
	__u64 upper = ge_a & ~gt_z & ~w & 0x8080808080808080ULL;

	return w | (upper >> 2);
}

/*
 * Lowercases a key in place, as dns_read_name lowercases what it reads: a
 * reader that copies whole labels normalises them with this afterwards.
 * The key must be 8-byte aligned (map memory laid out for it).
 */
static __always_inline void dns_key_lowercase(struct domain_key *key)
{
	__u64 *w = (__u64 *)key->name;

#pragma clang loop unroll(full)
	for (int i = 0; i < DOMAIN_KEY_LEN / 8; i++)
		w[i] = dns_ascii_lower64(w[i]);
}

/*
 * Reads the uncompressed name at byte `off` of the skb into `key`, which the
 * caller zeroed. `key` may be ring buffer or map memory: the 128-byte key
 * does not fit the BPF stack next to the loop's spill slots, so the name is
 * read straight into its destination and the pass below rewrites it in place.
 *
 * bpf_skb_load_bytes rather than direct packet access: an skb may be
 * non-linear, and data_end would then cut the name off mid-way, silently.
 * One load copies min(bytes left in the skb, DOMAIN_KEY_LEN) wire bytes;
 * then one flat pass over them, rather than a loop per label: `remaining`
 * counts down the current label, so a byte read with remaining == 0 is the
 * next length byte. Bounding the pass at the key width bounds the label
 * count too, and leaves the verifier one unrolled loop with constant
 * indices. Bytes past the terminator (QTYPE, QCLASS, further records) are
 * zeroed by the same pass.
 */
static __always_inline enum dns_name_status
dns_read_name(struct __sk_buff *skb, __u32 off, struct domain_key *key)
{
	__u32 len = skb->len;
	__u32 avail;
	__u64 n;
	__u32 remaining = 0;
	bool done = false;

	if (off >= len)
		return DNS_NAME_TRUNCATED;
	n = (__u64)len - off;
	if (n > DOMAIN_KEY_LEN)
		n = DOMAIN_KEY_LEN;
	/*
	 * n is 1..128, but the verifier does not relate len to off: to it
	 * len - off may be negative, and a helper's size must be known to lie
	 * in 1..128. ((n - 1) & 127) + 1 is exact for 1..128 and bounds the
	 * very register the helper gets, without a zero test (5.10 learns
	 * nothing from "n != 0"). The barrier keeps clang, which knows the
	 * mask is a no-op, from dropping it ("R4 min value is negative").
	 */
	n -= 1;
	barrier_var(n);
	n = (n & (DOMAIN_KEY_LEN - 1)) + 1;
	if (bpf_skb_load_bytes(skb, off, key->name, n) < 0)
		return DNS_NAME_TRUNCATED;
	avail = n;

#pragma clang loop unroll(full)
	for (__u32 i = 0; i < DOMAIN_KEY_LEN; i++) {
		__u8 c = key->name[i];

		if (done) {
			/* Past the root label: padding, whatever the wire said. */
			key->name[i] = 0;
			continue;
		}
		/* Not a wire byte: the memset's zero, not a terminator. */
		if (i >= avail)
			return DNS_NAME_TRUNCATED;
		if (remaining == 0) {
			if (c == 0) {
				done = true;
			} else if (c > DNS_LABEL_MAX) {
				if ((c & DNS_LABEL_TYPE_MASK) == DNS_LABEL_POINTER)
					return DNS_NAME_COMPRESSED;
				return DNS_NAME_BAD_LABEL;
			} else {
				remaining = c;
			}
		} else {
			if (c >= 'A' && c <= 'Z')
				key->name[i] = c + ('a' - 'A');
			remaining--;
		}
	}
	return done ? DNS_NAME_OK : DNS_NAME_TOO_LONG;
}

#endif /* KRT_DNSNAME_H */
