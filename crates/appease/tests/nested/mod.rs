//! Nested layouts: a systemd host's shape built by hand in the `cpu` hierarchy (a server in
//! `system.slice/server.service`, soakers and a sleeping shell in
//! `user.slice/user-0.slice/session-1.scope`, a CPU quota on `user.slice` that keeps them
//! in their scope), and what appease does where the two branches meet.

use super::*;
use std::io::BufRead;

use appease_bench::client;

mod system_container;

/// The shape's groups (top-level names of the test's own) and every process started in
/// them; the processes are ended and the groups removed on drop.
struct Shape {
    cg: appease_cgroup::Cgroups,
    server_unit: String,
    system: String,
    user: String,
    scope: String,
    /// Deepest first.
    groups: Vec<String>,
    children: Vec<std::process::Child>,
}

impl Shape {
    fn new(tag: &str) -> Self {
        let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
        let p = format!("appease-e2e-{tag}{}", std::process::id());
        let system = cg
            .ensure_top_group(&format!("{p}.system.slice"), false, 100)
            .unwrap();
        let user = cg
            .ensure_top_group(&format!("{p}.user.slice"), false, 100)
            .unwrap();
        let server_unit = cg
            .ensure_child_group(&system, "server.service", 100)
            .unwrap();
        let user0 = cg.ensure_child_group(&user, "user-0.slice", 100).unwrap();
        let scope = cg
            .ensure_child_group(&user0, "session-1.scope", 100)
            .unwrap();
        // The limit that keeps the batch in its scope: 1.9 CPUs.
        cg.set_cpu_quota(&user, Some(190_000)).unwrap();
        Shape {
            groups: vec![
                server_unit.clone(),
                scope.clone(),
                user0,
                system.clone(),
                user.clone(),
            ],
            cg,
            server_unit,
            system,
            user,
            scope,
            children: Vec::new(),
        }
    }

