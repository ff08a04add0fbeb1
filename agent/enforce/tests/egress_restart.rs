//! Network enforcement across a daemon restart (needs root, a cgroup v2
//! mount and bpffs): the egress backend pinned under a bpffs directory
//! keeps dropping when its process is gone, a new backend adopts the pins
//! and the manager converges from them by diffs, an incompatible pin
//! layout is discarded without a gap, and removing the pins detaches
//! everything. Run with `cargo test -p kyverno-runtime-enforce --features
//! host-tests --test egress_restart`.
//!
//! Each test mounts its own bpffs instance (so no pin outlives the test
//! even when it fails: unmounting the last mount of an instance frees its
//! pins) and creates its cgroups under the host's cgroup2 mount. A child of
//! this binary joins a cgroup and connects; a dropped SYN shows as a
//! connect timeout, and the assertions are on outcomes, never durations.
//! "The daemon exits" is dropping the manager and its backend: then no
//! process holds an fd of the programs, maps or links.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::egress::{connects, pid, pod, policy};
use common::TempCgroup;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use kyverno_runtime_bpf::egress::{EgressFilter, PinOutcome, LAYOUT_VERSION};
use kyverno_runtime_enforce::egress::{EgressEnforcer, EgressManager, NetworkPolicy};
use kyverno_runtime_enforce::openexec::Mode;
use kyverno_runtime_enforce::Enforcer as _;

/// The connect child of `common::egress::connects`.
#[test]
fn connect_child() {
    common::egress::connect_child();
}

/// A private bpffs instance, unmounted (and so emptied) on drop.
struct Bpffs(PathBuf);

impl Bpffs {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "krt-egress-restart-{tag}-{}-bpffs",
            std::process::id()
        ));
        // A leftover of an earlier run with the same pid.
        let _ = Command::new("umount")
            .arg(&dir)
            .stderr(Stdio::null())
            .status();
        fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t bpf failed: {status}");
        Self(dir)
    }

    /// The backend's pin directory, as the daemon's `<pin dir>/egress`.
    fn pins(&self) -> PathBuf {
        self.0.join("egress")
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = fs::remove_dir(&self.0);
    }
}

