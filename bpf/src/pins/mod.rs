//! The daemon's pin directory: one description of everything it pins
//! (every map, link and subdirectory, by name), the marker that says a
//! directory was made by it, and the only code that removes pins.
//!
//! # Layout
//!
//! ```text
//! <pin dir>/                     marker: daemon       (--pin-dir, DEFAULT_PIN_DIR)
//!   krt_pin_layout               the marker (a pinned, frozen array map)
//!   openexec/                    marker: openexec     (OpenExec::load)
//!     krt_pin_layout
//!     oe_cgroups ... oe_stats    the 11 maps of OPENEXEC_MAPS
//!     link_lsm_file_open ...     the 4 links of OPENEXEC_LINKS (and each `<name>_new`,
//!                                a replacement staged before its rename)
//!   egress/                      marker: egress       (EgressFilter::load_pinned)
//!     krt_pin_layout
//!     maps/                      the 17 maps of EGRESS_MAPS
//!     links/<cgroup id>          one cgroup_skb link per filtered cgroup (and `<id>_new`)
//!     snoop_links/<cgroup id>    one DNS answer snooper link per cgroup (and `<id>_new`)
//! ```
//!
//! The backends take their pin names from here ([`OPENEXEC_MAPS`],
//! [`EGRESS_MAPS`], ...), so what is created and what [`remove`] removes
//! cannot drift apart.
//!
//! # The marker
//!
//! bpffs holds only directories, pinned BPF objects and symlinks, so the
//! marker is a pinned object: a one-entry array map named
//! `krt_pin_layout`, frozen (read-only to every process) before it is
//! pinned, whose value is the bytes `kyverno-runtime\0`, the [`Kind`] of
//! the directory and the layout version ([`LAYOUT_VERSION`]). [`claim`]
//! writes it before the first pin goes into a directory, and refuses a
//! directory that holds entries the layout does not name.
//!
//! # Removing
//!
//! [`remove`] is what `kyverno-runtime cleanup` and the daemon's uninstall
//! path run. Before it changes anything it opens the directory (the last
//! path component must not be a symlink) and refuses it, with a
//! [`Refusal`], unless it is on a bpffs, is not the root of a mount, and
//! carries a marker of this layout. Then it works only through directory
//! descriptors (`unlinkat` relative to a descriptor opened with
//! `O_NOFOLLOW`; no path is resolved twice), removes only the entries the
//! layout names and only when each is the kind of object the layout says
//! (a map where a map belongs, a link where a link belongs), never enters
//! another mount, and removes a directory only once it is empty. Anything
//! else is kept and named in the [`Removal`]. The marker goes last, so an
//! interrupted removal can be run again.

mod fs;
mod marker;
mod remove;
#[doc(hidden)]
pub mod testing;

use std::fmt;
use std::path::{Path, PathBuf};

pub use remove::{Failed, Kept, KeptReason, Removal};

/// The pin directory of the daemon and of `cleanup` when no `--pin-dir`
/// is given: the host's bpffs reached through PID 1's root. In the chart's
/// pod (hostPID, no host mounts) that is the only way to the host's bpffs
/// (the container's own `/sys/fs/bpf` is not a bpffs, or not the host's);
/// on a node itself it is the same directory as
/// `/sys/fs/bpf/kyverno-runtime`.
pub const DEFAULT_PIN_DIR: &str = "/proc/1/root/sys/fs/bpf/kyverno-runtime";

/// The name of the marker pin, and of its map.
pub const MARKER: &str = "krt_pin_layout";

/// The version of this layout, in every marker this build writes; a
/// marker of another version is refused (its names may differ).
pub const LAYOUT_VERSION: u32 = 1;

/// Suffix of a link pin staged before its rename over the real one (bpffs
/// names cannot hold a `.`).
pub const STAGED_SUFFIX: &str = "_new";

