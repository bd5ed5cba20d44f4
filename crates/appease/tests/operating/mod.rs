//! Operating it: the control socket, metrics, the audit trail, appease top, make install.

use super::*;

root_test! {
    fn the_control_socket_answers_root_and_its_group_only() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = TempDir::new("control");
        let cfg = dir.file(
            "control.toml",
            "[batch]\nenabled = false\n[control]\ngroup = \"nogroup\"\n",
        );
        let daemon = Daemon::start(&dir.0, &cfg);
        let sock = std::fs::metadata(dir.0.join("control.sock")).unwrap();
        assert_eq!(
            (sock.permissions().mode() & 0o777, sock.uid(), sock.gid()),
            (0o660, 0, 65534),
            "the socket is root's and its group's"
        );
        let status_as = |ids: &[&str]| {
            Command::new("setpriv")
                .args(ids)
                .args([BIN, "status"])
                .env("APPEASE_RUN_DIR", &dir.0)
                .output()
                .expect("setpriv (util-linux) runs")
        };
        // A member of the group (uid nobody, gid nogroup): allowed.
        let out = status_as(&["--reuid=65534", "--regid=65534", "--clear-groups"]);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("appease daemon pid"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Neither root nor in the group: refused, and told why.
        let out = status_as(&["--reuid=65534", "--regid=12345", "--clear-groups"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "refused");
        assert!(
            err.contains("permission denied") && err.contains("control socket"),
            "{err}"
        );
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=12345",
                "--clear-groups",
                BIN,
                "reload",
            ])
            .env("APPEASE_RUN_DIR", &dir.0)
            .output()
            .unwrap();
        assert!(!out.status.success(), "no reload either");
        drop(daemon);
        // No daemon: a clear word, not a hang or a stale answer.
        let out = appease(&dir.0, &["status"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("no appease daemon is running"),
            "{err}"
        );
    }
}

root_test! {
    fn the_metrics_endpoint_passes_promtool_and_its_counters_move_under_load() {
        let dir = TempDir::new("metrics");
        let cfg = dir.file("test.toml", &test_config());
        let _soak = Soakers::start(2 * host_cpus());
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let daemon = Daemon::start_with(&dir.0, &cfg, &["--metrics", &addr], &[]);
        let first = scrape(&addr);
        let promtool = |text: &str| {
            let mut child = Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("promtool (Debian package prometheus; make test-deps installs it)");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
                "promtool check metrics: {}{}\n{text}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        promtool(&first);
        let unix_requests = "appease_requests_total{family=\"unix\"}";
        let inet_requests = "appease_requests_total{family=\"inet\"}";
        let elevations = "appease_elevations_total{reason=\"unix-request\"}";
        let (u0, i0) = (sample(&first, unix_requests), sample(&first, inet_requests));
        // The load seen first (about one time constant of its average), then servers that
        // receive requests under it, each after a pause (a request that wakes the daemon):
        // the counters move.
        let loaded = wait_for(Duration::from_secs(5), || {
            sample(&scrape(&addr), "appease_load_runnable_per_cpu") >= 1.2
        });
        assert!(loaded.is_some(), "the load is seen: {}", daemon.log_text());
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(60));
        let tcp = Service::tcp(Duration::from_millis(1), Duration::from_millis(60));
        let mut text = String::new();
        let moved = wait_for(Duration::from_secs(5), || {
            text = scrape(&addr);
            sample(&text, unix_requests) > u0
                && sample(&text, inet_requests) > i0
                && text.contains(elevations)
                && sample(&text, "appease_elevation_latency_seconds_count") > 0.0
                // A gauge: set from the state published once a second.
                && sample(&text, "appease_threads{class=\"latency\"}") >= 1.0
        });
        assert!(
            moved.is_some(),
            "counters move under load:\n{text}\n{}",
            daemon.log_text()
        );
        promtool(&text);
        drop((unix, tcp));
        drop(daemon);
        assert!(
            TcpStream::connect(&addr).is_err(),
            "the endpoint closes with the daemon"
        );
    }
}

