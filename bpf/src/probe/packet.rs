//! The packet `BPF_PROG_TEST_RUN` feeds a `cgroup_skb` program.

use crate::frame::ipv4_checksum;

/// Ethernet (14) + IPv4 (20) + UDP (8) + 4 bytes of payload.
pub(crate) const LEN: usize = 14 + 20 + 8 + 4;

/// A minimal, valid IPv4/UDP datagram from 127.0.0.1:40000 to 127.0.0.1:9
/// (discard) carrying `krt!`, behind an Ethernet header.
///
/// The kernel's skb test run wants an L2 frame even for cgroup programs: it
/// derives `skb->protocol` from the Ethernet type and pulls the header off
/// before running the program, which then sees the IPv4 header first. The
/// MAC addresses are zero, the loopback device's, so the frame is "to us".
pub(crate) fn ipv4_udp() -> [u8; LEN] {
    const ETH: usize = 14;
    const IP: usize = ETH + 20;
    let mut p = [0u8; LEN];
    // Ethernet: dst, src MAC zero; EtherType IPv4.
    p[12..ETH].copy_from_slice(&0x0800u16.to_be_bytes());
    // IPv4: version 4, IHL 5; total length; DF; TTL 64; UDP; loopback.
    p[ETH] = 0x45;
    p[ETH + 2..ETH + 4].copy_from_slice(&((LEN - ETH) as u16).to_be_bytes());
    p[ETH + 6] = 0x40;
    p[ETH + 8] = 64;
    p[ETH + 9] = 17;
    p[ETH + 12..ETH + 16].copy_from_slice(&[127, 0, 0, 1]);
    p[ETH + 16..IP].copy_from_slice(&[127, 0, 0, 1]);
    let csum = ipv4_checksum(&p[ETH..IP]);
    p[ETH + 10..ETH + 12].copy_from_slice(&csum.to_be_bytes());
    // UDP: ports, length; checksum 0 ("none", allowed for IPv4).
    p[IP..IP + 2].copy_from_slice(&40000u16.to_be_bytes());
    p[IP + 2..IP + 4].copy_from_slice(&9u16.to_be_bytes());
    p[IP + 4..IP + 6].copy_from_slice(&((LEN - IP) as u16).to_be_bytes());
    p[IP + 8..].copy_from_slice(b"krt!");
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_matches_the_textbook_example() {
        // The RFC 1071 / Wikipedia example header (checksum field zeroed).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&h), 0xb861);
    }

    #[test]
    fn probe_packet_is_a_valid_ipv4_udp_frame() {
        let p = ipv4_udp();
        assert_eq!(&p[12..14], &[0x08, 0x00]);
        assert_eq!(ipv4_checksum(&p[14..34]), 0, "header checksum must verify");
        assert_eq!(u16::from_be_bytes([p[16], p[17]]) as usize, LEN - 14);
        assert_eq!(p[23], 17);
        assert_eq!(u16::from_be_bytes([p[38], p[39]]) as usize, LEN - 34);
    }
}
