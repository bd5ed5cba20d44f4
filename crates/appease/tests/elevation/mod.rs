//! Elevation: servers that receive requests are raised by the load's ladder and fade back;
//! a long request sinks, a cheater loses its raise, a hand-set nice is left alone.

use super::*;

root_test! {
    fn servers_are_elevated_under_load_unix_more_and_fade_back() {
        let (_dir, _cfg, _soak, daemon) = loaded("elevate", 4);
        let tcp = Service::tcp(Duration::from_millis(2), Duration::from_millis(20));
        let unix = Service::unix(Duration::from_millis(2), Duration::from_millis(20));
        let (t_tcp, t_unix) = (tcp.server_tid, unix.server_tid);
        let took_tcp = wait_for(Duration::from_secs(1), || nice_of(t_tcp) < 0);
        let took_unix = wait_for(Duration::from_secs(1), || nice_of(t_unix) < 0);
        assert!(
            took_tcp.is_some(),
            "TCP server elevated within 1 s: {}",
            daemon.log_text()
        );
        assert!(took_unix.is_some(), "UNIX server elevated within 1 s");
        eprintln!("elevated after {took_tcp:?} (tcp) and {took_unix:?} (unix)");
        assert_eq!(
            nice_of(t_tcp),
            -4,
            "network request: the ladder's inet_nice"
        );
        assert_eq!(nice_of(t_unix), -8, "UNIX request elevates more: unix_nice");

        // Status (rewritten every second) lists both with their original nice and why.
        let listed = |st: &serde_json::Value, tid: u32| lists_thread(st, |t| t["tid"] == tid);
        let (shown, st) = daemon.status_until(Duration::from_secs(3), |st| {
            listed(st, t_tcp) && listed(st, t_unix)
        });
        assert!(shown, "{st}");
        let threads = st["threads"].as_array().unwrap();
        let row = |tid: u32| threads.iter().find(|t| t["tid"] == tid).cloned().unwrap();
        assert_eq!(row(t_unix)["original_nice"], 0);
        assert_eq!(row(t_unix)["class"], "latency");
        assert_eq!(row(t_unix)["why"], "unix-request");
        assert_eq!(row(t_tcp)["why"], "network-request");
        assert_eq!(st["probe"]["lost_events"], 0);

        // Requests stop: the elevation fades to the original nice (8 levels x 50 ms).
        tcp.pause();
        unix.pause();
        let back = wait_for(Duration::from_secs(3), || {
            nice_of(t_tcp) == 0 && nice_of(t_unix) == 0
        });
        assert!(back.is_some(), "both back to nice 0 after requests stop");
        eprintln!("faded back after {back:?}");
    }
}

root_test! {
    fn a_long_request_sinks_below_its_own_nice_and_its_next_request_brings_it_back() {
        let (_dir, _cfg, _soak, mut daemon) = loaded("sink", 4);
        // One process, one cgroup: a thread serving short requests (2 ms each, every 20 ms)
        // and one whose requests each compute 300 ms (the default sinks past 50 ms).
        let short = Service::unix(Duration::from_millis(2), Duration::from_millis(20));
        let long = Service::unix(Duration::from_millis(300), Duration::from_millis(50));
        let (s, l) = (short.server_tid, long.server_tid);
        assert!(
            wait_for(Duration::from_secs(3), || nice_of(l) == 10).is_some(),
            "the long request sinks 10 levels below nice 0: {}",
            daemon.log_text()
        );
        assert_eq!(
            nice_of(s),
            -8,
            "the short requests' thread keeps its elevation"
        );
        let (shown, st) = daemon.status_until(Duration::from_secs(3), |st| {
            lists_thread(st, |t| t["tid"] == l && t["class"] == "sunk" && t["nice"] == 10)
        });
        assert!(shown, "status shows it sunk: {st}");
        // Its next request brings it back (elevated), and it sinks again as it computes.
        assert!(
            wait_for(Duration::from_secs(10), || nice_of(l) == -8).is_some(),
            "surfaced at its next request: {}",
            daemon.log_text()
        );
        assert!(wait_for(Duration::from_secs(5), || nice_of(l) == 10).is_some());
        drop((short, long));
        assert!(daemon.signal(libc::SIGTERM).success());
        let log = daemon.full_log();
        assert!(
            log.contains("long-request"),
            "the audit trail says why: {log}"
        );
    }
}

