use super::*;

fn thread(comm: &str, nice: i32, policy: u32, ioprio: i32, cgroup: &str) -> ThreadState {
    ThreadState {
        pid: 10,
        ppid: 1,
        comm: comm.into(),
        start: 5,
        nice,
        policy,
        rt_priority: 0,
        ioprio,
        cgroup: Some(cgroup.into()),
        oom_score_adj: Some(0),
    }
}

fn snapshot(threads: Vec<(u32, ThreadState)>, groups: &[&str], autogroup: &str) -> Snapshot {
    Snapshot {
        threads: threads.into_iter().collect(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        settings: vec![(
            "/proc/sys/kernel/sched_autogroup_enabled".into(),
            autogroup.into(),
        )],
        cgroups: None,
    }
}

#[test]
fn the_report_says_what_changed_per_command_most_threads_first() {
    let before = snapshot(
        vec![(1, thread("make", 0, 0, 0, "/"))],
        &["/appease.batch"],
        "1\n",
    );
    let after = snapshot(
        vec![
            (1, thread("make", 19, 5, 3 << 13, "/cpu80")),
            // Born after the peer started: compared with a fresh thread.
            (2, thread("gcc", 19, 5, 3 << 13, "/cpu80")),
            (3, thread("gcc", 19, 5, 3 << 13, "/cpu80")),
            (4, thread("bash", 0, 0, 0, "/")),
        ],
        &["/appease.batch", "/cpu80", "/cpu90"],
        "0\n",
    );
    let mut after = after;
    // A build started at nice 19 by a shell the snapshot knew: inherited, not changed.
    let mut shell = thread("bash", 19, 0, 0, "/");
    shell.pid = 50;
    let mut cargo = thread("cargo", 19, 0, 0, "/");
    (cargo.pid, cargo.ppid) = (51, 50);
    after.threads.insert(51, cargo);
    let mut before = before;
    before.threads.insert(50, shell);
    let lines = summarize(count_changes(&before, &after), &before, &after);
    assert_eq!(
        lines,
        [
            "gcc (2 threads): I/O none → idle",
            "gcc (2 threads): cgroup / → /cpu80",
            "gcc (2 threads): nice 0 → 19",
            "gcc (2 threads): policy normal → idle",
            "make (1 thread): I/O none → idle",
            "make (1 thread): cgroup / → /cpu80",
            "make (1 thread): nice 0 → 19",
            "make (1 thread): policy normal → idle",
            "made the cgroup /cpu80",
            "made the cgroup /cpu90",
            "/proc/sys/kernel/sched_autogroup_enabled: 1 → 0",
        ]
    );
}

#[test]
fn a_reused_pid_is_not_taken_for_the_parent_it_was() {
    // pid 60 was a process at nice 19 that ended; a new process got pid 60 and its
    // child was reniced by the peer: the old one's nice is not what it inherited.
    let mut old = thread("sh", 19, 0, 0, "/");
    (old.pid, old.start) = (60, 5);
    let before = snapshot(vec![(60, old)], &[], "1\n");
    let mut new = thread("sh", 0, 0, 0, "/");
    (new.pid, new.start) = (60, 9);
    let mut child = thread("make", 19, 0, 0, "/");
    (child.pid, child.ppid, child.start) = (61, 60, 10);
    let after = snapshot(vec![(60, new), (61, child)], &[], "1\n");
    assert_eq!(
        summarize(count_changes(&before, &after), &before, &after),
        ["make (1 thread): nice 0 → 19"]
    );
}

#[test]
fn names_of_classes_and_choice_files() {
    assert_eq!(ioprio_name((2 << 13) | 7), "best-effort 7");
    assert_eq!(ioprio_name(0), "none");
    assert_eq!(policy_name(5), "idle");
    assert_eq!(setting_value("none voluntary (full) lazy\n"), "full");
    assert_eq!(setting_value("1\n"), "1");
}

#[test]
#[ignore = "needs root (priorities, I/O classes, cgroups): make test runs it"]
fn what_a_peer_changes_is_reported_and_put_back() {
    // A peer's doing, by hand: a process reniced, made SCHED_IDLE, its I/O idle and
    // moved into a cgroup made for it, as Ananicy does to make.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let cg = Cgroups::detect().unwrap();
    let before = Arc::new(Snapshot::take());
    assert!(before.threads.contains_key(&pid));
    // Samples while the changes are made (own: a pid nothing descends from).
    let sampler = Sampler::start(before.clone(), u32::MAX, Duration::from_millis(100));
    let group = format!("/appease-peer-test-{}", std::process::id());
    fs::create_dir(cg.root().join(&group[1..])).unwrap();
    cg.move_process(pid, &group).unwrap();
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: our own child.
    unsafe {
        assert_eq!(libc::setpriority(libc::PRIO_PROCESS, pid, 19), 0);
        assert_eq!(
            libc::sched_setscheduler(pid as i32, libc::SCHED_IDLE, &param),
            0
        );
        let idle = 3 << 13;
        assert_eq!(
            libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, pid as i32, idle),
            0
        );
    }
    let now = Snapshot::take();
    let changed = summarize(count_changes(&before, &now), &before, &now);
    for want in [
        "sleep (1 thread): nice 0 → 19",
        "sleep (1 thread): policy normal → idle",
        "sleep (1 thread): I/O none → idle",
    ] {
        assert!(changed.iter().any(|l| l == want), "{want} in {changed:?}");
    }
    // A change undone before the end is reported as seen before it.
    std::thread::sleep(Duration::from_millis(400));
    // SAFETY: our own child.
    unsafe {
        let best_effort_4 = (2 << 13) | 4;
        assert_eq!(
            libc::syscall(
                libc::SYS_ioprio_set,
                IOPRIO_WHO_PROCESS,
                pid as i32,
                best_effort_4
            ),
            0
        );
    }
    let seen = sampler.finish();
    let at_end = count_changes(&before, &Snapshot::take());
    let gone = lines(gone_by_end(seen, &at_end));
    assert_eq!(gone, vec!["sleep (1 thread): I/O none → idle".to_string()]);
    assert!(
        changed
            .iter()
            .any(|l| l == &format!("made the cgroup {group}")),
        "{changed:?}"
    );
    let failed = before.restore();
    assert!(failed.is_empty(), "{failed:?}");
    let after = Snapshot::take();
    let (was, is) = (&before.threads[&pid], &after.threads[&pid]);
    assert_eq!(was, is, "every field of the thread back");
    assert!(
        !cg.root().join(&group[1..]).exists(),
        "the peer's cgroup removed"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_missing_peer_is_a_message_that_says_how_to_get_it() {
    let e = locate(
        Peer::Ananicy,
        &[("ananicy".into(), "/nonexistent/ananicy".into())],
    )
    .unwrap_err();
    assert!(
        e.contains("ananicy is not installed") && e.contains("make install"),
        "{e}"
    );
    let e = locate(
        Peer::System76Scheduler,
        &[("system76-scheduler".into(), "/nonexistent/s76".into())],
    )
    .unwrap_err();
    assert!(
        e.contains("system76-scheduler is not installed") && e.contains("just install"),
        "{e}"
    );
}
