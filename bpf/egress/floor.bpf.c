// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The benchmark floor: a cgroup_skb/egress program that does nothing but
 * pass. BPF_PROG_TEST_RUN's per-run time for it is the cost of the test
 * harness and the program call itself, which the egress filter's and the
 * classifier's figures are divided by. Never attached.
 */
#include "common.h"

SEC("cgroup_skb/egress")
int krt_floor(struct __sk_buff *skb)
{
	return 1;
}
