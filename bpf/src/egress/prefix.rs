//! [`Prefix`]: an IPv4 or IPv6 network, `addr/len`, as the tries store it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use super::EgressError;

/// An IP network: an address and how many of its leading bits count.
///
/// The host bits are cleared on construction (`10.1.2.3/8` becomes
/// `10.0.0.0/8`), so two spellings of one network are one value and one
/// trie entry: the kernel matches only the first `len` bits anyway, but
/// it stores, and a map dump shows, whatever bits it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl Prefix {
    /// `addr/len`; fails when `len` exceeds the family's width (32 or 128).
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, EgressError> {
        let max = max_len(addr);
        if len > max {
            return Err(EgressError::InvalidPrefix { addr, len, max });
        }
        Ok(Self {
            addr: mask(addr, len),
            len,
        })
    }

    /// The single address `addr` (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Self {
        Self {
            addr,
            len: max_len(addr),
        }
    }

    /// The network address (host bits zero).
    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    /// How many leading bits of [`Self::addr`] are significant.
    pub const fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether `addr` is inside this network (never across families).
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && mask(addr, self.len) == self.addr
    }
}

/// 32 for IPv4, 128 for IPv6.
const fn max_len(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `addr` with every bit after the first `len` cleared (`len` in range).
fn mask(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & keep))
        }
        IpAddr::V6(a) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & keep))
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl From<IpAddr> for Prefix {
    fn from(addr: IpAddr) -> Self {
        Self::host(addr)
    }
}

/// `10.0.0.0/8`, `2001:db8::/32`, or a bare address (a host prefix).
impl FromStr for Prefix {
    type Err = EgressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| EgressError::ParsePrefix {
            input: s.to_owned(),
            reason,
        };
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
        match len {
            None => Ok(Self::host(addr)),
            // Digits only: `u8::from_str` would also take "+8".
            Some(len) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
                let len = len.parse().map_err(|_| bad("prefix length out of range"))?;
                Self::new(addr, len)
            }
            Some(_) => Err(bad("prefix length is not a number")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    #[test]
    fn host_bits_are_cleared() {
        assert_eq!(p("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(p("10.1.2.3/8"), p("10.0.0.0/8"));
        assert_eq!(
            p("2001:db8:1:2:3:4:5:6/64").to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(p("255.255.255.255/0").to_string(), "0.0.0.0/0");
        assert_eq!(p("ffff::1/0").to_string(), "::/0");
        assert_eq!(p("192.0.2.7/31").to_string(), "192.0.2.6/31");
    }

    #[test]
    fn bare_addresses_are_host_prefixes() {
        assert_eq!(p("192.0.2.1").prefix_len(), 32);
        assert_eq!(p("2001:db8::1").prefix_len(), 128);
        assert_eq!(
            p("192.0.2.1/32"),
            Prefix::host("192.0.2.1".parse().unwrap())
        );
    }

    #[test]
    fn lengths_beyond_the_family_are_refused() {
        let err = "10.0.0.0/33".parse::<Prefix>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "10.0.0.0/33 is not a prefix: IPv4 prefixes are at most /32"
        );
        assert!("::/129".parse::<Prefix>().is_err());
        assert!(Prefix::new("::".parse().unwrap(), 128).is_ok());
    }

    #[test]
    fn malformed_text_is_refused_with_the_reason() {
        for (input, reason) in [
            ("10.0.0/8", "not an IP address"),
            ("10.0.0.0/", "prefix length is not a number"),
            ("10.0.0.0/+8", "prefix length is not a number"),
            ("10.0.0.0/ 8", "prefix length is not a number"),
            ("10.0.0.0/300", "prefix length out of range"),
            ("example.com", "not an IP address"),
        ] {
            match input.parse::<Prefix>() {
                Err(EgressError::ParsePrefix {
                    input: i,
                    reason: r,
                }) => {
                    assert_eq!((i.as_str(), r), (input, reason));
                }
                other => panic!("{input}: {other:?}"),
            }
        }
    }

    #[test]
    fn contains_stays_within_the_family() {
        assert!(p("10.0.0.0/8").contains("10.255.0.1".parse().unwrap()));
        assert!(!p("10.0.0.0/8").contains("11.0.0.1".parse().unwrap()));
        assert!(p("0.0.0.0/0").contains("192.0.2.1".parse().unwrap()));
        assert!(!p("0.0.0.0/0").contains("::".parse().unwrap()));
        assert!(!p("::/0").contains("0.0.0.0".parse().unwrap()));
        assert!(p("2001:db8::/64").contains("2001:db8::ffff".parse().unwrap()));
    }
}
