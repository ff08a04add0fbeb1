//! A validating admission webhook that answers every review with
//! `allowed: false` and status code 429 (issue 34, item 6): the API server
//! passes a webhook's code of 400 or more through to the client, so every
//! write the webhook's rules cover is refused with 429 Too Many Requests,
//! as by a server shedding load. Its own TLS (a self-signed certificate
//! for 127.0.0.1, handed to the API server as the webhook's `caBundle`),
//! plain HTTP/1.1 over it, one thread per connection.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The running webhook; stops accepting when dropped.
pub struct ThrottlingWebhook {
    /// Its port on 127.0.0.1.
    pub port: u16,
    ca_pem: String,
    reviews: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl ThrottlingWebhook {
    /// Starts it on a free loopback port.
    pub fn start() -> ThrottlingWebhook {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let ca_pem = cert.pem();
        let config = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let reviews = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, stopping) = (Arc::clone(&reviews), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (config, counted) = (Arc::clone(&config), Arc::clone(&counted));
                std::thread::spawn(move || serve(conn, config, &counted));
            }
        });
        ThrottlingWebhook {
            port,
            ca_pem,
            reviews,
            stop,
        }
    }

    /// Reviews answered so far.
    pub fn reviews(&self) -> u64 {
        self.reviews.load(Ordering::SeqCst)
    }

    /// A ValidatingWebhookConfiguration named `name` sending the daemon's
    /// writes (status, Reports, Events) here.
    pub fn configuration(&self, name: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: {name}}}
webhooks:
- name: throttle.faults.kyverno-runtime.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  clientConfig: {{url: \"https://127.0.0.1:{port}/throttle\", caBundle: \"{ca}\"}}
  rules:
  - {{operations: [CREATE, UPDATE], apiGroups: [runtime.nirmata.io], apiVersions: [\"*\"], resources: [runtimepolicies/status]}}
  - {{operations: [CREATE, UPDATE], apiGroups: [openreports.io], apiVersions: [\"*\"], resources: [reports]}}
  - {{operations: [CREATE, UPDATE], apiGroups: [events.k8s.io, \"\"], apiVersions: [\"*\"], resources: [events]}}
",
            port = self.port
        )
    }
}

impl Drop for ThrottlingWebhook {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Answers the reviews of one connection (the API server keeps it alive).
fn serve(conn: TcpStream, config: Arc<rustls::ServerConfig>, counted: &AtomicU64) {
    let Ok(session) = rustls::ServerConnection::new(config) else {
        return;
    };
    // One reader for the connection's life: a request's bytes read ahead
    // stay for the next.
    let mut tls = BufReader::new(rustls::StreamOwned::new(session, conn));
    loop {
        let Some(body) = read_request(&mut tls) else {
            return;
        };
        let uid = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["request"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": uid,
                "allowed": false,
                "status": {
                    "code": 429,
                    "reason": "TooManyRequests",
                    "message": "faults: the server sheds load (issue 34, item 6)",
                },
            },
        })
        .to_string();
        counted.fetch_add(1, Ordering::SeqCst);
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{review}",
            review.len()
        );
        let out = tls.get_mut();
        if out.write_all(response.as_bytes()).is_err() || out.flush().is_err() {
            return;
        }
    }
}

/// One request's body (its headers read up to the blank line, then
/// Content-Length bytes); `None` at the end of the connection.
fn read_request(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}
