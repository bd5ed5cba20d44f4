//! On the real kernel's CPU hierarchy (root needed; CI runs as root).

use std::process::Command;

use appease_cgroup::Cgroups;

#[test]
fn top_group_idle_weight_move_and_remove() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: creating cgroups needs root (CI runs as root)");
        return;
    }
    let cg = Cgroups::detect().expect("this host has a CPU cgroup hierarchy");
    let name = format!("appease-test-{}", std::process::id());
    let group = cg.ensure_top_group(&name, true, 10).unwrap();
    assert_eq!(group, format!("/{name}"));
    assert!(cg.idle(&group).unwrap());

    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let home = cg.group_of(pid).unwrap();
    cg.move_process(pid, &group).unwrap();
    assert_eq!(cg.group_of(pid).unwrap(), group);
    assert_eq!(cg.processes(&group).unwrap(), vec![pid]);

    cg.set_idle(&group, false).unwrap();
    assert!(!cg.idle(&group).unwrap());
    cg.move_process(pid, &home).unwrap();
    assert_eq!(cg.group_of(pid).unwrap(), home);
    child.kill().unwrap();
    child.wait().unwrap();

    // A vanished task is reported as gone, not as a failure.
    let err = cg.move_process(pid, &group).unwrap_err();
    assert!(err.is_gone(), "{err}");
    cg.remove(&group).unwrap();
    assert!(!cg.exists(&group));
    cg.remove(&group).unwrap(); // removing twice is fine
}
