//! Where `http.get` may connect: the guard against a policy author turning
//! the daemon (privileged, on every node, inside the cluster network) into
//! a fetcher of cloud metadata, node-local services and cluster-internal
//! endpoints (issue 37, finding 2).
//!
//! Every destination address, named in the URL or resolved from a name, is
//! first made canonical: an IPv6 address that carries an IPv4 one
//! (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64
//! `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`, Teredo
//! `2001::/32`) is judged as that IPv4 address. Decimal, octal and
//! shortened IPv4 forms (`2852039166`, `0251.0376.0251.0376`, `127.1`) are
//! not addresses to the URL parser; they reach the system resolver, whose
//! answer is judged like any other. Then:
//!
//! - never fetched, whatever the allow-list says: link-local
//!   (`169.254.0.0/16`, `fe80::/10`, where the metadata endpoints of AWS,
//!   GCP, Azure and OpenStack live), the other metadata addresses
//!   ([`METADATA`]), unspecified, multicast and broadcast addresses;
//! - fetched only when the allow-list (`--data-http-allow`, the chart's
//!   `daemon.dataSources.httpAllow`) holds them: loopback, the private
//!   ranges (`10/8`, `172.16/12`, `192.168/16`), shared address space
//!   (`100.64/10`), unique local IPv6 (`fc00::/7`) and site-local
//!   (`fec0::/10`): where node and cluster-internal services (the API
//!   server, Services, pods, kubelets) are reached;
//! - anything else (the public internet) is fetched.
//!
//! The connector connects only to the addresses that passed (the checked
//! resolution is the one used: no second lookup).

use kyverno_runtime_bpf::egress::Prefix;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Cloud metadata endpoints outside link-local space: AWS over IPv6
/// (`fd00:ec2::254`), Alibaba Cloud (`100.100.100.200`), Azure's
/// WireServer (`168.63.129.16`). Never fetched.
pub const METADATA: [IpAddr; 3] = [
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
];

/// The address policy of `http.get` (see the [module docs](self)).
#[derive(Clone, Debug, Default)]
pub struct DataGuard {
    allow: Vec<Prefix>,
}

impl DataGuard {
    /// A guard that fetches from internal ranges only inside `allow`.
    pub fn new(allow: Vec<Prefix>) -> Self {
        Self { allow }
    }

    /// `Ok` when `ip` may be fetched from; else why not, for the error the
    /// policy's status shows.
    pub fn check(&self, ip: IpAddr) -> Result<(), String> {
        let judged = canonical(ip);
        let shown = if judged == ip {
            ip.to_string()
        } else {
            format!("{ip} (that is {judged})")
        };
        if let Some(what) = never(judged) {
            return Err(format!("{shown} is {what}: never fetched"));
        }
        if let Some(what) = internal(judged) {
            if !self
                .allow
                .iter()
                .any(|p| p.contains(judged) || p.contains(ip))
            {
                return Err(format!(
                    "{shown} is {what}: refused unless the daemon's --data-http-allow \
                     (the chart's daemon.dataSources.httpAllow) holds it"
                ));
            }
        }
        Ok(())
    }
}

/// The IPv4 address `v6` carries, if it is one of the forms that route to
/// or stand for an IPv4 destination.
pub fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    match s {
        // IPv4-compatible (deprecated), not :: or ::1.
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(low),
        // NAT64, the well-known prefix.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        // NAT64, local-use prefixes (RFC 8215): the address in the last
        // 32 bits of a /96.
        [0x64, 0xff9b, 1, ..] => Some(low),
        // 6to4: the IPv4 address in bits 16..48.
        [0x2002, a, b, ..] => Some(Ipv4Addr::new(
            (a >> 8) as u8,
            a as u8,
            (b >> 8) as u8,
            b as u8,
        )),
        // Teredo: the client's address, inverted, in the last 32 bits.
        [0x2001, 0, ..] => Some(Ipv4Addr::from(!u32::from(low))),
        _ => None,
    }
}

/// `ip` as it is judged: the IPv4 address an IPv6 form carries, else
/// itself.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What makes a canonical address never fetchable.
fn never(ip: IpAddr) -> Option<&'static str> {
    if METADATA.contains(&ip) {
        return Some("a cloud metadata endpoint");
    }
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_link_local() {
                Some("link-local (where cloud metadata endpoints are)")
            } else if v4.octets()[0] == 0 {
                Some("unspecified (this host)")
            } else if v4.is_multicast() || v4.is_broadcast() {
                Some("multicast or broadcast")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if (v6.segments()[0] & 0xffc0) == 0xfe80 {
                Some("link-local (where cloud metadata endpoints are)")
            } else if v6.is_unspecified() {
                Some("unspecified (this host)")
            } else if v6.is_multicast() {
                Some("multicast or broadcast")
            } else {
                None
            }
        }
    }
}

/// What makes a canonical address node or cluster-internal.
fn internal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_private() {
                Some("a private address (node and cluster-internal)")
            } else if a == 100 && (b & 0xc0) == 64 {
                Some("shared address space (node and cluster-internal)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if (first & 0xfe00) == 0xfc00 {
                Some("a unique local address (node and cluster-internal)")
            } else if (first & 0xffc0) == 0xfec0 {
                Some("a site-local address (node and cluster-internal)")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }

    fn guard(allow: &[&str]) -> DataGuard {
        DataGuard::new(allow.iter().filter_map(|p| p.parse().ok()).collect())
    }

    #[test]
    fn every_form_of_the_metadata_address_is_refused() {
        // 169.254.169.254 as itself and as each IPv6 form that carries it.
        for form in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "::169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            // Teredo: the client address inverted.
            "2001:0:4136:e378:8000:63bf:5601:5601",
            "fe80::a9fe:a9fe",
            "fd00:ec2::254",
            "100.100.100.200",
            "168.63.129.16",
        ] {
            let why = guard(&["0.0.0.0/0", "::/0"]).check(ip(form));
            assert!(
                why.as_ref().is_err_and(|w| w.contains("never fetched")),
                "{form}: {why:?}"
            );
        }
    }

    #[test]
    fn internal_ranges_need_the_allow_list() {
        for form in [
            "127.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
            "10.96.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "fd12::1",
            "fec0::1",
            "64:ff9b::a00:1",
        ] {
            let why = guard(&[]).check(ip(form));
            assert!(
                why.as_ref().is_err_and(|w| w.contains("--data-http-allow")),
                "{form}: {why:?}"
            );
        }
        // Allowed by the list, in any of their forms.
        let g = guard(&["127.0.0.0/8", "10.96.0.0/12"]);
        for form in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "10.96.0.1",
            "::ffff:10.96.0.1",
        ] {
            assert_eq!(g.check(ip(form)), Ok(()), "{form}");
        }
        assert!(g.check(ip("10.1.0.1")).is_err(), "outside the list");
        assert!(g.check(ip("::1")).is_err(), "IPv6 loopback is not 127/8");
    }

    #[test]
    fn the_public_internet_is_fetched() {
        for form in [
            "8.8.8.8",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "2606:4700::1",
        ] {
            assert_eq!(guard(&[]).check(ip(form)), Ok(()), "{form}");
        }
    }

    #[test]
    fn an_error_names_the_form_and_what_it_is() {
        assert_eq!(
            guard(&[]).check(ip("::ffff:169.254.169.254")),
            Err(
                "::ffff:169.254.169.254 (that is 169.254.169.254) is link-local (where cloud \
                 metadata endpoints are): never fetched"
                    .into()
            )
        );
    }
}
