//! TLS ClientHellos built byte by byte for the protocol classifier's tests
//! and benchmark: an SNI extension, optional filler extensions and an ALPN
//! list where a test puts them. Nothing here validates.

#![allow(dead_code)]

/// `n` as a big-endian u16 length field.
pub fn u16be(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap().to_be_bytes()
}

/// One extension: its type, its body's length and the body.
pub fn extension(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut e = kind.to_be_bytes().to_vec();
    e.extend_from_slice(&u16be(body.len()));
    e.extend_from_slice(body);
    e
}

/// The ALPN extension offering `names` in order.
pub fn alpn_extension(names: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for n in names {
        list.push(u8::try_from(n.len()).unwrap());
        list.extend_from_slice(n);
    }
    let mut body = u16be(list.len()).to_vec();
    body.extend_from_slice(&list);
    extension(16, &body)
}

/// The server_name extension naming `host`.
pub fn sni_extension(host: &[u8]) -> Vec<u8> {
    let mut entry = vec![0u8]; // host_name
    entry.extend_from_slice(&u16be(host.len()));
    entry.extend_from_slice(host);
    let mut body = u16be(entry.len()).to_vec();
    body.extend_from_slice(&entry);
    extension(0, &body)
}

/// A ClientHello in one TLS record: an SNI extension, `fillers` empty
/// extensions (GREASE-like, type 0x0a0a + i), then ALPN offering `alpn`
/// (no ALPN extension when `None`).
pub fn client_hello_with(alpn: Option<&[&[u8]]>, fillers: usize) -> Vec<u8> {
    let mut exts = sni_extension(b"example.com");
    for i in 0..fillers {
        exts.extend_from_slice(&extension(0x0a0a + u16::try_from(i).unwrap(), &[]));
    }
    if let Some(names) = alpn {
        exts.extend_from_slice(&alpn_extension(names));
    }
    // supported_versions: TLS 1.3, TLS 1.2.
    exts.extend_from_slice(&extension(43, &[4, 0x03, 0x04, 0x03, 0x03]));

    let mut body = vec![0x03, 0x03]; // legacy_version
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(32);
    body.extend_from_slice(&[0xa5; 32]); // legacy_session_id
    body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]); // cipher_suites
    body.extend_from_slice(&[1, 0]); // compression: null
    body.extend_from_slice(&u16be(exts.len()));
    body.extend_from_slice(&exts);

    let mut hs = vec![1u8]; // client_hello
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    hs.extend_from_slice(&len[1..]);
    hs.extend_from_slice(&body);

    let mut record = vec![22, 0x03, 0x01];
    record.extend_from_slice(&u16be(hs.len()));
    record.extend_from_slice(&hs);
    record
}

/// A ClientHello offering `alpn`, with no filler extensions.
pub fn client_hello(alpn: &[&[u8]]) -> Vec<u8> {
    client_hello_with(Some(alpn), 0)
}