root_test! {
    fn every_change_and_its_undoing_is_one_audit_line_and_a_storm_is_held_back() {
        let dir = TempDir::new("audit");
        let group = format!("appease-e2e-audit{}", std::process::id());
        // Every request elevates, whatever the load: the demoted soakers are no load (the
        // ladder leaves the idle group out), and the storm alone may stay under one runnable
        // thread per CPU. Nor does the CPU pressure gate hold any elevation back.
        let storm_ladder = format!(
            "[elevation]\nmin_psi_pct = 0.0\n{}",
            ladder(&[(0.0, -8, -5, 10)])
        );
        let cfg = dir.file(
            "audit.toml",
            &format!("{}{storm_ladder}", batch_config(&group)),
        );
        let soakers = Soakers(vec![forking_soaker(), forking_soaker(), forking_soaker()]);
        let soaker = soakers.0[0].id();
        let home = cpu_cgroup(soaker).unwrap();
        let mut daemon = Daemon::start_with(&dir.0, &cfg, &["--log-format", "json"], &[]);
        let gpath = format!("/{group}");
        let demoted = wait_for(Duration::from_secs(8), || in_idle_group(soaker, &gpath));
        assert!(demoted.is_some(), "demoted: {}", daemon.log_text());
        // One server whose thread is watched, then a storm of elevations and fades on 32
        // connections: each gets a request every 100 ms, after its elevation (8 levels on
        // UNIX sockets, 5 on TCP, 10 ms a level) has faded, so each request is an elevation
        // and, 80 or 50 ms later, a restore.
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(60));
        let tid = unix.server_tid;
        let storm = Load::start(32, 4, 320.0);
        let began = std::time::Instant::now();
        let mut lines = Vec::new();
        let seen = wait_for(Duration::from_secs(8), || {
            lines = audit_lines(&daemon.full_log());
            let elevated = lines.iter().any(|l| {
                l["change"] == "elevate"
                    && l["tid"] == tid
                    && l["from"] == "nice 0"
                    && l["to"].as_str().is_some_and(|t| t.starts_with("nice -"))
                    && l["why"] == "unix-request"
            });
            let held = |change: &str| {
                lines
                    .iter()
                    .any(|l| l["change"] == change && l["held"].as_u64() > Some(0))
            };
            // The trail may hold lines back after the burst's 50 requests, before the storm
            // has run a hundred. Restores come a fade after their elevations: the storm runs
            // until they too are more than the trail writes.
            elevated && held("elevate") && held("restore") && storm.done.load(Ordering::Relaxed) > 100
        });
        let elapsed = began.elapsed().as_secs_f64() + 1.0;
        assert!(
            seen.is_some(),
            "the server's elevation is audited and the storm held back: {lines:#?}"
        );
        assert!(storm.done.load(Ordering::Relaxed) > 100, "the storm ran");
        // The burst (50) and 10 lines a second after it: what the trail promises.
        let elevate_lines = lines
            .iter()
            .filter(|l| l["change"] == "elevate" && l["held"].is_null())
            .count();
        assert!(
            elevate_lines as f64 <= 50.0 + 10.0 * (elapsed + 3.0),
            "{elevate_lines} elevate lines in {elapsed:.1} s"
        );
        let demote = lines
            .iter()
            .find(|l| l["change"] == "demote" && l["pid"] == soaker)
            .unwrap_or_else(|| panic!("the demotion is audited: {lines:#?}"));
        assert_eq!(demote["from"], home.as_str());
        assert_eq!(demote["to"], format!("{gpath}/job-{soaker}").as_str());
        assert!(
            demote["why"]
                .as_str()
                .is_some_and(|w| w.contains("no requests")),
            "{demote}"
        );
        drop(storm);
        // Stopping undoes everything, each undoing audited with its reason.
        assert!(daemon.signal(libc::SIGTERM).success());
        let lines = audit_lines(&daemon.full_log());
        assert!(
            lines.iter().any(|l| l["change"] == "move-back"
                && l["pid"] == soaker
                && l["from"]
                    .as_str()
                    .is_some_and(|f| f.starts_with(&format!("{gpath}/")))
                && l["to"] == home.as_str()
                && l["why"] == "appease stops"),
            "{lines:#?}"
        );
        // Elevations faded out and put back (at shutdown too, unless the storm spent the
        // budget: then the count of what was held is said).
        assert!(
            lines.iter().any(|l| l["change"] == "restore"
                && l["from"].as_str().is_some_and(|f| f.starts_with("nice -"))
                && l["to"] == "nice 0"
                && l["why"].is_string()),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l["change"] == "restore" && l["held"].as_u64() > Some(0)),
            "{lines:#?}"
        );
        assert_eq!(cpu_cgroup(soaker).as_deref(), Some(home.as_str()));
        drop(unix);
    }
}

