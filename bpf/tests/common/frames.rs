//! Ethernet, IPv4, IPv6 and UDP frames for BPF_PROG_TEST_RUN of the
//! cgroup_skb programs (checksums zero: the programs do not check them).

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

/// EtherType of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// EtherType of IPv4.
/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// IP protocol numbers.
pub const UDP: u8 = 17;
pub const TCP: u8 = 6;

/// An Ethernet frame (addresses zero) around `packet`.
pub fn ethernet(ethertype: u16, packet: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(packet);
    f
}

/// A UDP datagram.
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = sport.to_be_bytes().to_vec();
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// An IPv4 packet (no options, DF, TTL 64).
pub fn ipv4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, l4: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&u16::try_from(20 + l4.len()).unwrap().to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(l4);
    ip
}

/// An IPv6 packet (hop limit 64).
pub fn ipv6(proto: u8, src: Ipv6Addr, dst: Ipv6Addr, l4: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
    ip.extend_from_slice(&[proto, 64]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(l4);
    ip
}
