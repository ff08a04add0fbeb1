//! Which names name a secret: flag names (`--password`, `-storepass`),
//! assignment keys (`MYSQL_PWD=`, `Pwd=`), header and JSON keys
//! (`Authorization:`, `"api_key":`).
//!
//! A name is split into lower-case words at separators and camelCase
//! boundaries (`keyStorePassword` → `key store password`), then:
//!
//! - it is a **secret** name when its words, joined, contain `password`,
//!   `passwd`, `passphrase`, `secret`, `token`, `apikey`, `accesskey`,
//!   `privatekey`, `credential`, `authorization`, `cookie`, `bearer`, or
//!   `pwd`; or one word contains `pass` (`-passin`, `storepass`) or `auth`
//!   (`basicauth`, `--auth`), or is `creds`/`cred`;
//! - it is **key-like** when, short of that, a word is `key` or ends in
//!   `key` (`--key`, `AccountKey`), or is `pw`, `sig` or `signature`; the
//!   value of a key-like name stays when it names a key file
//!   ([`reads_as_key_file`]: `--key /etc/tls/client.key`, `-inkey tls.pem`);
//! - either way it is **not** a secret name when its last word says the
//!   value only points at the secret (`--password-file`, `TOKEN_PATH`,
//!   `--secret-name`, `--password-stdin`: file, path, dir, env, name, url,
//!   stdin, ...) or describes it (`--key-type`, `--key-size`), or its first
//!   word negates or prompts (`--no-password`, `--ask-pass`);
//! - the few words that contain `pass` or `auth` without meaning a secret
//!   (bypass, passive, passthrough, compass, author, authority) do not
//!   count.
//!
//! A secret name masks its value in every form (`--flag value`,
//! `--flag=value`, `KEY=value`, `Name: value`, `"name": "value"`); a
//! key-like name only in the forms a program is configured through
//! (`--key value`, `--key=value`, `KEY=value`), not in `name: value`,
//! which in prose ("no such key: x") is rarely a secret.

/// Whether a value given to a key-like name (`--key`, `-inkey`) names
/// the file holding the key rather than being the key: a plain path (`/`,
/// `./`, `../`, `~/`) or file name with a key or certificate extension
/// (`client.key`, `tls.pem`, `store.p12`), of letters, digits and `._-~+/*`
/// only (`*`: a glob, or a run masked already). A secret name's value is
/// masked whatever it looks like.
pub(crate) fn reads_as_key_file(value: &str) -> bool {
    const EXTENSIONS: [&str; 10] = [
        ".key", ".pem", ".crt", ".cer", ".der", ".p12", ".pfx", ".jks", ".asc", ".gpg",
    ];
    let value = value.trim_matches(['"', '\'']);
    if !value
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '.' | '/' | '_' | '-' | '~' | '+' | '*'))
    {
        // `Pwd=client.pem`, `u:p@db.pem`: not a plain file name.
        return false;
    }
    ["/", "./", "../", "~/"]
        .iter()
        .any(|p| value.starts_with(p))
        || EXTENSIONS
            .iter()
            .any(|e| value.len() > e.len() && value.to_ascii_lowercase().ends_with(e))
}

/// How a name relates to a secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Secrecy {
    /// An ordinary name.
    Plain,
    /// `key`, `pw`, `sig`: a secret as a flag or assignment, not in prose.
    KeyLike,
    /// A secret in every form.
    Secret,
}

impl Secrecy {
    /// Whether a value given to this name in `form` is masked.
    pub(crate) fn masks(self, form: Form) -> bool {
        match self {
            Secrecy::Plain => false,
            Secrecy::KeyLike => form == Form::Assignment,
            Secrecy::Secret => true,
        }
    }
}

/// The form a name is given its value in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// `--flag value`, `--flag=value`, `KEY=value`.
    Assignment,
    /// `Name: value`, `"name": "value"`.
    Colon,
}

/// Joined words containing one of these name a secret.
const SECRET_PARTS: [&str; 13] = [
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "credential",
    "authorization",
    "cookie",
    "bearer",
    "pwd",
];

/// Words containing `pass` or `auth` that do not mean a secret.
const INNOCENT_WORDS: [&str; 10] = [
    "bypass",
    "passive",
    "passthrough",
    "passthru",
    "compass",
    "author",
    "authors",
    "authored",
    "authority",
    "authorities",
];

