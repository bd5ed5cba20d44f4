//! The daemon's life: start, stop, kill -9 and restore, bad config, no root, dry run, a
//! second daemon, capabilities, a full disk, a cgroup filesystem that refuses writes, a
//! group left idle by a daemon whose run directory was lost.

use super::*;

root_test! {
    fn sigterm_puts_every_thread_back() {
        let (dir, _cfg, _soak, mut daemon) = loaded("sigterm", 4);
        // The daemon itself runs in the real-time class (no entity of the fair class its
        // servers and batch share), and its children would not inherit that.
        // SAFETY: plain queries of another process's scheduling.
        let policy = unsafe { libc::sched_getscheduler(daemon.pid() as i32) };
        let mut param = libc::sched_param { sched_priority: -1 };
        assert_eq!(
            unsafe { libc::sched_getparam(daemon.pid() as i32, &mut param) },
            0
        );
        assert_eq!(
            (policy, param.sched_priority),
            (libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, 1),
            "the daemon runs SCHED_FIFO 1 with reset-on-fork"
        );
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(10));
        assert!(wait_for(Duration::from_secs(2), || nice_of(unix.server_tid) < 0).is_some());
        let status = daemon.signal(libc::SIGTERM);
        assert!(status.success(), "clean exit on SIGTERM");
        assert_eq!(
            nice_of(unix.server_tid),
            0,
            "restored on SIGTERM while still receiving requests"
        );
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo"
        );
    }
}

root_test! {
    fn kill_9_then_restore_and_restarted_daemon_bring_threads_back() {
        // 1. kill -9 during elevation, then `appease restore`.
        let (dir, cfg, _soak, mut daemon) = loaded("kill9", 4);
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(10));
        let tcp = Service::tcp(Duration::from_millis(1), Duration::from_millis(10));
        let both_elevated = || nice_of(unix.server_tid) < 0 && nice_of(tcp.server_tid) < 0;
        assert!(wait_for(Duration::from_secs(2), both_elevated).is_some());
        daemon.signal(libc::SIGKILL);
        assert!(
            both_elevated(),
            "a killed daemon restores nothing by itself"
        );
        assert!(
            dir.0.join("journal.jsonl").exists(),
            "the journal survives the crash"
        );
        let out = appease(&dir.0, &["restore"]);
        assert!(
            out.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(nice_of(unix.server_tid), 0);
        assert_eq!(nice_of(tcp.server_tid), 0);
        // The two servers, and the clients, which receive answers on sockets too.
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        let restored: u32 = said
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(restored >= 2, "{said}");

        // 2. kill -9 again, then a new daemon puts them back when it starts.
        let mut daemon = Daemon::start(&dir.0, &cfg);
        assert!(wait_for(Duration::from_secs(3), both_elevated).is_some());
        daemon.signal(libc::SIGKILL);
        unix.pause();
        tcp.pause();
        assert!(both_elevated());
        let daemon = Daemon::start(&dir.0, &cfg);
        assert_eq!(
            nice_of(unix.server_tid),
            0,
            "restored at daemon start: {}",
            daemon.log_text()
        );
        assert_eq!(nice_of(tcp.server_tid), 0);
    }
}

root_test! {
    fn restore_right_after_kill_9_waits_for_the_dying_daemon_and_puts_everything_back() {
        let (dir, gpath, soakers, mut daemon) = demoted_soaker("kill9-now", "");
        let pid = soakers.0[0].id();
        let mut killed = daemon.kill_now();
        // At once: the killed daemon still holds its lock while it detaches its probe.
        let out = appease(&dir.0, &["restore"]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "restore at once after kill -9: {said}");
        assert!(!in_idle_group(pid, &gpath), "the soaker is back: {said}");
        assert!(killed.wait().is_ok());
        assert!(!dir.0.join("journal.jsonl").exists(), "nothing left to undo: {said}");
    }
}

