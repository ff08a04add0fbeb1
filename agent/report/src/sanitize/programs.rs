//! Program rules: flags and arguments whose meaning depends on the program.
//!
//! A program is recognized by the base name of any argument that is not a
//! flag (`/usr/bin/mysql`, the `mysql` of `kubectl exec db -- mysql`), and
//! its rules hold from there to the end of the argument vector. An
//! argument that merely equals a program's name (`--host mysql`) turns its
//! rules on too: that can only mask more.
//!
//! - **Short flags that take a password**, listed in [`PASSWORD_FLAGS`]:
//!   `mysql -pX` / `-p X`, `sshpass -p X`, `docker login -p X`,
//!   `redis-cli -a X`, `openssl -k X`, `ldapsearch -w X`, `sqlcmd -P X`,
//!   ... The value is masked attached (`-p***`) or as the next argument.
//! - **`-p` of any other program** is masked too, unless the value reads
//!   as a port, a number or a path (`-p 8080`, `-p 127.0.0.1:80:80/tcp`,
//!   `-p /run/app.pid`), or the program is one known to use `-p` for
//!   something else and to run no other program ([`P_IS_NOT_A_PASSWORD`]:
//!   `mkdir -p build`, `cp -p a b`), or the next argument is a flag.
//!   Programs that run others (`sudo`, `env`, `nohup`, ...) are looked
//!   through to the program they run.
//! - **Credentials `user:password`** after `-u`, `-U`, `--user`,
//!   `--proxy-user` (curl, etcdctl, and any program: `-u admin:***`),
//!   `-a`/`--auth` of httpie, `-E`/`--cert file:password` of curl; the
//!   user stays. `user%password` for the Samba tools, `user,password` for
//!   lftp. A numeric `uid:gid` stays.
//! - **Positional secrets**: `htpasswd -b file user PASSWORD`, `kubectl
//!   create secret ... --from-literal=key=***`, the value after a secret
//!   key given to `set`/`config` (`aws configure set
//!   aws_secret_access_key ***`, `npm config set //r/:_authToken ***`),
//!   `vault login ***`, `redis-cli AUTH ***`, `mc alias set NAME URL ***
//!   ***`, `sqlplus user/***@db`.

use super::argv::{flag_name, Edits};
use super::names::{classify, Secrecy};
use super::MASK;

/// How a program's short flag takes its secret value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takes {
    /// Attached (`-pX`) or the next argument, whatever it looks like.
    Required,
    /// Attached, or the next argument unless that is a flag (`mysql -p`
    /// alone prompts; masking the word after it errs safe).
    Optional,
    /// Attached only (`7z -pX`: a bare `-p` prompts, and the next argument
    /// is the archive).
    AttachedOnly,
}

/// Programs whose short flags take a password.
struct PasswordFlags {
    programs: &'static [&'static str],
    /// Only after this subcommand (`docker login`, `az login`).
    after: Option<&'static str>,
    flags: &'static [(char, Takes)],
}

use Takes::{AttachedOnly, Optional, Required};

