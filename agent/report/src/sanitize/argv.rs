//! The argv rules: what an argument vector tells that a single string does
//! not. Applied by [`sanitize_argv`](super::sanitize_argv) before the text
//! rules, which then run on every argument as well.
//!
//! - **Generic** (every program): the argument after a flag whose name
//!   names a secret (`--password X`, `-storepass X`, `--key X`; see
//!   [`names`](super::names)) is masked whole, whatever it looks like; so
//!   is the argument after a secret key with its value split off
//!   (`password:` `X`) and after a bare auth scheme (`Bearer` `X`).
//! - **Program rules** ([`programs`](super::programs)): short flags whose
//!   meaning depends on the program (`-p` of mysql, sshpass, `docker
//!   login`; `-a` of redis-cli; `-k` of openssl; ...), credentials in
//!   `user:password` form, and positional secrets.
//! - **Shell command lines**: an argument holding whitespace is also read
//!   as a shell command line ([`shell`](super::shell)), and each command in
//!   it gets these same rules (`sh -c "mysql -pX"`, `ssh host "..."`,
//!   `su -c "..."`), down to [`MAX_DEPTH`] levels of nesting.

use super::{programs, shell, MASK};

/// How deep shell command lines nest before only the text rules apply.
pub(super) const MAX_DEPTH: usize = 4;

/// The masking decided for an argument vector: arguments masked whole, and
/// arguments rewritten in part (`-p***`, `admin:***`).
pub(super) struct Edits {
    out: Vec<String>,
    whole: Vec<bool>,
    partial: Vec<bool>,
}

impl Edits {
    fn new(argv: &[String]) -> Edits {
        Edits {
            out: argv.to_vec(),
            whole: vec![false; argv.len()],
            partial: vec![false; argv.len()],
        }
    }

    /// Masks argument `i` (if there is one) whole.
    pub(super) fn mask_whole(&mut self, i: usize) {
        if let Some(slot) = self.out.get_mut(i) {
            *slot = MASK.to_string();
            self.whole[i] = true;
        }
    }

    /// Rewrites argument `i` to `text`. A second rewrite of the same
    /// argument by another rule masks it whole: either rule saw a secret,
    /// and neither rewrite alone keeps the other's out.
    pub(super) fn rewrite(&mut self, i: usize, text: String) {
        if i >= self.out.len() || self.whole[i] {
            return;
        }
        if self.partial[i] && self.out[i] != text {
            self.mask_whole(i);
            return;
        }
        self.out[i] = text;
        self.partial[i] = true;
    }
}

/// The argv rules over `argv` (already cleaned of control characters),
/// `depth` levels of shell command lines deep.
pub(super) fn mask_words(argv: &[String], depth: usize) -> Vec<String> {
    let mut edits = Edits::new(argv);
    generic(argv, &mut edits);
    programs::apply(argv, &mut edits);
    let Edits { mut out, whole, .. } = edits;
    if depth < MAX_DEPTH {
        for (arg, masked) in out.iter_mut().zip(whole) {
            if !masked && arg.contains(char::is_whitespace) {
                *arg = shell::mask_line(arg, |words| mask_words(words, depth + 1));
            }
        }
    }
    out
}

/// The generic rules (see the module docs).
fn generic(argv: &[String], edits: &mut Edits) {
    use super::names::{classify, reads_as_key_file, Form, Secrecy};
    for (i, arg) in argv.iter().enumerate() {
        if let Some(name) = flag_name(arg) {
            let masks = match classify(name) {
                Secrecy::Plain => false,
                Secrecy::KeyLike => argv.get(i + 1).is_some_and(|v| !reads_as_key_file(v)),
                Secrecy::Secret => true,
            };
            if masks && !arg.contains('=') {
                edits.mask_whole(i + 1);
            }
        }
        // A key whose value is the next argument: `password:` `X`,
        // `--token=` `X`.
        let trimmed = arg.trim_end();
        if let Some(key) = trimmed.strip_suffix(['=', ':']) {
            let key = key.trim_end().trim_matches(['"', '\'']);
            let form = if trimmed.ends_with('=') {
                Form::Assignment
            } else {
                Form::Colon
            };
            let key = key.rsplit(char::is_whitespace).next().unwrap_or(key);
            // A scheme after the key (`Authorization:` `Bearer` `X`) is
            // kept; the scheme rule below masks what follows it.
            let scheme_next = argv.get(i + 1).is_some_and(|n| is_scheme(n));
            if classify(key).masks(form) && !scheme_next {
                edits.mask_whole(i + 1);
            }
        }
        // An auth scheme whose credentials are the next argument.
        if is_scheme(trimmed.rsplit(char::is_whitespace).next().unwrap_or("")) {
            edits.mask_whole(i + 1);
        }
    }
}

/// An HTTP auth scheme whose credentials follow it.
fn is_scheme(word: &str) -> bool {
    ["bearer", "basic", "digest", "negotiate"]
        .iter()
        .any(|s| word.eq_ignore_ascii_case(s))
}

/// The name of a flag argument (`--password`, `-p`, `-storepass`, `--user`
/// of `--user=x`) without its value, or `None` when `arg` is not a flag
/// (`-`, `--`, a word).
pub(super) fn flag_name(arg: &str) -> Option<&str> {
    if !arg.starts_with('-') || arg == "-" || arg == "--" {
        return None;
    }
    Some(arg.split('=').next().unwrap_or(arg))
}