root_test! {
    fn bad_config_is_one_clear_error_and_changes_nothing() {
        let dir = TempDir::new("badcfg");
        let cases = [
            ("unknown.toml", "[elevation]\nslice_ms = 3\n", "line 2, column 1"),
            ("malformed.toml", "[probe]\nmin_gap_ms = -3\n", "line 2"),
            (
                "ladder.toml",
                "[[elevation.ladder]]\nfrom_runnable_per_cpu = 0.0\nunix_nice = -30\ninet_nice = 0\ndecay_ms = 10\n",
                "outside -20..=19",
            ),
        ];
        for (name, text, expect) in cases {
            let path = dir.file(name, text);
            for args in [
                vec!["check-config", path.to_str().unwrap()],
                vec!["daemon", "--config", path.to_str().unwrap()],
            ] {
                let out = appease(&dir.0, &args);
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(!out.status.success(), "{args:?} must fail");
                assert!(
                    err.contains(name) && err.contains(expect),
                    "{args:?}: {err}"
                );
                assert_eq!(
                    err.lines().filter(|l| l.contains("error")).count(),
                    1,
                    "one error: {err}"
                );
            }
        }
        assert!(!dir.0.join("journal.jsonl").exists(), "nothing was changed");
        let out = appease(&dir.0, &["check-config", "/nonexistent/appease.toml"]);
        assert!(String::from_utf8_lossy(&out.stderr)
            .contains("cannot read config file /nonexistent/appease.toml"));
        let good = dir.file("good.toml", appease_config_default());
        assert!(appease(&dir.0, &["check-config", good.to_str().unwrap()])
            .status
            .success());
    }
}

fn appease_config_default() -> &'static str {
    include_str!("../../../../config/default.toml")
}

