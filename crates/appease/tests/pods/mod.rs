//! Containers and pods are a boundary: their class applies to them as a whole, in place.
//! These build, in the CPU hierarchy of this host, the exact cgroup paths Docker's cgroupfs
//! driver and the kubelet's two drivers create.

use super::*;

root_test! {
    fn besteffort_pods_are_the_idle_class_in_place_under_both_kubelet_drivers_and_a_rewrite_is_undone() {
        let uid = std::process::id();
        let fs_pod = format!("/kubepods/besteffort/pod{uid}-e2e");
        let sd_pod =
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}_e2e.slice");
        let burst = format!("/kubepods/burstable/pod{uid}-e2e");
        let made = MadeGroups::new(&[
            &format!("{fs_pod}/0123456789ab"),
            &format!("{sd_pod}/cri-containerd-0123456789ab.scope"),
            &format!("{burst}/0123456789ab"),
        ]);
        let cg = made.cg.clone();
        // What the kubelet writes for a BestEffort pod: the smallest weight.
        for pod in [&fs_pod, &sd_pod] {
            std::fs::write(cg.root().join(&pod[1..]).join("cpu.shares"), "2").unwrap();
        }
        let soakers = Soakers(vec![
            soaker_in(&cg, &format!("{fs_pod}/0123456789ab")),
            soaker_in(&cg, &format!("{sd_pod}/cri-containerd-0123456789ab.scope")),
        ]);
        let idle_sleeper = {
            let c = Command::new("sleep").arg("60").spawn().unwrap();
            cg.move_process(c.id(), &format!("{burst}/0123456789ab"))
                .unwrap();
            c
        };
        let _end_sleeper = KillOnDrop(idle_sleeper.id());
        let dir = TempDir::new("pods");
        let cfg = dir.file(
            "batch.toml",
            &batch_config(&format!("appease-e2e-pods{uid}")),
        );
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let both_idle = || {
            [&fs_pod, &sd_pod]
                .iter()
                .all(|p| cg.idle(p).unwrap_or(false))
        };
        assert!(
            wait_for(Duration::from_secs(5), both_idle).is_some(),
            "BestEffort pods made idle: {}",
            daemon.log_text()
        );
        assert!(!cg.idle(&burst).unwrap(), "a Burstable pod is not");
        for (s, pod) in soakers.0.iter().zip([&fs_pod, &sd_pod]) {
            let now = cpu_cgroup(s.id()).unwrap();
            assert!(
                now.starts_with(pod.as_str()),
                "{now}: no process left its pod"
            );
        }
        // The kubelet rewrites the pod's settings: idle flag off, its weight again.
        cg.set_idle(&fs_pod, false).unwrap();
        std::fs::write(cg.root().join(&fs_pod[1..]).join("cpu.shares"), "2").unwrap();
        assert!(
            wait_for(Duration::from_secs(3), || cg.idle(&fs_pod).unwrap_or(false)).is_some(),
            "the rewrite is undone: {}",
            daemon.log_text()
        );
        // The log line follows the write that undid the rewrite: wait for it as well.
        assert!(
            wait_for(Duration::from_secs(3), || daemon
                .log_text()
                .contains("applied again"))
            .is_some(),
            "and logged"
        );
        assert!(daemon.signal(libc::SIGTERM).success());
        for pod in [&fs_pod, &sd_pod] {
            assert!(!cg.idle(pod).unwrap(), "{pod} not idle after exit");
            assert_eq!(cg.weight_raw(pod).unwrap(), "2", "{pod}'s weight back");
        }
    }
}

root_test! {
    fn a_soaker_alone_in_a_docker_container_makes_the_container_idle_in_place_and_kill_9_restores() {
        let id = format!("{:0>64x}", std::process::id());
        let ctr = format!("/docker/{id}");
        let (made, weight, soakers, dir, mut daemon) = container_made_idle(&ctr, "docker");
        let cg = made.cg.clone();
        let pid = soakers.0[0].id();
        assert_eq!(cpu_cgroup(pid).as_deref(), Some(ctr.as_str()), "not moved");
        assert_eq!(
            policy_of(pid, pid),
            0,
            "the class is the container's, not per thread"
        );
        let mut st = daemon.status_json();
        let listed =
            wait_for(Duration::from_secs(3), || {
                st = daemon.status_json();
                st["processes"].as_array().unwrap().iter().any(|p| {
                    p["group"] == ctr.as_str() && p["placement"] == "in place: the group is idle"
                })
            });
        assert!(listed.is_some(), "status says how: {st}");
        daemon.signal(libc::SIGKILL);
        assert!(cg.idle(&ctr).unwrap(), "still idle after the crash");
        let out = appease(&dir.0, &["restore"]);
        assert!(out.status.success(), "{out:?}");
        assert!(!cg.idle(&ctr).unwrap(), "idle flag back");
        assert_eq!(cg.weight_raw(&ctr).unwrap(), weight, "weight back");
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo"
        );
    }
}

root_test! {
    fn in_a_pid_namespace_of_its_own_the_daemon_and_restore_refuse_with_one_clear_error() {
        let dir = TempDir::new("pidns");
        for args in [&["daemon"][..], &["restore"][..]] {
            // A container without --pid=host: its own PID namespace and its own /proc.
            let out = Command::new("unshare")
                .args(["--pid", "--fork", "--mount-proc", BIN])
                .args(args)
                .env("APPEASE_RUN_DIR", &dir.0)
                .output()
                .expect("unshare (util-linux) runs");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} refused: {err}");
            assert!(
                err.contains("PID namespace of its own") && err.contains("hostPID: true"),
                "{args:?}: {err}"
            );
            assert_eq!(err.lines().count(), 1, "one line: {err}");
            assert!(!dir.0.join("journal.jsonl").exists(), "nothing journaled");
        }
    }
}

root_test! {
    fn a_container_made_idle_for_a_soaker_that_ends_is_given_back_while_the_daemon_runs() {
        let id = format!("{:0>63x}e", std::process::id());
        let ctr = format!("/docker/{id}");
        let (made, _, mut soakers, dir, mut daemon) = container_made_idle(&ctr, "docker-end");
        let cg = made.cg.clone();
        // The job ends; the container stays (the next job in it must not start idle).
        for c in soakers.0.iter_mut() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert!(
            wait_for(Duration::from_secs(3), || !cg.idle(&ctr).unwrap_or(true)).is_some(),
            "given back at the next scan: {}",
            daemon.log_text()
        );
        assert!(daemon.signal(libc::SIGTERM).success());
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo"
        );
    }
}
