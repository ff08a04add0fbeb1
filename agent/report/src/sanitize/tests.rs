//! The text rules and the pipeline of [`sanitize`], case by case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

#[track_caller]
fn check(input: &str, want: &str) {
    assert_eq!(sanitize(input), want, "sanitize({input:?})");
    assert_eq!(sanitize(want), want, "idempotent on {want:?}");
}

#[test]
fn the_patterns_compile() {
    assert!(PATTERNS.is_some());
}

/// Idempotence and bounds over many combinations of tricky fragments,
/// including cuts at every position near the length limit.
#[test]
fn idempotent_and_bounded_on_mixed_input() {
    let fragments = [
        "token=",
        "--password ",
        "Authorization: Bearer ",
        "https://u:p@h/",
        "\"secret\": \"",
        "'",
        "}",
        " ",
        "\n",
        "\u{200B}",
        "é",
        "…",
        "***",
        "0123456789abcdef",
        "AbC9",
        "/usr/bin/",
        "=",
        ":",
        "-",
        "x",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "ghp_",
        "AKIAIOSFODNN7EXAMPLE",
        "eyJhbGciOiJIUzI1NiJ9.",
        "-----BEGIN RSA PRIVATE KEY-----",
        "-----END RSA PRIVATE KEY-----",
        "u:p@db",
        "@sha256:",
        "Cookie: ",
        "; ",
        "MYSQL_PWD=",
        "--key ",
        "client.pem",
        "Pwd=",
        "PWD=/",
        "\"",
    ];
    // A small deterministic generator (xorshift): no test dependency,
    // and a failure reproduces.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let len = (next() % 120) as usize;
        let input: String = (0..len)
            .map(|_| fragments[(next() % fragments.len() as u64) as usize])
            .collect();
        let once = sanitize(&input);
        assert!(once.chars().count() <= MAX_CHARS, "{input:?}");
        assert!(!once.contains('\n'), "{input:?}");
        assert_eq!(sanitize(&once), once, "not idempotent on {input:?}");
    }
}

#[test]
fn plain_values_pass_unchanged() {
    for s in [
        "/usr/bin/curl",
        "/usr/lib/x86_64-linux-gnu/libssl.so.3",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "10.0.0.1",
        "api.openai.azure.com",
        "tcp",
        "web-7d9f8b6c5d-x2x9z",
        "8d3f0c2e-1b2a-4c3d-9e8f-0a1b2c3d4e5f",
        "exec of /bin/sh was denied by the kernel (policy no-shell)",
    ] {
        check(s, s);
    }
}

#[test]
fn flags_naming_secrets_lose_their_values() {
    check(
        "mysql --password=hunter2 -h db",
        "mysql --password=*** -h db",
    );
    check(
        "mysql --password hunter2 -h db",
        "mysql --password *** -h db",
    );
    check("cli --token abc123 --verbose", "cli --token *** --verbose");
    check("cli --api-key=abc", "cli --api-key=***");
    check("cli --auth-token\tabc", "cli --auth-token ***");
    check(
        "cli --client-secret 'two words'",
        "cli --client-secret '***'",
    );
}

