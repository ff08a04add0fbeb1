/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Layouts of the DNS answer snooper (bpf/dnssnoop/snoop.bpf.c) that its
 * Rust handle (kyverno_runtime_bpf::egress) reads from the generated
 * skeleton's types.
 */
#ifndef KRT_DNSSNOOP_H
#define KRT_DNSSNOOP_H

#include "vmlinux.h"
#include "dnsname.h"
#include "egress.h"

/* Answer records walked per response; more are counted (walk_limit) and
 * not read. A response carries a handful: a CNAME or two, then the A or
 * AAAA records of the last name. */
#define KRT_DNS_SNOOP_ANSWERS_MAX 16
/* Names an address may be owned by: the question and up to three CNAME
 * targets reached from it. A longer chain is counted (walk_limit). */
#define KRT_DNS_SNOOP_CHAIN_MAX 4

/*
 * Gated DNS responses by outcome, one struct per CPU at key 0 of
 * `snoop_stats`, cumulative since load. Every response (a datagram from
 * UDP port 53 to a cgroup whose set names domains, with the QR bit) adds
 * one to `responses`; then records and failures are counted as they are
 * met. Every path passes the packet but one: an answer naming an address
 * the set must deny and cannot hold (answers_refused) is dropped.
 */
struct krt_dns_snoop_stats {
	/* Gated responses read. */
	__u64 responses;
	/* A or AAAA records whose address was learned (or refreshed). */
	__u64 learned;
	/* A or AAAA records reached from the question whose names no domain
	 * of the set names: not learned. */
	__u64 unnamed;
	/* A, AAAA or CNAME records whose owner is neither the question nor a
	 * name a CNAME of the same response led to: skipped. */
	__u64 unchained;
	/* Responses the parser stopped in: a header, record or name that the
	 * datagram ends inside of, a reserved label type, or a compression
	 * pointer that does not point backwards. What was learned before the
	 * failure stays learned. */
	__u64 malformed;
	/* Names over DOMAIN_KEY_LEN: no policy can name them. */
	__u64 name_too_long;
	/* Records beyond KRT_DNS_SNOOP_ANSWERS_MAX, or CNAMEs beyond
	 * KRT_DNS_SNOOP_CHAIN_MAX names: not read. */
	__u64 walk_limit;
	/* A header that is not a single-question response the parser reads
	 * (QDCOUNT other than 1). */
	__u64 unsupported;
	/* egress_learned refused the update. */
	__u64 learn_failed;
	/* A or AAAA records not learned: the set held its share of
	 * egress_learned (see learned_budget, which counts them by set). */
	__u64 over_share;
	/* Responses dropped because an address a name denied by an enforced
	 * policy could not be learned (the set held its share): the pod is
	 * never told an address it could not be stopped from reaching. */
	__u64 answers_refused;
	/* Responses not from a declared resolver (dns_resolvers): nothing
	 * learned (a pod answering itself, loopback, a forged source). */
	__u64 untrusted_source;
	/* Responses from a declared resolver that answer no pending question
	 * of the cgroup (wrong id or port, unsolicited, late, or a second
	 * answer): nothing learned. */
	__u64 unsolicited;
	/* Responses to a pending question whose question section is not the
	 * one asked (name, type or class): nothing learned. */
	__u64 question_mismatch;
	/*
	 * The question side, counted by the egress filter for cgroups whose
	 * set names domains. Questions noted, awaiting their answer ...
	 */
	__u64 questions_noted;
	/* ... sent to an address that is not a declared resolver (their
	 * answers teach nothing: a resolver the node does not declare) ... */
	__u64 questions_undeclared;
	/* ... over the cgroup's KRT_DNS_QUESTIONS_PER_S (not noted) ... */
	__u64 questions_over_budget;
	/* ... or not readable as one question of a name under DOMAIN_KEY_LEN
	 * bytes (not noted), or dns_questions refused the update. */
	__u64 questions_unreadable;
};

#endif /* KRT_DNSSNOOP_H */
