//! Certificates for the collector's mutual TLS, made by openssl (a CA, a
//! server certificate for 127.0.0.1, a client certificate): shared by the
//! tests that run `kyverno-runtime collector`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate.
pub fn certificates(dir: &Path) {
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.crt"),
        "-subj",
        "/CN=krt-test-ca",
        "-days",
        "1",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        (
            "client",
            "subjectAltName=DNS:daemon\nextendedKeyUsage=clientAuth\n",
        ),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &p(&format!("{name}.key")),
            "-out",
            &p(&format!("{name}.csr")),
            "-subj",
            &format!("/CN={name}"),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &p(&format!("{name}.csr")),
            "-CA",
            &p("ca.crt"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            &p(&format!("{name}.crt")),
            "-extfile",
            &p(&format!("{name}.ext")),
        ]);
    }
}
