use std::sync::{Arc, Mutex};

use appease_cgroup::{Cgroups, Version};

use super::*;
use crate::groups::Groups;
use crate::journal::Journal;
use crate::testing::{Bus, FakeSystemd};

/// A child process alone in a fake v2 tree that systemd owns, and an actuator
/// journaling into `dir` that talks to `fake`.
fn set_up(
    dir: &std::path::Path,
    fake: &Arc<Mutex<FakeSystemd>>,
) -> (std::process::Child, KernelActuator) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "needs root: run it as root (make test does)");
    let child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let root = dir.join("cgroup");
    std::fs::create_dir_all(&root).unwrap();
    // The child's real v2 path on this host is "/" (the fake tree's root).
    std::fs::write(root.join("cgroup.procs"), format!("{}\n", child.id())).unwrap();
    let cg = Cgroups::at(Version::V2, &root).unwrap();
    let groups = Groups::new(cg, "appease")
        .owned_by_systemd(true)
        .with_units(Box::new(Bus(fake.clone())));
    let journal = Journal::open(&dir.join("run")).unwrap();
    let act = KernelActuator::new(Some(journal), vec![])
        .unwrap()
        .with_groups(groups);
    (child, act)
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("appease-act-{tag}-{}", std::process::id()));
    let _fresh = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn start_of(pid: u32) -> u64 {
    sys::task_stat(pid, pid).unwrap().start
}

fn policy(pid: u32) -> i32 {
    // SAFETY: sched_getscheduler only reads.
    unsafe { libc::sched_getscheduler(pid as i32) }
}

#[test]
#[ignore = "needs root (putting a thread back from SCHED_IDLE): make test runs it, or as root cargo test -- --include-ignored"]
fn a_refused_dbus_call_leaves_the_unit_as_it_was_and_demotes_per_thread() {
    let dir = temp_dir("refused");
    let fake = Arc::new(Mutex::new(FakeSystemd {
        weight: 100,
        refuse_set: true,
        ..Default::default()
    }));
    let (mut child, mut act) = set_up(&dir, &fake);
    let pid = child.id();
    let n = act
        .demote(pid, &[(pid, start_of(pid))], "cpu-soaker", false)
        .unwrap();
    assert_eq!(n, 1, "demoted all the same");
    assert_eq!(fake.lock().unwrap().weight, 100, "the unit as it was");
    assert_eq!(policy(pid), libc::SCHED_IDLE, "per thread instead");
    assert!(act.idle_units.is_empty());
    assert_eq!(act.counters.failures, 1, "counted");
    let journal = Journal::open(&dir.join("run")).unwrap();
    assert!(journal.state().units.is_empty(), "no unit left to undo");
    let report = act.restore_all();
    assert_eq!(report.failed, 0);
    assert_eq!(policy(pid), libc::SCHED_OTHER, "put back");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root (putting a thread back from SCHED_IDLE): make test runs it, or as root cargo test -- --include-ignored"]
fn a_unit_that_goes_away_is_skipped_before_and_counted_gone_after_adoption() {
    let dir = temp_dir("gone");
    let fake = Arc::new(Mutex::new(FakeSystemd {
        weight: 100,
        gone: true,
        ..Default::default()
    }));
    let (mut child, mut act) = set_up(&dir, &fake);
    let pid = child.id();
    // Gone before: no unit to make idle, the process is demoted per thread.
    assert_eq!(
        act.demote(pid, &[(pid, start_of(pid))], "cpu-soaker", false)
            .unwrap(),
        1
    );
    assert!(act.idle_units.is_empty());
    assert_eq!(policy(pid), libc::SCHED_IDLE);
    assert_eq!(act.promote(pid, &[pid]).unwrap(), 1);
    assert_eq!(policy(pid), libc::SCHED_OTHER);
    // Made idle, then gone (stopped) before appease gives it back.
    fake.lock().unwrap().gone = false;
    assert_eq!(
        act.demote(pid, &[(pid, start_of(pid))], "cpu-soaker", false)
            .unwrap(),
        1
    );
    assert_eq!(
        fake.lock().unwrap().weight,
        WEIGHT_IDLE,
        "the unit made idle"
    );
    fake.lock().unwrap().gone = true;
    let report = act.restore_all();
    assert_eq!((report.gone, report.failed), (1, 0), "{report:?}");
    let journal = Journal::open(&dir.join("run")).unwrap();
    assert!(journal.state().units.is_empty(), "nothing left to undo");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