/// Polls until a child in `cg` connects to `ip` (a removed pin detaches
/// its link only after an RCU grace period).
fn eventually_connects(cg: &TempCgroup, ip: &str) -> bool {
    for _ in 0..10 {
        if connects(cg, ip) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn enforcement_survives_a_restart_and_converges_by_diffs() {
    let bpffs = Bpffs::new("survive");
    let pins = bpffs.pins();
    let cg = TempCgroup::new("egress-restart", "survive");

    // The first daemon: two deny policies on one pod, each with host
    // entries (in the host map) and a prefix (in a trie), so the adopted
    // state and the program's per-set lookups cover both.
    let before = {
        let backend = EgressEnforcer::load_pinned(&pins).unwrap();
        assert_eq!(backend.kernel().filter().pin_outcome(), &PinOutcome::Fresh);
        let mut m = EgressManager::new(backend).unwrap();
        assert!(m.upsert_pod(pod("pod-1", &cg)).is_empty());
        // deny-2 names a domain too: its entry, the snooper's link and
        // what it learned are pinned with the rest.
        for (id, deny) in [
            (
                "deny-2",
                &["127.0.0.2/32", "127.0.0.8/29", "denied.test"][..],
            ),
            ("deny-3", &["127.0.0.3", "127.0.0.16/29"][..]),
        ] {
            let out = m.upsert_policy(policy(id, &[], deny));
            assert!(out.failures.is_empty(), "{:?}", out.failures);
        }
        for denied in ["127.0.0.2", "127.0.0.3", "127.0.0.9", "127.0.0.17"] {
            assert!(!connects(&cg, denied), "{denied}");
        }
        assert!(connects(&cg, "127.0.0.1"));
        m.programmed().clone()
        // The daemon exits: every fd of the manager's backend is closed.
    };
    assert!(pins.join("links").join(cg.id().to_string()).exists());
    assert!(pins.join("snoop_links").join(cg.id().to_string()).exists());
    assert_eq!(
        EgressFilter::pinned_layout_version(&pins).unwrap(),
        Some(LAYOUT_VERSION)
    );
    for denied in ["127.0.0.2", "127.0.0.3", "127.0.0.9", "127.0.0.17"] {
        assert!(
            !connects(&cg, denied),
            "the deny of {denied} holds with no process holding the objects"
        );
    }
    assert!(connects(&cg, "127.0.0.1"));
    // The host entries are in the host map and the prefixes in the tries,
    // and both read back as the prefixes the policies named.
    let pinned = EgressFilter::read_pinned_state(&pins).unwrap();
    let set = pinned.sets.values().next().unwrap();
    let deny: Vec<String> = set.deny.iter().map(ToString::to_string).collect();
    assert_eq!(
        deny,
        [
            "127.0.0.2/32",
            "127.0.0.3/32",
            "127.0.0.8/29",
            "127.0.0.16/29"
        ],
        "{pinned:?}"
    );

    // The next daemon adopts the pins: held() is what the first one held,
    // rebuilt from the maps, and adopting wrote nothing.
    let backend = EgressEnforcer::load_pinned(&pins).unwrap();
    assert_eq!(
        backend.kernel().filter().pin_outcome(),
        &PinOutcome::Adopted
    );
    assert_eq!(backend.held().unwrap(), before);
    assert_eq!(
        before[&pid("deny-2")].cgroups,
        [cg.id()].into(),
        "{before:?}"
    );
    assert_eq!(backend.kernel().mutations(), 0, "adoption wrote nothing");
    let mut m = EgressManager::new(backend).unwrap();
    assert_eq!(m.programmed(), &before);
    // The same pod and the surviving policy: no change, so no kernel write.
    assert!(m.upsert_pod(pod("pod-1", &cg)).is_empty());
    let out = m.upsert_policy(policy(
        "deny-2",
        &[],
        &["127.0.0.2/32", "127.0.0.8/29", "denied.test"],
    ));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert_eq!(m.backend().kernel().mutations(), 0, "nothing to change");
    assert_eq!(
        m.backend().kernel().snooped().collect::<Vec<_>>(),
        [cg.id()],
        "the snooper's link was adopted with the filter's"
    );
    assert_eq!(m.programmed(), &before);
    assert!(!connects(&cg, "127.0.0.2"));
    // deny-3 was deleted while no daemon ran: kept until the reconcile,
    // which removes it. Its host entry and its prefix go, deny-2's stay:
    // the adopted filter knows the set still has both kinds of entry.
    assert!(!connects(&cg, "127.0.0.3"), "kept until the reconcile");
    assert!(!connects(&cg, "127.0.0.17"), "kept until the reconcile");
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    assert!(!m.programmed().contains_key(&pid("deny-3")));
    assert!(connects(&cg, "127.0.0.3"), "deny-3 is gone");
    assert!(connects(&cg, "127.0.0.17"), "deny-3 is gone");
    assert!(!connects(&cg, "127.0.0.2"), "deny-2 still holds");
    assert!(!connects(&cg, "127.0.0.9"), "deny-2 still holds");
    assert!(connects(&cg, "127.0.0.1"));
    // A monitor policy reprograms the cgroup's flags (observe): the
    // adopted filter still knows which lookups its set needs.
    let out = m.upsert_policy(NetworkPolicy {
        mode: Mode::Monitor,
        ..policy("watch-4", &["127.0.0.0/8"], &[])
    });
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    let state = m.backend().kernel().filter().read_state().unwrap();
    assert!(state.filters[&cg.id()].1.observe, "{state:?}");
    assert!(!connects(&cg, "127.0.0.2"), "deny-2 still holds");
    assert!(!connects(&cg, "127.0.0.9"), "deny-2 still holds");
    let held_now = m.backend().held().unwrap();
    drop(m);

    // A third load reads back exactly what the second one left.
    let backend = EgressEnforcer::load_pinned(&pins).unwrap();
    assert_eq!(backend.held().unwrap(), held_now);
    drop(backend);

    // Uninstall: removing the pins detaches everything (after an RCU grace
    // period).
    EgressEnforcer::remove_pins(&pins).unwrap();
    assert!(!pins.exists());
    assert!(eventually_connects(&cg, "127.0.0.2"), "the deny is gone");
}

#[test]
fn an_incompatible_pin_layout_is_discarded_without_a_gap() {
    let bpffs = Bpffs::new("layout");
    let pins = bpffs.pins();
    let a = TempCgroup::new("egress-restart", "layout-a");
    let b = TempCgroup::new("egress-restart", "layout-b");
    {
        let mut m = EgressManager::new(EgressEnforcer::load_pinned(&pins).unwrap()).unwrap();
        m.upsert_pod(pod("pod-a", &a));
        m.upsert_pod(pod("pod-b", &b));
        let out = m.upsert_policy(policy("deny-2", &[], &["127.0.0.2"]));
        assert!(out.failures.is_empty(), "{:?}", out.failures);
    }
    // The pins now read as another build's layout.
    EgressFilter::set_pinned_layout_version(&pins, LAYOUT_VERSION + 1).unwrap();

    let backend = EgressEnforcer::load_pinned(&pins).unwrap();
    match backend.kernel().filter().pin_outcome() {
        PinOutcome::Discarded { reason } => {
            assert!(
                reason.contains(&format!("layout version {}", LAYOUT_VERSION + 1)),
                "{reason}"
            );
        }
        other => panic!("not discarded: {other:?}"),
    }
    assert!(backend.held().unwrap().is_empty(), "nothing misread");
    // Each cgroup's filter link and snooper link.
    assert_eq!(backend.kernel().stale_links(), 4);
    assert_eq!(
        EgressFilter::pinned_layout_version(&pins).unwrap(),
        Some(LAYOUT_VERSION),
        "rebuilt with this build's layout"
    );
    // The old links keep enforcing the old state meanwhile.
    assert!(!connects(&a, "127.0.0.2"));
    assert!(!connects(&b, "127.0.0.2"));

    // The new daemon programs pod-a again: its link replaces the old pin.
    let mut m = EgressManager::new(backend).unwrap();
    m.upsert_pod(pod("pod-a", &a));
    let out = m.upsert_policy(policy("deny-2", &[], &["127.0.0.2"]));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert_eq!(m.backend().kernel().stale_links(), 2, "b's two");
    assert!(!connects(&a, "127.0.0.2"));
    assert!(connects(&a, "127.0.0.1"));
    assert!(!connects(&b, "127.0.0.2"), "b's old link still holds");
    // The reconcile releases what nobody re-programmed.
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    assert_eq!(m.backend().kernel().stale_links(), 0);
    assert!(eventually_connects(&b, "127.0.0.2"), "b's old link is gone");
    assert!(!connects(&a, "127.0.0.2"), "a is served by the new state");
    drop(m);

    EgressEnforcer::remove_pins(&pins).unwrap();
    assert!(eventually_connects(&a, "127.0.0.2"));
}

#[test]
fn a_cgroup_removed_while_down_is_forgotten() {
    let bpffs = Bpffs::new("gone");
    let pins = bpffs.pins();
    let kept = TempCgroup::new("egress-restart", "gone-kept");
    let gone = TempCgroup::new("egress-restart", "gone-removed");
    let gone_id = gone.id();
    {
        let mut m = EgressManager::new(EgressEnforcer::load_pinned(&pins).unwrap()).unwrap();
        m.upsert_pod(pod("pod-kept", &kept));
        m.upsert_pod(pod("pod-gone", &gone));
        let out = m.upsert_policy(policy("deny-2", &[], &["127.0.0.2"]));
        assert!(out.failures.is_empty(), "{:?}", out.failures);
    }
    assert!(gone.remove(), "a cgroup with a pinned link can be removed");
    // The kernel releases the removed cgroup's programs asynchronously;
    // until then its link still reads as attached.
    let mut held = None;
    for _ in 0..100 {
        let backend = EgressEnforcer::load_pinned(&pins).unwrap();
        let h = backend.held().unwrap();
        if !h[&pid("deny-2")].cgroups.contains(&gone_id) {
            held = Some(h);
            break;
        }
        drop(backend);
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = held.expect("the removed cgroup is still held");
    assert_eq!(held[&pid("deny-2")].cgroups, [kept.id()].into());
    assert!(!pins.join("links").join(gone_id.to_string()).exists());
    assert!(!connects(&kept, "127.0.0.2"));
    EgressEnforcer::remove_pins(&pins).unwrap();
    assert!(eventually_connects(&kept, "127.0.0.2"));
}
