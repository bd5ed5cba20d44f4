use super::*;

const S: u64 = 1_000_000_000;

fn p(pid: u32, ppid: u32, comm: &str, cpu_s: f64) -> ProcSample {
    ProcSample {
        pid,
        ppid,
        comm: comm.into(),
        start: pid as u64,
        cpu_ns: (cpu_s * 1e9) as u64,
        wait_ns: 0,
        kernel_thread: false,
        has_tty: false,
        listens: false,
        age_ns: 3600 * S,
        sched_idle: false,
        last_response: None,
    }
}

fn params() -> BatchParams {
    BatchParams {
        min_cpus: 0.8,
        after: Duration::from_secs(3),
        request_memory: Duration::from_secs(60),
    }
}

fn listening(p: ProcSample) -> ProcSample {
    ProcSample { listens: true, ..p }
}

fn interactive_shell(pid: u32, ppid: u32) -> ProcSample {
    ProcSample {
        has_tty: true,
        ..p(pid, ppid, "bash", 0.0)
    }
}

/// Runs scans once a second; `cpu(t, pid)` gives each process's cumulative CPU seconds.
fn run(
    c: &mut BatchClassifier,
    secs: u64,
    procs: impl Fn(u64) -> Vec<ProcSample>,
    asked: impl Fn(u32) -> Option<Nanos> + Copy,
) -> Vec<(u64, BatchDecision)> {
    let mut out = vec![];
    for t in 0..=secs {
        for d in c.on_scan(t * S, &procs(t), asked, |_| None) {
            out.push((t, d));
        }
    }
    out
}

fn none(_: u32) -> Option<Nanos> {
    None
}

/// The decisions but the moves of processes found in demoted trees later.
fn demotions(d: Vec<(u64, BatchDecision)>) -> Vec<(u64, BatchDecision)> {
    d.into_iter()
        .filter(|(_, x)| !matches!(x, BatchDecision::Follow { .. }))
        .collect()
}

#[test]
fn make_and_its_compilers_are_one_tree_under_the_shell() {
    let mut c = BatchClassifier::new(params());
    // shell 10 -> make 20 -> cc 21, cc 22 (each a CPU); make itself idle.
    let procs = |t: u64| {
        let t = t as f64;
        vec![
            p(1, 0, "systemd", 0.0),
            interactive_shell(10, 1),
            p(20, 10, "make", 0.01 * t),
            p(21, 20, "cc1", 0.9 * t),
            p(22, 20, "cc1", 0.9 * t),
        ]
    };
    let d = run(&mut c, 5, procs, none);
    assert_eq!(d.len(), 1, "{d:?}");
    let (
        t,
        BatchDecision::Demote {
            root,
            members,
            cpus,
            ..
        },
    ) = &d[0]
    else {
        panic!("{d:?}")
    };
    assert_eq!(
        (*t, *root),
        (4, 20),
        "demoted after 3 s of soaking, counted from the first rate"
    );
    assert_eq!(members, &vec![20, 21, 22]);
    assert!((cpus - 1.81).abs() < 0.01);
    assert_eq!(c.tree_of(21), Some(20));
}

#[test]
fn a_server_answering_requests_is_never_demoted() {
    let mut c = BatchClassifier::new(params());
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            p(30, 1, "postgres", 1.0 * t as f64),
        ]
    };
    let asked = |pid: u32| (pid == 30).then_some(0);
    assert!(run(&mut c, 10, procs, asked).is_empty());
}

#[test]
fn soakers_beside_a_server_in_one_process_tree_are_demoted_alone() {
    let mut c = BatchClassifier::new(params());
    // A test harness (40) that serves requests and spawned two plain soakers.
    let procs = |t: u64| {
        let t = t as f64;
        vec![
            p(1, 0, "systemd", 0.0),
            p(40, 1, "harness", 0.1 * t),
            p(41, 40, "sh", 1.0 * t),
            p(42, 40, "sh", 1.0 * t),
        ]
    };
    let asked = |pid: u32| (pid == 40).then_some(0);
    let d = run(&mut c, 4, procs, asked);
    let roots: Vec<u32> = d
        .iter()
        .filter_map(|(_, d)| match d {
            BatchDecision::Demote { root, .. } => Some(*root),
            _ => None,
        })
        .collect();
    assert_eq!(roots, vec![41, 42]);
}

