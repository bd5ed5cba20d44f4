//! Limits bind a whole cgroup: trees under one are demoted in place.

use super::*;

root_test! {
    fn a_soaker_under_a_cpu_limit_is_demoted_in_place_and_the_limit_still_binds_the_group() {
        let (limited, _dir, soakers, server, mut daemon, batch_group) =
            demoted_under_a_limit("limit", None);
        let soaker = soakers.0[0].id();
        let group = limited.path.clone();
        assert_eq!(
            cpu_cgroup(soaker).as_deref(),
            Some(group.as_str()),
            "not moved"
        );
        assert_eq!(cpu_cgroup(server.pid).as_deref(), Some(group.as_str()));
        assert_eq!(
            policy_of(server.pid, server.pid),
            0,
            "the server is not batch"
        );
        assert!(
            !limited.cg.exists(&format!("/{batch_group}")),
            "no idle group was needed"
        );
        let mut st = daemon.status_json();
        let listed = wait_for(Duration::from_secs(3), || {
            st = daemon.status_json();
            st["processes"].as_array().unwrap().iter().any(|p| {
                p["pid"] == soaker
                    && p["placement"].as_str().unwrap().starts_with("in place")
                    && p["group"] == group.as_str()
            })
        });
        assert!(listed.is_some(), "status says how: {st}");

        // Together, the two still get half a CPU: the quota binds the whole group.
        let before = cpu_ns_of(soaker) + cpu_ns_of(server.pid);
        let t = std::time::Instant::now();
        thread::sleep(Duration::from_secs(2));
        let used =
            (cpu_ns_of(soaker) + cpu_ns_of(server.pid) - before) as f64 / t.elapsed().as_nanos() as f64;
        eprintln!("the limited group used {used:.3} CPUs (quota 0.5)");
        assert!(
            used <= 0.55,
            "the group used {used:.3} CPUs over its 0.5 quota"
        );
        assert!(used >= 0.3, "the group ran: {used:.3} CPUs");

        // A child born after the demotion is born idle, in the group.
        let kid = fork_a_sleep(soaker);
        let _end_kid = KillOnDrop(kid);
        assert_eq!(policy_of(kid, kid), 5, "born idle");
        assert_eq!(cpu_cgroup(kid).as_deref(), Some(group.as_str()));

        // Stop: both back in the normal class, still in their group.
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(policy_of(soaker, soaker), 0, "{}", daemon.log_text());
        assert_eq!(
            policy_of(kid, kid),
            0,
            "the child born idle is put back too"
        );
        assert_eq!(cpu_cgroup(soaker).as_deref(), Some(group.as_str()));
    }
}

root_test! {
    fn kill_9_with_a_soaker_demoted_in_place_then_restore_puts_its_class_back() {
        let (_limited, dir, soakers, _server, mut daemon, _) = demoted_under_a_limit("limk", None);
        let soaker = soakers.0[0].id();
        let kid = fork_a_sleep(soaker);
        let _end_kid = KillOnDrop(kid);
        daemon.signal(libc::SIGKILL);
        assert_eq!(policy_of(soaker, soaker), 5, "still idle after the crash");
        let out = appease(&dir.0, &["restore"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(policy_of(soaker, soaker), 0);
        assert_eq!(
            policy_of(kid, kid),
            0,
            "a child with no record of its own goes back as its parent"
        );
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

root_test! {
    fn an_administrators_change_to_a_group_made_idle_is_kept_by_the_restore_after_a_crash() {
        // A limited group that holds only batch: made idle where it is, as a whole.
        let mut limited = LimitedGroup::new("adm", None);
        let (dir, cfg, _) = limited_batch_config("adm");
        let soakers = Soakers(vec![forking_soaker()]);
        limited.adopt(soakers.0[0].id());
        let group = limited.path.clone();
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let idle = wait_for(Duration::from_secs(8), || {
            limited.cg.idle(&group).unwrap_or(false)
        });
        assert!(
            idle.is_some(),
            "the group made idle where it is: {}",
            daemon.log_text()
        );
        daemon.signal(libc::SIGKILL);
        // The administrator's choice between the crash and the restore.
        limited.cg.set_idle(&group, false).unwrap();
        limited.cg.set_weight_raw(&group, "300").unwrap();
        let out = appease(&dir.0, &["restore"]);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{out:?}");
        assert!(!limited.cg.idle(&group).unwrap(), "{log}");
        assert_eq!(
            limited.cg.weight_raw(&group).unwrap().trim(),
            "300",
            "the administrator's weight kept: {log}"
        );
        assert!(
            log.contains("changed by someone else since"),
            "the restore says what it left: {log}"
        );
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo: {log}"
        );
    }
}