root_test! {
    fn no_root_or_no_bpf_capability_is_a_clear_error() {
        let dir = TempDir::new("noroot");
        // Not root at all.
        // `appease daemon` under setpriv (util-linux) with the given restrictions.
        let daemon_as = |restrictions: &[&str]| {
            Command::new("setpriv")
                .args(restrictions)
                .args([BIN, "daemon"])
                .env("APPEASE_RUN_DIR", &dir.0)
                .stdin(Stdio::null())
                .output()
                .expect("setpriv (util-linux) runs")
        };
        let out = daemon_as(&["--reuid=65534", "--regid=65534", "--clear-groups"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("needs root"), "{err}");
        // Root, but without the capabilities BPF needs.
        let out = daemon_as(&["--inh-caps=-all", "--bounding-set=-bpf,-perfmon,-sys_admin"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "must fail without CAP_BPF: {err}");
        assert!(
            err.contains("BPF probe") && err.contains("CAP_BPF"),
            "{err}"
        );
        assert!(!dir.0.join("journal.jsonl").exists(), "nothing was changed");
    }
}

root_test! {
    fn dry_run_decides_and_reports_but_changes_nothing() {
        let dir = TempDir::new("dryrun");
        let cfg = dir.file("test.toml", &test_config());
        let _soak = Soakers::start(4);
        let log = dir.0.join("dry.log");
        let mut child = Command::new(BIN)
            .args([
                "--log-format",
                "json",
                "daemon",
                "--dry-run",
                "--log",
                "debug",
                "--config",
            ])
            .arg(&cfg)
            .env("APPEASE_RUN_DIR", &dir.0)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Running, and seeing the load (servers started after this find the ladder engaged).
        let loaded = wait_for(Duration::from_secs(5), || {
            status_of(&dir.0).is_some_and(|s| {
                s["pid"] == child.id() && s["load"]["runnable_per_cpu"].as_f64() >= Some(1.0)
            })
        });
        assert!(
            loaded.is_some(),
            "the dry-run daemon runs and sees the load"
        );
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(10));
        let tid = unix.server_tid;
        let mut st = serde_json::Value::Null;
        let decided = wait_for(Duration::from_secs(3), || {
            let out = appease(&dir.0, &["status", "--json"]);
            st = serde_json::from_slice(&out.stdout).unwrap_or_default();
            st["threads"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["tid"] == tid && t["nice"] == -8))
        });
        assert!(
            decided.is_some(),
            "status shows the elevation it would make: {st}"
        );
        assert_eq!(st["dry_run"], true);
        for _ in 0..50 {
            assert_eq!(nice_of(tid), 0, "dry run changes nothing");
            thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        assert!(child.wait().unwrap().success(), "SIGINT ends it cleanly");
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "a dry run journals nothing"
        );
        // --log-format json: every line one object a log collector can read.
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        assert!(lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
        assert!(
            lines
                .iter()
                .any(|l| l["fields"]["message"].as_str() == Some("appease daemon running")),
            "{text}"
        );
    }
}

root_test! {
    fn a_cgroup_filesystem_that_refuses_writes_leaves_nothing_changed() {
        let dir = TempDir::new("refuse");
        let group = format!("appease-e2e-refuse-{}", std::process::id());
        let cfg = dir.file("batch.toml", &batch_config(&group));
        let soakers = Soakers(vec![forking_soaker(), forking_soaker(), forking_soaker()]);
        let pids: Vec<u32> = soakers.0.iter().map(|c| c.id()).collect();
        let before: Vec<Option<String>> = pids.iter().map(|&p| cpu_cgroup(p)).collect();
        // Half of every cgroup write and mkdir is refused, at random (a test build's
        // failpoint): creating the group, making it idle, moving each process in, and, at
        // exit, moving them back.
        let mut daemon =
            Daemon::start_with_env(&dir.0, &cfg, &[("FAILPOINTS", "cgroup-write=50%return")]);
        let in_group = |pid: u32| in_idle_group(pid, &format!("/{group}"));
        // Demotions are tried at every scan (200 ms) once the soakers have soaked 2 s.
        let some = wait_for(Duration::from_secs(10), || {
            pids.iter().any(|&p| in_group(p))
        });
        let mut st = daemon.status_json();
        let refused = wait_for(Duration::from_secs(5), || {
            st = daemon.status_json();
            daemon.log_text().contains("Permission denied")
        });
        assert!(
            refused.is_some(),
            "writes were refused and said so: {}",
            daemon.log_text()
        );
        assert_eq!(st["pid"], daemon.pid(), "the daemon goes on");
        eprintln!("some soaker demoted despite refusals: {}", some.is_some());
        // Exit: what could not be put back stays in the journal for `appease restore`.
        let code = daemon.signal(libc::SIGTERM);
        assert!(
            code.code().is_some(),
            "the daemon exits, never dies: {code:?}"
        );
        let out = appease(&dir.0, &["restore"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after: Vec<Option<String>> = pids.iter().map(|&p| cpu_cgroup(p)).collect();
        assert_eq!(after, before, "every process back in its group");
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        assert!(
            !cg.exists(&format!("/{group}")),
            "no group of appease's left"
        );
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo"
        );
        drop(soakers);
    }
}

root_test! {
    /// A forked copy of this process that spins and, every 20 ms, takes whatever waits on
    /// `socket` without blocking: a request whenever the other end sends one.
    fn a_second_daemon_for_the_same_idle_group_refuses_whatever_its_run_directory() {
        let group = format!("appease-e2e-two{}", std::process::id());
        let (first, second) = (TempDir::new("two-a"), TempDir::new("two-b"));
        let cfg = first.file("batch.toml", &batch_config(&group));
        let mut daemon = Daemon::start(&first.0, &cfg);
        let out = Command::new(BIN)
            .args(["daemon", "--config"])
            .arg(&cfg)
            .env("APPEASE_RUN_DIR", &second.0)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("uses the idle group /{group}"))
                && err.contains(&format!("pid {}", daemon.pid())),
            "names the group and the daemon that has it: {err}"
        );
        assert!(!second.0.join("journal.jsonl").exists(), "nothing done");
        // A dry run changes nothing, so it may watch beside it.
        let mut dry = Command::new(BIN)
            .args(["daemon", "--dry-run", "--config"])
            .arg(&cfg)
            .env("APPEASE_RUN_DIR", &second.0)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_for(Duration::from_secs(10), || status_of(&second.0).is_some()).is_some(),
            "the dry run starts"
        );
        // SAFETY: ending our own child.
        unsafe { libc::kill(dry.id() as i32, libc::SIGTERM) };
        assert!(dry.wait().unwrap().success());
        assert!(daemon.signal(libc::SIGTERM).success());
    }
}