/// The programs whose short flags take a password. `-p` of a program not
/// listed here is judged by its value (see the module docs).
const PASSWORD_FLAGS: &[PasswordFlags] = &[
    PasswordFlags {
        programs: &[
            "mysql",
            "mysqldump",
            "mysqladmin",
            "mysqlimport",
            "mysqlcheck",
            "mysqlshow",
            "mysqlslap",
            "mysqlpump",
            "mysqlbinlog",
            "mysqlsh",
            "mysql_upgrade",
            "mariadb",
            "mariadb-dump",
            "mariadb-admin",
            "mariadb-import",
            "mariadb-check",
            "mariadb-show",
            "mariadb-slap",
            "mariadb-binlog",
            "mariadb-upgrade",
        ],
        after: None,
        flags: &[('p', Optional)],
    },
    PasswordFlags {
        programs: &[
            "sshpass",
            "mongo",
            "mongosh",
            "mongodump",
            "mongorestore",
            "mongoexport",
            "mongoimport",
            "mongostat",
            "mongotop",
            "mongofiles",
            "useradd",
            "usermod",
            "ncftp",
            "ncftpget",
            "ncftpput",
            "ncftpls",
            "hydra",
        ],
        after: None,
        flags: &[('p', Required)],
    },
    PasswordFlags {
        programs: &[
            "docker", "podman", "nerdctl", "buildah", "skopeo", "oras", "helm", "crane", "regctl",
            "finch", "az",
        ],
        after: Some("login"),
        flags: &[('p', Required)],
    },
    PasswordFlags {
        programs: &["redis-cli", "keydb-cli", "valkey-cli"],
        after: None,
        flags: &[('a', Required)],
    },
    PasswordFlags {
        programs: &[
            "ldapsearch",
            "ldapadd",
            "ldapmodify",
            "ldapdelete",
            "ldapmodrdn",
            "ldapcompare",
            "ldapwhoami",
            "ldapexop",
        ],
        after: None,
        flags: &[('w', Required)],
    },
    PasswordFlags {
        programs: &["ldappasswd"],
        after: None,
        flags: &[('w', Required), ('s', Required), ('a', Required)],
    },
    PasswordFlags {
        programs: &["openssl"],
        after: None,
        flags: &[('k', Required), ('K', Required)],
    },
    PasswordFlags {
        programs: &[
            "sqlcmd",
            "bcp",
            "osql",
            "zip",
            "zipcloak",
            "unzip",
            "mosquitto_pub",
            "mosquitto_sub",
            "mosquitto_rr",
        ],
        after: None,
        flags: &[('P', Required)],
    },
    PasswordFlags {
        programs: &["ssh-keygen"],
        after: None,
        flags: &[('N', Required), ('P', Required)],
    },
    PasswordFlags {
        programs: &["7z", "7za", "7zr", "7zz", "rar", "unrar"],
        after: None,
        flags: &[('p', AttachedOnly)],
    },
    PasswordFlags {
        // `-b name=value` is a cookie (a bare file name is a cookie jar,
        // masked too: it cannot be told from a cookie without `=`).
        programs: &["curl"],
        after: None,
        flags: &[('b', Required)],
    },
    PasswordFlags {
        programs: &["influx"],
        after: None,
        flags: &[('t', Required)],
    },
];

/// Programs whose `-p` is known not to be a password (a switch, a PID, a
/// prefix, a patch level) and which run no other program, so a `-p`
/// after them is theirs.
pub(super) const P_IS_NOT_A_PASSWORD: &[&str] = &[
    "mkdir", "cp", "ls", "tar", "bsdtar", "cpio", "rsync", "scp", "patch", "install", "git",
    "openssl", "curl", "wget", "ps", "top", "htop", "netstat", "lsof", "sysctl", "unzip",
];

/// Programs that run the program named after them (and their own flags),
/// looked through when finding whose `-p` it is.
const WRAPPERS: &[&str] = &[
    "env",
    "sudo",
    "doas",
    "nohup",
    "nice",
    "ionice",
    "timeout",
    "stdbuf",
    "setsid",
    "exec",
    "time",
    "command",
    "tini",
    "dumb-init",
    "gosu",
    "su-exec",
];

/// The Samba tools, whose `-U` takes `user%password`.
const SAMBA: &[&str] = &[
    "smbclient",
    "rpcclient",
    "smbcacls",
    "smbget",
    "smbmap",
    "net",
];

/// Oracle tools taking `user/password@db` as an argument.
const ORACLE: &[&str] = &["sqlplus", "rman", "expdp", "impdp", "exp", "imp", "sqlldr"];

/// The base name of a program argument (`/usr/bin/mysql` → `mysql`).
fn base_name(arg: &str) -> &str {
    arg.rsplit('/').next().unwrap_or(arg)
}

/// `NAME=value`, as a shell reads an assignment before a command.
fn is_assignment(arg: &str) -> bool {
    match arg.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// A value `-p` of an unknown program may keep: a port, a number, a port
/// mapping (`8080`, `8080:80`, `127.0.0.1:8080:80/tcp`, `[::1]:80`), or a
/// path (`/run/x.pid`, `./x`, `../x`, `~/x`).
fn reads_as_port_or_path(value: &str) -> bool {
    if ["/", "./", "../", "~/"]
        .iter()
        .any(|p| value.starts_with(p))
    {
        return true;
    }
    let core = ["/tcp", "/udp", "/sctp"]
        .iter()
        .find_map(|s| value.strip_suffix(s))
        .unwrap_or(value);
    !core.is_empty()
        && core.chars().any(|c| c.is_ascii_digit())
        && core
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | ':' | '-' | '[' | ']'))
}