/// The open/exec backend's subdirectory of the daemon's pin directory.
pub const OPENEXEC_DIR: &str = "openexec";
/// The egress backend's subdirectory of the daemon's pin directory.
pub const EGRESS_DIR: &str = "egress";
/// The egress backend's map subdirectory.
pub const EGRESS_MAPS_DIR: &str = "maps";
/// The egress filter's links, one per cgroup id.
pub const EGRESS_LINKS_DIR: &str = "links";
/// The DNS answer snooper's links, one per cgroup id.
pub const EGRESS_SNOOP_LINKS_DIR: &str = "snoop_links";

/// Every map the open/exec backend pins (all but its per-CPU scratch
/// buffers; the denial ring too, so records written during a restart
/// reach the new reader).
pub const OPENEXEC_MAPS: [&str; 11] = [
    "oe_denials",
    "oe_denial_rate",
    "oe_names",
    "oe_pending",
    "oe_cgroups",
    "oe_open_paths",
    "oe_exec_paths",
    "oe_config",
    "oe_owners",
    "oe_observations",
    "oe_stats",
];

/// The link pins of the BPF-LSM hook set.
pub const OPENEXEC_LSM_LINKS: [&str; 2] = ["link_lsm_file_open", "link_lsm_bprm_check"];
/// The link pins of the fmod_ret hook set.
pub const OPENEXEC_FMOD_RET_LINKS: [&str; 2] =
    ["link_fmod_ret_file_open", "link_fmod_ret_bprm_check"];

/// Every map the egress backend pins under `maps/` (all of its object's
/// but `.bss`, the generations, the per-socket verdict cache and its
/// seen-once slots; the
/// snooper's own counters are not pinned either).
pub const EGRESS_MAPS: [&str; 17] = [
    "cgroup_filters",
    "allow_v4",
    "deny_v4",
    "allow_v6",
    "deny_v6",
    "egress_hosts",
    "observations",
    "stats",
    "egress_meta",
    "egress_policies",
    "egress_rules",
    "egress_bindings",
    "egress_domains",
    "egress_learned",
    "egress_domain_rules",
    "learned_budget",
    "learned_released",
];

/// What a directory with a marker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The daemon's `--pin-dir`: the backends' subdirectories.
    Daemon,
    /// The open/exec backend's directory.
    OpenExec,
    /// The egress backend's directory.
    Egress,
}

impl Kind {
    /// The number the marker stores.
    pub const fn code(self) -> u32 {
        match self {
            Kind::Daemon => 1,
            Kind::OpenExec => 2,
            Kind::Egress => 3,
        }
    }

    /// The kind a marker's number names.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Kind::Daemon),
            2 => Some(Kind::OpenExec),
            3 => Some(Kind::Egress),
            _ => None,
        }
    }

    /// The layout of a directory of this kind.
    pub const fn layout(self) -> &'static Layout {
        match self {
            Kind::Daemon => &DAEMON,
            Kind::OpenExec => &OPENEXEC,
            Kind::Egress => &EGRESS,
        }
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Daemon => "daemon",
            Kind::OpenExec => "openexec",
            Kind::Egress => "egress",
        }
    }
}

/// A directory with a marker, and what it may hold.
#[derive(Debug)]
pub struct Layout {
    /// What its marker says.
    pub kind: Kind,
    /// Its entries (the marker aside).
    pub entries: &'static [Entry],
}

/// One name (or family of names) a directory of the layout may hold.
#[derive(Debug)]
pub enum Entry {
    /// A pinned map.
    Map(&'static str),
    /// A pinned link, or its replacement staged as `<name>_new`.
    Link(&'static str),
    /// Pinned links named by a cgroup id (decimal), or `<id>_new`.
    CgroupLinks,
    /// A plain subdirectory and what it may hold.
    Dir(&'static str, &'static [Entry]),
    /// A subdirectory with a marker of its own.
    Marked(&'static str, &'static Layout),
}

/// The object a pin must be, for [`Entry::Map`], [`Entry::Link`] and
/// [`Entry::CgroupLinks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A BPF map.
    Map,
    /// A BPF link.
    Link,
}

impl ObjectKind {
    /// "map" or "link".
    pub const fn name(self) -> &'static str {
        match self {
            ObjectKind::Map => "map",
            ObjectKind::Link => "link",
        }
    }
}

