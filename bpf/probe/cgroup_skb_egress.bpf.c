// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Probe: does the kernel load and attach a cgroup_skb/egress program?
 *
 * Always passes the packet (1) so attaching it to a cgroup changes nothing;
 * userspace proves it runs with BPF_PROG_TEST_RUN and the packet counter.
 */
#include "common.h"

/* Packets seen (real egress from the cgroup plus test runs). */
__u64 packet_count = 0;

SEC("cgroup_skb/egress")
int krt_probe_cgroup_skb_egress(struct __sk_buff *skb)
{
	__sync_fetch_and_add(&packet_count, 1);
	return 1;
}
