//! `network` values: egress destinations.

use super::numeric::{inet_aton, numeric_looking};
use super::{digits_and_dots, validate_hostname, FieldPath, Reason, Underscore, ValueError, STAR};
use kyverno_runtime_api::runtimepolicy::MAX_HOSTNAME_LEN;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The cluster DNS domain [`parse_network`] assumes (the kubelet's
/// `--cluster-domain` default).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// A parsed `network` value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NetworkTarget {
    /// One IPv4 or IPv6 address.
    Ip(IpAddr),
    /// A CIDR of any prefix length, normalized.
    Cidr(Cidr),
    /// A cluster Service, named `<name>.<namespace>.svc` or
    /// `<name>.<namespace>.svc.<cluster domain>`: its addresses come from
    /// the Service object, not from DNS.
    Service {
        /// The Service's name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// Any other host name, lowercased and without a trailing dot:
    /// resolved through DNS.
    Domain(String),
    /// `"*"`: every destination (meaningful alone in deny, see
    /// [`check_star`](super::check_star)).
    Any,
}

impl NetworkTarget {
    /// Whether `ip` is this target without resolving anything: an equal
    /// address, an address in the CIDR, or anything for [`Any`](Self::Any).
    /// Services and domains are `false` here; their addresses come from
    /// the Service object or a DNS answer.
    pub fn contains_addr(&self, ip: IpAddr) -> bool {
        match self {
            NetworkTarget::Ip(a) => *a == ip,
            NetworkTarget::Cidr(c) => c.contains(ip),
            NetworkTarget::Any => true,
            NetworkTarget::Service { .. } | NetworkTarget::Domain(_) => false,
        }
    }
}

/// Formats the normalized value, which [`parse_network`] reads back to an
/// equal target (a Service as `<name>.<namespace>.svc`).
impl fmt::Display for NetworkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkTarget::Ip(a) => write!(f, "{a}"),
            NetworkTarget::Cidr(c) => write!(f, "{c}"),
            NetworkTarget::Service { name, namespace } => write!(f, "{name}.{namespace}.svc"),
            NetworkTarget::Domain(d) => f.write_str(d),
            NetworkTarget::Any => f.write_str(STAR),
        }
    }
}

/// An IP network: an address with its host bits cleared and a prefix
/// length of 0 to 32 (IPv4) or 0 to 128 (IPv6).
///
/// Whether the value as written had host bits set (`10.0.0.1/8`, which the
/// API server's `isCIDR` accepts) is kept in
/// [`had_host_bits`](Self::had_host_bits) so a caller can warn; equality
/// and hashing ignore it, since both spellings denote the same network.
#[derive(Clone, Copy, Debug)]
pub struct Cidr {
    addr: IpAddr,
    prefix_len: u8,
    host_bits_set: bool,
}

impl Cidr {
    /// The network of `addr` with `prefix_len` bits, or `None` when the
    /// length exceeds the family's width.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Option<Cidr> {
        let masked = match addr {
            IpAddr::V4(a) => {
                let bits = u32::from(a);
                IpAddr::V4(Ipv4Addr::from(bits & v4_mask(prefix_len)?))
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a);
                IpAddr::V6(Ipv6Addr::from(bits & v6_mask(prefix_len)?))
            }
        };
        Some(Cidr {
            addr: masked,
            prefix_len,
            host_bits_set: masked != addr,
        })
    }

    /// The network address (host bits cleared).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether the value as written had host bits set, which were cleared.
    pub fn had_host_bits(&self) -> bool {
        self.host_bits_set
    }

    /// Whether `ip` is in this network (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                v4_mask(self.prefix_len).is_some_and(|m| u32::from(ip) & m == u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                v6_mask(self.prefix_len).is_some_and(|m| u128::from(ip) & m == u128::from(net))
            }
            _ => false,
        }
    }
}

impl PartialEq for Cidr {
    fn eq(&self, other: &Self) -> bool {
        (self.addr, self.prefix_len) == (other.addr, other.prefix_len)
    }
}

impl Eq for Cidr {}

impl Hash for Cidr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.addr, self.prefix_len).hash(state);
    }
}

/// `<network address>/<prefix length>`.
impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

fn v4_mask(prefix_len: u8) -> Option<u32> {
    (prefix_len <= 32).then(|| {
        u32::MAX
            .checked_shl(32 - u32::from(prefix_len))
            .unwrap_or(0)
    })
}