/// What a name found in a directory of the layout is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Named {
    Object(ObjectKind),
    Dir(&'static [Entry]),
    Marked(&'static Layout),
}

/// What `name` is in a directory holding `entries`, if the layout names
/// it (the marker is not looked up here).
pub(crate) fn lookup(entries: &'static [Entry], name: &str) -> Option<Named> {
    entries.iter().find_map(|e| match e {
        Entry::Map(n) if *n == name => Some(Named::Object(ObjectKind::Map)),
        Entry::Link(n) if *n == name || name.strip_suffix(STAGED_SUFFIX) == Some(n) => {
            Some(Named::Object(ObjectKind::Link))
        }
        Entry::CgroupLinks if is_cgroup_link_name(name) => Some(Named::Object(ObjectKind::Link)),
        Entry::Dir(n, sub) if *n == name => Some(Named::Dir(sub)),
        Entry::Marked(n, sub) if *n == name => Some(Named::Marked(sub)),
        _ => None,
    })
}

/// `<u64>` or `<u64>_new`, digits only (no sign, no leading `+`).
fn is_cgroup_link_name(name: &str) -> bool {
    let id = name.strip_suffix(STAGED_SUFFIX).unwrap_or(name);
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && id.parse::<u64>().is_ok()
}

/// `maps` as [`Entry::Map`]s, then `links` as [`Entry::Link`]s.
const fn entries<const N: usize>(maps: &[&'static str], links: &[&'static str]) -> [Entry; N] {
    assert!(maps.len() + links.len() == N);
    let mut out = [const { Entry::CgroupLinks }; N];
    let mut i = 0;
    while i < maps.len() {
        out[i] = Entry::Map(maps[i]);
        i += 1;
    }
    let mut j = 0;
    while j < links.len() {
        out[i + j] = Entry::Link(links[j]);
        j += 1;
    }
    out
}

static OPENEXEC_ENTRIES: [Entry; 15] = entries(
    &OPENEXEC_MAPS,
    &[
        OPENEXEC_LSM_LINKS[0],
        OPENEXEC_LSM_LINKS[1],
        OPENEXEC_FMOD_RET_LINKS[0],
        OPENEXEC_FMOD_RET_LINKS[1],
    ],
);
static EGRESS_MAP_ENTRIES: [Entry; 17] = entries(&EGRESS_MAPS, &[]);

/// The open/exec backend's directory.
pub static OPENEXEC: Layout = Layout {
    kind: Kind::OpenExec,
    entries: &OPENEXEC_ENTRIES,
};

/// The egress backend's directory.
pub static EGRESS: Layout = Layout {
    kind: Kind::Egress,
    entries: &[
        Entry::Dir(EGRESS_MAPS_DIR, &EGRESS_MAP_ENTRIES),
        Entry::Dir(EGRESS_LINKS_DIR, &[Entry::CgroupLinks]),
        Entry::Dir(EGRESS_SNOOP_LINKS_DIR, &[Entry::CgroupLinks]),
    ],
};

/// The daemon's pin directory.
pub static DAEMON: Layout = Layout {
    kind: Kind::Daemon,
    entries: &[
        Entry::Marked(OPENEXEC_DIR, &OPENEXEC),
        Entry::Marked(EGRESS_DIR, &EGRESS),
    ],
};

/// Why a directory was refused, before anything in it was touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The path names no directory.
    NotADirectory,
    /// Its last component is a symbolic link.
    Symlink,
    /// It is not on a bpffs.
    NotBpffs {
        /// The filesystem's magic number (statfs `f_type`).
        magic: u64,
    },
    /// It is the root of a mount (a bpffs root holds every tool's pins;
    /// `/` and a bind mount are refused the same way).
    MountRoot,
    /// It carries no marker.
    NoMarker,
    /// It carries a `krt_pin_layout` pin that is not a marker of this
    /// layout (another shape, another version, another program's).
    BadMarker(String),
    /// Its marker is of another kind than the caller expects.
    WrongKind {
        /// What the marker says.
        found: Kind,
        /// What the caller expected.
        want: Kind,
    },
    /// Without a marker, it holds entries the layout does not name: it
    /// is not ours to claim.
    ForeignEntries(Vec<String>),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotADirectory => write!(f, "not a directory"),
            Refusal::Symlink => write!(
                f,
                "it is a symbolic link (name the directory itself, not a link to it)"
            ),
            Refusal::NotBpffs { magic } => write!(
                f,
                "not on a bpffs (filesystem magic {magic:#x}); kyverno-runtime pins only on bpffs"
            ),
            Refusal::MountRoot => write!(
                f,
                "it is the root of a mount (a bpffs root holds other tools' pins); the daemon pins in a directory below it, such as /sys/fs/bpf/kyverno-runtime"
            ),
            Refusal::NoMarker => write!(
                f,
                "it has no {MARKER} marker, so kyverno-runtime's daemon did not make it"
            ),
            Refusal::BadMarker(why) => {
                write!(f, "its {MARKER} is not a kyverno-runtime marker: {why}")
            }
            Refusal::WrongKind { found, want } => write!(
                f,
                "its marker says it is a {} directory, not a {} one",
                found.name(),
                want.name()
            ),
            Refusal::ForeignEntries(names) => {
                const SHOWN: usize = 5;
                let mut shown = names
                    .iter()
                    .take(SHOWN)
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                if names.len() > SHOWN {
                    shown.push_str(&format!(" and {} more", names.len() - SHOWN));
                }
                write!(
                    f,
                    "it holds entries that are not kyverno-runtime's ({shown}); use an empty or new directory"
                )
            }
        }
    }
}