root_test! {
    fn a_forking_server_elevates_fresh_connections_and_sinks_a_heavy_one_at_the_threshold() {
        let (_dir, _cfg, _soak, daemon) = loaded("forking", 4);
        let (server, port) = perl_server(FORKING_SERVER);
        let addr = format!("127.0.0.1:{port}");
        let server_pid = server.0[0].id();
        let connect = |known: &[u32]| connect_child(&addr, server_pid, known);
        let (mut heavy, heavy_pid) = connect(&[]);
        // The heavy request: elevated at its read like any other, sunk past 50 ms of CPU.
        heavy.write_all(b"h").unwrap();
        assert!(
            wait_for(Duration::from_secs(3), || nice_of_process(heavy_pid) == 10).is_some(),
            "the heavy request sinks: {}",
            daemon.log_text()
        );
        // Meanwhile a fresh connection's short requests are elevated (-4: a network request).
        let (mut short, short_pid) = connect(&[heavy_pid]);
        ask(&mut short, b"s");
        assert!(
            wait_for(Duration::from_secs(1), || {
                ask(&mut short, b"s");
                nice_of_process(short_pid) == -4
            })
            .is_some(),
            "a fresh connection's child is elevated: {}",
            daemon.log_text()
        );
        assert_eq!(
            nice_of_process(heavy_pid),
            10,
            "the heavy one stays sunk meanwhile"
        );
        let mut r = [0u8; 1];
        heavy.read_exact(&mut r).unwrap();
        drop((heavy, short, server));
    }
}

root_test! {
    fn a_forking_servers_child_in_a_session_of_its_own_is_elevated_with_the_kernels_slice_and_sunk_with_a_long_one() {
        let _on = AutogroupsOn::new();
        assert_in_root_cpu_group();
        let (_dir, _cfg, _soak, daemon) = loaded("own-session", 4);
        let default_slice = appease_actuator::sys::sched_getattr(gettid()).unwrap().slice_ns;
        // A child of each kind of forking server, elevated by its requests.
        let elevated_child = |script: &str| {
            let (server, port) = perl_server(script);
            let addr = format!("127.0.0.1:{port}");
            let (mut c, child) = connect_child(&addr, server.0[0].id(), &[]);
            let up = wait_for(Duration::from_secs(3), || {
                ask(&mut c, b"s");
                nice_of_process(child) == -4
            });
            assert!(up.is_some(), "the child is elevated: {}", daemon.log_text());
            let slice = appease_actuator::sys::sched_getattr(child).unwrap().slice_ns;
            (server, c, child, slice)
        };
        let own = elevated_child(&session_forking_server());
        assert_eq!(
            stat_of(&format!("/proc/{}/stat", own.2)).unwrap().session,
            own.2,
            "the child leads its session"
        );
        let shared = elevated_child(FORKING_SERVER);
        // In a session of its own the child is alone at the top level: a short slice
        // would act on every other session, its clients' first. In the server's session
        // it orders the child among the server's own.
        assert_eq!(own.3, default_slice, "the kernel's slice: {}", daemon.log_text());
        assert_eq!(shared.3, 500_000, "the short slice: {}", daemon.log_text());
        // A heavy request sinks both 10 levels; alone in its autogroup, where the nice acts
        // on nothing, the child is given a long slice as well, which every woken task of
        // a shorter one preempts.
        let sunk = |child: &(Soakers, TcpStream, u32, u64)| {
            let mut c = child.1.try_clone().unwrap();
            c.write_all(b"h").unwrap();
            let down = wait_for(Duration::from_secs(3), || nice_of_process(child.2) == 10);
            assert!(down.is_some(), "sunk: {}", daemon.log_text());
            let slice = appease_actuator::sys::sched_getattr(child.2).unwrap().slice_ns;
            let mut r = [0u8; 1];
            c.read_exact(&mut r).unwrap();
            slice
        };
        assert_eq!(sunk(&own), 6_000_000, "a long slice: {}", daemon.log_text());
        assert_eq!(sunk(&shared), default_slice, "its own slice: {}", daemon.log_text());
        // Its next request brings it back, with the kernel's slice again.
        let mut c = own.1.try_clone().unwrap();
        let back = wait_for(Duration::from_secs(3), || {
            ask(&mut c, b"s");
            nice_of_process(own.2) == -4
                && appease_actuator::sys::sched_getattr(own.2).unwrap().slice_ns == default_slice
        });
        assert!(back.is_some(), "surfaced: {}", daemon.log_text());
        drop((c, own, shared));
    }
}