root_test! {
    fn top_shows_an_elevated_server_and_a_demoted_soaker_sorts_filters_and_quits_on_q() {
        // The load that engages the ladder is kept out of the idle class by a rule: once all
        // of the batch is idle, nothing competes with the server and its elevation ends.
        let keep_normal = "[[rule]]\ncomm = \"e2e-load\"\nclass = \"normal\"\n";
        let (dir, gpath, soakers, daemon) =
            demoted_soaker("top", &format!("{}{keep_normal}", latency_config()));
        let soaker = soakers.0[0].id();
        // Load enough for the ladder, and a server that receives requests under it.
        let _load = Soakers::start_named(2 * host_cpus(), &dir.0, "e2e-load");
        let unix = Service::unix(Duration::from_millis(1), Duration::from_millis(20));
        let tid = unix.server_tid.to_string();
        let tmux = Tmux(format!("appease-e2e-top{}", std::process::id()));
        let rc = dir.0.join("top.rc");
        let started = tmux.run(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "40",
            "-e",
            &format!("APPEASE_RUN_DIR={}", dir.0.display()),
            &format!("{BIN} top --interval 0.3; echo $? > {}", rc.display()),
        ]);
        assert!(started.status.success(), "{started:?}");
        let row_of = |screen: &str, id: &str| {
            screen
                .lines()
                .find(|l| l.split_whitespace().take(2).any(|w| w == id))
                .map(str::to_string)
        };
        let mut screen = String::new();
        let shown = wait_for(Duration::from_secs(8), || {
            screen = tmux.screen();
            let server = row_of(&screen, &tid);
            let batch = row_of(&screen, &soaker.to_string());
            server.is_some_and(|l| l.contains("latency") && l.contains("request"))
                && batch.is_some_and(|l| l.contains("batch") && l.contains(&gpath))
                && screen.contains("runnable/CPU")
                && screen.contains("batch group idle")
        });
        assert!(
            shown.is_some(),
            "the server elevated and the soaker demoted, with the load at the top:\n{screen}\n{}",
            daemon.log_text()
        );
        // CPU use is measured between refreshes: the soaker's is a number.
        let cpu_shown = wait_for(Duration::from_secs(3), || {
            screen = tmux.screen();
            row_of(&screen, &soaker.to_string()).is_some_and(|l| {
                l.split_whitespace()
                    .nth(5)
                    .is_some_and(|c| c.parse::<f64>().is_ok())
            })
        });
        assert!(cpu_shown.is_some(), "{screen}");
        // f: only latency-class rows; s: the next sort key.
        tmux.run(&["send-keys", "f", "s"]);
        let filtered = wait_for(Duration::from_secs(3), || {
            screen = tmux.screen();
            screen.contains("class (latency)")
                && screen.contains("sort (pid)")
                && row_of(&screen, &soaker.to_string()).is_none()
                && row_of(&screen, &tid).is_some()
        });
        assert!(filtered.is_some(), "{screen}");
        // q: the view ends with status 0 and the terminal is its shell's again.
        tmux.run(&["send-keys", "q"]);
        let ended = wait_for(Duration::from_secs(3), || {
            std::fs::read_to_string(&rc).is_ok_and(|t| t.trim() == "0")
        });
        assert!(ended.is_some(), "q quits: {}", tmux.screen());
        drop(unix);
    }
}