fn v6_mask(prefix_len: u8) -> Option<u128> {
    (prefix_len <= 128).then(|| {
        u128::MAX
            .checked_shl(128 - u32::from(prefix_len))
            .unwrap_or(0)
    })
}

/// Parses a `network` value with the [`DEFAULT_CLUSTER_DOMAIN`]; see
/// [`parse_network_in`].
pub fn parse_network(value: &str, path: &FieldPath) -> Result<NetworkTarget, ValueError> {
    parse_network_in(value, path, DEFAULT_CLUSTER_DOMAIN)
}

/// Parses a `network` value: an IPv4 or IPv6 address, a CIDR of any prefix
/// length, a cluster Service name, a domain name, or `"*"`
/// ([`NetworkTarget::Any`]).
///
/// The shape is decided as the CRD's rule decides it, in this order, so the
/// two cannot disagree on what a value is:
///
/// 1. containing `/`: a CIDR (`10.0.0.0/8`, `fd00::/8`, `0.0.0.0/0`);
///    host bits are cleared and remembered ([`Cidr::had_host_bits`]);
/// 2. containing `:`: an IPv6 address;
/// 3. only digits and dots: an IPv4 address in dotted decimal, so
///    `10.0.0.300` and `1.2.3` are refused rather than taken for names;
/// 4. numbers and dots with a `0x` hex part (`0x7f.0.0.1`): refused, since
///    the C library reads them as an address and never asks DNS, so as a
///    name they could never match;
/// 5. anything else: a host name (RFC 1123, see [`validate_hostname`]; no
///    wildcards, no `_`), lowercased, without its trailing dot.
///
/// A refused number names the address `inet_aton` reads it as, when it
/// reads one ([`Reason::Ipv4Shorthand`]: `127.1`, `0177.0.0.1`,
/// `2130706433` are 127.0.0.1 to curl and ping, and the kernel sees
/// 127.0.0.1).
///
/// Addresses: IPv6 zone ids (`fe80::1%eth0`) are refused, since they name a
/// link on one host. IPv4-mapped IPv6 addresses and CIDRs
/// (`::ffff:10.0.0.1`) are refused and the error names the IPv4 form to
/// write: the API server's `isIP`/`isCIDR` refuse them too, and the egress
/// programs take the family from the packet (`skb->protocol`), so traffic a
/// dual-stack socket sends to a mapped address leaves as IPv4 and the
/// mapped form could never match it. (IPv4-compatible `::a.b.c.d` is an
/// ordinary IPv6 address.)
///
/// Service or domain: a name is a cluster Service when it is exactly
/// `<name>.<namespace>.svc` or `<name>.<namespace>.svc.<cluster_domain>`
/// (compared without case or trailing dot). Every other valid name is a
/// [`NetworkTarget::Domain`], including:
///
/// - the two-label short form `<name>.<namespace>` (`my-svc.my-ns`): a pod's
///   resolver search path would expand it to the Service, but it is
///   indistinguishable from an external two-label domain (`example.com`,
///   `api.internal`), and a name that silently switched meaning with
///   whatever Services exist would be worse than one that means one thing.
///   Write the `.svc` form to name a Service;
/// - names with more labels under `.svc` (`web-0.nginx.ns.svc.cluster.local`,
///   a StatefulSet pod behind a headless Service): a DNS record, not a Service;
/// - `.svc.<other domain>` when `<other domain>` is not the cluster's.
///
/// The value as written is at most `MAX_HOSTNAME_LEN` (253) bytes, the
/// CRD's bound, so `<253-byte name>.` is refused here as it is at admission.
pub fn parse_network_in(
    value: &str,
    path: &FieldPath,
    cluster_domain: &str,
) -> Result<NetworkTarget, ValueError> {
    classify(value, cluster_domain).map_err(|reason| ValueError::new(path, value, reason))
}

fn classify(value: &str, cluster_domain: &str) -> Result<NetworkTarget, Reason> {
    if value == STAR {
        return Ok(NetworkTarget::Any);
    }
    if value.is_empty() {
        return Err(Reason::Empty);
    }
    if value.len() > MAX_HOSTNAME_LEN {
        return Err(Reason::hostname_too_long(value.len()));
    }
    if value.contains('/') {
        return parse_cidr(value).map(NetworkTarget::Cidr);
    }
    if value.contains(':') {
        return parse_addr(value).map(NetworkTarget::Ip);
    }
    if digits_and_dots(value) || numeric_looking(value) {
        return match parse_addr(value) {
            Ok(ip) => Ok(NetworkTarget::Ip(ip)),
            Err(reason) => Err(match inet_aton(value) {
                Some(ipv4) => Reason::Ipv4Shorthand { ipv4 },
                None if digits_and_dots(value) => reason,
                None => Reason::NumericName,
            }),
        };
    }
    if value.contains('*') {
        return Err(Reason::NetworkWildcard);
    }
    let name = validate_hostname(value, Underscore::Refused)?;
    let domain = cluster_domain.strip_suffix('.').unwrap_or(cluster_domain);
    Ok(match service_parts(&name, &domain.to_ascii_lowercase()) {
        Some((name, namespace)) => NetworkTarget::Service {
            name: name.to_string(),
            namespace: namespace.to_string(),
        },
        None => NetworkTarget::Domain(name),
    })
}