#[test]
fn light_or_short_bursts_are_not_batch() {
    let mut c = BatchClassifier::new(params());
    let light = |t: u64| vec![p(1, 0, "systemd", 0.0), p(50, 1, "indexer", 0.5 * t as f64)];
    assert!(
        run(&mut c, 10, light, none).is_empty(),
        "half a CPU is below min_cpus"
    );
    let mut c = BatchClassifier::new(params());
    // Two seconds of soaking, then idle: never sustained for 3 s.
    let burst = |t: u64| vec![p(1, 0, "systemd", 0.0), p(51, 1, "x", t.min(2) as f64)];
    assert!(run(&mut c, 10, burst, none).is_empty());
}

#[test]
fn interactive_shells_and_the_service_manager_are_never_roots() {
    let mut c = BatchClassifier::new(params());
    // The soaking loop runs in the interactive shell itself.
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            ProcSample {
                cpu_ns: t * S,
                ..interactive_shell(10, 1)
            },
        ]
    };
    assert!(run(&mut c, 10, procs, none).is_empty());
}

#[test]
fn a_demoted_tree_that_starts_answering_requests_is_promoted() {
    let mut c = BatchClassifier::new(params());
    let procs = |t: u64| {
        let t = t as f64;
        vec![
            p(1, 0, "systemd", 0.0),
            p(60, 1, "worker", t),
            p(61, 60, "child", t),
        ]
    };
    let d = run(&mut c, 4, procs, none);
    assert!(matches!(
        d[..],
        [(4, BatchDecision::Demote { root: 60, .. })]
    ));
    // At 6 s the child receives a request.
    let asked = |pid: u32| (pid == 61).then_some(6 * S);
    let d = c.on_scan(7 * S, &procs(7), asked, |_| None);
    assert_eq!(
        d,
        vec![BatchDecision::Promote {
            root: 60,
            members: vec![60, 61]
        }]
    );
    // It answered recently: not demoted again while request_memory lasts.
    for t in 8..20 {
        assert!(c.on_scan(t * S, &procs(t), asked, |_| None).is_empty());
    }
}

#[test]
fn children_forked_after_demotion_join_the_tree() {
    let mut c = BatchClassifier::new(params());
    let procs = |t: u64| {
        let mut v = vec![p(1, 0, "systemd", 0.0), p(70, 1, "make", t as f64)];
        if t >= 6 {
            v.push(p(71, 70, "cc1", (t - 6) as f64));
        }
        v
    };
    let d = run(&mut c, 8, procs, none);
    // Followed once, by the scan that first sees it: born in the group it stays there; one
    // forked before its parent moved (the demoting scan's snapshot missed it) is moved.
    assert!(
        matches!(
            &d[..],
            [
                (4, BatchDecision::Demote { root: 70, .. }),
                (6, BatchDecision::Follow { root: 70, members }),
            ] if members == &vec![71]
        ),
        "{d:?}"
    );
    assert_eq!(c.tree_of(71), Some(70));
}

#[test]
fn rules_force_a_class() {
    let mut c = BatchClassifier::new(params());
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            p(80, 1, "ffmpeg", 0.1 * t as f64),
            p(81, 1, "postgres", 2.0 * t as f64),
        ]
    };
    let forced = |p: &ProcSample| match p.comm.as_str() {
        "ffmpeg" => Some(Class::Batch),
        "postgres" => Some(Class::Latency),
        _ => None,
    };
    let mut d = vec![];
    for t in 0..10 {
        d.extend(c.on_scan(t * S, &procs(t), none, forced));
    }
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(matches!(
        &d[0],
        BatchDecision::Demote {
            root: 80,
            why: "rule",
            ..
        }
    ));
}