#[test]
fn key_values_naming_secrets_lose_their_values() {
    check("DB_PASSWORD=hunter2 other=1", "DB_PASSWORD=*** other=1");
    check("github_token=ghp_x&page=2", "github_token=***&page=2");
    check(r#"{"password": "p w"}"#, r#"{"password": "***"}"#);
    check(r#"password="unclosed"#, r#"password="***""#);
    check("Private_Key: abc", "Private_Key: ***");
    check("credentials=a,b", "credentials=***,b");
    check("passwd=", "passwd=");
}

#[test]
fn authorization_headers_keep_only_the_scheme() {
    check(
        "Authorization: Bearer eyJhbGciOi",
        "Authorization: Bearer ***",
    );
    check(
        "Authorization: Basic dXNlcjpwYXNz",
        "Authorization: Basic ***",
    );
    check("curl -H 'Bearer abc.def-ghi'", "curl -H 'Bearer ***'");
}

#[test]
fn url_userinfo_is_masked() {
    check(
        "https://user:pass@example.com/x?y=1",
        "https://***@example.com/x?y=1",
    );
    check(
        "git clone https://ghp_token@github.com/o/r",
        "git clone https://***@github.com/o/r",
    );
    check("postgres://u:p@db:5432", "postgres://***@db:5432");
}

#[test]
fn random_looking_runs_are_masked() {
    // AWS's documented example secret key: base64 with '/' inside.
    check("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", MASK);
    check(
        "curl -d 0123456789abcdef0123456789abcdef x",
        "curl -d *** x",
    );
    check(
        "/home/u/aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI/file",
        "/home/u/***/file",
    );
    // A JWT: masked whole by its shape, keeping `eyJ`.
    check(
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
            "eyJ***",
        );
    // Single-case long runs are words, not keys.
    check(
        "/opt/verylongdirectorynamewithoutcapitals123/bin",
        "/opt/verylongdirectorynamewithoutcapitals123/bin",
    );
}

#[test]
fn control_and_invisible_characters_cannot_forge_or_hide() {
    check("a\nb\rc\td\u{7}e", "a b c d e");
    check("line\u{2028}break", "line break");
    check("evil\u{202E}txt.exe", "eviltxt.exe");
    check("pass\u{200B}word=hunter2", "password=***");
}

#[test]
fn long_values_are_bounded_on_a_char_boundary() {
    let long = "é".repeat(1000);
    let out = sanitize(&long);
    assert_eq!(out.chars().count(), MAX_CHARS);
    assert!(out.ends_with('…'));
    assert_eq!(sanitize(&out), out);
    // 'x', not 'a': a long run of hex digits is masked as key material.
    let exact = "x".repeat(MAX_CHARS);
    assert_eq!(sanitize(&exact), exact);
    let over = "x".repeat(MAX_CHARS + 1);
    assert_eq!(sanitize(&over).chars().count(), MAX_CHARS);
}

#[test]
fn a_secret_is_masked_before_truncation_could_hide_its_key() {
    let input = format!("{} --password hunter2", "x ".repeat(200));
    assert!(!sanitize(&input).contains("hunter2"));
    let input = format!("--password {}", "hunter2".repeat(100));
    assert_eq!(sanitize(&input), "--password ***");
}

#[test]
fn pathological_input_is_cut_without_leaving_a_fragment() {
    // A masked key=value shrinks 16 KiB to a few bytes; the pre-cut
    // must not leave half of the following token behind.
    let token = "AbCdEfGh12345678AbCdEfGh12345678AbCd";
    let pad = "a".repeat(PRE_CUT_CHARS - 20);
    let input = format!("token={pad} {token}");
    let out = sanitize(&input);
    assert!(!out.contains("AbCd"), "{out}");
    let single = "x".repeat(PRE_CUT_CHARS * 2);
    assert_eq!(sanitize(&single), "");
}

#[test]
fn an_argv_masks_the_values_of_secret_flags_and_credentials() {
    let argv: Vec<String> = [
        "curl",
        "-u",
        "admin:hunter2",
        "--password",
        "hunter3",
        "--token=hunter4",
        "-H",
        "Authorization: Bearer hunter5",
        "sort",
        "-u",
        "file",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = super::sanitize_argv(&argv);
    let joined = out.join(" ");
    for secret in ["hunter2", "hunter3", "hunter4", "hunter5"] {
        assert!(!joined.contains(secret), "{secret}: {joined}");
    }
    assert_eq!(out[2], "admin:***");
    assert_eq!(out[4], "***");
    assert_eq!(out[10], "file", "-u without user:password is not masked");
    assert_eq!(super::sanitize_argv(&out), out, "idempotent");
}

/// Every row of the redaction table, exactly; every secret gone from the
/// argument vector and from the joined form a Report shows; idempotent.
#[test]
fn the_redaction_table() {
    let mut failures = Vec::new();
    for case in cases::CASES {
        let got = sanitize_argv(&case.argv());
        if got != case.redacted {
            failures.push(format!(
                "{}:\n  argv {:?}\n  want {:?}\n  got  {:?}",
                case.rule, case.argv, case.redacted, got
            ));
            continue;
        }
        assert_eq!(sanitize_argv(&got), got, "{}: not idempotent", case.rule);
        let joined = sanitize(&got.join(" "));
        for secret in case.secrets {
            assert!(!got.concat().contains(secret), "{}: {secret}", case.rule);
            assert!(
                !joined.contains(secret),
                "{}: {secret} in {joined}",
                case.rule
            );
        }
        if case.stays_readable() {
            assert_eq!(
                joined,
                case.argv.join(" "),
                "{}: the joined form",
                case.rule
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let masked = cases::CASES.iter().filter(|c| !c.stays_readable()).count();
    println!(
        "redaction table: {} rows, {masked} masked, {} readable, {} secrets",
        cases::CASES.len(),
        cases::CASES.len() - masked,
        cases::all_secrets().count()
    );
}

/// Idempotence, length and bounds of `sanitize_argv` over many argument
/// vectors mixed from program names, flags, values and shell lines.
#[test]
fn argv_is_idempotent_and_keeps_its_length_on_mixed_input() {
    let fragments = [
        "mysql",
        "docker",
        "login",
        "sshpass",
        "redis-cli",
        "AUTH",
        "openssl",
        "htpasswd",
        "-bc",
        "kubectl",
        "create",
        "secret",
        "set",
        "vault",
        "mc",
        "alias",
        "sqlplus",
        "curl",
        "smbclient",
        "sh",
        "-c",
        "--",
        "-p",
        "-pX",
        "-u",
        "-U",
        "-a",
        "-k",
        "-E",
        "--user",
        "--user=a:b",
        "--password",
        "--key",
        "--from-literal",
        "--from-literal=a=b",
        "a:b",
        "a%b",
        "u/p@db",
        "8080",
        "/etc/x.pem",
        "Authorization:",
        "Bearer",
        "password=",
        "***",
        "x y",
        "mysql -pX 'a b' && curl -u a:b",
        "\"$(sshpass -p x y)\"",
        "'unclosed",
        "MYSQL_PWD=x",
        "\u{200B}",
        "\n",
    ];
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let len = (next() % 10) as usize;
        let argv: Vec<String> = (0..len)
            .map(|_| {
                let parts = 1 + next() % 3;
                (0..parts)
                    .map(|_| fragments[(next() % fragments.len() as u64) as usize])
                    .collect::<Vec<_>>()
                    .join(if next() % 2 == 0 { " " } else { "" })
            })
            .collect();
        let once = sanitize_argv(&argv);
        assert_eq!(once.len(), argv.len(), "{argv:?}");
        for a in &once {
            assert!(a.chars().count() <= MAX_CHARS, "{argv:?}");
            assert!(!a.contains('\n'), "{argv:?}");
        }
        assert_eq!(sanitize_argv(&once), once, "not idempotent on {argv:?}");
    }
}

/// A nesting of shell command lines deeper than the argv rules follow, and
/// a long argument, still come out bounded and idempotent.
#[test]
fn deep_and_long_shell_lines_are_bounded() {
    let mut line = "mysql -pX".to_string();
    for _ in 0..10 {
        line = format!("sh -c {}", shell_quote(&line));
    }
    let argv = vec!["sh".to_string(), "-c".to_string(), line];
    let once = sanitize_argv(&argv);
    assert_eq!(sanitize_argv(&once), once);
    let long = vec!["sh".into(), "-c".into(), "a -p b ; ".repeat(5000)];
    let once = sanitize_argv(&long);
    assert!(once[2].chars().count() <= MAX_CHARS);
    assert_eq!(sanitize_argv(&once), once);
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The table as `docs/redaction.md` shows it.
fn rendered_table() -> String {
    fn shown(arg: &str) -> String {
        let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-*".contains(c);
        if !arg.is_empty() && arg.chars().all(plain) {
            return arg.to_string();
        }
        if arg.contains('\n') {
            let escaped = arg
                .replace('\\', r"\\")
                .replace('\'', r"\'")
                .replace('\n', r"\n");
            return format!("$'{escaped}'");
        }
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
    fn line(argv: &[&str]) -> String {
        let text: Vec<String> = argv.iter().map(|a| shown(a)).collect();
        format!("`{}`", text.join(" ").replace('|', r"\|"))
    }
    let mut out = String::from("| Rule | Command line | Reads as |\n|---|---|---|\n");
    for case in cases::CASES {
        let redacted = if case.stays_readable() {
            "(unchanged)".to_string()
        } else {
            line(case.redacted)
        };
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            case.rule,
            line(case.argv),
            redacted
        ));
    }
    out
}

/// `docs/redaction.md` shows the table the test above runs.
#[test]
fn the_docs_show_the_redaction_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/redaction.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let table = rendered_table();
    assert!(
        doc.contains(&table),
        "{path} does not show the redaction table as it is; replace its table with:\n\n{table}"
    );
}

/// An evaluator's error quoting an argument: what `sanitize_argv` masks in
/// the argument is masked in the error, whole or in part.
#[test]
fn a_text_quoting_argv_loses_what_argv_masks() {
    let argv: Vec<String> = [
        "mysql",
        "-p",
        "hunter2",
        "-pattached",
        "sh -c 'curl -u a:s3cret x'",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (text, want) in [
        ("No such key: hunter2", "No such key: ***"),
        ("bad value -pattached", "bad value -p***"),
        ("nothing of it here", "nothing of it here"),
        ("quoted s3cret", "quoted ***"),
        ("No such key: mysql", "No such key: mysql"),
    ] {
        assert_eq!(sanitize_with_argv(text, &argv), want, "{text}");
    }
    assert_eq!(sanitize_with_argv("token=x", &[]), "token=***");
}

/// Many arguments, many programs, many flags: the rules stay linear (a
/// quadratic walk would take minutes here).
#[test]
fn a_huge_argv_is_redacted_in_linear_time() {
    let argv: Vec<String> = (0..60_000)
        .map(|i| match i % 4 {
            0 => "mysql".to_string(),
            1 => "-p".to_string(),
            2 => "docker".to_string(),
            _ => "login".to_string(),
        })
        .collect();
    let started = std::time::Instant::now();
    let out = sanitize_argv(&argv);
    assert_eq!(out.len(), argv.len());
    assert_eq!(out[2], MASK, "the word after mysql's -p");
    println!("60,000 arguments in {:?}", started.elapsed());
}