/// `(name, namespace)` when `name` (lowercase, no trailing dot) is exactly
/// `<name>.<namespace>.svc[.<cluster_domain>]`.
fn service_parts<'a>(name: &'a str, cluster_domain: &str) -> Option<(&'a str, &'a str)> {
    let rest = name.strip_suffix(".svc").or_else(|| {
        if cluster_domain.is_empty() {
            return None;
        }
        name.strip_suffix(cluster_domain)?.strip_suffix(".svc.")
    })?;
    let (svc, namespace) = rest.split_once('.')?;
    (!namespace.contains('.')).then_some((svc, namespace))
}

/// An address as the API server's `isIP` takes it: no zone, not IPv4-mapped.
fn parse_addr(s: &str) -> Result<IpAddr, Reason> {
    if s.contains('%') {
        return Err(Reason::ZoneId);
    }
    if s.contains(':') {
        let v6: Ipv6Addr = s.parse().map_err(|_| Reason::BadIpv6)?;
        if let Some(ipv4) = v6.to_ipv4_mapped() {
            return Err(Reason::Ipv4Mapped { ipv4 });
        }
        return Ok(IpAddr::V6(v6));
    }
    // std refuses leading zeros ("010.0.0.1"), as Go's netip does.
    s.parse::<Ipv4Addr>()
        .map(IpAddr::V4)
        .map_err(|_| Reason::BadIpv4)
}