root_test! {
    fn once_its_probe_is_loaded_the_daemon_keeps_only_the_capabilities_it_uses() {
        let dir = TempDir::new("caps");
        let group = format!("appease-e2e-caps{}", std::process::id());
        let cfg = dir.file("batch.toml", &batch_config(&group));
        let mut daemon = Daemon::start(&dir.0, &cfg);
        // CAP_DAC_OVERRIDE (1) and CAP_SYS_NICE (23), in every thread of it.
        let kept = format!("{:016x}", (1u64 << 1) | (1u64 << 23));
        let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.pid())).unwrap();
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap();
            for set in ["CapEff", "CapPrm", "CapBnd"] {
                let line = status
                    .lines()
                    .find(|l| l.starts_with(set))
                    .unwrap()
                    .to_string();
                assert!(line.ends_with(&kept), "{set} of {:?}: {line}", t.path());
            }
            assert!(status.lines().any(|l| l == "CapInh:\t0000000000000000"));
        }
        // And with only those it still demotes, and puts back on exit.
        let soakers = Soakers(vec![forking_soaker()]);
        let pid = soakers.0[0].id();
        assert!(
            wait_for(Duration::from_secs(8), || in_idle_group(
                pid,
                &format!("/{group}")
            ))
            .is_some(),
            "{}",
            daemon.log_text()
        );
        assert!(daemon.signal(libc::SIGTERM).success());
        assert!(!in_idle_group(pid, &format!("/{group}")));
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        assert!(
            !cg.exists(&format!("/{group}")),
            "removed without CAP_SYS_ADMIN"
        );
    }
}

root_test! {
    fn a_full_disk_under_the_run_directory_means_no_change_and_the_daemon_goes_on() {
        let dir = TempDir::new("full");
        let fs = TinyFs::mount(&dir.0.join("run"), "1m");
        let cfg = dir.file("test.toml", &test_config());
        let soakers = Soakers::start(4);
        let mut daemon = Daemon::start(&fs.0, &cfg);
        assert!(
            wait_for(Duration::from_secs(5), || daemon.status_json()["load"]
                ["runnable_per_cpu"]
                .as_f64()
                .unwrap_or(0.0)
                >= 1.2)
            .is_some(),
            "the ladder engaged"
        );
        let filler = fs.fill();
        // Journal before change: with no room for the record, no change is made.
        let svc = Service::unix(Duration::from_micros(300), Duration::from_millis(10));
        assert!(
            wait_for(Duration::from_secs(2), || nice_of(svc.server_tid) != 0).is_none(),
            "elevated though its journal record could not be written"
        );
        let pid = daemon.pid();
        assert!(
            std::fs::metadata(format!("/proc/{pid}")).is_ok(),
            "the daemon goes on"
        );
        // Room again: it elevates as before, and puts everything back on exit.
        std::fs::remove_file(filler).unwrap();
        assert!(
            wait_for(Duration::from_secs(5), || nice_of(svc.server_tid) < 0).is_some(),
            "elevated once the disk has room: {}\n{}",
            daemon.log_text(),
            daemon.status_json()
        );
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(nice_of(svc.server_tid), 0);
        drop(svc);
        drop(soakers);
        assert!(!fs.0.join("journal.jsonl").exists(), "nothing left to undo");
    }
}

root_test! {
    fn a_batch_group_left_idle_by_a_daemon_whose_run_directory_was_lost_is_used_as_found() {
        // A daemon killed together with its run directory leaves its group idle, with no
        // journal to say so. The kernel refuses a weight for an idle group: the next
        // daemon must take the group as it finds it, not fail every demotion, and remove
        // it on exit with the empty job groups left inside.
        let dir = TempDir::new("left-idle");
        let group = format!("appease-e2e-left{}", std::process::id());
        let gpath = format!("/{group}");
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        cg.ensure_top_group(&group, true, 100).unwrap();
        // With an empty job's group inside it, which no journal names.
        let stray = cg.root().join(&group).join("job-1");
        std::fs::create_dir(&stray).unwrap();
        let home = cpu_cgroup(std::process::id()).unwrap();
        let cfg = dir.file("batch.toml", &batch_config(&group));
        let soakers = Soakers(vec![forking_soaker()]);
        let pid = soakers.0[0].id();
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let demoted = wait_for(Duration::from_secs(8), || in_idle_group(pid, &gpath));
        let log = daemon.log_text();
        assert!(demoted.is_some(), "demoted into the group found idle: {log}");
        assert!(!log.contains("could not demote"), "{log}");
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(cpu_cgroup(pid).unwrap(), home);
        assert!(!cg.exists(&gpath), "removed on exit, with the empty job group left in it");
        drop(soakers);
    }
}
