//! Frames for `BPF_PROG_TEST_RUN` of a `cgroup_skb` program.
//!
//! The kernel's skb test run wants an L2 frame even for cgroup programs: it
//! derives `skb->protocol` from the Ethernet type and pulls the header off
//! before running the program, which then sees the IP header first. The
//! MAC addresses are zero, the loopback device's, so the frame is "to us".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const UDP: u8 = 17;
const TCP: u8 = 6;

/// The TCP flags of an ordinary data segment: PSH|ACK.
pub const PSH_ACK: u8 = 0x18;
/// The TCP flags of a connection's first segment: SYN.
pub const SYN: u8 = 0x02;

/// RFC 1071 checksum of an IPv4 header whose checksum field is zero (or,
/// over a header with a correct checksum, 0).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A UDP datagram from port 40000 to 9 (discard) carrying `krtd`.
fn udp_datagram() -> [u8; 12] {
    let mut u = [0u8; 12];
    u[0..2].copy_from_slice(&40000u16.to_be_bytes());
    u[2..4].copy_from_slice(&9u16.to_be_bytes());
    u[4..6].copy_from_slice(&12u16.to_be_bytes());
    u[8..].copy_from_slice(b"krtd");
    u
}

fn ipv4(dst: Ipv4Addr) -> Vec<u8> {
    let l4 = udp_datagram();
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(20 + l4.len() as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = UDP;
    ip[12..16].copy_from_slice(&[10, 99, 0, 1]);
    ip[16..20].copy_from_slice(&dst.octets());
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&l4);
    ethernet(ETH_P_IP, &ip)
}

fn ipv6(dst: Ipv6Addr) -> Vec<u8> {
    let l4 = udp_datagram();
    let mut ip = vec![0u8; 40];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
    ip[6] = UDP;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1).octets());
    ip[24..40].copy_from_slice(&dst.octets());
    ip.extend_from_slice(&l4);
    ethernet(ETH_P_IPV6, &ip)
}

/// A UDP frame to `dst` (from 10.99.0.1 or 2001:db8:ffff::1), IPv4 or
/// IPv6 as `dst` is.
pub fn udp_to(dst: IpAddr) -> Vec<u8> {
    match dst {
        IpAddr::V4(a) => ipv4(a),
        IpAddr::V6(a) => ipv6(a),
    }
}

/// A length as a header's 16-bit field: the builders are for test
/// frames, far below 64 KiB; a larger one saturates (and is malformed).
fn len16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// An IP packet (IPv4 or IPv6 as `dst` is, from 10.99.0.1 or
/// 2001:db8:ffff::1, the sources of [`udp_to`]) carrying `l4` as `proto`.
fn ip_carrying(dst: IpAddr, proto: u8, l4: &[u8]) -> Vec<u8> {
    match dst {
        IpAddr::V4(dst) => {
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&len16(20 + l4.len()).to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64;
            ip[9] = proto;
            ip[12..16].copy_from_slice(&[10, 99, 0, 1]);
            ip[16..20].copy_from_slice(&dst.octets());
            let c = ipv4_checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            ip.extend_from_slice(l4);
            ethernet(ETH_P_IP, &ip)
        }
        IpAddr::V6(dst) => {
            let mut ip = vec![0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&len16(l4.len()).to_be_bytes());
            ip[6] = proto;
            ip[7] = 64;
            ip[8..24]
                .copy_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1).octets());
            ip[24..40].copy_from_slice(&dst.octets());
            ip.extend_from_slice(l4);
            ethernet(ETH_P_IPV6, &ip)
        }
    }
}

/// A TCP segment (no options, sequence and acknowledgement 1) from port
/// `sport` to `dst` with `flags` (e.g. [`PSH_ACK`], [`SYN`]) carrying
/// `payload`, IPv4 or IPv6 as `dst` is. Checksums other than IPv4's are
/// left zero (a test run does not verify them).
pub fn tcp_segment_to(sport: u16, dst: SocketAddr, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(20 + payload.len());
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dst.port().to_be_bytes());
    t.extend_from_slice(&1u32.to_be_bytes()); // seq
    t.extend_from_slice(&1u32.to_be_bytes()); // ack
    t.extend_from_slice(&[0x50, flags]); // data offset 5 words
    t.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, checksum, urgent
    t.extend_from_slice(payload);
    ip_carrying(dst.ip(), TCP, &t)
}

/// A UDP datagram from port `sport` to `dst` carrying `payload`, IPv4 or
/// IPv6 as `dst` is (checksum zero).
pub fn udp_datagram_to(sport: u16, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::with_capacity(8 + payload.len());
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dst.port().to_be_bytes());
    u.extend_from_slice(&len16(8 + payload.len()).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    ip_carrying(dst.ip(), UDP, &u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_the_address_and_a_valid_header() {
        let v4 = udp_to(IpAddr::from([10, 1, 2, 3]));
        assert_eq!(&v4[12..14], &ETH_P_IP.to_be_bytes());
        assert_eq!(&v4[14 + 16..14 + 20], &[10, 1, 2, 3]);
        assert_eq!(ipv4_checksum(&v4[14..34]), 0, "a correct header sums to 0");
        let dst: Ipv6Addr = "fd00::1".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        let v6 = udp_to(IpAddr::V6(dst));
        assert_eq!(&v6[12..14], &ETH_P_IPV6.to_be_bytes());
        assert_eq!(&v6[14 + 24..14 + 40], &dst.octets());
    }

    #[test]
    fn segments_and_datagrams_carry_their_ports_and_payload() {
        let to = SocketAddr::from(([10, 1, 2, 3], 443));
        let t = tcp_segment_to(40001, to, PSH_ACK, b"SSH-");
        assert_eq!(t.len(), 14 + 20 + 20 + 4);
        assert_eq!(t[14 + 9], TCP);
        assert_eq!(&t[14 + 2..14 + 4], &(20u16 + 20 + 4).to_be_bytes());
        assert_eq!(ipv4_checksum(&t[14..34]), 0, "a correct header sums to 0");
        assert_eq!(&t[34..36], &40001u16.to_be_bytes());
        assert_eq!(&t[36..38], &443u16.to_be_bytes());
        assert_eq!(t[34 + 13], PSH_ACK);
        assert_eq!(&t[54..], b"SSH-");
        // The same datagram as udp_to builds, but for the ports and payload.
        let u = udp_datagram_to(40000, SocketAddr::from(([10, 1, 2, 3], 9)), b"krtd");
        assert_eq!(u, udp_to(IpAddr::from([10, 1, 2, 3])));
        let dst: Ipv6Addr = "fd00::1".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        let u6 = udp_datagram_to(50001, SocketAddr::from((dst, 53)), b"q");
        assert_eq!(u6[14 + 6], UDP);
        assert_eq!(&u6[14 + 4..14 + 6], &9u16.to_be_bytes());
        assert_eq!(&u6[14 + 24..14 + 40], &dst.octets());
        assert_eq!(&u6[54..56], &50001u16.to_be_bytes());
        assert_eq!(&u6[56..58], &53u16.to_be_bytes());
        assert_eq!(&u6[62..], b"q");
    }
}
