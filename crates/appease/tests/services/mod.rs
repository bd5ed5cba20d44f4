//! Services and roles from the config, and reloading it.

use super::*;

root_test! {
    fn a_service_group_the_kernel_refuses_stops_the_start_and_changes_nothing() {
        let dir = TempDir::new("refused");
        let name = format!("refused{}", std::process::id() % 100_000);
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        // An idle group of that name already exists: the kernel refuses a weight on it.
        let gpath = cg
            .ensure_top_group(&format!("appease.svc.{name}"), true, 100)
            .unwrap();
        let cfg = dir.file(
            "refused.toml",
            &format!("[[service]]\nname = \"{name}\"\ncomm = \"no-such-comm\"\ntrust_comm = true\nweight = 200\n"),
        );
        let shares = cg.root().join(&gpath[1..]).join("cpu.shares");
        let before = std::fs::read_to_string(&shares).ok();
        let out = appease(&dir.0, &["daemon", "--config", cfg.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("service \"{name}\": cannot set up its group")),
            "{err}"
        );
        assert_eq!(
            err.lines().filter(|l| l.contains("error:")).count(),
            1,
            "one error, with its cause chain: {err}"
        );
        // The group that was there is still there, as it was.
        assert!(cg.exists(&gpath) && cg.idle(&gpath).unwrap());
        assert_eq!(std::fs::read_to_string(&shares).ok(), before);
        cg.remove(&gpath).unwrap();
    }
}

