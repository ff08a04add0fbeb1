//! The bytes workloads send and the scenario's resolver answers: DNS
//! questions and answers (RFC 1035, uncompressed questions, A and AAAA
//! answers pointing at the question's name), an ssh client's banner, and
//! a TLS 1.3 ClientHello offering one ALPN. Nothing here panics on what a
//! peer sends: a message that cannot be read is `None`.

use std::net::IpAddr;

/// Record type A.
pub const TYPE_A: u16 = 1;
/// Record type AAAA.
pub const TYPE_AAAA: u16 = 28;
/// Where the question's name starts (after the 12-byte header).
const QNAME_AT: usize = 12;

/// An ssh client's first line: the protocol classifier names the flow `ssh`.
pub const SSH_BANNER: &[u8] = b"SSH-2.0-OpenSSH_9.6 krt-conformance\r\n";

/// A line of text nothing classifies.
pub const TEXT: &[u8] = b"hello from krt-conformance\n";

/// A query for `name` (type A or AAAA) with `id`.
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    // RD set, one question.
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        let bytes = label.as_bytes();
        let len = bytes.len().min(63);
        q.push(u8::try_from(len).unwrap_or(63));
        q.extend_from_slice(&bytes[..len]);
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// A query's id, name (lowercase, dotted) and type; `None` when it cannot
/// be read.
pub fn read_query(msg: &[u8]) -> Option<(u16, String, u16, usize)> {
    let id = u16::from_be_bytes([*msg.first()?, *msg.get(1)?]);
    let mut at = QNAME_AT;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        if len == 0 {
            at += 1;
            break;
        }
        if len > 63 {
            return None;
        }
        let label = msg.get(at + 1..at + 1 + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += 1 + len;
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    // The end of the question (type and class).
    let end = at + 4;
    msg.get(..end)?;
    Some((id, labels.join("."), qtype, end))
}

/// The answer to `query`: every address of `addrs` of the asked family as
/// a record owned by the question's name (a compression pointer), with
/// `ttl`; NXDOMAIN when `addrs` is `None`. `None` when the query cannot be
/// read.
pub fn answer(query: &[u8], addrs: Option<&[IpAddr]>, ttl: u32) -> Option<Vec<u8>> {
    let (id, _, qtype, end) = read_query(query)?;
    let mut r = id.to_be_bytes().to_vec();
    let records: Vec<&IpAddr> = addrs
        .unwrap_or_default()
        .iter()
        .filter(|a| match a {
            IpAddr::V4(_) => qtype == TYPE_A,
            IpAddr::V6(_) => qtype == TYPE_AAAA,
        })
        .collect();
    // QR, RD, RA; rcode 3 (NXDOMAIN) for an unknown name.
    let rcode = if addrs.is_none() { 3 } else { 0 };
    r.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1]);
    r.extend_from_slice(&u16::try_from(records.len()).unwrap_or(0).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(query.get(QNAME_AT..end)?);
    for addr in records {
        // A pointer to the question's name.
        r.extend_from_slice(&[0xc0, 12]);
        let (rtype, data) = match addr {
            IpAddr::V4(a) => (TYPE_A, a.octets().to_vec()),
            IpAddr::V6(a) => (TYPE_AAAA, a.octets().to_vec()),
        };
        r.extend_from_slice(&rtype.to_be_bytes());
        r.extend_from_slice(&1u16.to_be_bytes());
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
        r.extend_from_slice(&data);
    }
    Some(r)
}

/// What a response says: its rcode and the A/AAAA addresses it carries;
/// `None` when it cannot be walked.
pub fn read_answer(msg: &[u8]) -> Option<(u8, Vec<IpAddr>)> {
    let rcode = msg.get(3)? & 0x0f;
    let ancount = u16::from_be_bytes([*msg.get(6)?, *msg.get(7)?]);
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
    let mut at = skip_name(QNAME_AT)? + 4;
    let mut addrs = Vec::new();
    for _ in 0..ancount {
        at = skip_name(at)?;
        let fixed = msg.get(at..at + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let rdlen = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        at += 10;
        let data = msg.get(at..at + rdlen)?;
        match (rtype, rdlen) {
            (TYPE_A, 4) => addrs.push(IpAddr::from([data[0], data[1], data[2], data[3]])),
            (TYPE_AAAA, 16) => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(data);
                addrs.push(IpAddr::from(octets));
            }
            _ => {}
        }
        at += rdlen;
    }
    Some((rcode, addrs))
}

fn u16be(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
}

fn extension(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut e = kind.to_be_bytes().to_vec();
    e.extend_from_slice(&u16be(body.len()));
    e.extend_from_slice(body);
    e
}

/// A TLS 1.3 ClientHello in one record, offering `alpn` (ALPN extension)
/// and TLS 1.3 (supported_versions); the classifier names it `tls/<alpn>`.
pub fn client_hello(alpn: &str) -> Vec<u8> {
    let proto = &alpn.as_bytes()[..alpn.len().min(255)];
    let mut list = vec![u8::try_from(proto.len()).unwrap_or(u8::MAX)];
    list.extend_from_slice(proto);
    let mut alpn_body = u16be(list.len()).to_vec();
    alpn_body.extend_from_slice(&list);
    let mut exts = extension(16, &alpn_body);
    exts.extend_from_slice(&extension(43, &[4, 0x03, 0x04, 0x03, 0x03]));
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x5a; 32]);
    body.push(32);
    body.extend_from_slice(&[0xa5; 32]);
    body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&u16be(exts.len()));
    body.extend_from_slice(&exts);
    let mut hs = vec![1u8];
    let len = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
    hs.extend_from_slice(&len[1..]);
    hs.extend_from_slice(&body);
    let mut record = vec![22, 0x03, 0x01];
    record.extend_from_slice(&u16be(hs.len()));
    record.extend_from_slice(&hs);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_is_answered_from_the_table_and_read_back() {
        let q = query(7, "Allowed.Test", TYPE_A);
        assert_eq!(
            read_query(&q).map(|(id, n, t, _)| (id, n, t)),
            Some((7, "allowed.test".into(), TYPE_A))
        );
        let addrs: Vec<IpAddr> = vec!["10.20.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let a = answer(&q, Some(&addrs), 300).unwrap();
        assert_eq!(read_answer(&a), Some((0, vec![addrs[0]])));
        let q6 = query(8, "allowed.test", TYPE_AAAA);
        let a6 = answer(&q6, Some(&addrs), 300).unwrap();
        assert_eq!(read_answer(&a6), Some((0, vec![addrs[1]])));
        let nx = answer(&q, None, 300).unwrap();
        assert_eq!(read_answer(&nx), Some((3, vec![])));
    }

    #[test]
    fn garbage_is_not_read() {
        assert_eq!(read_query(&[1, 2, 3]), None);
        assert_eq!(read_answer(&[0; 5]), None);
        let mut q = query(1, "x.test", TYPE_A);
        q.truncate(15);
        assert_eq!(answer(&q, None, 1), None);
    }

    #[test]
    fn the_client_hello_carries_its_alpn() {
        let hello = client_hello("h2");
        assert_eq!(&hello[..3], &[22, 3, 1]);
        let record_len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(record_len, hello.len() - 5);
        assert!(hello.windows(3).any(|w| w == [2, b'h', b'2']));
        assert!(client_hello("http/1.1")
            .windows(9)
            .any(|w| w == b"\x08http/1.1"));
    }
}