/// Result of the pin directory's operations.
pub type Result<T, E = PinError> = std::result::Result<T, E>;

/// What went wrong with a pin directory.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// Refused before anything was touched.
    #[error("refusing {dir}: {reason}", dir = .dir.display())]
    Refused {
        /// The directory as given.
        dir: PathBuf,
        /// Why.
        reason: Refusal,
    },
    /// A system call failed while opening or inspecting the directory, or
    /// while creating it.
    #[error("{dir}: {op}: {error}", dir = .dir.display())]
    Io {
        /// The directory as given.
        dir: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error (shown in the message, so not a `source`).
        error: std::io::Error,
    },
    /// The marker could not be written.
    #[error("{dir}: writing the {MARKER} marker: {message}", dir = .dir.display())]
    Marker {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        message: String,
    },
}

impl PinError {
    /// Whether this is a refusal (nothing was touched).
    pub fn is_refusal(&self) -> bool {
        matches!(self, PinError::Refused { .. })
    }
}

/// What [`inspect`] read about a directory, without changing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// statfs `f_type`.
    pub fs_magic: u64,
    /// Whether it is the root of a mount (or the process's root).
    pub mount_root: bool,
    /// Its marker.
    pub marker: MarkerState,
}

/// A directory's marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerState {
    /// There is no `krt_pin_layout` entry.
    Absent,
    /// A marker of this layout.
    Ours(Kind),
    /// A `krt_pin_layout` entry that is not a marker of this layout.
    NotOurs(String),
}

/// The statfs magic of bpffs.
pub const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