#[test]
fn a_member_the_config_exempts_later_leaves_its_tree_alone() {
    let mut c = BatchClassifier::new(params());
    // script 30 -> worker 31, worker 32, each a CPU.
    let procs = |t: u64| {
        let t = t as f64;
        vec![
            p(1, 0, "systemd", 0.0),
            p(30, 1, "script", 0.01 * t),
            p(31, 30, "worker", 0.9 * t),
            p(32, 30, "indexer", 0.9 * t),
        ]
    };
    let mut d = vec![];
    for t in 0..5 {
        d.extend(c.on_scan(t * S, &procs(t), none, |_| None));
    }
    assert!(
        matches!(&d[..], [BatchDecision::Demote { root: 30, members, .. }] if members == &[30, 31, 32]),
        "{d:?}"
    );
    // A reload makes the indexer an exception (or a service): it alone comes back,
    // once, and the tree stays demoted.
    let exempt = |p: &ProcSample| (p.comm == "indexer").then_some(Class::Normal);
    let mut d = vec![];
    for t in 5..10 {
        d.extend(c.on_scan(t * S, &procs(t), none, exempt));
    }
    assert!(
        matches!(&d[..], [BatchDecision::Release { root: 30, pid: 32 }]),
        "{d:?}"
    );
    assert_eq!(c.tree_of(31), Some(30));
    assert_eq!(c.tree_of(32), None);
}

#[test]
fn protection_rules() {
    assert!(protected(&p(1, 0, "anything", 0.0)));
    assert!(protected(&p(300, 2, "kworker/0:1", 0.0)));
    assert!(protected(&p(300, 1, "sshd", 0.0)));
    assert!(
        protected(&p(300, 1, "sshd-session", 0.0)),
        "OpenSSH 9.8 and later"
    );
    assert!(protected(&interactive_shell(300, 1)));
    assert!(
        !protected(&p(300, 1, "sh", 0.0)),
        "a script's shell is an ordinary program"
    );
    assert!(!protected(&p(300, 1, "make", 0.0)));
}

#[test]
fn demand_counts_waiting_so_crowded_soakers_still_qualify() {
    let mut c = BatchClassifier::new(params());
    // Eight soakers on two CPUs: each runs a quarter of the time, waits the rest.
    let procs = |t: u64| {
        let mut v = vec![p(1, 0, "systemd", 0.0)];
        for pid in 100..108 {
            v.push(ProcSample {
                wait_ns: (0.75 * t as f64 * 1e9) as u64,
                ..p(pid, 1, "soak", 0.25 * t as f64)
            });
        }
        v
    };
    let d = run(&mut c, 4, procs, none);
    assert_eq!(d.len(), 8, "{d:?}");
}

#[test]
fn a_load_generators_queued_threads_are_not_demand() {
    // 256 client threads woken by responses on a busy host: together they wait for a CPU
    // 160 s a second while the process runs 0.3 CPUs. Reading responses, it is judged by
    // its CPU; the same waits without responses are a crowd of soakers.
    let generator = |reads: bool| {
        move |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                ProcSample {
                    wait_ns: 160 * t * S,
                    last_response: reads.then(|| t * S - S / 10),
                    ..p(300, 1, "sysbench", 0.3 * t as f64)
                },
            ]
        }
    };
    let mut c = BatchClassifier::new(params());
    let d = run(&mut c, 10, generator(true), none);
    assert!(d.is_empty(), "{d:?}");
    let mut c = BatchClassifier::new(params());
    let d = run(&mut c, 10, generator(false), none);
    assert!(
        matches!(&d[..], [(_, BatchDecision::Demote { root: 300, .. })]),
        "{d:?}"
    );
}

#[test]
fn a_supervisor_of_an_idle_server_and_a_soaker_is_not_the_root() {
    let mut c = BatchClassifier::new(params());
    // An unattended supervisor (no terminal) runs a server that listens but has had
    // no traffic yet, and a soaker: only the soaker is batch.
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            p(90, 1, "supervisor", 0.0),
            listening(p(91, 90, "server", 0.0)),
            p(92, 90, "soak", t as f64),
        ]
    };
    let d = run(&mut c, 4, procs, none);
    assert!(
        matches!(&d[..], [(_, BatchDecision::Demote { root: 92, .. })]),
        "{d:?}"
    );
}

