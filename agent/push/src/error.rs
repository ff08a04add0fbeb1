//! The errors of the push sink and the collector.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Which of the TLS files a [`Error`] is about, so the message says what the
/// file was supposed to hold as well as where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    /// The CA certificate(s) that sign the peer's certificate.
    Ca,
    /// This side's certificate chain.
    Certificate,
    /// This side's private key.
    Key,
}

impl fmt::Display for TlsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsFile::Ca => "CA certificate file",
            TlsFile::Certificate => "certificate file",
            TlsFile::Key => "private key file",
        })
    }
}

/// Why a push sink or a collector could not be built or run, or why a
/// received message is not a finding.
///
/// A message names what failed, not why: the cause is the error's
/// `source()`, so a chain printer (`{:#}` of anyhow) shows it once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TLS file is missing or unreadable.
    #[error("reading {file} {}", .path.display())]
    Read {
        /// What the file should hold.
        file: TlsFile,
        /// Where it was looked for.
        path: PathBuf,
        /// What the filesystem said.
        source: io::Error,
    },
    /// A TLS file is not well-formed PEM.
    #[error("{file} {} is not PEM", .path.display())]
    Pem {
        /// What the file should hold.
        file: TlsFile,
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        source: rustls::pki_types::pem::Error,
    },
    /// A TLS file holds no item of the kind it should (no `CERTIFICATE`
    /// block in a certificate file, no private key in a key file).
    #[error("{file} {} holds no {}", .path.display(), match .file { TlsFile::Key => "private key", _ => "certificate" })]
    Empty {
        /// What the file should hold.
        file: TlsFile,
        /// The file.
        path: PathBuf,
    },
    /// A CA certificate is PEM but not a usable X.509 trust anchor.
    #[error("{file} {} holds a certificate that is not a usable CA", .path.display())]
    TrustAnchor {
        /// What the file should hold ([`TlsFile::Ca`]).
        file: TlsFile,
        /// The file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The certificate and key do not make an identity: the key is of an
    /// unsupported type, the certificate does not parse, or they do not
    /// belong together.
    #[error("certificate file {} and private key file {} are not a usable pair", .cert.display(), .key.display())]
    Identity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The client-certificate verifier could not be built from the CA file
    /// (for example, it holds no usable trust anchor).
    #[error("CA certificate file {} cannot verify client certificates", .path.display())]
    ClientVerifier {
        /// The CA file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::server::VerifierBuilderError,
    },
    /// The TLS configuration could not be built from the crypto provider.
    #[error("building the TLS configuration")]
    Tls {
        /// What rustls said.
        source: rustls::Error,
    },
    /// The push target is not `HOST:PORT`.
    #[error("push target {target:?}: {reason}")]
    Target {
        /// The target as configured.
        target: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configuration value is out of range.
    #[error("push configuration {field}: {reason}")]
    Config {
        /// The [`PushConfig`](crate::PushConfig) field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The collector could not listen.
    #[error("listening on {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the socket layer said.
        source: io::Error,
    },
    /// The collector's gRPC server failed.
    #[error("serving gRPC")]
    Serve {
        /// What tonic said.
        source: tonic::transport::Error,
    },
    /// The collector's output file could not be opened.
    #[error("collector output {}", .path.display())]
    OpenOutput {
        /// The file.
        path: PathBuf,
        /// What the filesystem said.
        source: io::Error,
    },
    /// The collector could not write a finding to its output.
    #[error("writing the collector output")]
    Output {
        /// What the writer said.
        source: io::Error,
    },
    /// A received message's enum field holds a value this build does not
    /// know (or the reserved zero where a value is required).
    #[error("finding field {field}: unknown value {value}")]
    UnknownEnum {
        /// The message field.
        field: &'static str,
        /// The value received.
        value: i32,
    },
    /// A received message lacks a required field.
    #[error("finding field {field} is missing")]
    MissingField {
        /// The message field.
        field: &'static str,
    },
    /// A received timestamp is outside what this system can represent.
    #[error("finding field {field} is out of range")]
    Timestamp {
        /// The message field.
        field: &'static str,
        /// What prost-types said.
        source: prost_types::TimestampError,
    },
    /// A received fingerprint is not 64 hex digits.
    #[error("finding field fingerprint is not 64 hex digits")]
    Fingerprint,
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short stable name for metric labels and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Pem { .. } => "pem",
            Error::Empty { .. } => "empty",
            Error::TrustAnchor { .. } => "trust_anchor",
            Error::Identity { .. } => "identity",
            Error::ClientVerifier { .. } => "client_verifier",
            Error::Tls { .. } => "tls",
            Error::Target { .. } => "target",
            Error::Config { .. } => "config",
            Error::Bind { .. } => "bind",
            Error::Serve { .. } => "serve",
            Error::OpenOutput { .. } => "open_output",
            Error::Output { .. } => "output",
            Error::UnknownEnum { .. } => "unknown_enum",
            Error::MissingField { .. } => "missing_field",
            Error::Timestamp { .. } => "timestamp",
            Error::Fingerprint => "fingerprint",
        }
    }
}
