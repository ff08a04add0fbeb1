//! A private apt: one suite's package lists and downloads, kept in the vmtest
//! cache and never mixed with the machine's own apt state.
//!
//! The machine only configures its own release, but the kernel matrix needs
//! four suites. Rather than editing `/etc/apt` (shared with other work on the
//! machine, and root-only), each suite gets its own `sources.list`, lists and
//! cache directories, selected with `-o Dir::…` options on every apt call. The
//! mirror URI is borrowed from the machine's configuration (never written into
//! this repository): whatever mirror or proxy the machine is allowed to reach
//! is the one we use.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use crate::error::{describe_status, tail, Error, Result};
use crate::kernel::KernelSeries;

/// The deb822 sources file Debian 12 and later install.
pub const DEB822_SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";
/// The classic one-line sources file.
pub const ONE_LINE_SOURCES: &str = "/etc/apt/sources.list";

/// How long downloaded package lists are trusted before a refresh is tried.
/// Kernel ABIs move every few weeks; a day keeps warm runs off the network.
pub const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Lines of apt output kept in error reports.
const TAIL_LINES: usize = 25;

/// One deb822 paragraph: `(field, value)` pairs in file order. Continuation
/// lines are joined to their field's value with `\n`.
pub type Paragraph = Vec<(String, String)>;