root_test! {
    fn latency_services_get_their_own_groups_and_share_the_cpus_by_weight() {
        let dir = TempDir::new("services");
        let tag = std::process::id() % 10_000;
        let (a, b) = (format!("svc-a{tag}"), format!("svc-b{tag}"));
        let cfg = dir.file(
            "svc.toml",
            &format!(
                "[batch]\nenabled = false\nscan_ms = 200\n\n\
                 [[service]]\nname = \"a{tag}\"\ncomm = \"{a}\"\ntrust_comm = true\n\n\
                 [[service]]\nname = \"b{tag}\"\ncomm = \"{b}\"\ntrust_comm = true\n"
            ),
        );
        let home = cpu_cgroup(std::process::id()).unwrap();
        // Two CPU-hungry processes of service A, one of service B.
        let procs = Soakers(vec![named_soaker(&a), named_soaker(&a), named_soaker(&b)]);
        let pids: Vec<u32> = procs.0.iter().map(|c| c.id()).collect();
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let (ga, gb) = (
            format!("/appease.svc.a{tag}"),
            format!("/appease.svc.b{tag}"),
        );
        let placed = wait_for(Duration::from_secs(5), || {
            cpu_cgroup(pids[0]).as_deref() == Some(ga.as_str())
                && cpu_cgroup(pids[1]).as_deref() == Some(ga.as_str())
                && cpu_cgroup(pids[2]).as_deref() == Some(gb.as_str())
        });
        assert!(
            placed.is_some(),
            "placed in their groups: {}",
            daemon.log_text()
        );

        // Isolated and equal weights: B's one process gets as much as A's two together
        // (unmanaged, it would get a third of the CPUs).
        let cpu = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
                .ok()
                .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let before: Vec<f64> = pids.iter().map(|&p| cpu(p)).collect();
        thread::sleep(Duration::from_secs(3));
        let used: Vec<f64> = pids.iter().zip(&before).map(|(&p, b)| cpu(p) - b).collect();
        let ratio = used[2] / (used[0] + used[1]);
        eprintln!("service B / service A CPU: {ratio:.2} (used {used:?})");
        assert!(
            (0.75..=1.33).contains(&ratio),
            "fair between services: {ratio:.2}"
        );
        let st = daemon.status_json();
        assert!(
            st["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["class"] == "latency"),
            "status shows them as latency: {st}"
        );

        assert!(daemon.signal(libc::SIGTERM).success());
        for &p in &pids {
            assert_eq!(cpu_cgroup(p).unwrap(), home, "back in the original group");
        }
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        assert!(!cg.exists(&ga) && !cg.exists(&gb), "service groups removed");
    }
}

root_test! {
    fn roles_give_fixed_staggered_priorities_and_are_restored() {
        let dir = TempDir::new("roles");
        let tag = std::process::id() % 10_000;
        let (a, b) = (format!("role-a{tag}"), format!("role-b{tag}"));
        let cfg = dir.file(
            "roles.toml",
            &format!(
                "[batch]\nenabled = false\nscan_ms = 200\n[roles]\ntop_nice = -6\n\n\
                 [[role]]\napp = \"search\"\ncomm = \"{a}\"\ntrust_comm = true\nrank = 0\n\n\
                 [[role]]\napp = \"search\"\ncomm = \"{b}\"\ntrust_comm = true\nrank = 1\n"
            ),
        );
        let procs = Soakers(vec![named_soaker(&a), named_soaker(&b)]);
        let pids: Vec<u32> = procs.0.iter().map(|c| c.id()).collect();
        let nice = nice_of_process;
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let set = wait_for(Duration::from_secs(3), || {
            nice(pids[0]) == -6 && nice(pids[1]) == -5
        });
        assert!(
            set.is_some(),
            "staggered: {} {}: {}",
            nice(pids[0]),
            nice(pids[1]),
            daemon.log_text()
        );
        let (shown, st) = daemon.status_until(Duration::from_secs(3), |st| {
            lists_thread(st, |t| t["why"] == "role search rank 1")
        });
        assert!(shown, "status says why: {st}");
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!((nice(pids[0]), nice(pids[1])), (0, 0), "restored on exit");
    }
}

root_test! {
    fn a_reload_applies_services_roles_and_exceptions_and_a_bad_one_changes_nothing() {
        let dir = TempDir::new("reload");
        let tag = std::process::id() % 10_000;
        let [role_a, role_b, ex, sv] = ["rl-a", "rl-b", "ex-", "sv-"].map(|n| format!("{n}{tag}"));
        let common = format!(
            "[batch]\ngroup = \"appease.t{tag}\"\nafter_ms = 1000\nscan_ms = 200\n\
             [roles]\ntop_nice = -6\n\
             [[role]]\napp = \"a\"\ncomm = \"{role_a}\"\ntrust_comm = true\nrank = 0\n"
        );
        let before = format!("{common}[[role]]\napp = \"a\"\ncomm = \"{role_b}\"\ntrust_comm = true\nrank = 1\n");
        let cfg = dir.file("reload.toml", &before);
        let home = cpu_cgroup(std::process::id()).unwrap();
        let procs = Soakers(vec![
            named_soaker(&role_a),
            named_soaker(&role_b),
            named_soaker(&ex),
            named_soaker(&sv),
        ]);
        let [pa, pb, pe, ps] = [0, 1, 2, 3].map(|i| procs.0[i].id());
        let daemon = Daemon::start(&dir.0, &cfg);
        let batch = format!("/appease.t{tag}");
        let set = wait_for(Duration::from_secs(10), || {
            nice_of_process(pa) == -6
                && nice_of_process(pb) == -5
                && in_idle_group(pe, &batch)
                && in_idle_group(ps, &batch)
        });
        assert!(
            set.is_some(),
            "roles set, soakers demoted: {}",
            daemon.log_text()
        );

        // The new config: role B removed, a service for the soaker SV, and the soaker EX and
        // role A's process made exceptions (both already managed).
        let service = format!("r{tag}");
        std::fs::write(
            &cfg,
            format!(
                "{common}[hands_off]\ncomms = [\"{ex}\", \"{role_a}\"]\n\
                 [[service]]\nname = \"{service}\"\ncomm = \"{sv}\"\ntrust_comm = true\n"
            ),
        )
        .unwrap();
        let out = appease(&dir.0, &["reload"]);
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for part in [
            format!("applied: [[service]] {service} added"),
            "applied: [hands_off]".into(),
            "applied: [[role]]".into(),
        ] {
            assert!(said.contains(&part), "the reload says {part:?}: {said}");
        }
        let svc_group = format!("/appease.svc.{service}");
        let applied = wait_for(Duration::from_secs(5), || {
            nice_of_process(pa) == 0
                && nice_of_process(pb) == 0
                && cpu_cgroup(pe).as_deref() == Some(home.as_str())
                && cpu_cgroup(ps).as_deref() == Some(svc_group.as_str())
        });
        assert!(
            applied.is_some(),
            "reload in full effect: nice {} {}, cgroups {:?} {:?}: {}",
            nice_of_process(pa),
            nice_of_process(pb),
            cpu_cgroup(pe),
            cpu_cgroup(ps),
            daemon.log_text()
        );
        // And it stays so: the exception is not demoted again, the role not given back.
        for _ in 0..10 {
            thread::sleep(Duration::from_millis(200));
            assert_eq!(
                cpu_cgroup(pe).as_deref(),
                Some(home.as_str()),
                "an exception stays home"
            );
            assert_eq!((nice_of_process(pa), nice_of_process(pb)), (0, 0));
        }

        // A bad config: refused with one clear error, the running config kept.
        std::fs::write(&cfg, format!("{common}[elevation]\ntick_ms = \"often\"\n")).unwrap();
        let out = appease(&dir.0, &["reload"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "a bad reload fails");
        assert!(
            err.contains("keeps its last good config") && err.contains("line 13, column 11"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one error: {err}");
        thread::sleep(Duration::from_millis(600));
        assert_eq!(cpu_cgroup(ps).as_deref(), Some(svc_group.as_str()));
        assert_eq!(cpu_cgroup(pe).as_deref(), Some(home.as_str()));
        assert!(daemon.log_text().contains("keeping the last good config"));

        drop(daemon);
        for pid in [pa, pb, pe, ps] {
            assert_eq!(
                cpu_cgroup(pid).as_deref(),
                Some(home.as_str()),
                "all home after exit"
            );
            assert_eq!(nice_of_process(pid), 0);
        }
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        assert!(
            !cg.exists(&svc_group) && !cg.exists(&batch),
            "groups removed"
        );
    }
}
