use appease_cgroup::{Cgroups, Version};

use super::*;
use crate::journal::Journal;
use crate::KernelActuator;

/// A fake v2 tree whose root is this host's v2 path of the test's children ("/"):
/// moves are writes to its files, the processes stay where they are.
#[test]
fn a_pid_whose_start_time_is_not_the_one_the_scan_saw_is_not_moved() {
    let dir = std::env::temp_dir().join(format!("appease-groups-{}", std::process::id()));
    let _fresh = std::fs::remove_dir_all(&dir);
    let root = dir.join("cgroup");
    std::fs::create_dir_all(&root).unwrap();
    // The idle group as the kernel would make it (a fake tree has no kernel).
    std::fs::create_dir_all(root.join("appease")).unwrap();
    std::fs::write(root.join("appease/cpu.idle"), "0").unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id();
    let cg = Cgroups::at(Version::V2, &root).unwrap();
    if cg.group_of(pid).unwrap() != "/" {
        let _ = child.kill();
        panic!("this test needs its children at the root of the v2 hierarchy");
    }
    let mut act = KernelActuator::new(Some(Journal::open(&dir.join("run")).unwrap()), vec![])
        .unwrap()
        .with_groups(Groups::new(cg, "appease"));
    let start = sys::task_stat(pid, pid).unwrap().start;
    // As if the scan had seen another process under this PID (ended, PID reused).
    assert_eq!(
        act.demote(pid, &[(pid, start + 1)], "cpu-soaker", false)
            .unwrap(),
        0
    );
    assert!(!act.is_moved(pid));
    assert!(Journal::open(&dir.join("run"))
        .unwrap()
        .state()
        .moves
        .is_empty());
    // The process the scan saw is moved, into its job's group in the idle group.
    assert_eq!(
        act.demote(pid, &[(pid, start)], "cpu-soaker", false)
            .unwrap(),
        1
    );
    let procs =
        std::fs::read_to_string(root.join(format!("appease/job-{pid}/cgroup.procs"))).unwrap();
    assert_eq!(procs.trim(), pid.to_string());
    // Moved back where it was (a fake group cannot be removed: not checked).
    act.restore_all();
    let back = std::fs::read_to_string(root.join("cgroup.procs")).unwrap();
    assert_eq!(back.trim(), pid.to_string());
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fake v2 tree in a directory of its own (`name`) with the batch groups made (a fake
/// tree has no kernel to make their files), two `sleep`s to move, and an actuator on it.
fn two_sleepers_in_a_fake_tree(
    name: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    Vec<std::process::Child>,
    KernelActuator,
) {
    let dir = std::env::temp_dir().join(format!("appease-{name}-{}", std::process::id()));
    let _fresh = std::fs::remove_dir_all(&dir);
    let root = dir.join("cgroup");
    for g in ["appease", "appease-feeders"] {
        std::fs::create_dir_all(root.join(g)).unwrap();
        std::fs::write(root.join(g).join("cpu.idle"), "0").unwrap();
    }
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap()
        })
        .collect();
    let cg = Cgroups::at(Version::V2, &root).unwrap();
    let act = KernelActuator::new(Some(Journal::open(&dir.join("run")).unwrap()), vec![])
        .unwrap()
        .with_groups(Groups::new(cg, "appease"));
    (dir, root, children, act)
}

/// A tree that feeds on a server's responses goes to the feeders' group, of the least
/// weight while the idle group is idle, of the batch groups' weight when they have one.
#[test]
fn a_feeding_tree_goes_to_the_feeders_group_which_follows_the_batch_mode() {
    let (dir, root, mut children, mut act) = two_sleepers_in_a_fake_tree("feeders");
    let (feeder, soaker) = (children[0].id(), children[1].id());
    let start = |pid| sys::task_stat(pid, pid).unwrap().start;
    let read = |f: &str| {
        std::fs::read_to_string(root.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    act.demote(feeder, &[(feeder, start(feeder))], "cpu-soaker", true)
        .unwrap();
    act.demote(soaker, &[(soaker, start(soaker))], "cpu-soaker", false)
        .unwrap();
    let checks = [
        (
            read(&format!("appease-feeders/job-{feeder}/cgroup.procs")),
            feeder.to_string(),
        ),
        (
            read(&format!("appease/job-{soaker}/cgroup.procs")),
            soaker.to_string(),
        ),
        (read("appease-feeders/cpu.weight"), "1".into()),
        (read("appease-feeders/cpu.idle"), "0".into()),
        (read("appease/cpu.idle"), "1".into()),
    ];
    // Quiet: both groups of the same weight; idle again: the feeders' the least.
    act.set_batch_weight(Some(100), "quiet").unwrap();
    let quiet = [
        read("appease-feeders/cpu.weight"),
        read("appease/cpu.weight"),
        read("appease/cpu.idle"),
    ];
    act.set_batch_weight(None, "idle").unwrap();
    let idle = [read("appease-feeders/cpu.weight"), read("appease/cpu.idle")];
    act.restore_all();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (got, want) in checks {
        assert_eq!(got, want);
    }
    assert_eq!(quiet, ["100", "100", "0"]);
    assert_eq!(idle, ["1", "1"]);
}

/// A process the scan finds in a demoted tree after the demotion (forked before its parent
/// moved, so born outside) follows the tree into its job's group, in the feeders' group
/// too; a tree that was never moved has nothing to follow.
#[test]
fn a_process_found_in_a_demoted_tree_later_follows_it_into_its_group() {
    let (dir, root, mut children, mut act) = two_sleepers_in_a_fake_tree("follow");
    let (loop_pid, late) = (children[0].id(), children[1].id());
    let start = |pid| sys::task_stat(pid, pid).unwrap().start;
    let never_moved = act.follow(late, &[(late, start(late))]).unwrap();
    act.demote(loop_pid, &[(loop_pid, start(loop_pid))], "cpu-soaker", true)
        .unwrap();
    let stale = act.follow(loop_pid, &[(late, start(late) + 1)]).unwrap();
    let followed = act.follow(loop_pid, &[(late, start(late))]).unwrap();
    let again = act.follow(loop_pid, &[(late, start(late))]).unwrap();
    let procs =
        std::fs::read_to_string(root.join(format!("appease-feeders/job-{loop_pid}/cgroup.procs")))
            .unwrap();
    let in_journal = Journal::open(&dir.join("run")).unwrap().state().moves.len();
    act.restore_all();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (never_moved, stale, followed, again),
        (0, 0, 1, 0),
        "moved once, and only the process the scan saw"
    );
    // A fake group's cgroup.procs holds the last write.
    assert_eq!(procs.trim(), late.to_string());
    assert_eq!(in_journal, 2, "each move journaled before it is made");
}