/// A CIDR as the API server's `isCIDR` takes it (Go's `netip.ParsePrefix`:
/// a decimal prefix length without sign or leading zeros; host bits allowed).
fn parse_cidr(s: &str) -> Result<Cidr, Reason> {
    let (addr, len) = s.split_once('/').ok_or(Reason::BadCidrAddress)?;
    let addr = match parse_addr(addr) {
        Ok(a) => a,
        Err(r @ (Reason::ZoneId | Reason::Ipv4Mapped { .. })) => return Err(r),
        Err(_) => return Err(Reason::BadCidrAddress),
    };
    let max: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let bad = Reason::BadPrefixLen { max };
    let well_formed = !len.is_empty()
        && len.len() <= 3
        && len.bytes().all(|b| b.is_ascii_digit())
        && (len == "0" || !len.starts_with('0'));
    if !well_formed {
        return Err(bad);
    }
    let prefix_len: u8 = len.parse().map_err(|_| bad.clone())?;
    Cidr::new(addr, prefix_len).ok_or(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(value: &str) -> Result<NetworkTarget, Reason> {
        parse_network(value, &FieldPath::spec()).map_err(|e| e.reason)
    }

    fn ip(s: &str) -> NetworkTarget {
        NetworkTarget::Ip(s.parse().unwrap())
    }

    fn cidr(addr: &str, len: u8) -> NetworkTarget {
        NetworkTarget::Cidr(Cidr::new(addr.parse().unwrap(), len).unwrap())
    }

    fn svc(name: &str, namespace: &str) -> NetworkTarget {
        NetworkTarget::Service {
            name: name.into(),
            namespace: namespace.into(),
        }
    }

    fn domain(d: &str) -> NetworkTarget {
        NetworkTarget::Domain(d.into())
    }

    fn shorthand(ipv4: &str) -> Reason {
        Reason::Ipv4Shorthand {
            ipv4: ipv4.parse().unwrap(),
        }
    }

    // The address cases were checked against Go's net/netip with the API
    // server's isIP/isCIDR conditions (no zone, not IPv4-mapped).
    #[rstest]
    #[case::ipv4("10.0.0.1", ip("10.0.0.1"))]
    #[case::ipv4_zero("0.0.0.0", ip("0.0.0.0"))]
    #[case::ipv4_broadcast("255.255.255.255", ip("255.255.255.255"))]
    #[case::ipv6_loopback("::1", ip("::1"))]
    #[case::ipv6_unspecified("::", ip("::"))]
    #[case::ipv6_full("2001:0db8:0000:0000:0000:0000:0000:0001", ip("2001:db8::1"))]
    #[case::ipv6_uppercase("2001:DB8::1", ip("2001:db8::1"))]
    #[case::ipv4_compatible_is_plain_ipv6("::10.0.0.1", ip("::a00:1"))]
    #[case::ipv6_trailing_compression("1:2:3:4:5:6:7::", ip("1:2:3:4:5:6:7:0"))]
    #[case::ipv6_embedded_ipv4("1:2:3:4:5:6:1.2.3.4", ip("1:2:3:4:5:6:102:304"))]
    #[case::ipv6_near_mapped("::fffe:1.2.3.4", ip("::fffe:102:304"))]
    #[case::cidr_v4("10.0.0.0/8", cidr("10.0.0.0", 8))]
    #[case::cidr_v4_everything("0.0.0.0/0", cidr("0.0.0.0", 0))]
    #[case::cidr_v4_host("192.168.1.7/32", cidr("192.168.1.7", 32))]
    #[case::cidr_v4_odd("10.1.2.3/13", cidr("10.0.0.0", 13))]
    #[case::cidr_v6("fd00::/8", cidr("fd00::", 8))]
    #[case::cidr_v6_everything("::/0", cidr("::", 0))]
    #[case::cidr_v6_127("2001:db8::/127", cidr("2001:db8::", 127))]
    #[case::cidr_v6_host("2001:db8::1/128", cidr("2001:db8::1", 128))]
    #[case::service_short("my-svc.my-ns.svc", svc("my-svc", "my-ns"))]
    #[case::service_full("my-svc.my-ns.svc.cluster.local", svc("my-svc", "my-ns"))]
    #[case::service_absolute("My-Svc.My-Ns.SVC.Cluster.Local.", svc("my-svc", "my-ns"))]
    #[case::two_labels_are_a_domain("my-svc.my-ns", domain("my-svc.my-ns"))]
    #[case::statefulset_pod_is_a_domain(
        "web-0.nginx.ns.svc.cluster.local",
        domain("web-0.nginx.ns.svc.cluster.local")
    )]
    #[case::one_label_before_svc_is_a_domain("ns.svc", domain("ns.svc"))]
    #[case::other_cluster_domain_is_a_domain("a.b.svc.example.org", domain("a.b.svc.example.org"))]
    #[case::lookalike_suffix_is_a_domain(
        "a.b.svc.xcluster.local",
        domain("a.b.svc.xcluster.local")
    )]
    #[case::domain("api.example.com", domain("api.example.com"))]
    #[case::domain_uppercase("API.Example.COM", domain("api.example.com"))]
    #[case::domain_trailing_dot("example.com.", domain("example.com"))]
    #[case::single_label("localhost", domain("localhost"))]
    #[case::digits_with_a_letter("1e100.net", domain("1e100.net"))]
    #[case::hex_label_in_a_name("0xcafe.example", domain("0xcafe.example"))]
    #[case::hex_looking_word("deadbeef", domain("deadbeef"))]
    #[case::star("*", NetworkTarget::Any)]
    fn accepts(#[case] value: &str, #[case] want: NetworkTarget) {
        assert_eq!(parse(value), Ok(want));
    }

    #[rstest]
    #[case::empty("", Reason::Empty)]
    #[case::octet_out_of_range("10.0.0.300", Reason::BadIpv4)]
    #[case::three_octets("1.2.3", shorthand("1.2.0.3"))]
    #[case::five_octets("1.2.3.4.5", Reason::BadIpv4)]
    #[case::leading_zero("010.0.0.1", shorthand("8.0.0.1"))]
    #[case::trailing_dot_address("1.2.3.4.", Reason::BadIpv4)]
    #[case::digits_only("12345", shorthand("0.0.48.57"))]
    #[case::digits_over_32_bits("4294967296", Reason::BadIpv4)]
    #[case::two_parts("127.1", shorthand("127.0.0.1"))]
    #[case::octal("0177.0.0.1", shorthand("127.0.0.1"))]
    #[case::hex_parts("0x7f.0.0.1", shorthand("127.0.0.1"))]
    #[case::hex_word("0x7F000001", shorthand("127.0.0.1"))]
    #[case::decimal_word("2130706433", shorthand("127.0.0.1"))]
    #[case::hex_absolute("0x7f.0.0.1.", Reason::NumericName)]
    #[case::hex_out_of_range("0x100.0.0.1", Reason::NumericName)]
    #[case::hex_empty("0x.1", Reason::NumericName)]
    #[case::only_dots("...", Reason::BadIpv4)]
    #[case::double_colon_twice("2001:db8::1::2", Reason::BadIpv6)]
    #[case::ipv6_bad_group("2001:db8::fffff", Reason::BadIpv6)]
    #[case::host_and_port("example.com:443", Reason::BadIpv6)]
    #[case::url("https://example.com", Reason::BadCidrAddress)]
    #[case::zone("fe80::1%eth0", Reason::ZoneId)]
    #[case::zone_in_cidr("fe80::%eth0/64", Reason::ZoneId)]
    #[case::mapped("::ffff:10.0.0.1", Reason::Ipv4Mapped { ipv4: Ipv4Addr::new(10, 0, 0, 1) })]
    #[case::mapped_hex("::ffff:a00:1", Reason::Ipv4Mapped { ipv4: Ipv4Addr::new(10, 0, 0, 1) })]
    #[case::mapped_cidr("::ffff:10.0.0.0/104", Reason::Ipv4Mapped { ipv4: Ipv4Addr::new(10, 0, 0, 0) })]
    #[case::ipv6_embedded_leading_zero("::1.2.3.04", Reason::BadIpv6)]
    #[case::ipv6_nine_groups("1:2:3:4:5:6:7:8:9", Reason::BadIpv6)]
    #[case::ipv6_two_compressions("1::2::3", Reason::BadIpv6)]
    #[case::ipv6_leading_single_colon(":1::", Reason::BadIpv6)]
    #[case::ipv6_full_and_compressed("1:2:3:4:5:6:7:8::", Reason::BadIpv6)]
    #[case::single_number("0", shorthand("0.0.0.0"))]
    #[case::mapped_long_form("0:0:0:0:0:ffff:1.2.3.4", Reason::Ipv4Mapped { ipv4: Ipv4Addr::new(1, 2, 3, 4) })]
    #[case::mapped_prefix("::ffff:0:0/96", Reason::Ipv4Mapped { ipv4: Ipv4Addr::new(0, 0, 0, 0) })]
    #[case::prefix_zero_padded("0.0.0.0/00", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_space("1.2.3.4/ 8", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_33("10.0.0.0/33", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_129("fd00::/129", Reason::BadPrefixLen { max: 128 })]
    #[case::prefix_empty("10.0.0.0/", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_leading_zero("10.0.0.0/08", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_sign("10.0.0.0/+8", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_huge("10.0.0.0/99999999999999999999", Reason::BadPrefixLen { max: 32 })]
    #[case::prefix_two_slashes("10.0.0.0/8/8", Reason::BadPrefixLen { max: 32 })]
    #[case::cidr_without_address("/8", Reason::BadCidrAddress)]
    #[case::cidr_of_a_name("example.com/8", Reason::BadCidrAddress)]
    #[case::cidr_bad_ipv4("10.0.0.300/8", Reason::BadCidrAddress)]
    #[case::wildcard("*.example.com", Reason::NetworkWildcard)]
    #[case::inner_wildcard("a.*.com", Reason::NetworkWildcard)]
    #[case::double_star("**", Reason::NetworkWildcard)]
    #[case::underscore("_sip._tcp.example.com", Reason::InvalidChar { ch: '_' })]
    #[case::double_dot("a..b", Reason::EmptyLabel)]
    #[case::leading_dot(".example.com", Reason::EmptyLabel)]
    #[case::hyphen_label("a.-b.com", Reason::LabelHyphen)]
    #[case::space(" example.com", Reason::InvalidChar { ch: ' ' })]
    fn rejects(#[case] value: &str, #[case] want: Reason) {
        assert_eq!(parse(value), Err(want));
    }

    #[test]
    fn host_bits_are_cleared_and_remembered() {
        let NetworkTarget::Cidr(c) = parse("10.1.2.3/8").unwrap() else {
            panic!("not a CIDR")
        };
        assert_eq!(c.addr(), "10.0.0.0".parse::<IpAddr>().unwrap());
        assert_eq!(c.prefix_len(), 8);
        assert!(c.had_host_bits());
        assert_eq!(NetworkTarget::Cidr(c), cidr("10.0.0.0", 8));
        let NetworkTarget::Cidr(c) = parse("10.0.0.0/8").unwrap() else {
            panic!("not a CIDR")
        };
        assert!(!c.had_host_bits());
        let NetworkTarget::Cidr(c) = parse("2001:db8::1/32").unwrap() else {
            panic!("not a CIDR")
        };
        assert_eq!(c.to_string(), "2001:db8::/32");
        assert!(c.had_host_bits());
    }

    #[test]
    fn cidr_membership() {
        let addr = |s: &str| s.parse::<IpAddr>().unwrap();
        let t = parse("10.0.0.0/8").unwrap();
        assert!(t.contains_addr(addr("10.255.0.1")));
        assert!(!t.contains_addr(addr("11.0.0.1")));
        assert!(!t.contains_addr(addr("::ffff:10.0.0.1")));
        let all4 = parse("0.0.0.0/0").unwrap();
        assert!(all4.contains_addr(addr("1.2.3.4")));
        assert!(!all4.contains_addr(addr("::1")));
        assert!(parse("::/0").unwrap().contains_addr(addr("2001:db8::1")));
        assert!(parse("fd00::/8").unwrap().contains_addr(addr("fdff::1")));
        assert!(!parse("fd00::/8").unwrap().contains_addr(addr("fe00::1")));
        assert!(parse("1.2.3.4/32").unwrap().contains_addr(addr("1.2.3.4")));
        assert!(!parse("1.2.3.4/32").unwrap().contains_addr(addr("1.2.3.5")));
        assert!(parse("1.2.3.4").unwrap().contains_addr(addr("1.2.3.4")));
        assert!(!parse("example.com").unwrap().contains_addr(addr("1.2.3.4")));
        assert!(NetworkTarget::Any.contains_addr(addr("::")));
    }

    #[rstest]
    #[case::custom_domain("a.b.svc.corp.example", "corp.example", svc("a", "b"))]
    #[case::custom_domain_given_absolute("a.b.svc.corp.example", "Corp.Example.", svc("a", "b"))]
    #[case::default_not_assumed(
        "a.b.svc.cluster.local",
        "corp.example",
        domain("a.b.svc.cluster.local")
    )]
    #[case::svc_suffix_always("a.b.svc", "corp.example", svc("a", "b"))]
    #[case::empty_domain("a.b.svc", "", svc("a", "b"))]
    fn cluster_domain_is_a_parameter(
        #[case] value: &str,
        #[case] cluster_domain: &str,
        #[case] want: NetworkTarget,
    ) {
        assert_eq!(
            parse_network_in(value, &FieldPath::spec(), cluster_domain),
            Ok(want)
        );
    }

    #[test]
    fn length_is_the_written_value_at_most_max_hostname_len_bytes() {
        // A name of one- and two-character labels, exactly `n` bytes long.
        let name = |n: usize| {
            if n % 2 == 1 {
                format!("{}a", "a.".repeat((n - 1) / 2))
            } else {
                format!("{}bb", "a.".repeat((n - 2) / 2))
            }
        };
        let (max, over) = (MAX_HOSTNAME_LEN, MAX_HOSTNAME_LEN + 1);
        let ok = name(max);
        assert_eq!(ok.len(), max);
        assert!(matches!(parse(&ok), Ok(NetworkTarget::Domain(_))));
        let bad = name(over);
        assert_eq!(bad.len(), over);
        assert_eq!(parse(&bad), Err(Reason::TooLong { len: over, max }));
        assert_eq!(
            parse(&format!("{ok}.")),
            Err(Reason::TooLong { len: over, max })
        );
    }

    #[test]
    fn the_error_carries_path_and_value() {
        let path = FieldPath::values(
            2,
            crate::values::BehaviorKind::Network,
            crate::values::RuleSide::Deny,
        )
        .index(0);
        let e = parse_network("10.0.0.300", &path).unwrap_err();
        assert_eq!(e.path, "spec.behaviors[2].network.deny.values[0]");
        assert_eq!(e.value, "10.0.0.300");
        assert_eq!(e.reason, Reason::BadIpv4);
    }

    #[rstest]
    #[case("10.1.2.3/8", "10.0.0.0/8")]
    #[case("2001:DB8::1", "2001:db8::1")]
    #[case("My-Svc.NS.svc.cluster.local.", "my-svc.ns.svc")]
    #[case("Example.COM.", "example.com")]
    #[case("*", "*")]
    fn display_is_the_normalized_value(#[case] value: &str, #[case] shown: &str) {
        let t = parse(value).unwrap();
        assert_eq!(t.to_string(), shown);
        assert_eq!(parse(shown), Ok(t));
    }
}