/// A last word that makes the value a reference to the secret or a
/// description of it, not the secret itself.
const REFERENCE_WORDS: [&str; 22] = [
    "file",
    "files",
    "path",
    "dir",
    "directory",
    "jar",
    "stdin",
    "env",
    "name",
    "names",
    "type",
    "size",
    "bits",
    "length",
    "ttl",
    "url",
    "uri",
    "endpoint",
    "method",
    "mode",
    "helper",
    "command",
];

/// A first word that makes the flag a switch, not a holder of the secret.
const SWITCH_WORDS: [&str; 3] = ["no", "ask", "prompt"];

/// Words ending in `key` that are not keys.
const NOT_KEYS: [&str; 6] = ["monkey", "hockey", "turkey", "jockey", "donkey", "whiskey"];

/// How `name` (a flag with its dashes, a key, a header name) relates to a
/// secret; see the module docs.
pub(crate) fn classify(name: &str) -> Secrecy {
    let words = words(name.trim_start_matches('-'));
    let (Some(first), Some(last)) = (words.first(), words.last()) else {
        return Secrecy::Plain;
    };
    if words.len() > 1 && REFERENCE_WORDS.contains(&last.as_str()) {
        return Secrecy::Plain;
    }
    if words.len() > 1 && SWITCH_WORDS.contains(&first.as_str()) {
        return Secrecy::Plain;
    }
    let counted: Vec<&str> = words
        .iter()
        .map(String::as_str)
        .filter(|w| !INNOCENT_WORDS.contains(w))
        .collect();
    let joined: String = counted.concat();
    let secret = SECRET_PARTS.iter().any(|p| joined.contains(p))
        || counted
            .iter()
            .any(|w| w.contains("pass") || w.contains("auth") || matches!(*w, "creds" | "cred"));
    if secret {
        return Secrecy::Secret;
    }
    let key_like = counted.iter().any(|w| {
        (w.ends_with("key") && !NOT_KEYS.contains(w)) || matches!(*w, "pw" | "sig" | "signature")
    });
    if key_like {
        Secrecy::KeyLike
    } else {
        Secrecy::Plain
    }
}

/// `name` in lower-case words: split at anything not alphanumeric and at
/// camelCase boundaries (`AWSSecretKey` → `aws secret key`).
fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let chars: Vec<char> = name.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            continue;
        }
        if c.is_uppercase() && !word.is_empty() {
            let previous = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if previous.is_lowercase()
                || previous.is_ascii_digit()
                || (previous.is_uppercase() && next_is_lower)
            {
                out.push(std::mem::take(&mut word));
            }
        }
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_at_separators_and_camel_case() {
        assert_eq!(words("keyStorePassword"), ["key", "store", "password"]);
        assert_eq!(words("AWSSecretKey"), ["aws", "secret", "key"]);
        assert_eq!(words("MYSQL_PWD"), ["mysql", "pwd"]);
        assert_eq!(words("x-api-key"), ["x", "api", "key"]);
        assert_eq!(
            words("//registry/:_authToken"),
            ["registry", "auth", "token"]
        );
    }

    #[test]
    fn secret_names() {
        for name in [
            "--password",
            "--pwd",
            "MYSQL_PWD",
            "Pwd",
            "PGPASSWORD",
            "-storepass",
            "-passin",
            "--pass",
            "--basicauth",
            "Authorization",
            "Proxy-Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "X-Auth-Token",
            "PRIVATE-TOKEN",
            "api_key",
            "aws_secret_access_key",
            "client-secret",
            "--creds",
            "--oauth2-bearer",
            "keyStorePassword",
        ] {
            assert_eq!(classify(name), Secrecy::Secret, "{name}");
        }
    }

    #[test]
    fn key_like_names() {
        for name in ["--key", "AccountKey", "sig", "X-Amz-Signature", "-pw"] {
            let got = classify(name);
            assert!(got != Secrecy::Plain, "{name}: {got:?}");
        }
        assert_eq!(classify("--key"), Secrecy::KeyLike);
        assert!(!Secrecy::KeyLike.masks(Form::Colon));
        assert!(Secrecy::KeyLike.masks(Form::Assignment));
    }

    #[test]
    fn plain_names() {
        for name in [
            "--password-file",
            "TOKEN_PATH",
            "--secret-name",
            "--password-stdin",
            "--key-type",
            "--no-password",
            "--ask-pass",
            "--author",
            "--authority",
            "--bypass-cache",
            "--passive",
            "-keystore",
            "--port",
            "-p",
            "--user",
            "--keyboard",
            "monkey",
            "PWD-file",
            "",
            "--",
        ] {
            assert_eq!(classify(name), Secrecy::Plain, "{name}");
        }
    }
}