    /// Starts `cmd` in `group`: it enters the group before it runs.
    fn spawn_in(&mut self, group: &str, cmd: &mut Command) -> u32 {
        let child = appease_bench::nested::spawn_in_group(&self.cg, group, cmd).unwrap();
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// The synthetic server (5 ms of CPU per request) in `system.slice/server.service`;
    /// its port.
    fn start_server(&mut self) -> u16 {
        let unit = self.server_unit.clone();
        self.start_server_in(&unit, "5")
    }

    /// The synthetic server with `cpu_ms` of CPU per request in `group`; its port.
    fn start_server_in(&mut self, group: &str, cpu_ms: &str) -> u16 {
        let mut cmd = Command::new(BIN);
        cmd.args(["bench-worker", "server", "--cpu-ms", cpu_ms, "--port", "0"])
            .stdout(Stdio::piped());
        self.spawn_in(group, &mut cmd);
        let mut line = String::new();
        let out = self.children.last_mut().unwrap().stdout.as_mut().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        line.trim().parse().expect("the server's port")
    }

    /// A sleeping shell and `n` soakers in the session scope; the soakers' pids.
    fn start_session(&mut self, n: usize) -> Vec<u32> {
        let scope = self.scope.clone();
        self.spawn_in(&scope, Command::new("sh").args(["-c", "sleep 100000; :"]));
        (0..n)
            .map(|_| {
                self.spawn_in(
                    &scope,
                    Command::new("sh").args(["-c", "while :; do :; done"]),
                )
            })
            .collect()
    }

    fn user_idle(&self) -> bool {
        self.cg.idle(&self.user).unwrap()
    }
}

impl Drop for Shape {
    fn drop(&mut self) {
        // Everything in the shape's groups, the shells' sleeps included.
        for g in &self.groups {
            for p in self.cg.processes(g).unwrap_or_default() {
                // SAFETY: ending processes this test started in its own groups.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for g in &self.groups {
            wait_for(Duration::from_secs(3), || self.cg.remove(g).is_ok());
        }
    }
}

/// The server's p99 at 40 requests/s (open loop, fixed spacing), ms: the median of three
/// 3-second windows, so one window caught by a stall of the host (CI shares its machine)
/// does not decide a comparison on its own.
fn p99_ms(port: u16) -> f64 {
    let mut windows: Vec<f64> = (0..3)
        .map(|_| {
            let r = client::open_loop(
                &client::Target::Tcp(([127, 0, 0, 1], port).into()),
                &client::Protocol::Synthetic,
                client::Arrivals::Fixed,
                40.0,
                Duration::from_secs(3),
                Duration::from_secs(2),
                &Arc::new(AtomicBool::new(false)),
            )
            .unwrap();
            r.latency_us.value_at_quantile(0.99) as f64 / 1000.0
        })
        .collect();
    windows.sort_by(f64::total_cmp);
    windows[1]
}

/// Requests flow to the server while `f` runs (the daemon must see it serve).
fn with_traffic<T>(port: u16, f: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let load = thread::spawn(move || {
        client::open_loop(
            &client::Target::Tcp(([127, 0, 0, 1], port).into()),
            &client::Protocol::Synthetic,
            client::Arrivals::Fixed,
            40.0,
            Duration::from_secs(120),
            Duration::ZERO,
            &st,
        )
        .map(|_| ())
    });
    let out = f();
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap().unwrap();
    out
}

root_test! {
    fn a_limited_sessions_branch_is_made_idle_beside_a_server_which_fares_as_with_it_idle_by_hand() {
        let mut shape = Shape::new("nest");
        let port = shape.start_server();
        let soakers = shape.start_session(4 * host_cpus());
        thread::sleep(Duration::from_secs(1));
        let unmanaged = p99_ms(port);
        // The best setup by hand: the batch's branch idle where it meets the server's.
        shape.cg.set_idle(&shape.user, true).unwrap();
        thread::sleep(Duration::from_millis(500));
        let by_hand = p99_ms(port);
        shape.cg.set_idle(&shape.user, false).unwrap();
        let shares = shape.cg.weight_raw(&shape.user).unwrap();

        let dir = TempDir::new("nest");
        let cfg = dir.file(
            "nest.toml",
            &batch_config(&format!("appease-e2e-nestb{}", std::process::id())),
        );
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let settled = with_traffic(port, || {
            wait_for(Duration::from_secs(20), || shape.user_idle())
        });
        assert!(
            settled.is_some(),
            "user.slice idle: {}",
            daemon.log_text()
        );
        // The idle branch carries the class: the soakers demoted in place are back in
        // their own (per-thread SCHED_IDLE under it cost the server).
        for &p in &soakers {
            assert_eq!(policy_of(p, p), 0, "carried by the branch: {}", daemon.log_text());
        }

        for &p in &soakers {
            assert_eq!(
                cpu_cgroup(p).as_deref(),
                Some(shape.scope.as_str()),
                "not moved"
            );
        }
        // The status is published once a second.
        let mut st = daemon.status_json();
        let listed = wait_for(Duration::from_secs(3), || {
            st = daemon.status_json();
            let procs = st["processes"].as_array().unwrap();
            let text = |p: &serde_json::Value, field: &str| p[field].as_str().unwrap_or("").to_string();
            procs.iter().any(|p| {
                p["group"] == shape.user.as_str()
                    && text(p, "why").contains("everything busy in it is demoted batch")
            }) && soakers.iter().all(|&s| {
                procs.iter().any(|p| {
                    p["pid"] == s && text(p, "placement").contains("carries the class")
                })
            })
        });
        assert!(listed.is_some(), "status lists the idle branch: {st}");
        let with_appease = p99_ms(port);
        eprintln!(
            "server p99: unmanaged {unmanaged:.2} ms, user.slice idle by hand {by_hand:.2} ms, appease {with_appease:.2} ms"
        );
        // Never worse than doing nothing. How close it comes to the branch made idle by hand
        // is the bench's figure (docs/RESULTS.md, "Nested layouts"), not asserted here: run from
        // the first session, as CI runs it (no session autogroup), whole windows of every mode,
        // by hand included, came out either near 5.5 ms or near 9.3 ms.
        assert!(
            with_appease <= unmanaged * 1.2,
            "appease's p99 {with_appease:.2} ms against {unmanaged:.2} unmanaged ({by_hand:.2} by hand)"
        );

        // A program started in the session (someone typing) gives the branch back at once;
        // once a scan has seen it asleep, the branch is idle again.
        let scope = shape.scope.clone();
        shape.spawn_in(&scope, Command::new("sleep").arg("3"));
        let back = wait_for(Duration::from_secs(2), || {
            daemon
                .full_log()
                .contains("why=\"a program started in the batch's branch\"")
        });
        assert!(back.is_some(), "given back on exec: {}", daemon.log_text());
        for &p in &soakers {
            assert_eq!(policy_of(p, p), 5, "SCHED_IDLE again, in place");
        }
        let again = with_traffic(port, || {
            wait_for(Duration::from_secs(10), || {
                shape.user_idle() && soakers.iter().all(|&p| policy_of(p, p) == 0)
            })
        });
        assert!(again.is_some(), "idle again, carrying the class: {}", daemon.log_text());

        // Stop: the branch as it was, the soakers back in the normal class, nothing moved.
        assert!(daemon.signal(libc::SIGTERM).success());
        assert!(!shape.user_idle());
        assert_eq!(shape.cg.weight_raw(&shape.user).unwrap(), shares);
        for &p in &soakers {
            assert_eq!(policy_of(p, p), 0);
        }

        // After kill -9, appease restore puts the branch back.
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let idle = with_traffic(port, || {
            wait_for(Duration::from_secs(20), || shape.user_idle())
        });
        assert!(idle.is_some(), "{}", daemon.log_text());
        daemon.signal(libc::SIGKILL);
        assert!(shape.user_idle(), "still idle after the crash");
        let out = appease(&dir.0, &["restore"]);
        assert!(out.status.success(), "{out:?}");
        assert!(!shape.user_idle());
        assert_eq!(shape.cg.weight_raw(&shape.user).unwrap(), shares);
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo"
        );
    }
}

root_test! {
    fn where_the_batchs_branch_cannot_be_idle_the_servers_is_weighted_up_and_put_back() {
        let mut shape = Shape::new("weigh");
        let port = shape.start_server();
        // Someone's development server in the session, serving: the session's branch
        // holds a server, so it cannot be made idle.
        let scope = shape.scope.clone();
        let dev = shape.start_server_in(&scope, "1");
        let soakers = shape.start_session(4 * host_cpus());
        let system = shape.system.clone();
        let shares = shape.cg.weight_raw(&system).unwrap();
        thread::sleep(Duration::from_secs(1));
        let (unmanaged, by_hand) = with_traffic(dev, || {
            let unmanaged = p99_ms(port);
            // By hand: system.slice weighted up as appease does it.
            shape.cg.set_weight(&system, 10_000).unwrap();
            thread::sleep(Duration::from_millis(500));
            let by_hand = p99_ms(port);
            shape.cg.set_weight_raw(&system, &shares).unwrap();
            (unmanaged, by_hand)
        });

        let dir = TempDir::new("weigh");
        let cfg = dir.file(
            "weigh.toml",
            &batch_config(&format!("appease-e2e-weighb{}", std::process::id())),
        );
        // v2's highest weight, a hundred times the default (102400 shares on v1).
        let raised = || {
            let raw = shape.cg.weight_raw(&system).unwrap();
            shape.cg.weight_from_raw(&raw) == Some(10_000)
        };
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let with_appease = with_traffic(dev, || {
            let settled = with_traffic(port, || wait_for(Duration::from_secs(20), raised));
            assert!(settled.is_some(), "system.slice weighted up: {}", daemon.log_text());
            assert!(!shape.user_idle(), "the branch holds a server: not idle");
            let idle = wait_for(Duration::from_secs(10), || {
                soakers.iter().all(|&p| policy_of(p, p) == 5)
            });
            assert!(idle.is_some(), "SCHED_IDLE in place: {}", daemon.log_text());
            // The status is published once a second.
            let mut st = daemon.status_json();
            let listed = wait_for(Duration::from_secs(3), || {
                st = daemon.status_json();
                st["processes"].as_array().unwrap().iter().any(|p| {
                    p["group"] == system.as_str()
                        && p["placement"].as_str().unwrap_or("").contains("weight raised")
                })
            });
            assert!(listed.is_some(), "status lists the weighted branch: {st}");
            p99_ms(port)
        });
        eprintln!(
            "server p99: unmanaged {unmanaged:.2} ms, system.slice weighted up by hand {by_hand:.2} ms, appease {with_appease:.2} ms"
        );
        // How close it comes to by hand is the bench's figure (docs/RESULTS.md, "Nested
        // layouts"): windows of every mode here come out near 5.5 or near 9.3 ms.
        assert!(
            with_appease <= unmanaged * 1.2,
            "appease's p99 {with_appease:.2} ms against {unmanaged:.2} unmanaged ({by_hand:.2} by hand)"
        );

        // Stop: the weight as it was.
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(shape.cg.weight_raw(&system).unwrap(), shares);

        // After kill -9, appease restore puts it back.
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let again = with_traffic(dev, || {
            with_traffic(port, || wait_for(Duration::from_secs(20), raised))
        });
        assert!(again.is_some(), "{}", daemon.log_text());
        daemon.signal(libc::SIGKILL);
        assert!(raised(), "still raised after the crash");
        let out = appease(&dir.0, &["restore"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(shape.cg.weight_raw(&system).unwrap(), shares);
        assert!(!shape.cg.idle(&system).unwrap());
        assert!(!dir.0.join("journal.jsonl").exists(), "nothing left to undo");
    }
}
