//! Mutual TLS for both ends of the push stream: PEM files read and checked
//! up front, rustls configurations on the `ring` provider.
//!
//! Everything a TLS file can get wrong is found here, when the sink or the
//! collector is built, rather than at the first connection: a daemon with a
//! mistyped `--push-tls-key` must fail to start, not run for hours and then
//! count every finding as lost.
//!
//! The provider is passed explicitly instead of relying on rustls' process
//! default: the binary links rustls through kube as well, and an implicit
//! default is either a panic (no provider installed, or two compiled in) or
//! whatever another component installed.

use crate::error::{Error, Result, TlsFile};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::Arc;

/// gRPC runs over HTTP/2 only; both ends say so in ALPN, so a peer that
/// cannot speak it fails the handshake instead of a confusing first frame.
const ALPN_H2: &[u8] = b"h2";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The most bytes a TLS file may hold: the bound every file input of the
/// project has (a CA bundle of every public root is about 200 KiB), so a
/// flag pointing at `/dev/zero` fails at once instead of filling memory.
pub const MAX_TLS_FILE_BYTES: u64 = 16 * 1024 * 1024;

fn read(file: TlsFile, path: &Path) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let error = |source| Error::Read {
        file,
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(error)?
        .take(MAX_TLS_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(error)?;
    if bytes.len() as u64 > MAX_TLS_FILE_BYTES {
        return Err(error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_TLS_FILE_BYTES} bytes (the limit for a TLS file)"),
        )));
    }
    Ok(bytes)
}

/// Every `CERTIFICATE` block of a PEM file, at least one.
fn certificates(file: TlsFile, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(file, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem {
            file,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(Error::Empty {
            file,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let file = TlsFile::Key;
    let bytes = read(file, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| match source {
        pem::Error::NoItemsFound => Error::Empty {
            file,
            path: path.to_owned(),
        },
        source => Error::Pem {
            file,
            path: path.to_owned(),
            source,
        },
    })
}

/// The CA file as a root store: every certificate in it must be a usable
/// trust anchor (a file with one good and one broken certificate is a
/// mistake to report, not to half-accept).
fn roots(path: &Path) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for cert in certificates(TlsFile::Ca, path)? {
        store.add(cert).map_err(|source| Error::TrustAnchor {
            file: TlsFile::Ca,
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(store)
}

/// The files of one end of a mutual TLS connection, already read and
/// parsed.
pub(crate) struct Identity {
    roots: RootCertStore,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key_path: std::path::PathBuf,
}

impl Identity {
    /// Reads and parses the three files, naming the first one that is
    /// missing, unreadable or malformed.
    pub(crate) fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Identity> {
        Ok(Identity {
            roots: roots(ca)?,
            chain: certificates(TlsFile::Certificate, cert)?,
            key: private_key(key)?,
            ca: ca.to_owned(),
            cert: cert.to_owned(),
            key_path: key.to_owned(),
        })
    }

    fn identity_error(&self, source: rustls::Error) -> Error {
        Error::Identity {
            cert: self.cert.clone(),
            key: self.key_path.clone(),
            source,
        }
    }

    /// The daemon's side: trusts only the CA file (no system roots: the
    /// collector is ours, not a public service) and presents the client
    /// certificate. rustls checks here that the key is usable and matches
    /// the certificate.
    pub(crate) fn client_config(self) -> Result<ClientConfig> {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| Error::Tls { source })?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|source| self.identity_error(source))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }

    /// The collector's side: presents its certificate and *requires* a
    /// client certificate that chains to the CA file; a client without one
    /// fails the handshake.
    pub(crate) fn server_config(self) -> Result<ServerConfig> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots.clone()), provider())
                .build()
                .map_err(|source| Error::ClientVerifier {
                    path: self.ca.clone(),
                    source,
                })?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| Error::Tls { source })?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|source| self.identity_error(source))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }
}

/// A push target split into what TCP dials and what TLS verifies.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The host as written (a DNS name or an IP literal, without brackets).
    pub(crate) host: String,
    /// The TCP port.
    pub(crate) port: u16,
    /// The name the collector's certificate must carry (a DNS name or IP
    /// address SAN).
    pub(crate) server_name: ServerName<'static>,
}

impl Target {
    /// Parses `HOST:PORT`, `IPv4:PORT` or `[IPv6]:PORT`.
    pub(crate) fn parse(target: &str) -> Result<Target> {
        let bad = |reason| Error::Target {
            target: target.to_owned(),
            reason,
        };
        let (host, port) = if let Some(rest) = target.strip_prefix('[') {
            let (host, port) = rest
                .split_once("]:")
                .ok_or_else(|| bad("an IPv6 target is [ADDRESS]:PORT"))?;
            (host, port)
        } else {
            target
                .rsplit_once(':')
                .ok_or_else(|| bad("expected HOST:PORT"))?
        };
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        if host.contains(':') && !target.starts_with('[') {
            return Err(bad("an IPv6 target is [ADDRESS]:PORT"));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
        if port == 0 {
            return Err(bad("the port is not a number from 1 to 65535"));
        }
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| bad("the host is neither a DNS name nor an IP address"))?;
        Ok(Target {
            host: host.to_owned(),
            port,
            server_name,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_tls_file_over_the_bound_is_refused_unread() {
        // Sparse: the bound plus one byte, without writing 16 MiB.
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("ca.pem");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_TLS_FILE_BYTES + 1)
            .unwrap();
        let err = read(TlsFile::Ca, &big).unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("larger than 16777216 bytes (the limit for a TLS file)"),
            "{chain}"
        );
        let err = read(TlsFile::Ca, Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(err, Error::Read { .. }), "{err}");
    }

    #[test]
    fn targets_parse() {
        let t = Target::parse("collector.example:4317").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("collector.example", 4317));
        let t = Target::parse("127.0.0.1:1").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 1));
        let t = Target::parse("[::1]:4317").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 4317));
        for bad in [
            "",
            "collector",
            ":4317",
            "h:0",
            "h:99999",
            "h:x",
            "::1:4317",
            "[::1]4317",
            "bad name:1",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