/// Parses deb822 text (`Field: value` paragraphs separated by blank lines;
/// `#` comment lines are dropped). Used both for `*.sources` files and for
/// `apt-cache show` output.
pub fn parse_deb822(text: &str) -> Vec<Paragraph> {
    let mut paragraphs = Vec::new();
    let mut current: Paragraph = Vec::new();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            if !current.is_empty() {
                paragraphs.push(std::mem::take(&mut current));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if line.starts_with(' ') || line.starts_with('\t') {
            if let Some((_, value)) = current.last_mut() {
                value.push('\n');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((field, value)) = line.split_once(':') {
            current.push((field.trim().to_owned(), value.trim().to_owned()));
        }
    }
    if !current.is_empty() {
        paragraphs.push(current);
    }
    paragraphs
}

/// The value of `field` (case-insensitive, as deb822 field names are).
pub fn field<'a>(paragraph: &'a Paragraph, name: &str) -> Option<&'a str> {
    paragraph
        .iter()
        .find(|(f, _)| f.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A "main" suite is a release's own archive (`bookworm`, `trixie`, `sid`),
/// as opposed to `bookworm-security`, `bookworm-updates` or a flat `./` repo.
fn is_main_suite(suite: &str) -> bool {
    !suite.is_empty() && !suite.contains('-') && !suite.contains('/') && suite != "."
}

/// The first URI of the first enabled `deb` paragraph of a deb822 sources
/// file that lists a main suite.
pub fn mirror_from_deb822(text: &str) -> Option<String> {
    parse_deb822(text).into_iter().find_map(|p| {
        let enabled = field(&p, "Enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        let is_deb = field(&p, "Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let main = field(&p, "Suites").is_some_and(|s| s.split_whitespace().any(is_main_suite));
        if !(enabled && is_deb && main) {
            return None;
        }
        field(&p, "URIs")?
            .split_whitespace()
            .next()
            .map(str::to_owned)
    })
}

/// The URI of the first `deb URI SUITE COMPONENTS…` line of a one-line
/// sources file whose suite is a main suite (`[options]` are skipped).
pub fn mirror_from_one_line(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim();
        let rest = line.strip_prefix("deb")?;
        if !rest.starts_with([' ', '\t']) {
            return None; // `deb-src`, or not a source line at all
        }
        let mut rest = rest.trim_start();
        if let Some(opts) = rest.strip_prefix('[') {
            rest = opts.split_once(']')?.1.trim_start();
        }
        let mut words = rest.split_whitespace();
        let uri = words.next()?;
        let suite = words.next()?;
        is_main_suite(suite).then(|| uri.to_owned())
    })
}

/// The machine's Debian mirror, from [`DEB822_SOURCES`] and then
/// [`ONE_LINE_SOURCES`].
pub fn system_mirror() -> Result<String> {
    mirror_from_files(Path::new(DEB822_SOURCES), Path::new(ONE_LINE_SOURCES))
}

/// [`system_mirror`] reading the given files instead of the machine's.
pub fn mirror_from_files(deb822: &Path, one_line: &Path) -> Result<String> {
    if let Ok(text) = std::fs::read_to_string(deb822) {
        if let Some(uri) = mirror_from_deb822(&text) {
            return Ok(uri);
        }
    }
    if let Ok(text) = std::fs::read_to_string(one_line) {
        if let Some(uri) = mirror_from_one_line(&text) {
            return Ok(uri);
        }
    }
    Err(Error::NoMirror {
        searched: vec![deb822.to_owned(), one_line.to_owned()],
    })
}

/// The private `sources.list` for one suite.
pub fn sources_list(mirror: &str, suite: &str) -> String {
    format!("deb [arch=amd64] {mirror} {suite} main\n")
}

/// Package names from `apt-cache search` output (`name - description`),
/// deduplicated, in order of first appearance.
pub fn parse_search(output: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for line in output.lines() {
        if let Some((name, _)) = line.split_once(" - ") {
            let name = name.trim();
            if !name.is_empty() && !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }
    names
}

/// A package as `apt-cache show` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageInfo {
    /// Package name.
    pub name: String,
    /// Its candidate version.
    pub version: String,
    /// Names of the packages in its `Depends` (first alternative of each
    /// clause; version constraints dropped).
    pub depends: Vec<String>,
}

/// Parses `apt-cache show` output into one [`PackageInfo`] per paragraph.
pub fn parse_show(output: &str) -> Vec<PackageInfo> {
    parse_deb822(output)
        .into_iter()
        .filter_map(|p| {
            let name = field(&p, "Package")?.to_owned();
            let version = field(&p, "Version")?.to_owned();
            let depends = field(&p, "Depends")
                .map(|d| {
                    d.split(',')
                        .filter_map(|clause| {
                            let first = clause.split('|').next()?.trim();
                            let name = first.split([' ', '(', ':']).next()?.trim();
                            (!name.is_empty()).then(|| name.to_owned())
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(PackageInfo {
                name,
                version,
                depends,
            })
        })
        .collect()
}

/// apt, pointed at one suite's private state in the cache.
pub(crate) struct PrivateApt {
    series: KernelSeries,
    suite: &'static str,
    dir: PathBuf,
}

impl PrivateApt {
    /// Prepares the directories and the sources list for `series`' suite.
    pub(crate) fn new(series: KernelSeries, dir: PathBuf, mirror: &str) -> Result<Self> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).map_err(|e| Error::io("creating apt dir", &d, e))?;
        }
        let apt = PrivateApt {
            series,
            suite: series.suite(),
            dir,
        };
        let list = apt.dir.join("sources.list");
        let want = sources_list(mirror, apt.suite);
        // Rewrite only on change, so the file's mtime means something.
        if std::fs::read_to_string(&list).ok().as_deref() != Some(want.as_str()) {
            std::fs::write(&list, want).map_err(|e| Error::io("writing sources list", &list, e))?;
            // A different mirror invalidates the lists' freshness.
            let _ = std::fs::remove_file(apt.stamp());
        }
        Ok(apt)
    }

    /// The suite this apt serves.
    pub(crate) fn suite(&self) -> &'static str {
        self.suite
    }

    fn stamp(&self) -> PathBuf {
        self.dir.join("updated")
    }

    /// The options that make every apt call use only our private state.
    fn options(&self) -> Vec<String> {
        let d = &self.dir;
        vec![
            format!(
                "-oDir::Etc::sourcelist={}",
                d.join("sources.list").display()
            ),
            "-oDir::Etc::sourceparts=-".to_owned(),
            format!("-oDir::State::Lists={}", d.join("lists").display()),
            format!("-oDir::Cache={}", d.join("cache").display()),
            "-oAcquire::Languages=none".to_owned(),
            // The machine may enable AppStream metadata for its own sources;
            // we only need Packages, and DEP-11 doubles the download.
            "-oAcquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_owned(),
            // Some images disable the binary package cache; with it, warm
            // `apt-cache` calls take 0.15 s instead of 1 s. The source cache
            // would only duplicate it (35 MB per suite).
            "-oDir::Cache::pkgcache=pkgcache.bin".to_owned(),
            "-oDir::Cache::srcpkgcache=".to_owned(),
        ]
    }

    /// Whether the lists were refreshed successfully less than `max_age` ago.
    pub(crate) fn lists_fresh(&self, max_age: Duration) -> bool {
        std::fs::metadata(self.stamp())
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < max_age)
    }

    /// Whether any lists were ever downloaded.
    pub(crate) fn has_lists(&self) -> bool {
        self.stamp().exists()
    }

    /// `apt-get update` for the private list (network).
    pub(crate) fn update(&self) -> Result<()> {
        let out = self.run("apt-get", &["update"], None)?;
        let text = combined(&out);
        // apt-get update exits 0 when only some indexes failed; a missing
        // index is still a failure for us.
        let partial = text.contains("Failed to fetch") || text.contains("index files failed");
        if !out.status.success() || partial {
            return Err(self.download_error(
                format!("apt-get update ({})", self.suite),
                describe_status(&out.status),
                &text,
            ));
        }
        let stamp = self.stamp();
        std::fs::write(&stamp, b"").map_err(|e| Error::io("writing stamp", &stamp, e))?;
        Ok(())
    }

    /// `apt-cache search --names-only REGEX` (local, no network).
    pub(crate) fn search(&self, regex: &str) -> Result<Vec<String>> {
        let out = self.run("apt-cache", &["search", "--names-only", regex], None)?;
        self.check("apt-cache search", &out)?;
        Ok(parse_search(&String::from_utf8_lossy(&out.stdout)))
    }

    /// `apt-cache show --no-all-versions PKG…` (local, no network).
    pub(crate) fn show(&self, packages: &[String]) -> Result<Vec<PackageInfo>> {
        let mut args = vec!["show", "--no-all-versions"];
        args.extend(packages.iter().map(String::as_str));
        let out = self.run("apt-cache", &args, None)?;
        self.check("apt-cache show", &out)?;
        Ok(parse_show(&String::from_utf8_lossy(&out.stdout)))
    }

    /// `apt-get download PKG=VERSION` into `dest_dir` (network), returning the
    /// `.deb`. An already-downloaded file is reused.
    pub(crate) fn download(&self, name: &str, version: &str, dest_dir: &Path) -> Result<PathBuf> {
        let file = dest_dir.join(format!("{name}_{}_amd64.deb", version.replace(':', "%3a")));
        if file.exists() {
            return Ok(file);
        }
        std::fs::create_dir_all(dest_dir)
            .map_err(|e| Error::io("creating debs dir", dest_dir, e))?;
        // Download into a scratch directory and rename, so an interrupted
        // download never leaves a truncated .deb that looks complete.
        let scratch = tempfile::Builder::new()
            .prefix(".download-")
            .tempdir_in(dest_dir)
            .map_err(|e| Error::io("creating download dir", dest_dir, e))?;
        let spec = format!("{name}={version}");
        let out = self.run("apt-get", &["download", &spec], Some(scratch.path()))?;
        if !out.status.success() {
            return Err(self.download_error(
                format!("apt-get download {spec}"),
                describe_status(&out.status),
                &combined(&out),
            ));
        }
        let deb = std::fs::read_dir(scratch.path())
            .map_err(|e| Error::io("listing download dir", scratch.path(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| {
                self.download_error(
                    format!("apt-get download {spec}"),
                    "no .deb produced".to_owned(),
                    &combined(&out),
                )
            })?;
        std::fs::rename(&deb, &file).map_err(|e| Error::io("moving .deb into cache", &file, e))?;
        Ok(file)
    }

    fn run(&self, program: &str, args: &[&str], cwd: Option<&Path>) -> Result<Output> {
        let mut cmd = Command::new(program);
        cmd.args(self.options()).args(args).env("LC_ALL", "C");
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        cmd.output().map_err(|e| Error::Tool {
            tool: format!("{program} {}", args.first().copied().unwrap_or_default()),
            status: format!("could not start: {e}"),
            output_tail: String::new(),
        })
    }

    fn check(&self, what: &str, out: &Output) -> Result<()> {
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::Tool {
                tool: format!("{what} ({})", self.suite),
                status: describe_status(&out.status),
                output_tail: tail(&combined(out), TAIL_LINES),
            })
        }
    }

    fn download_error(&self, step: String, status: String, output: &str) -> Error {
        Error::Download {
            series: self.series,
            step,
            status,
            apt_tail: tail(output, TAIL_LINES),
        }
    }
}

