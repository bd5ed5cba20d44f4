//! On the real kernel's CPU hierarchy (root needed; CI runs as root).

use std::process::Command;

use appease_cgroup::Cgroups;

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn top_group_idle_weight_move_and_remove() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "creating cgroups needs root; run it as root (make test does)"
    );
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

    // Empty job groups directly inside go; one holding a process stays, and so does any
    // other group (not appease's).
    let dir = cg.root().join(&name);
    for sub in ["job-1", "job-2", "job-", "other"] {
        std::fs::create_dir(dir.join(sub)).unwrap();
    }
    cg.move_process(pid, &format!("{group}/job-2")).unwrap();
    assert_eq!(cg.remove_empty_job_groups(&group), 1);
    assert!(!dir.join("job-1").exists() && dir.join("job-2").is_dir());
    assert!(dir.join("job-").is_dir() && dir.join("other").is_dir());
    cg.move_process(pid, &group).unwrap();
    assert_eq!(cg.remove_empty_job_groups(&group), 1);
    assert_eq!(cg.remove_empty_job_groups("/"), 0, "never at the root");
    for sub in ["job-", "other"] {
        std::fs::remove_dir(dir.join(sub)).unwrap();
    }

    cg.set_idle(&group, false).unwrap();
    assert!(!cg.idle(&group).unwrap());
    // The weight lands in the version's own file and scale, and reads back.
    cg.set_weight(&group, 250).unwrap();
    let want = match cg.version() {
        appease_cgroup::Version::V1 => "2560", // shares = weight × 1024 / 100
        appease_cgroup::Version::V2 => "250",
    };
    assert_eq!(cg.weight_raw(&group).unwrap(), want);
    cg.set_weight_raw(&group, want).unwrap();
    assert_eq!(cg.weight_raw(&group).unwrap(), want, "written back as read");
    cg.move_process(pid, &home).unwrap();
    assert_eq!(cg.group_of(pid).unwrap(), home);
    child.kill().unwrap();
    child.wait().unwrap();

    // A vanished task is reported as gone, not as a failure.
    let err = cg.move_process(pid, &group).unwrap_err();
    assert!(err.is_gone(), "{err}");
    // A group found idle (left by a run that was killed) is taken as it is for an idle
    // group, and refused, unchanged, for a weighted one.
    cg.set_idle(&group, true).unwrap();
    assert_eq!(cg.ensure_top_group(&name, true, 10).unwrap(), group);
    assert!(cg.idle(&group).unwrap());
    assert!(cg.ensure_top_group(&name, false, 100).is_err());
    assert!(cg.idle(&group).unwrap());

    cg.remove(&group).unwrap();
    assert!(!cg.exists(&group));
    cg.remove(&group).unwrap(); // removing twice is fine
}

#[test]
fn the_proc_parsers_never_panic_on_damaged_proc_text() {
    use appease_fuzz::{fuzz, seed_from, text};
    fuzz(
        "/proc/PID/stat (cgroup)",
        seed_from("/proc/self/stat"),
        |b| {
            let _ = appease_cgroup::stat_ppid(b);
            let _ = appease_cgroup::ProcStat::parse(b);
            let _ = appease_cgroup::names::escaped(b);
        },
    );
    fuzz("/proc/PID/cgroup", seed_from("/proc/self/cgroup"), |b| {
        let t = text(b);
        let _ = appease_cgroup::parse_proc_cgroup(&t, appease_cgroup::Version::V1);
        let _ = appease_cgroup::parse_proc_cgroup(&t, appease_cgroup::Version::V2);
    });
}
