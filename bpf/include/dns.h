/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared between the DNS question observer (bpf/dns/query.bpf.c) and
 * userspace (kyverno_runtime_bpf::dns).
 *
 * Rust reads these layouts from the generated skeleton's `types` module and
 * checks its decoder's offsets against them at compile time, so changing a
 * layout here breaks the build rather than the decoding.
 */
#ifndef KRT_DNS_H
#define KRT_DNS_H

#include "vmlinux.h"
#include "dnsname.h"

/* One record per question: who asked, and for which name. No timestamp:
 * the reader stamps a record on arrival. No pid or comm: a cgroup_skb
 * program may not call bpf_get_current_comm, so a question is attributed to
 * a pod (through its cgroup), not to a process. */
struct dns_query_event {
	/* cgroup v2 id of the sending socket (the inode of its directory). */
	__u64 cgroup_id;
	/* QNAME of the first question, normalised (see dnsname.h). */
	struct domain_key qname;
};

/* Kernel-side loss, per CPU, cumulative, never reset. */
struct dns_stats {
	/* bpf_ringbuf_reserve failed: the reader is behind. */
	__u64 ringbuf_full;
	/* A gated datagram to port 53 whose name could not be read: truncated,
	 * compressed, a reserved label type, or over DOMAIN_KEY_LEN. */
	__u64 name_unreadable;
};

#endif /* KRT_DNS_H */