/// stdout followed by stderr, as text.
pub(crate) fn combined(out: &Output) -> String {
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# a snapshot comment
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
";

    #[test]
    fn deb822_picks_main_suite_stanza() {
        assert_eq!(
            mirror_from_deb822(DEB822).as_deref(),
            Some("http://mirror.invalid/debian")
        );
    }

    #[test]
    fn deb822_skips_security_disabled_and_src() {
        let text = "\
Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.invalid/debian
Suites: bookworm
Components: main

Types: deb
Enabled: no
URIs: http://off.invalid/debian
Suites: bookworm

Types: deb
URIs: http://mirror.invalid/debian http://second.invalid/debian
Suites: bookworm
";
        assert_eq!(
            mirror_from_deb822(text).as_deref(),
            Some("http://mirror.invalid/debian")
        );
        assert_eq!(mirror_from_deb822("Types: deb\nSuites: sid\n"), None);
    }

    #[test]
    fn one_line_sources() {
        let text = "\
# deb http://commented.invalid/debian bookworm main
deb-src http://src.invalid/debian bookworm main
deb http://mirror.invalid/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.invalid/debian bookworm main contrib
deb http://later.invalid/debian bookworm main
";
        assert_eq!(
            mirror_from_one_line(text).as_deref(),
            Some("http://mirror.invalid/debian")
        );
        assert_eq!(
            mirror_from_one_line("debx http://x.invalid sid main\n"),
            None
        );
    }

    #[test]
    fn files_fall_back_to_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let deb822 = dir.path().join("debian.sources");
        let one = dir.path().join("sources.list");
        std::fs::write(
            &deb822,
            "Types: deb\nURIs: http://s.invalid/\nSuites: bookworm-security\n",
        )
        .unwrap();
        std::fs::write(&one, "deb http://mirror.invalid/debian bookworm main\n").unwrap();
        assert_eq!(
            mirror_from_files(&deb822, &one).unwrap(),
            "http://mirror.invalid/debian"
        );
        std::fs::write(&deb822, DEB822).unwrap();
        assert_eq!(
            mirror_from_files(&deb822, &one).unwrap(),
            "http://mirror.invalid/debian"
        );
        let missing = dir.path().join("nope");
        assert!(matches!(
            mirror_from_files(&missing, &missing),
            Err(Error::NoMirror { .. })
        ));
    }

    #[test]
    fn private_sources_list_line() {
        assert_eq!(
            sources_list("http://mirror.invalid/debian", "sid"),
            "deb [arch=amd64] http://mirror.invalid/debian sid main\n"
        );
    }

    #[test]
    fn search_output_dedupes() {
        let out = "\
linux-image-5.10.0-30-cloud-amd64 - Linux 5.10 for x86-64 cloud (signed)
linux-image-5.10.0-32-cloud-amd64 - Linux 5.10 for x86-64 cloud (signed)
linux-image-5.10.0-30-cloud-amd64 - Linux 5.10 for x86-64 cloud (signed)
";
        assert_eq!(
            parse_search(out),
            vec![
                "linux-image-5.10.0-30-cloud-amd64",
                "linux-image-5.10.0-32-cloud-amd64"
            ]
        );
    }

    #[test]
    fn show_output_depends() {
        let out = "\
Package: linux-image-7.2.13+deb14-cloud-amd64
Version: 7.2.13-1
Depends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.2.13+deb14-cloud-amd64 (= 7.2.13-1), linux-binary-7.2.13+deb14-cloud-amd64 (= 7.2.13-1),
 linux-modules-7.2.13+deb14-cloud-amd64 (= 7.2.13-1)
Description: Linux 7.2.13 for x86-64 cloud

Package: linux-image-6.1.0-50-cloud-amd64
Version: 6.1.176-1
Depends: kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool
";
        let pkgs = parse_show(out);
        assert_eq!(pkgs.len(), 2);
        assert_eq!(pkgs[0].version, "7.2.13-1");
        assert_eq!(
            pkgs[0].depends,
            vec![
                "dracut",
                "linux-base-7.2.13+deb14-cloud-amd64",
                "linux-binary-7.2.13+deb14-cloud-amd64",
                "linux-modules-7.2.13+deb14-cloud-amd64"
            ]
        );
        assert_eq!(
            pkgs[1].depends,
            vec!["kmod", "linux-base", "initramfs-tools"]
        );
    }
}