#[test]
fn a_server_that_listens_after_its_supervisors_tree_was_demoted_has_it_judged_again() {
    let mut c = BatchClassifier::new(params());
    // The server is still starting (not listening) when the tree is judged: the whole
    // supervisor is demoted. Its listen() at 6 s makes it a server: the tree is promoted
    // at once (its first request must not wait behind the idle class), and the soaker
    // alone is batch again.
    let procs = |t: u64| {
        let server = p(91, 90, "server", 0.0);
        vec![
            p(1, 0, "systemd", 0.0),
            p(90, 1, "supervisor", 0.0),
            if t >= 6 { listening(server) } else { server },
            p(92, 90, "soak", t as f64),
        ]
    };
    let d = run(&mut c, 5, procs, none);
    assert!(
        matches!(&d[..], [(_, BatchDecision::Demote { root: 90, .. })]),
        "{d:?}"
    );
    let d = c.on_scan(6 * S, &procs(6), none, |_| None);
    assert_eq!(
        d,
        vec![BatchDecision::Promote {
            root: 90,
            members: vec![90, 91, 92]
        }]
    );
    let mut again = vec![];
    for t in 7..=12 {
        again.extend(c.on_scan(t * S, &procs(t), none, |_| None));
    }
    assert!(
        matches!(&again[..], [BatchDecision::Demote { root: 92, .. }]),
        "{again:?}"
    );
}

#[test]
fn a_tree_demoted_with_a_listening_member_is_not_promoted_for_it() {
    let mut c = BatchClassifier::new(params());
    // A soaker that holds a listening socket and is never asked: batch, and stays so.
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            listening(p(95, 1, "soak", t as f64)),
        ]
    };
    let d = run(&mut c, 12, procs, none);
    assert!(
        matches!(&d[..], [(_, BatchDecision::Demote { root: 95, .. })]),
        "{d:?}"
    );
}

#[test]
fn a_listening_child_charged_a_clock_tick_in_a_short_scan_still_splits_the_tree() {
    // Scans every 200 ms. The supervisor's idle server is charged one 10 ms tick every
    // other scan (it woke at a tick): it serves however little it runs.
    let mut c = BatchClassifier::new(params());
    let mut out = vec![];
    for i in 0..=25u64 {
        let t = i * S / 5;
        let procs = vec![
            p(1, 0, "systemd", 0.0),
            p(90, 1, "supervisor", 0.0),
            listening(p(91, 90, "server", (i / 2) as f64 * 0.010)),
            p(92, 90, "soak", t as f64 / S as f64),
        ];
        out.extend(c.on_scan(t, &procs, none, |_| None));
    }
    assert!(
        matches!(&out[..], [BatchDecision::Demote { root: 92, .. }]),
        "{out:?}"
    );
}

#[test]
fn a_script_with_an_idle_helper_and_busy_children_is_one_tree() {
    let mut c = BatchClassifier::new(params());
    // A backup script: a `sleep` watchdog and a `tee` beside two compressors.
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            p(100, 1, "backup.sh", 0.0),
            p(101, 100, "sleep", 0.0),
            p(102, 100, "tee", 0.001 * t as f64),
            p(103, 100, "gzip", t as f64),
            p(104, 100, "xz", t as f64),
        ]
    };
    let d = run(&mut c, 4, procs, none);
    let [(_, BatchDecision::Demote { root, members, .. })] = &d[..] else {
        panic!("one tree: {d:?}")
    };
    assert_eq!((*root, members), (100, &vec![100, 101, 102, 103, 104]));
}

#[test]
fn a_child_that_once_received_requests_still_makes_its_parent_a_supervisor() {
    let mut c = BatchClassifier::new(params());
    // The server's last request was long ago (beyond `request_memory`): it still serves.
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            p(90, 1, "supervisor", 0.0),
            p(91, 90, "server", 0.0),
            p(92, 90, "soak", t as f64),
        ]
    };
    let asked = |pid: u32| (pid == 91).then_some(0);
    let mut out = vec![];
    for t in 100..=105 {
        out.extend(c.on_scan(t * S, &procs(t), asked, |_| None));
    }
    assert!(
        matches!(&out[..], [BatchDecision::Demote { root: 92, .. }]),
        "{out:?}"
    );
}

#[test]
fn young_idle_children_do_not_stop_the_climb() {
    let mut c = BatchClassifier::new(params());
    // make with a busy compiler and a compiler just started.
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            p(95, 1, "make", 0.0),
            p(96, 95, "cc1", t as f64),
            ProcSample {
                age_ns: S / 10,
                ..p(97, 95, "cc1", 0.0)
            },
        ]
    };
    let d = run(&mut c, 4, procs, none);
    assert!(
        matches!(&d[..], [(_, BatchDecision::Demote { root: 95, .. })]),
        "{d:?}"
    );
}

