//! `kyverno-runtime policy check` on values that can never match: refused
//! with the rule they break, or accepted with a warning naming what they
//! really are; and a misplaced `"*"` does not hide the list's other errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn check(yaml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["policy", "check"])
        .arg(&file)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

const HEAD: &str = "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata: {name: p}\nspec:\n  mode: monitor\n  behaviors:\n";

#[test]
fn numbers_the_c_library_reads_as_an_address_are_not_names() {
    let (ok, out) = check(&format!(
        "{HEAD}  - network: {{deny: {{values: [\"0x7f.0.0.1\", \"127.1\", \"0177.0.0.1\", \"2130706433\", \"0xcafe.example\"]}}}}\n\
         \x20 - dns: {{allow: {{values: [\"0x7f.0.0.1\", \"1.0.0.127.in-addr.arpa\"]}}}}\n"
    ));
    assert!(!ok, "{out}");
    for value in ["0x7f.0.0.1", "127.1", "0177.0.0.1", "2130706433"] {
        assert!(
            out.contains(&format!(
                "error: spec.behaviors[0].network.deny: \"{value}\" is not programmed: is IPv4 shorthand: the C library (inet_aton, as curl, ping and getaddrinfo use it) reads it as 127.0.0.1"
            )),
            "{value}: {out}"
        );
    }
    assert!(
        out.contains(
            "error: spec.behaviors[1].dns.allow: \"0x7f.0.0.1\" is an address, not a name"
        ),
        "{out}"
    );
    assert!(!out.contains("\"0xcafe.example\" is"), "{out}");
    assert!(!out.contains("\"1.0.0.127.in-addr.arpa\" is"), "{out}");
}

#[test]
fn paths_with_control_bidi_or_trailing_space_are_refused_and_printed_escaped() {
    let (ok, out) = check(&format!(
        "{HEAD}  - open: {{deny: {{values: [\"/etc/shadow\\n\", \"/etc/passwd \", \"/tmp/x\\u202Ehs.exe\", \"/srv/my files\"]}}}}\n"
    ));
    assert!(!ok, "{out}");
    for want in [
        "\"/etc/shadow\\n\" contains the control character U+000A",
        "\"/etc/passwd \" ends with whitespace (U+0020)",
        "\"/tmp/x\\u{202e}hs.exe\" contains the bidirectional control U+202E",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    // The list itself is printed escaped: no raw newline or override.
    assert!(!out.contains('\u{202E}'), "{out}");
    assert!(
        out.contains("    deny:  \"/etc/shadow\\n\", /etc/passwd , \"/tmp/x\\u{202e}hs.exe\", /srv/my files\n"),
        "{out}"
    );
}

#[test]
fn values_that_cannot_match_as_written_are_warnings_not_errors() {
    let (ok, out) = check(&format!(
        "{HEAD}  - network: {{deny: {{values: [\"10.0.0.1/8\", \"10.0.0.0/8\"]}}}}\n\
         \x20 - exec: {{deny: {{values: [\"/proc/self/exe\", \"/bin/sh\"]}}}}\n\
         \x20 - open: {{deny: {{values: [\"/dev/stdin\", \"/proc/42/root/etc/shadow\"]}}}}\n"
    ));
    assert!(ok, "a warning does not fail the check: {out}");
    for want in [
        "    warning: spec.behaviors[0].network.deny: \"10.0.0.1/8\" has host bits set: it is the network 10.0.0.0/8, which is what is programmed and matched; write 10.0.0.0/8, or the one address alone\n",
        "    warning: spec.behaviors[1].exec.deny: \"/proc/self/exe\" goes through /proc/self, a link the kernel resolves before the exec or open hook sees the path",
        "    warning: spec.behaviors[2].open.deny: \"/dev/stdin\" goes through /dev/stdin,",
        "    warning: spec.behaviors[2].open.deny: \"/proc/42/root/etc/shadow\" goes through /proc/<pid>/root,",
        "  ok\n",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert_eq!(out.matches("warning:").count(), 4, "{out}");
}

/// A `"*"` in allow (here from an expression, which admission cannot see)
/// keeps the behavior from being programmed; every other bad value of the
/// behavior is still reported.
#[test]
fn a_star_error_does_not_hide_the_other_errors() {
    let (ok, out) = check(&format!(
        "{HEAD}  - exec:\n      allow: {{values: [\"bin/rel\"], expression: \"['*']\"}}\n      deny: {{values: [\"curl\", \"/etc/\", \"/bin/sh\"]}}\n"
    ));
    assert!(!ok, "{out}");
    for want in [
        "error: spec.behaviors[0].exec.allow.values[1]: \"*\" is only meaningful in deny",
        "error: spec.behaviors[0].exec.allow.values[0]: \"bin/rel\" is not an absolute path",
        "error: spec.behaviors[0].exec.deny.values[0]: \"curl\" is not an absolute path",
        "error: spec.behaviors[0].exec.deny.values[1]: \"/etc/\" ends with /",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert_eq!(out.matches("error:").count(), 4, "{out}");
}

/// Issue 33: an explicit deny beside a default deny, in another behavior of
/// the kind or in the same list, is accepted and kept in the merged list
/// `policy check` prints (the merge used to drop it without a word).
#[test]
fn an_explicit_deny_beside_a_default_deny_is_kept_in_the_printed_lists() {
    let (ok, out) = check(&format!(
        "{HEAD}  - network:\n      allow: {{values: [\"10.50.0.0/16\"]}}\n      deny: {{values: [\"*\"]}}\n  - network:\n      deny: {{values: [\"10.50.0.9\"]}}\n  - exec:\n      allow: {{values: [\"/usr/bin/curl\"]}}\n      deny: {{values: [\"*\", \"/usr/bin/wget\", \"*\"]}}\n"
    ));
    assert!(ok, "{out}");
    for want in [
        "  spec.behaviors[0].network\n    allow: 10.50.0.0/16\n    deny:  *, 10.50.0.9\n",
        "  spec.behaviors[2].exec\n    allow: /usr/bin/curl\n    deny:  *, /usr/bin/wget\n",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert!(!out.contains("error:"), "{out}");
}
