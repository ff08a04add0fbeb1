//! What the DNS answer snooper's tests share: the sides a domain can be
//! on, the pod and its resolver, and the frames between them.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::Ipv4Addr;

use kyverno_runtime_bpf::egress::{Domain, DomainVerdicts};

use crate::frames::{ethernet, ipv4, udp, ETH_P_IP, UDP};

/// A name whose answers allow their addresses.
pub const ALLOW: DomainVerdicts = DomainVerdicts {
    allow: true,
    deny: false,
    observe: false,
};
/// A name whose answers deny their addresses.
pub const DENY: DomainVerdicts = DomainVerdicts {
    allow: false,
    deny: true,
    observe: false,
};

/// The declared resolver and the pod.
pub const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);

/// A domain from a literal.
pub fn d(name: &str) -> Domain {
    Domain::new(name).unwrap()
}

/// A datagram from `src`:53 to the pod's port `port`.
pub fn answer_from(src: Ipv4Addr, port: u16, msg: &[u8]) -> Vec<u8> {
    ethernet(ETH_P_IP, &ipv4(UDP, src, POD, &udp(53, port, msg)))
}

/// The pod's question from its port `port` to `dst`:53.
pub fn question_to(dst: Ipv4Addr, port: u16, msg: &[u8]) -> Vec<u8> {
    ethernet(ETH_P_IP, &ipv4(UDP, POD, dst, &udp(port, 53, msg)))
}
