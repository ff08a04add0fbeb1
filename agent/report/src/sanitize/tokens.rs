//! Secrets recognized by their shape, wherever they stand: vendor tokens
//! with a published prefix, AWS access key ids, JWTs and PEM private key
//! blocks.
//!
//! A token keeps its prefix and loses the rest (`ghp_***`, `AKIA***`,
//! `eyJ***`): the prefix is public, and it tells a reader which kind of
//! credential to rotate. A private key block keeps its first armor line
//! and loses everything after it (`-----BEGIN RSA PRIVATE KEY-----***`):
//! its end line may be missing (an argument cut by the kernel), and a rule
//! that kept it could see it mangled by the next (a random run glued to
//! it), which would make masking twice differ from masking once.

use regex::{Captures, Regex};

/// Prefixes whose token body may be of any length: each is specific enough
/// that even a cut-off token behind it is a secret.
const OPEN_PREFIXES: &str = r"github_pat_|gh[pousr]_|glpat-|gldt-|glrt-|glptt-|glsoat-|xox[abposr]-|xapp-|sk_live_|sk_test_|rk_live_|rk_test_|dop_v1_|shpat_|shpss_|pypi-AgE";

/// The compiled shapes.
pub(super) struct Tokens {
    /// Vendor tokens, AWS key ids, JWTs; the prefix is group `prefix`.
    token: Regex,
    /// A PEM private key block (newlines already spaces).
    private_key: Regex,
}

impl Tokens {
    pub(super) fn compile() -> Option<Tokens> {
        let token = [
            // Open prefixes: GitHub, GitLab, Slack, Stripe, DigitalOcean,
            // Shopify, PyPI.
            format!(r"(?P<p1>{OPEN_PREFIXES})[A-Za-z0-9_\-]+"),
            // AWS access key ids (long-term, temporary, and the other
            // unique-id prefixes AWS documents).
            r"(?P<p2>AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z0-9]{16}\b"
                .to_string(),
            // Google API keys and OAuth access tokens; Vault tokens;
            // npm tokens; OpenAI/Anthropic-style `sk-` keys; SendGrid.
            r"(?P<p3>AIza)[A-Za-z0-9_\-]{30,}".to_string(),
            r"(?P<p4>ya29\.|hv[sbr]\.)[A-Za-z0-9_\-]{20,}".to_string(),
            r"(?P<p5>npm_)[A-Za-z0-9]{30,}".to_string(),
            r"(?P<p6>sk-)[A-Za-z0-9_\-]{20,}".to_string(),
            r"(?P<p7>SG\.)[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}".to_string(),
            // A JWT (or its first part): `{"` in base64url is `eyJ`.
            r"(?P<p8>eyJ)[A-Za-z0-9_\-]{8,}(?:\.[A-Za-z0-9_\-]*){0,2}".to_string(),
        ]
        .join("|");
        Some(Tokens {
            token: Regex::new(&format!(r"\b(?:{token})")).ok()?,
            private_key: Regex::new(
                r"(?P<begin>-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)(?s:.*)",
            )
            .ok()?,
        })
    }

    /// Masks every token shape in `input`.
    pub(super) fn mask(&self, input: &str) -> String {
        let keys = self.private_key.replace_all(input, |c: &Captures<'_>| {
            format!("{}{}", &c["begin"], super::MASK)
        });
        self.token
            .replace_all(&keys, |c: &Captures<'_>| {
                let prefix = (1..=8)
                    .find_map(|i| c.name(&format!("p{i}")))
                    .map_or("", |m| m.as_str());
                format!("{prefix}{}", super::MASK)
            })
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn mask(s: &str) -> String {
        Tokens::compile().unwrap().mask(s)
    }

    #[test]
    fn tokens_keep_their_prefix() {
        for (input, want) in [
            ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "ghp_***"),
            ("gho_16C7e42F292c6912E7710c838347Ae178B4a", "gho_***"),
            ("github_pat_11ABCDEFG0abcdefghij_klmnop", "github_pat_***"),
            ("glpat-xxxxxxxxxxxxxxxxxxxx", "glpat-***"),
            ("xoxb-123-456-abc", "xoxb-***"),
            ("xoxp-123-456-abc", "xoxp-***"),
            ("id=AKIAIOSFODNN7EXAMPLE,", "id=AKIA***,"),
            ("AIzaSyA1234567890abcdefghijklmnopqrstu", "AIza***"),
            ("hvs.CAESIJ1234567890abcdefghij", "hvs.***"),
            ("sk-proj-abcdefghijklmnopqrstuvwx", "sk-***"),
            ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-nat_ure", "eyJ***"),
        ] {
            assert_eq!(mask(input), want, "{input}");
            assert_eq!(mask(want), want, "idempotent on {want}");
        }
    }

    #[test]
    fn private_key_blocks_keep_their_first_line() {
        let block =
            "-----BEGIN RSA PRIVATE KEY----- MIIEpAIBAAKCAQEA -----END RSA PRIVATE KEY----- after";
        let want = "-----BEGIN RSA PRIVATE KEY-----***";
        assert_eq!(mask(block), want);
        assert_eq!(mask(want), want);
        // Cut before its end line: masked to the end.
        assert_eq!(
            mask("-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXkt"),
            "-----BEGIN OPENSSH PRIVATE KEY-----***"
        );
    }

    #[test]
    fn look_alikes_stay() {
        for s in [
            "task-1234567890abcdefghijklmnop",
            "AKIA",
            "eyJ",
            "npm_config_cache=/tmp",
            "skip-ghp_", // no body
            "ASIAN-FOOD",
            "-----BEGIN CERTIFICATE-----",
        ] {
            assert_eq!(mask(s), s);
        }
    }
}
