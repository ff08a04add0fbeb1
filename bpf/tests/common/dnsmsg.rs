//! DNS messages built byte by byte for the snooper's tests: names in wire
//! form, compression pointers where a test puts them, answer records of
//! any type. Nothing here validates: the tests craft broken messages too.

#![allow(dead_code)]

use std::net::{Ipv4Addr, Ipv6Addr};

/// Where the question's name starts (right after the 12-byte header).
pub const QNAME_AT: usize = 12;

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_TXT: u16 = 16;
pub const TYPE_AAAA: u16 = 28;
pub const CLASS_IN: u16 = 1;

/// `name`'s labels, length-prefixed, without the root label.
pub fn labels(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(u8::try_from(label.len()).unwrap());
        out.extend_from_slice(label.as_bytes());
    }
    out
}

/// `name` in uncompressed wire form (labels, then the root label).
pub fn wire(name: &str) -> Vec<u8> {
    let mut out = labels(name);
    out.push(0);
    out
}

/// A compression pointer to message offset `at`.
pub fn ptr(at: usize) -> Vec<u8> {
    let at = u16::try_from(at).unwrap();
    assert!(at < 0x4000);
    vec![0xc0 | (at >> 8) as u8, (at & 0xff) as u8]
}

/// `prefix`'s labels followed by a pointer to `at`.
pub fn labels_then(prefix: &str, at: usize) -> Vec<u8> {
    let mut out = labels(prefix);
    out.extend(ptr(at));
    out
}

/// A response under construction: header (QR, RD, RA, the rcode), one
/// question, then the answers appended; ANCOUNT follows the appends.
#[derive(Clone, Debug)]
pub struct Response {
    pub bytes: Vec<u8>,
}

impl Response {
    /// A NOERROR response to `qname` (uncompressed at [`QNAME_AT`]) of
    /// type `qtype`.
    pub fn new(qname: &str, qtype: u16) -> Self {
        Self::with_question(&wire(qname), qtype)
    }

    /// The same with the question's name given in wire form.
    pub fn with_question(qname: &[u8], qtype: u16) -> Self {
        let mut bytes = vec![0x4b, 0x1d, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(qname);
        bytes.extend_from_slice(&qtype.to_be_bytes());
        bytes.extend_from_slice(&CLASS_IN.to_be_bytes());
        Self { bytes }
    }

    /// Sets the rcode.
    pub fn rcode(mut self, rcode: u8) -> Self {
        self.bytes[3] = (self.bytes[3] & 0xf0) | (rcode & 0x0f);
        self
    }

    /// Clears QR: a query.
    pub fn query_bit_cleared(mut self) -> Self {
        self.bytes[2] &= 0x7f;
        self
    }

    /// Overwrites QDCOUNT.
    pub fn qdcount(mut self, n: u16) -> Self {
        self.bytes[4..6].copy_from_slice(&n.to_be_bytes());
        self
    }

    /// Overwrites ANCOUNT (after the appends, to lie about it).
    pub fn ancount(mut self, n: u16) -> Self {
        self.bytes[6..8].copy_from_slice(&n.to_be_bytes());
        self
    }

    fn count_answer(&mut self) {
        let n = u16::from_be_bytes([self.bytes[6], self.bytes[7]]) + 1;
        self.bytes[6..8].copy_from_slice(&n.to_be_bytes());
    }

    /// Appends a record owned by `owner` (wire form, maybe compressed);
    /// returns the offset of its data.
    pub fn record(
        &mut self,
        owner: &[u8],
        rtype: u16,
        class: u16,
        ttl: u32,
        rdata: &[u8],
    ) -> usize {
        self.bytes.extend_from_slice(owner);
        self.bytes.extend_from_slice(&rtype.to_be_bytes());
        self.bytes.extend_from_slice(&class.to_be_bytes());
        self.bytes.extend_from_slice(&ttl.to_be_bytes());
        self.bytes
            .extend_from_slice(&u16::try_from(rdata.len()).unwrap().to_be_bytes());
        let at = self.bytes.len();
        self.bytes.extend_from_slice(rdata);
        self.count_answer();
        at
    }

    /// An A record.
    pub fn a(&mut self, owner: &[u8], ttl: u32, addr: Ipv4Addr) -> usize {
        self.record(owner, TYPE_A, CLASS_IN, ttl, &addr.octets())
    }

    /// An AAAA record.
    pub fn aaaa(&mut self, owner: &[u8], ttl: u32, addr: Ipv6Addr) -> usize {
        self.record(owner, TYPE_AAAA, CLASS_IN, ttl, &addr.octets())
    }

    /// A CNAME record; returns the offset of its target name.
    pub fn cname(&mut self, owner: &[u8], ttl: u32, target: &[u8]) -> usize {
        self.record(owner, TYPE_CNAME, CLASS_IN, ttl, target)
    }
}

/// A query for `name` of type `qtype` (what a resolver child sends).
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(&wire(name));
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    q
}

/// The query `response` answers: its id, RD, one question, and its
/// question section byte for byte (labels up to the root label or a
/// pointer, then type and class); `None` when that cannot be cut out.
pub fn question_of(response: &[u8]) -> Option<Vec<u8>> {
    let mut at = QNAME_AT;
    loop {
        let len = *response.get(at)?;
        if len == 0 {
            at += 1;
            break;
        }
        if len & 0xc0 == 0xc0 {
            at += 2;
            break;
        }
        at += 1 + usize::from(len);
    }
    let mut q = response.get(0..2)?.to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(response.get(QNAME_AT..at + 4)?);
    Some(q)
}

/// The question name of a query (uncompressed, as [`query`] writes it),
/// lowercased and dotted; `None` if it cannot be read.
pub fn question_name(msg: &[u8]) -> Option<String> {
    let mut at = QNAME_AT;
    let mut out: Vec<String> = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        if len == 0 {
            return Some(out.join("."));
        }
        if len > 63 {
            return None;
        }
        let label = msg.get(at + 1..at + 1 + len)?;
        out.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += 1 + len;
    }
}

/// The address of the first A record of a response, skipping the question
/// and any record before it (names compressed or not); `None` when there
/// is none or the message cannot be walked. What a resolving child does
/// with an answer.
pub fn first_a(msg: &[u8]) -> Option<Ipv4Addr> {
    let skip_name = |mut at: usize| -> Option<usize> {
        loop {
            let len = *msg.get(at)?;
            if len == 0 {
                return Some(at + 1);
            }
            if len & 0xc0 == 0xc0 {
                return Some(at + 2);
            }
            at += 1 + usize::from(len);
        }
    };
    let ancount = u16::from_be_bytes([*msg.get(6)?, *msg.get(7)?]);
    let mut at = skip_name(QNAME_AT)? + 4;
    for _ in 0..ancount {
        at = skip_name(at)?;
        let fixed = msg.get(at..at + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let rdlen = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        at += 10;
        let rdata = msg.get(at..at + rdlen)?;
        if rtype == TYPE_A && rdlen == 4 {
            return Some(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]));
        }
        at += rdlen;
    }
    None
}
