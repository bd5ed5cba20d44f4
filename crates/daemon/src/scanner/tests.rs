use super::*;

fn task(pid: u32, tid: u32, cpu_ns: u64, wait_ns: u64, running: bool) -> TaskRecord {
    TaskRecord {
        pid,
        tid,
        ppid: if pid == tid { 7 } else { 0 },
        cpu_ns,
        wait_ns,
        start_boot_ns: if pid == tid { 123_456_789_000 } else { 0 },
        age_ns: 5,
        gone_cpu_ns: if pid == tid { 1_000 } else { 0 },
        kernel_thread: false,
        running,
        has_tty: pid == tid,
        listens: false,
        idle_group: running && tid == 41,
        sched_idle: tid == 42 || tid == 41,
        response_ns: 0,
        app: pid,
        comm: if pid == tid {
            "make".into()
        } else {
            "worker".into()
        },
        cgroup_ids: Default::default(),
    }
}

fn proc(pid: u32, ppid: u32) -> ProcSample {
    ProcSample {
        pid,
        ppid,
        comm: "p".into(),
        start: 1,
        cpu_ns: 0,
        wait_ns: 0,
        kernel_thread: false,
        has_tty: false,
        listens: false,
        age_ns: 0,
        sched_idle: false,
        last_response: None,
    }
}

#[test]
fn ancestors_climb_to_the_first_unknown_parent() {
    // 1 -> 40 -> 41 -> 50 (the daemon); 60 is a sibling's child.
    let procs = [
        proc(1, 0),
        proc(40, 1),
        proc(41, 40),
        proc(50, 41),
        proc(60, 41),
    ];
    assert_eq!(ancestors_of(50, &procs), vec![41, 40, 1]);
    assert_eq!(itself_and_ancestors(50, &procs), vec![50, 41, 40, 1]);
    assert_eq!(ancestors_of(60, &procs), vec![41, 40, 1]);
    assert!(ancestors_of(1, &procs).is_empty());
    // A parent missing from the table ends the climb; a loop does not hang it.
    assert_eq!(ancestors_of(7, &[proc(7, 8)]), vec![8]);
    assert_eq!(ancestors_of(7, &[proc(7, 8), proc(8, 7)]), vec![8, 7]);
}

#[test]
fn the_idle_groups_share_and_waiting_come_from_the_change_since_the_last_scan() {
    let mut w = Worker::new(
        Source::Proc(HashMap::new()),
        &Config::default().batch_params(),
        HashSet::new(),
    );
    let mut a = proc(10, 1);
    let b = proc(11, 1);
    let group: HashSet<u32> = [10, 11].into();
    assert_eq!(
        w.floor_sample(0, &[a.clone(), b.clone()], &group, &HashSet::new()),
        None,
        "no last scan"
    );
    w.seen = [(10, (1, 0, 0)), (11, (1, 0, 0))].into();
    w.last_scan = Some(0);
    // Over one second, 10 used half a CPU and waited 50 ms.
    a.cpu_ns = 500_000_000;
    a.wait_ns = 50_000_000;
    let s = w
        .floor_sample(
            1_000_000_000,
            &[a.clone(), b.clone()],
            &group,
            &HashSet::new(),
        )
        .unwrap();
    assert!(
        (s.share_pct - 50.0 / host::cpus() as f64).abs() < 1e-9,
        "{s:?}"
    );
    assert!(!s.waiting, "50 ms in a second is not a tenth");
    let s = w
        .floor_sample(1_000_000_000, &[a, b], &group, &[11].into())
        .unwrap();
    assert!(s.waiting, "one runnable now is waiting");
    assert_eq!(
        w.floor_sample(1, &[], &HashSet::new(), &HashSet::new()),
        None,
        "empty group"
    );
}

#[test]
fn a_request_counts_for_its_process_not_for_a_later_one_with_its_pid() {
    // pid 40 received a request; it exited and a new process got pid 40.
    let last: HashMap<u32, (u64, u64)> = [(40, (1000, 5)), (41, (2000, 6))].into();
    let start_of: HashMap<u32, u64> = [(40, 1777), (41, 2000)].into();
    let live = requests_of_live(&last, &start_of);
    assert_eq!(
        live.get(&40),
        None,
        "the newcomer with pid 40 received nothing"
    );
    assert_eq!(live.get(&41), Some(&6));
}

#[test]
fn a_process_is_its_leaders_fields_and_its_threads_sums() {
    let tasks = [
        task(40, 40, 100, 10, false),
        task(40, 41, 200, 20, true),
        task(40, 42, 300, 30, true),
        task(50, 50, 5, 0, false),
        // A thread whose leader was not listed (it ended mid-read) is dropped.
        task(60, 61, 9, 9, true),
    ];
    let snap = from_tasks(&tasks, 10_000_000);
    let p40 = snap.procs.iter().find(|p| p.pid == 40).unwrap();
    assert_eq!(p40.comm, "make");
    assert_eq!(p40.ppid, 7);
    assert_eq!(
        p40.cpu_ns,
        1_000 + 600,
        "threads plus exited ones and children"
    );
    assert_eq!(p40.wait_ns, 60);
    assert_eq!(p40.start, 12_345, "clock ticks of 10 ms, as /proc counts");
    assert!(p40.has_tty);
    assert!(
        snap.runnable.contains(&40),
        "a running thread makes it runnable"
    );
    assert!(!snap.runnable.contains(&50));
    assert!(!snap.procs.iter().any(|p| p.pid == 60));
    assert_eq!(snap.cost.threads, 5);
    assert_eq!(
        snap.idle_group_runnable, 1,
        "thread 41, running in an idle group"
    );
    assert_eq!(
        snap.sched_idle_runnable, 1,
        "thread 42, SCHED_IDLE and running outside an idle group (41 is in one)"
    );
}