root_test! {
    fn the_load_follows_the_run_queues_between_scans() {
        let dir = TempDir::new("live-load");
        // Scans about every 30 s: the first at start, the next long after this test's end.
        // No demotion (after_ms far away): the idle cgroup below is the test's own.
        let cfg = dir.file(
            "test.toml",
            &test_config().replace(
                "enabled = false",
                "enabled = true\nafter_ms = 600000\nscan_ms = 30000",
            ),
        );
        let daemon = Daemon::start(&dir.0, &cfg);
        let scanned = wait_for(Duration::from_secs(5), || {
            daemon.status_json()["batch"]["scan"]["processes"]
                .as_u64()
                .unwrap_or(0)
                > 0
        });
        assert!(scanned.is_some(), "a first scan: {}", daemon.log_text());
        let load = || {
            daemon.status_json()["load"]["runnable_per_cpu"]
                .as_f64()
                .unwrap_or(f64::NAN)
        };
        let soakers = Soakers::start(4 * host_cpus());
        let counted = wait_for(Duration::from_secs(5), || load() >= 2.0);
        assert!(
            counted.is_some(),
            "soakers of the normal class count: {:.2}",
            load()
        );
        // Into an idle cgroup made by hand, between two scans: the next sample sees them
        // there, the load falls as it is smoothed (a 1 s time constant).
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        let group = cg
            .root()
            .join(format!("appease-e2e-live-{}", std::process::id()));
        std::fs::create_dir(&group).unwrap();
        std::fs::write(group.join("cpu.idle"), "1").unwrap();
        for c in &soakers.0 {
            std::fs::write(group.join("cgroup.procs"), c.id().to_string()).unwrap();
        }
        let left_out = wait_for(Duration::from_secs(6), || {
            load() < 0.7
                && daemon.status_json()["load"]["idle_group_runnable"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 4 * host_cpus() as u64
        });
        let (now, status) = (load(), daemon.status_json()["load"].clone());
        drop(soakers);
        let _gone = wait_for(Duration::from_secs(2), || {
            std::fs::read_to_string(group.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
        });
        std::fs::remove_dir(&group).unwrap();
        assert!(
            left_out.is_some(),
            "tasks moved into an idle cgroup leave the load before the next scan (now {now:.2} per CPU, {status}): {}",
            daemon.log_text()
        );
    }
}

root_test! {
    fn an_elevation_does_not_wait_for_a_scan_under_way() {
        let dir = TempDir::new("slow-scan");
        // Batch on (so there are scans), but no soaker demoted for the test's length; fades
        // of 5 ms a level, so that each request finds its thread back at its own nice (a
        // thread still elevated is held: its requests wake nobody).
        let cfg = dir.file(
            "test.toml",
            &test_config()
                .replace(
                    "enabled = false",
                    "enabled = true\nafter_ms = 600000\nscan_ms = 200",
                )
                .replace("decay_ms = 50", "decay_ms = 5"),
        );
        let _soak = Soakers::start(4);
        // Every scan takes 3 s (a host with very many processes, a slow /proc): a scan run
        // by the event loop would hold every elevation up to as long.
        let daemon = Daemon::start_with_env(&dir.0, &cfg, &[("FAILPOINTS", "scan=sleep(3000)")]);
        let loaded = wait_for(Duration::from_secs(5), || {
            daemon.status_json()["load"]["runnable_per_cpu"]
                .as_f64()
                .unwrap_or(0.0)
                >= 1.0
        });
        assert!(loaded.is_some(), "{}", daemon.log_text());
        // A request every 100 ms: each after a quiet spell, each wakes the daemon.
        let unix = Service::unix(Duration::from_millis(2), Duration::from_millis(100));
        let took = wait_for(Duration::from_secs(1), || nice_of(unix.server_tid) < 0);
        assert!(
            took.is_some(),
            "the server is elevated while a 3 s scan is under way: {}",
            daemon.log_text()
        );
        // Many fresh elevations later, none waited for a scan.
        let mut st = daemon.status_json();
        let enough = wait_for(Duration::from_secs(8), || {
            st = daemon.status_json();
            st["elevation_latency_us"]["count"].as_u64().unwrap_or(0) >= 20
                && st["batch"]["scan"]["processes"].as_u64().unwrap_or(0) > 0
        });
        assert!(
            enough.is_some(),
            "a scan ended and an elevation was timed: {st}"
        );
        let max_us = st["elevation_latency_us"]["max"].as_u64().unwrap();
        assert!(
            max_us < 500_000,
            "the slowest read -> elevation took {max_us} us, as long as a scan: {st}"
        );
        eprintln!("slowest elevation {max_us} us; elevated after {took:?}");
    }
}

root_test! {
    fn a_spinning_cheater_loses_its_elevation() {
        // With the cheater, 3 spinners on 2 CPUs: about 1.5 runnable per CPU.
        let (_dir, _cfg, _soak, daemon) = loaded("cheater", 2);

        let (mut a, mut b) = UnixStream::pair().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let st = stop.clone();
        let cheater = thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut byte = [0u8; 1];
            while !st.load(Ordering::Relaxed) {
                let _ = b.read(&mut byte); // "a request"
                spin_cpu(Duration::from_millis(4));
            }
        });
        let tid = rx.recv().unwrap();
        let feeder_stop = stop.clone();
        let feeder = thread::spawn(move || {
            while !feeder_stop.load(Ordering::Relaxed) {
                let _ = a.write_all(b"x");
                thread::sleep(Duration::from_millis(3));
            }
        });
        assert!(
            wait_for(Duration::from_secs(1), || nice_of(tid) < 0).is_some(),
            "first elevated like any thread receiving requests"
        );
        // Its bucket (200 ms, filling at 0.3 of a CPU) runs dry within about 0.3 s; after
        // that it must stay at its own nice.
        thread::sleep(Duration::from_millis(1000));
        let mut elevated = 0;
        let samples = 200;
        for _ in 0..samples {
            if nice_of(tid) < 0 {
                elevated += 1;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let st = daemon.status_json();
        stop.store(true, Ordering::Relaxed);
        cheater.join().unwrap();
        feeder.join().unwrap();
        assert!(
            elevated * 20 <= samples,
            "cheater elevated in {elevated} of {samples} samples after its budget ran out; tid {tid}\n{}",
            daemon.log_text()
        );
        assert!(st["actuator"]["restores"].as_u64().unwrap() >= 1, "{st}");
    }
}

root_test! {
    fn a_server_whose_budget_is_spent_no_longer_wakes_the_daemon_per_request() {
        let (_dir, _cfg, _soak, daemon) = loaded("spent", 2);
        // One serving thread (its client's reads are responses: not watched), 40 ms of CPU
        // per request and the next request 30 ms after each answer: over half a CPU beside
        // the soakers, its application's budget 0.3 of one. Each request comes after a quiet
        // spell long enough to wake the daemon.
        let service = Service::tcp(Duration::from_millis(40), Duration::from_millis(30));
        // The 200 ms bucket runs dry within a second.
        thread::sleep(Duration::from_secs(2));
        // Requests the probe saw (reads that are not responses), reported or not.
        let counts = |st: &serde_json::Value| {
            ["socket_reads", "response_reads", "waking_requests", "held_requests"]
                .map(|k| st["probe"][k].as_u64().unwrap_or(0))
        };
        let before = counts(&daemon.status_json());
        thread::sleep(Duration::from_secs(4));
        let st = daemon.status_json();
        let after = counts(&st);
        let [reads, responses, woke, held] = [0, 1, 2, 3].map(|i| after[i] - before[i]);
        let requests = reads.saturating_sub(responses);
        eprintln!("over 4 s: {requests} requests, {woke} woke the daemon, {held} reported at a tick");
        assert!(requests >= 20, "the server was asked: {st}");
        // Spent: restored for its budget and not elevated again (so not held elevated).
        assert!(st["actuator"]["restores"].as_u64().unwrap_or(0) >= 1, "{st}");
        assert_eq!(nice_of(service.server_tid), 0, "the spent server at its own nice");
        assert!(
            woke * 10 <= requests,
            "{woke} of {requests} requests of a spent application woke the daemon\n{}",
            daemon.log_text()
        );
    }
}

root_test! {
    fn a_thread_reniced_by_hand_is_left_alone() {
        let (_dir, _cfg, _soak, mut daemon) = loaded("renice", 4);
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(10));
        let tid = unix.server_tid;
        assert!(wait_for(Duration::from_secs(2), || nice_of(tid) < 0).is_some());
        set_nice(tid, 5);
        // Requests keep coming; fades and re-elevations would have changed it by now.
        thread::sleep(Duration::from_millis(1000));
        assert_eq!(nice_of(tid), 5, "appease does not fight the operator");
        let (noticed, st) = daemon.status_until(Duration::from_secs(3), |st| {
            st["actuator"]["hands_off"].as_u64().unwrap() >= 1
                && st["threads"].as_array().unwrap().iter().all(|t| t["tid"] != tid)
        });
        assert!(noticed, "status says it is left alone: {st}");
        daemon.signal(libc::SIGTERM);
        assert_eq!(nice_of(tid), 5, "and does not 'restore' it on exit either");
    }
}