/// Decides, from what [`inspect`] read, whether a directory may be
/// emptied: it must be on a bpffs, not a mount root, and carry a marker
/// (of kind `want`, when given). A pure function: the removal code runs
/// only on its `Ok`, so a refused directory sees no call that changes it.
pub fn check(found: &Inspection, want: Option<Kind>) -> std::result::Result<Kind, Refusal> {
    if found.fs_magic != BPF_FS_MAGIC {
        return Err(Refusal::NotBpffs {
            magic: found.fs_magic,
        });
    }
    if found.mount_root {
        return Err(Refusal::MountRoot);
    }
    match &found.marker {
        MarkerState::Absent => Err(Refusal::NoMarker),
        MarkerState::NotOurs(why) => Err(Refusal::BadMarker(why.clone())),
        MarkerState::Ours(kind) => match want {
            Some(want) if want != *kind => Err(Refusal::WrongKind { found: *kind, want }),
            _ => Ok(*kind),
        },
    }
}

/// Opens `dir` (its last component must not be a symlink) and reads what
/// [`check`] decides on. `Ok(None)`: there is no such directory.
pub fn inspect(dir: &Path) -> Result<Option<Inspection>> {
    Ok(fs::open_checked(dir)?.map(|(_, _, inspection)| inspection))
}

/// Removes the pins of the directory `dir`, whose marker names its layout
/// (see the [module docs](self#removing)); refuses it, touching nothing,
/// when [`check`] does. A missing directory is an empty [`Removal`].
pub fn remove(dir: &Path) -> Result<Removal> {
    remove::remove(dir, None)
}

/// [`remove`], refusing a directory whose marker is not of kind `want`
/// (a backend removing its own directory).
pub fn remove_kind(dir: &Path, want: Kind) -> Result<Removal> {
    remove::remove(dir, Some(want))
}

