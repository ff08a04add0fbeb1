//! Failed updates and adoption (#36): after each step the kernel is read
//! back by execs from the pod's cgroup and, where it says more, by reading
//! its maps raw; the manager's record must equal what it wants.

use super::*;
use kyverno_runtime_enforce::openexec::Dimension;
use kyverno_runtime_enforce::{Held, Program};
use kyverno_runtime_policy::values::AbsPath;

/// A path map with room for 1, 2 and then 3 entries (the kernel's own
/// "full", on a map made small on purpose): growing a deny list from one
/// path to four fails at each of its steps. A shrink back to the first
/// path then leaves exactly that path denied, whatever the failed attempt
/// wrote, and the manager's record equals what it wants.
pub(super) fn failed_update_then_shrink(env: &Env) -> Result<(), String> {
    let all = [bin("a"), bin("b"), bin("c"), bin("other")];
    let every: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut x = Expect::new(env);
    for room in 1..=3usize {
        let capacity = u32::try_from(room).map_err(|e| e.to_string())?;
        let (open, exec) =
            lsm::load_with_path_capacity(env.hooks, capacity).map_err(|e| e.to_string())?;
        let mut m = OpenExecManager::new(open, exec).map_err(|e| e.to_string())?;
        let a = env.cgroup("full");
        add_pod(&mut m, pod("pod-full", "web", &[&a]));
        policy("p-full", "web", Mode::Enforce)
            .exec(&[], &every[..1])
            .apply(&mut m);
        let grown = m.upsert_policy(policy("p-full", "web", Mode::Enforce).exec(&[], &every).0);
        x.check(
            !grown.failures.is_empty(),
            format!("room {room}: growing to 4 paths did not fail"),
        );
        for (i, path) in all.iter().enumerate() {
            let want = if i < room { Refused } else { Done };
            x.case(
                &format!("room {room}, after the failed growth"),
                Some(&a),
                "exec",
                path,
                want,
            );
        }
        let id = PolicyId::new("p-full").map_err(|e| e.to_string())?;
        let recorded: BTreeSet<String> = match m.programmed(Dimension::Exec).get(&id) {
            Some(Held {
                program: Program::Enforce(rules),
                ..
            }) => rules.deny.iter().map(ToString::to_string).collect(),
            _ => BTreeSet::new(),
        };
        let written: BTreeSet<String> = all[..room].iter().cloned().collect();
        x.check(
            recorded == written,
            format!("room {room}: the record {recorded:?} is not what was written {written:?}"),
        );
        let shrunk = m.upsert_policy(
            policy("p-full", "web", Mode::Enforce)
                .exec(&[], &every[..1])
                .0,
        );
        x.check(
            shrunk.failures.is_empty(),
            format!("room {room}: the shrink failed: {:?}", shrunk.failures),
        );
        for (i, path) in all.iter().enumerate() {
            let want = if i == 0 { Refused } else { Done };
            x.case(
                &format!("room {room}, after the shrink"),
                Some(&a),
                "exec",
                path,
                want,
            );
        }
        x.check(
            m.programmed(Dimension::Exec) == &m.desired(Dimension::Exec),
            format!("room {room}: the manager's record is not what it wants"),
        );
    }
    x.finish()
}

/// Path bits of an observe slot left in the pinned maps (an interrupted
/// change) are cleared when a restarted daemon adopts them: the monitor
/// policy holding the slot refuses nothing, and an enforce policy that
/// takes the slot later does not inherit them.
pub(super) fn an_observe_slots_leftover_bits_are_cleared_on_adoption(
    env: &Env,
) -> Result<(), String> {
    let pins = Path::new(PINS);
    let _ = OpenExec::remove_pins(pins);
    let a = env.cgroup("leftover");
    let mut x = Expect::new(env);
    {
        let mut m = env.manager(Some(pins));
        policy("mon", "web", Mode::Monitor)
            .exec(&[], &[&bin("a")])
            .apply(&mut m);
        add_pod(&mut m, pod("pod-left", "web", &[&a]));
    }
    let key = AbsPath::parse(&bin("a"))
        .map_err(|e| e.to_string())?
        .kernel_key();
    let slot = {
        // The leftover: a deny bit of the monitor policy's slot on a path.
        let raw = OpenExec::load(env.hooks, Some(pins)).map_err(|e| e.to_string())?;
        let slot = (0..openexec::SLOTS)
            .find(|s| {
                raw.owner(KDim::Exec, *s).ok().flatten().as_deref() == Some(b"mon".as_slice())
            })
            .ok_or("the monitor policy holds no exec slot")?;
        let mut rule = raw.rule(KDim::Exec, &key).map_err(|e| e.to_string())?;
        rule.deny |= 1 << slot;
        if let Some(name) = openexec::name_key(&key) {
            raw.set_name(&name, true).map_err(|e| e.to_string())?;
        }
        raw.set_rule(KDim::Exec, &key, rule)
            .map_err(|e| e.to_string())?;
        slot
    };
    let mut m = env.manager(Some(pins));
    // The kernel refuses by any bound slot's deny bits: left in place,
    // the bit would make the monitor policy refuse.
    x.case(
        "the adopted monitor slot refuses nothing",
        Some(&a),
        "exec",
        &bin("a"),
        Done,
    );
    policy("mon", "web", Mode::Monitor)
        .exec(&[], &[&bin("a")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-left", "web", &[&a]));
    let failures = m.reconcile_adopted(&BTreeSet::new());
    x.check(failures.is_empty(), format!("reconcile: {failures:?}"));
    // The monitor policy goes; an enforce policy takes its slot.
    x.check(
        m.delete_policy(&PolicyId::new("mon").map_err(|e| e.to_string())?)
            .is_empty(),
        "deleting the monitor policy failed",
    );
    policy("enf", "web", Mode::Enforce)
        .exec(&[], &[&bin("b")])
        .apply(&mut m);
    x.case(
        "the new policy's own deny",
        Some(&a),
        "exec",
        &bin("b"),
        Refused,
    );
    x.case(
        "the slot's leftover bit was not inherited",
        Some(&a),
        "exec",
        &bin("a"),
        Done,
    );
    drop(m);
    let raw = OpenExec::load(env.hooks, Some(pins)).map_err(|e| e.to_string())?;
    let rule = raw.rule(KDim::Exec, &key).map_err(|e| e.to_string())?;
    x.check(
        rule.deny & (1 << slot) == 0,
        format!("slot {slot}'s leftover deny bit is still in the map: {rule:?}"),
    );
    drop(raw);
    let _ = OpenExec::remove_pins(pins);
    x.finish()
}
