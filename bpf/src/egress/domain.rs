//! Domain names as the egress filter sets hold them ([`Domain`]), the
//! verdicts a set gives one ([`DomainVerdicts`]) and what the DNS answer
//! snooper learned from answers ([`Learned`]).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::dns::name::{decode_key, encode_name, DomainKey, EncodeError};

/// A domain name a filter set names: canonical text (lowercase, no
/// trailing dot) whose wire form fits a `struct domain_key` (at most 127
/// bytes of labels, see `bpf/include/dnsname.h`). Ordered by its text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Domain(String);

impl Domain {
    /// The domain `name` (presentation form; case and a trailing dot are
    /// normalised away). Fails for a name the kernel key cannot hold: the
    /// root, an empty label, a label over 63 bytes, a name over the key
    /// width.
    pub fn new(name: &str) -> Result<Self, EncodeError> {
        let key = encode_name(name)?;
        if key[0] == 0 {
            // The root names every domain at once; a policy never means it.
            return Err(EncodeError::Empty);
        }
        // The canonical text of the key, so equal keys are equal values.
        decode_key(&key)
            .map(Self)
            .map_err(|_| EncodeError::TooLong { len: key.len() })
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The kernel's key of the name.
    pub fn key(&self) -> DomainKey {
        // Built from a key by `new`, so it encodes again; the fallback is
        // unreachable and would only make the name match nothing.
        encode_name(&self.0).unwrap_or([0; crate::dns::name::DOMAIN_KEY_LEN])
    }

    /// The domain a kernel key holds; `None` for bytes no program writes.
    pub fn from_key(key: &[u8]) -> Option<Self> {
        let text = decode_key(key).ok()?;
        (text != ".").then_some(Self(text))
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The sides of a set a domain is on. The set's policies union, so a name
/// may be on both (a deny then wins, as for prefixes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainVerdicts {
    /// Addresses answered for the name pass.
    pub allow: bool,
    /// Addresses answered for the name drop.
    pub deny: bool,
    /// A monitor policy names the name: its answers are learned so the
    /// monitor can say which name a destination was known under; the
    /// filter's verdicts ignore it.
    pub observe: bool,
}

impl DomainVerdicts {
    /// On no side: the set does not name the domain.
    pub const fn is_empty(self) -> bool {
        !self.allow && !self.deny && !self.observe
    }
}

/// One address a set learned from a DNS answer (see
/// [`super::EgressFilter::learned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Learned {
    /// The set that learned it.
    pub set_id: u32,
    /// The address an A or AAAA record gave.
    pub addr: IpAddr,
    /// The sides of the names the answers reached it through (an answer
    /// adds its sides to an unexpired entry's: an address a denied name
    /// gave stays denied until it expires).
    pub verdicts: DomainVerdicts,
    /// The name id (see [`super::EgressFilter::set_domain`]) of the first
    /// policy-named name of the latest answer that taught it.
    pub name_id: u32,
    /// How long it still counts; `None` once expired (the filter then
    /// ignores it, and the bounded map reuses its slot).
    pub remaining: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical_and_bounded_by_the_key() {
        let d = Domain::new("Allowed.TEST.").unwrap();
        assert_eq!(d.as_str(), "allowed.test");
        assert_eq!(d, Domain::new("allowed.test").unwrap());
        assert_eq!(Domain::from_key(&d.key()), Some(d.clone()));
        assert_eq!(d.to_string(), "allowed.test");
        assert_eq!(Domain::new("."), Err(EncodeError::Empty));
        assert_eq!(Domain::new(""), Err(EncodeError::Empty));
        let wide = format!("{}.{}", "a".repeat(63), "b".repeat(62));
        assert!(Domain::new(&wide).is_ok());
        let too_wide = format!("{}.{}", "a".repeat(63), "b".repeat(63));
        assert_eq!(
            Domain::new(&too_wide),
            Err(EncodeError::TooLong { len: 129 })
        );
        assert_eq!(Domain::from_key(&[0; 128]), None, "the root");
        assert_eq!(Domain::from_key(&[0xc0; 128]), None);
    }

    #[test]
    fn verdicts_know_when_they_name_nothing() {
        assert!(DomainVerdicts::default().is_empty());
        assert!(!DomainVerdicts {
            allow: true,
            deny: false,
            observe: false
        }
        .is_empty());
    }
}