#[test]
fn a_root_that_moves_between_scans_keeps_its_soaking_time() {
    let mut c = BatchClassifier::new(params());
    // A parent that is busy in some scans (the climb starts from it) and not in
    // others: the soaker's tree is found under the parent or alone, alternately.
    let procs = |t: u64| {
        let parent_cpu = 0.2 * (t / 2) as f64 + if t % 2 == 1 { 0.2 } else { 0.0 };
        vec![
            p(1, 0, "systemd", 0.0),
            p(110, 1, "runner", parent_cpu),
            p(111, 110, "soak", t as f64),
            // A listening child: the soaker's own climb stops below runner.
            listening(p(112, 110, "server", 0.0)),
        ]
    };
    let d = run(&mut c, 6, procs, none);
    assert!(!d.is_empty(), "demoted despite the root moving: {d:?}");
}

#[test]
fn a_loop_whose_children_each_live_less_than_a_scan_is_judged_by_what_it_reaped() {
    let mut c = BatchClassifier::new(params());
    // `while :; do pg_dump | gzip; done`: every scan sees a new dump and compressor,
    // each just started; what the earlier ones used is the loop's reaped children's
    // CPU (its cutime). Their reads were responses, not requests.
    let procs = |t: u64| {
        let n = 1000 + 2 * t as u32;
        vec![
            p(1, 0, "systemd", 0.0),
            p(100, 1, "bash", 0.95 * t as f64),
            p(n, 100, "pg_dump", 0.01),
            p(n + 1, 100, "gzip", 0.02),
        ]
    };
    // Each scan after the demotion follows the new dump and compressor.
    let d = demotions(run(&mut c, 5, procs, none));
    let [(at, BatchDecision::Demote { root, .. })] = &d[..] else {
        panic!("one tree: {d:?}")
    };
    assert_eq!(*root, 100, "the loop, not one of its short-lived children");
    assert!(*at <= 4, "after 3 s of soaking: {d:?}");
    // Had the dump's reads been requests, the loop would serve, and stay.
    let mut c = BatchClassifier::new(params());
    let served = |pid: u32| (pid >= 1000 && pid % 2 == 0).then_some(0);
    let d = run(&mut c, 5, procs, served);
    assert!(
        !d.iter()
            .any(|(_, x)| matches!(x, BatchDecision::Demote { root: 100, .. })),
        "{d:?}"
    );
}

#[test]
fn a_loop_whose_short_lived_children_read_responses_feeds_on_a_server() {
    // `while :; do psql -c 'select …' | awk …; done`: the client that read its responses
    // in one scan is gone by the next; its reads count for the tree at its demotion.
    let loop_of = |reads: bool| {
        move |t: u64| {
            let n = 1000 + 2 * t as u32;
            let client = ProcSample {
                last_response: (reads && t == 1).then(|| t * S - S / 2),
                ..p(n, 100, "psql", 0.01)
            };
            vec![
                p(1, 0, "systemd", 0.0),
                p(100, 1, "bash", 0.95 * t as f64),
                client,
                p(n + 1, 100, "awk", 0.02),
            ]
        }
    };
    let feeds_of = |d: &[(u64, BatchDecision)]| match d {
        [(
            _,
            BatchDecision::Demote {
                root: 100, feeds, ..
            },
        )] => *feeds,
        _ => panic!("one tree: {d:?}"),
    };
    let mut c = BatchClassifier::new(params());
    let d = demotions(run(&mut c, 5, loop_of(true), none));
    assert!(feeds_of(&d));
    let mut c = BatchClassifier::new(params());
    assert!(!feeds_of(&demotions(run(&mut c, 5, loop_of(false), none))));
}

#[test]
fn responses_read_before_a_tree_soaked_do_not_make_it_feed() {
    // A build that fetched its sources long ago, then only computes.
    let mut c = BatchClassifier::new(params());
    let procs = |t: u64| {
        vec![
            p(1, 0, "systemd", 0.0),
            ProcSample {
                last_response: Some(10 * S),
                ..p(200, 1, "cargo", if t < 20 { 0.0 } else { (t - 20) as f64 })
            },
        ]
    };
    let d: Vec<_> = run(&mut c, 30, procs, none);
    assert!(
        matches!(
            &d[..],
            [(
                _,
                BatchDecision::Demote {
                    root: 200,
                    feeds: false,
                    ..
                }
            )]
        ),
        "{d:?}"
    );
}
