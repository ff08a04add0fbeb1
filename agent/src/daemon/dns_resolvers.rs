//! The DNS resolvers the node declares (`--dns-resolvers`): the only
//! addresses whose answers teach a policy naming a domain its addresses
//! (issue 37, finding 1; `docs/network-names.md`). The kernel side matches
//! each answer to a question the pod asked one of them
//! (`bpf/include/dnsquestion.h`); this module only decides the list.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

/// One `--dns-resolvers` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsResolver {
    /// The `nameserver` lines of the daemon's own `/etc/resolv.conf`
    /// (loopback skipped: a pod's loopback is its own).
    Auto,
    /// An address, as given (loopback too: the operator's explicit choice,
    /// for a test node).
    Addr(IpAddr),
}

/// Parses one `--dns-resolvers` value: `auto` or an IP address.
pub fn parse_dns_resolver(s: &str) -> Result<DnsResolver, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DnsResolver::Auto);
    }
    s.parse::<IpAddr>()
        .map(DnsResolver::Addr)
        .map_err(|_| format!("{s:?} is neither `auto` nor an IP address"))
}

/// The addresses of the `nameserver` lines of a resolv.conf text, in
/// order (comments, other options and unparsable addresses, such as an
/// IPv6 one with a zone, skipped).
pub fn nameservers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
                .and_then(|a| a.parse::<IpAddr>().ok())
        })
        .collect()
}

/// What [`declare`] decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Declared {
    /// The resolvers to declare, without repeats (IPv4-mapped IPv6
    /// addresses as the IPv4 address their packets carry).
    pub addrs: Vec<IpAddr>,
    /// Why something `auto` found was not declared, for the log.
    pub skipped: Vec<String>,
}

/// The resolvers `specs` name, `auto` read from `resolv_conf` (a missing
/// or unreadable file declares nothing and says why).
pub fn declare(specs: &[DnsResolver], resolv_conf: &Path) -> Declared {
    let mut out = Declared::default();
    let mut seen = BTreeSet::new();
    let mut add = |addr: IpAddr, out: &mut Declared| {
        let addr = addr.to_canonical();
        if seen.insert(addr) {
            out.addrs.push(addr);
        }
    };
    for spec in specs {
        match *spec {
            DnsResolver::Addr(a) => add(a, &mut out),
            DnsResolver::Auto => match std::fs::read_to_string(resolv_conf) {
                Ok(text) => {
                    for a in nameservers(&text) {
                        if a.to_canonical().is_loopback() {
                            out.skipped.push(format!(
                                "{a} ({}): loopback is the pod's own; list it explicitly to trust it",
                                resolv_conf.display()
                            ));
                        } else {
                            add(a, &mut out);
                        }
                    }
                }
                Err(e) => out
                    .skipped
                    .push(format!("auto: reading {}: {e}", resolv_conf.display())),
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn values_are_auto_or_addresses() {
        assert_eq!(parse_dns_resolver(" AUTO "), Ok(DnsResolver::Auto));
        assert_eq!(
            parse_dns_resolver("10.96.0.10"),
            Ok(DnsResolver::Addr(ip("10.96.0.10")))
        );
        assert_eq!(
            parse_dns_resolver("fd00::a"),
            Ok(DnsResolver::Addr(ip("fd00::a")))
        );
        for bad in ["", "kube-dns", "10.96.0.0/12", "10.96.0.10:53"] {
            let e = parse_dns_resolver(bad).unwrap_err();
            assert!(e.contains("neither `auto` nor an IP address"), "{bad}: {e}");
        }
    }

    #[test]
    fn nameserver_lines_are_read_and_the_rest_skipped() {
        let text = "# generated\nsearch default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver   fd00::a\nnameserver fe80::1%eth0\noptions ndots:5\n;nameserver 1.1.1.1\nnameserver\n";
        assert_eq!(nameservers(text), [ip("10.96.0.10"), ip("fd00::a")]);
    }

    #[test]
    fn auto_skips_loopback_and_explicit_values_are_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("resolv.conf");
        std::fs::write(
            &conf,
            "nameserver 127.0.0.53\nnameserver 10.96.0.10\nnameserver ::1\n",
        )
        .unwrap();
        let d = declare(
            &[
                DnsResolver::Auto,
                DnsResolver::Addr(ip("169.254.20.10")),
                DnsResolver::Addr(ip("::ffff:10.96.0.10")),
                DnsResolver::Addr(ip("127.0.4.53")),
            ],
            &conf,
        );
        assert_eq!(
            d.addrs,
            [ip("10.96.0.10"), ip("169.254.20.10"), ip("127.0.4.53")]
        );
        assert_eq!(d.skipped.len(), 2, "{:?}", d.skipped);
        assert!(d.skipped[0].starts_with("127.0.0.53"), "{:?}", d.skipped);
    }

    #[test]
    fn a_missing_resolv_conf_declares_nothing_and_says_why() {
        let d = declare(&[DnsResolver::Auto], Path::new("/nonexistent/resolv.conf"));
        assert!(d.addrs.is_empty());
        assert!(d.skipped[0].contains("/nonexistent/resolv.conf"), "{d:?}");
    }
}