/// A user id and group id, `1000:1000`.
fn is_uid_gid(value: &str) -> bool {
    match value.split_once(':') {
        Some((u, g)) => {
            !u.is_empty()
                && !g.is_empty()
                && u.bytes().all(|b| b.is_ascii_digit())
                && g.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// `value` with what follows the first of `separators` masked
/// (`admin:hunter2` → `admin:***`), or `None` when it holds none.
fn mask_after(value: &str, separators: &[char]) -> Option<String> {
    let at = value.find(separators)?;
    let (user, rest) = value.split_at(at);
    let sep = rest.chars().next()?;
    Some(format!("{user}{sep}{MASK}"))
}

/// What the walk over an argument vector has seen so far.
#[derive(Default)]
struct Seen {
    /// Password flags in force (their programs appeared).
    flags: Vec<&'static PasswordFlags>,
    /// Programs waiting for their subcommand (`docker` before `login`).
    waiting: Vec<&'static PasswordFlags>,
    /// The program whose `-p` a `-p` here would be, when found.
    owner: Option<String>,
    curl: bool,
    samba: bool,
    lftp: bool,
    httpie: bool,
    /// Where `htpasswd` stood, and whether a `-b` followed.
    htpasswd: Option<usize>,
    htpasswd_batch: bool,
    /// `kubectl` (or `oc`), then `create`, then `secret`.
    kube: u8,
    /// A `set`/`config`/`configure` word appeared.
    setter: bool,
    vault: bool,
    vault_login: bool,
    redis: bool,
    redis_auth: bool,
    /// `mc`, then `alias set`/`host add`, then how many positionals since.
    mc: u8,
    mc_positionals: usize,
    /// An Oracle tool appeared; its first `user/password` is not yet seen.
    oracle: bool,
}

/// Applies every program rule to `argv`.
pub(super) fn apply(argv: &[String], edits: &mut Edits) {
    let mut seen = Seen::default();
    let mut i = 0;
    while i < argv.len() {
        let arg = argv[i].as_str();
        if arg == "--" {
            // What follows is a command of its own (`kubectl exec pod --
            // mkdir -p x`): its `-p` is its program's.
            seen.owner = None;
            i += 1;
            continue;
        }
        match flag_name(arg) {
            None => positional(argv, i, &mut seen, edits),
            Some(name) => flag(argv, i, name, &mut seen, edits),
        }
        i += 1;
    }
    if let (Some(at), true) = (seen.htpasswd, seen.htpasswd_batch) {
        // `htpasswd -b[c] file user password`, `htpasswd -nb user
        // password`: the password is the last argument.
        if let Some(last) = (at + 1..argv.len())
            .rev()
            .find(|&j| flag_name(&argv[j]).is_none())
        {
            edits.mask_whole(last);
        }
    }
}

/// A word that is not a flag: a program, a subcommand, a value.
fn positional(argv: &[String], i: usize, seen: &mut Seen, edits: &mut Edits) {
    let arg = argv[i].as_str();
    let base = base_name(arg);
    // Each list holds a program's rules once, however often it appears, so
    // the walk stays linear in the arguments.
    fn add(list: &mut Vec<&'static PasswordFlags>, rules: &'static PasswordFlags) {
        if !list.iter().any(|r| std::ptr::eq(*r, rules)) {
            list.push(rules);
        }
    }
    for rules in PASSWORD_FLAGS {
        if rules.programs.contains(&base) {
            match rules.after {
                None => add(&mut seen.flags, rules),
                Some(_) => add(&mut seen.waiting, rules),
            }
        }
    }
    let ready: Vec<&'static PasswordFlags> = seen
        .waiting
        .iter()
        .copied()
        .filter(|r| r.after == Some(arg))
        .collect();
    for rules in ready {
        add(&mut seen.flags, rules);
    }
    if seen.owner.is_none()
        && !is_assignment(arg)
        && !arg.bytes().all(|b| b.is_ascii_digit())
        && !WRAPPERS.contains(&base)
    {
        seen.owner = Some(base.to_string());
    }
    match base {
        "curl" => seen.curl = true,
        "lftp" => seen.lftp = true,
        "http" | "https" | "httpie" | "xh" | "xhs" => seen.httpie = true,
        "htpasswd" => seen.htpasswd = Some(i),
        "kubectl" | "oc" => seen.kube = 1,
        "vault" => seen.vault = true,
        "redis-cli" | "keydb-cli" | "valkey-cli" => seen.redis = true,
        "mc" => seen.mc = 1,
        _ => {}
    }
    if SAMBA.contains(&base) {
        seen.samba = true;
    }
    if ORACLE.contains(&base) {
        seen.oracle = true;
    } else if seen.oracle && !arg.contains('=') && !arg.starts_with('@') {
        // The logon, `user/password@db` (a bare `/` is OS
        // authentication); a script (`@x.sql`) is not one.
        seen.oracle = false;
        if let Some((user, rest)) = arg.split_once('/') {
            if !user.is_empty() && !rest.is_empty() {
                let db = rest.find('@').map_or("", |at| &rest[at..]);
                edits.rewrite(i, format!("{user}/{MASK}{db}"));
            }
        }
    }
    match (seen.kube, arg) {
        (1, "create") => seen.kube = 2,
        (2, "secret") => seen.kube = 3,
        _ => {}
    }
    if seen.vault_login && !arg.contains('=') {
        edits.mask_whole(i);
        seen.vault_login = false;
    } else if seen.vault && arg == "login" {
        seen.vault_login = true;
    }
    if seen.redis_auth {
        edits.mask_whole(i);
    } else if seen.redis && arg.eq_ignore_ascii_case("auth") {
        seen.redis_auth = true;
    }
    match (seen.mc, arg) {
        (1, "alias") | (1, "host") => seen.mc = 2,
        (2, "set") | (2, "add") => {
            seen.mc = 3;
            seen.mc_positionals = 0;
        }
        (3, _) => {
            // NAME URL ACCESS_KEY SECRET_KEY
            seen.mc_positionals += 1;
            if seen.mc_positionals >= 3 {
                edits.mask_whole(i);
            }
        }
        _ => {}
    }
    if seen.setter && !arg.contains('=') && classify(arg) != Secrecy::Plain {
        if let Some(next) = argv.get(i + 1) {
            if flag_name(next).is_none() {
                edits.mask_whole(i + 1);
            }
        }
    }
    if matches!(arg, "set" | "config" | "configure") {
        seen.setter = true;
    }
}

/// A flag argument `arg` named `name` (`-p`, `-pX`, `--user=x`).
fn flag(argv: &[String], i: usize, name: &str, seen: &mut Seen, edits: &mut Edits) {
    let arg = argv[i].as_str();
    let next_is_value = argv.get(i + 1).is_some_and(|n| flag_name(n).is_none());
    let long = name.starts_with("--");
    if seen.htpasswd.is_some() && !long && arg[1..].chars().all(|c| c.is_ascii_alphabetic()) {
        seen.htpasswd_batch |= arg.contains('b');
    }
    if long {
        let attached = arg.split_once('=').map(|(_, v)| v);
        let credentials = match name {
            "--user" | "--proxy-user" => Some(user_separators(seen)),
            "--auth" if seen.httpie => Some(vec![':']),
            "--cert" | "--proxy-cert" if seen.curl => Some(vec![':']),
            "--from-literal" if seen.kube == 3 => Some(vec!['=']),
            _ => None,
        };
        if let Some(separators) = credentials {
            credential(argv, i, attached, &separators, edits);
        }
        return;
    }
    // A short flag: `-X`, with its value attached (`-Xvalue`) or next.
    let mut chars = arg[1..].chars();
    let Some(letter) = chars.next() else {
        return;
    };
    let attached = chars.as_str();
    let rule = seen
        .flags
        .iter()
        .flat_map(|r| r.flags.iter())
        .find(|(c, _)| *c == letter)
        .map(|(_, takes)| *takes);
    if let Some(takes) = rule {
        if !attached.is_empty() {
            edits.rewrite(i, format!("-{letter}{MASK}"));
        } else {
            match takes {
                Required => edits.mask_whole(i + 1),
                Optional if next_is_value => edits.mask_whole(i + 1),
                Optional | AttachedOnly => {}
            }
        }
        return;
    }
    match letter {
        'p' if attached.is_empty() && next_is_value => {
            let owner_keeps = seen
                .owner
                .as_deref()
                .is_some_and(|o| P_IS_NOT_A_PASSWORD.contains(&o));
            let value = argv.get(i + 1).map_or("", String::as_str);
            if !owner_keeps && !reads_as_port_or_path(value) {
                edits.mask_whole(i + 1);
            }
        }
        'u' | 'U' => {
            let attached = (!attached.is_empty()).then_some(attached);
            let separators = user_separators(seen);
            credential_short(argv, i, letter, attached, &separators, edits);
        }
        'a' if seen.httpie => {
            let attached = (!attached.is_empty()).then_some(attached);
            credential_short(argv, i, letter, attached, &[':'], edits);
        }
        'E' if seen.curl => {
            let attached = (!attached.is_empty()).then_some(attached);
            credential_short(argv, i, letter, attached, &[':'], edits);
        }
        _ => {}
    }
}

/// What separates a user from a password after `-u`/`--user` here.
fn user_separators(seen: &Seen) -> Vec<char> {
    let mut s = vec![':'];
    if seen.samba {
        s.push('%');
    }
    if seen.lftp {
        s.push(',');
    }
    s
}

/// Masks the password of a long credentials flag's value, attached
/// (`--user=admin:x`) or next (`--user admin:x`).
fn credential(
    argv: &[String],
    i: usize,
    attached: Option<&str>,
    separators: &[char],
    edits: &mut Edits,
) {
    let name = argv[i].split('=').next().unwrap_or_default();
    match attached {
        Some(value) => {
            if let Some(masked) = masked_credential(value, separators) {
                edits.rewrite(i, format!("{name}={masked}"));
            }
        }
        None => {
            if let Some(masked) = argv
                .get(i + 1)
                .and_then(|v| masked_credential(v, separators))
            {
                edits.rewrite(i + 1, masked);
            }
        }
    }
}

/// As [`credential`], for a short flag (`-uadmin:x`, `-u admin:x`).
fn credential_short(
    argv: &[String],
    i: usize,
    letter: char,
    attached: Option<&str>,
    separators: &[char],
    edits: &mut Edits,
) {
    match attached {
        Some(value) => {
            if let Some(masked) = masked_credential(value, separators) {
                edits.rewrite(i, format!("-{letter}{masked}"));
            }
        }
        None => {
            if let Some(masked) = argv
                .get(i + 1)
                .and_then(|v| masked_credential(v, separators))
            {
                edits.rewrite(i + 1, masked);
            }
        }
    }
}

/// `user:password` with the password masked; `None` when there is no
/// password in it or it is a numeric `uid:gid`.
fn masked_credential(value: &str, separators: &[char]) -> Option<String> {
    if is_uid_gid(value) {
        return None;
    }
    mask_after(value, separators).filter(|m| m != value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_read_as_ports_or_paths() {
        for v in [
            "8080",
            "8080:80",
            "127.0.0.1:8080:80/tcp",
            "[::1]:80",
            "1000-2000",
            "/run/x.pid",
            "./x",
            "~/x",
        ] {
            assert!(reads_as_port_or_path(v), "{v}");
        }
        for v in ["hunter2", "build", "", "tcp", "a/b"] {
            assert!(!reads_as_port_or_path(v), "{v}");
        }
    }

    #[test]
    fn assignments_and_uid_gid() {
        assert!(is_assignment("MYSQL_PWD=x"));
        assert!(!is_assignment("--user=x"));
        assert!(!is_assignment("1A=x"));
        assert!(is_uid_gid("1000:1000"));
        assert!(!is_uid_gid("app:app"));
        assert_eq!(
            masked_credential("admin:p:w", &[':']).as_deref(),
            Some("admin:***")
        );
        assert_eq!(masked_credential("admin", &[':']), None);
        assert_eq!(masked_credential("0:0", &[':']), None);
    }
}