/// Makes `dir` a directory of `layout`, before anything is pinned in it:
/// refuses it unless its nearest existing ancestor is on a bpffs, then
/// creates it (and its parents), refuses it if it is a symlink, a mount
/// root, or carries a marker of another kind, and writes the marker when
/// there is none yet, provided every entry already there is one the
/// layout names (pins of a build older than the marker).
pub fn claim(dir: &Path, layout: &'static Layout) -> Result<()> {
    marker::claim(dir, layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(fs_magic: u64, mount_root: bool, marker: MarkerState) -> Inspection {
        Inspection {
            fs_magic,
            mount_root,
            marker,
        }
    }

    #[test]
    fn check_refuses_all_but_a_marked_bpffs_directory_below_a_mount_root() {
        const TMPFS: u64 = 0x0102_1994;
        let ours = MarkerState::Ours(Kind::Daemon);
        let cases = [
            (
                found(TMPFS, false, ours.clone()),
                None,
                Err(Refusal::NotBpffs { magic: TMPFS }),
            ),
            (
                found(TMPFS, true, MarkerState::Absent),
                None,
                Err(Refusal::NotBpffs { magic: TMPFS }),
            ),
            (
                found(BPF_FS_MAGIC, true, ours.clone()),
                None,
                Err(Refusal::MountRoot),
            ),
            (
                found(BPF_FS_MAGIC, false, MarkerState::Absent),
                None,
                Err(Refusal::NoMarker),
            ),
            (
                found(BPF_FS_MAGIC, false, MarkerState::NotOurs("x".into())),
                None,
                Err(Refusal::BadMarker("x".into())),
            ),
            (
                found(BPF_FS_MAGIC, false, ours.clone()),
                Some(Kind::Egress),
                Err(Refusal::WrongKind {
                    found: Kind::Daemon,
                    want: Kind::Egress,
                }),
            ),
            (
                found(BPF_FS_MAGIC, false, ours.clone()),
                None,
                Ok(Kind::Daemon),
            ),
            (
                found(BPF_FS_MAGIC, false, ours),
                Some(Kind::Daemon),
                Ok(Kind::Daemon),
            ),
        ];
        for (inspection, want, expected) in cases {
            assert_eq!(
                check(&inspection, want),
                expected,
                "{inspection:?} {want:?}"
            );
        }
    }

    #[test]
    fn refusals_are_one_line() {
        let all = [
            Refusal::NotADirectory,
            Refusal::Symlink,
            Refusal::NotBpffs { magic: 0xef53 },
            Refusal::MountRoot,
            Refusal::NoMarker,
            Refusal::BadMarker("why".into()),
            Refusal::WrongKind {
                found: Kind::Egress,
                want: Kind::Daemon,
            },
            Refusal::ForeignEntries((0..9).map(|i| format!("x{i}")).collect()),
        ];
        for r in all {
            let text = r.to_string();
            assert!(!text.contains('\n') && !text.is_empty(), "{text}");
        }
        assert!(
            Refusal::ForeignEntries((0..9).map(|i| format!("x{i}")).collect())
                .to_string()
                .contains("and 4 more")
        );
    }

    #[test]
    fn the_layout_names_exactly_its_entries() {
        for name in OPENEXEC_MAPS {
            assert!(matches!(
                lookup(OPENEXEC.entries, name),
                Some(Named::Object(ObjectKind::Map))
            ));
            assert!(lookup(OPENEXEC.entries, &format!("{name}{STAGED_SUFFIX}")).is_none());
        }
        for name in OPENEXEC_LSM_LINKS.iter().chain(&OPENEXEC_FMOD_RET_LINKS) {
            for n in [name.to_string(), format!("{name}{STAGED_SUFFIX}")] {
                assert!(matches!(
                    lookup(OPENEXEC.entries, &n),
                    Some(Named::Object(ObjectKind::Link))
                ));
            }
        }
        let Some(Named::Dir(links)) = lookup(EGRESS.entries, EGRESS_LINKS_DIR) else {
            panic!("no links directory");
        };
        for good in ["1", "18446744073709551615", "42_new"] {
            assert!(
                matches!(lookup(links, good), Some(Named::Object(ObjectKind::Link))),
                "{good}"
            );
        }
        for bad in [
            "",
            "_new",
            "+1",
            "-1",
            "1a",
            "18446744073709551616",
            "1_new_new",
            "01.5",
        ] {
            assert!(lookup(links, bad).is_none(), "{bad}");
        }
        assert!(
            matches!(lookup(DAEMON.entries, OPENEXEC_DIR), Some(Named::Marked(l)) if l.kind == Kind::OpenExec)
        );
        assert!(
            matches!(lookup(DAEMON.entries, EGRESS_DIR), Some(Named::Marked(l)) if l.kind == Kind::Egress)
        );
        for foreign in [MARKER, "cilium_calls", "maps", "oe_cgroups", ".", ".."] {
            assert!(lookup(DAEMON.entries, foreign).is_none(), "{foreign}");
        }
    }

    #[test]
    fn every_name_is_a_valid_bpffs_name_and_unique_in_its_directory() {
        fn names(entries: &[Entry]) -> Vec<&'static str> {
            entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Map(n) | Entry::Link(n) | Entry::Dir(n, _) | Entry::Marked(n, _) => {
                        Some(*n)
                    }
                    Entry::CgroupLinks => None,
                })
                .collect()
        }
        fn walk(entries: &'static [Entry]) {
            let mut seen = names(entries);
            for n in &seen {
                assert!(!n.is_empty() && !n.contains(['.', '/']), "{n:?}");
                assert_ne!(*n, MARKER);
            }
            let count = seen.len();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), count, "{seen:?}");
            for e in entries {
                match e {
                    Entry::Dir(_, sub) => walk(sub),
                    Entry::Marked(_, layout) => walk(layout.entries),
                    _ => {}
                }
            }
        }
        walk(DAEMON.entries);
    }

    #[test]
    fn every_kind_round_trips_and_names_its_layout() {
        for kind in [Kind::Daemon, Kind::OpenExec, Kind::Egress] {
            assert_eq!(Kind::from_code(kind.code()), Some(kind));
            assert_eq!(kind.layout().kind, kind);
        }
        assert_eq!(Kind::from_code(0), None);
    }
}
