//! Docker for real: Debian's `dockerd` (cgroupfs driver, the only one without systemd as
//! PID 1: runc refuses the systemd driver here, "systemd not running on this host"), an
//! engine of the test's own with no bridge and no iptables rules, containers with no
//! network, and an image made here from the host's `/usr` (no registry).

use super::*;
use appease_bench::docker::{Container, Engine};

/// The engine of one test, in its own directory; stopped, and its cgroups removed, on drop.
fn engine(tag: &str) -> (TempDir, Engine) {
    let dir = TempDir::new(tag);
    let engine = Engine::start(&dir.0.join("docker")).expect("Debian's docker.io runs here");
    (dir, engine)
}

/// Every process of a container with the whole of its /proc/PID/cgroup (every hierarchy).
fn cgroups_of(c: &Container) -> Vec<(u32, String)> {
    let cg = appease_cgroup::Cgroups::detect().unwrap();
    let mut out: Vec<(u32, String)> = cg
        .processes_below(&c.group())
        .unwrap()
        .into_iter()
        .filter_map(|p| {
            Some((
                p,
                std::fs::read_to_string(format!("/proc/{p}/cgroup")).ok()?,
            ))
        })
        .collect();
    out.sort();
    out
}

/// CPUs a container used over `span`: its processes' CPU time from /proc, which reads
/// the same on cgroup v1 and v2 (cpuacct exists only on v1).
fn cpus_used(c: &Container, span: Duration) -> f64 {
    let cg = appease_cgroup::Cgroups::detect().unwrap();
    let usage_ns = || -> u64 {
        let ticks: u64 = cg
            .processes_below(&c.group())
            .unwrap()
            .into_iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
            .filter_map(|t| appease_cgroup::ProcStat::parse(&t))
            .map(|s| s.run_ticks)
            .sum();
        ticks * appease_cgroup::clock_tick_ns()
    };
    let before = usage_ns();
    thread::sleep(span);
    (usage_ns() - before) as f64 / span.as_nanos() as f64
}

/// On a failed test: ends appease's container, then restores from its journal.
struct RestoreAfter<'a>(&'a Engine, String, PathBuf);

impl Drop for RestoreAfter<'_> {
    fn drop(&mut self) {
        let _gone_already = self.0.docker(&["rm", "-f", &self.1]);
        if self.2.join("journal.jsonl").exists() {
            appease(&self.2, &["restore"]);
        }
    }
}

root_test! {
    fn soakers_in_real_docker_containers_stay_in_their_cgroups_a_quota_still_binds_and_a_stopped_container_is_let_go() {
        let (dir, engine) = engine("docker-real");
        // A soaker with a helper beside it (two processes), without and with a quota.
        let spin = ["sh", "-c", "sleep 600 & while :; do :; done"];
        let free = engine.run(&[], &spin).unwrap();
        let capped = engine.run(&["--cpus=0.5"], &spin).unwrap();
        assert!(
            wait_for(Duration::from_secs(5), || cgroups_of(&free).len() == 2
                && cgroups_of(&capped).len() == 2)
            .is_some(),
            "two processes in each container"
        );
        let before = [cgroups_of(&free), cgroups_of(&capped)];
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        let weights = [&free, &capped].map(|c| cg.weight_raw(&c.group()).unwrap());
        let parent_weight = cg.weight_raw("/docker").unwrap();
        // The quota holds the capped soaker to half a CPU: the threshold is lowered to match.
        let cfg = dir.file(
            "batch.toml",
            &format!(
                "{}min_cpus = 0.3\n",
                batch_config(&format!("appease-e2e-dk{}", std::process::id()))
            ),
        );
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let both_idle = || {
            [&free, &capped]
                .iter()
                .all(|c| cg.idle(&c.group()).unwrap_or(false))
        };
        assert!(
            wait_for(Duration::from_secs(10), both_idle).is_some(),
            "both containers made idle where they are: {}",
            daemon.log_text()
        );
        assert_eq!(
            [cgroups_of(&free), cgroups_of(&capped)],
            before,
            "no process left any of its container's cgroups"
        );
        // Every container under /docker is batch: /docker itself is idle, a sibling of the
        // host's servers; a container that starts there makes it normal again.
        let parent = "/docker";
        assert!(
            wait_for(Duration::from_secs(3), || cg.idle(parent).unwrap_or(false)).is_some(),
            "the containers' parent made idle: {}",
            daemon.log_text()
        );
        let other = engine.run(&[], &["sleep", "600"]).unwrap();
        assert!(
            wait_for(Duration::from_secs(2), || !cg.idle(parent).unwrap_or(true)).is_some(),
            "a new container is not left in an idle parent: {}",
            daemon.log_text()
        );
        engine.remove(&other).unwrap();
        assert!(
            wait_for(Duration::from_secs(3), || cg.idle(parent).unwrap_or(false)).is_some(),
            "idle again once it is gone: {}",
            daemon.log_text()
        );
        let used = cpus_used(&capped, Duration::from_secs(2));
        assert!(used <= 0.55, "--cpus=0.5 still binds: {used:.3} CPUs");
        eprintln!("capped container after demotion: {used:.3} CPUs (quota 0.5)");

        // A container that stops while demoted: let go at the next scan, nothing fails.
        engine.remove(&free).unwrap();
        assert!(
            wait_for(Duration::from_secs(5), || {
                daemon.status_json()["processes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|p| p["group"] != free.group().as_str())
            })
            .is_some(),
            "the stopped container is no longer listed: {}",
            daemon.log_text()
        );
        assert!(
            daemon.signal(libc::SIGTERM).success(),
            "{}",
            daemon.log_text()
        );
        assert!(!cg.idle(&capped.group()).unwrap(), "idle flag back");
        assert!(!cg.idle(parent).unwrap(), "the parent's too");
        assert_eq!(
            cg.weight_raw(parent).unwrap(),
            parent_weight,
            "and its weight"
        );
        assert_eq!(
            cg.weight_raw(&capped.group()).unwrap(),
            weights[1],
            "weight back"
        );
        assert!(
            !dir.0.join("journal.jsonl").exists(),
            "nothing left to undo"
        );
    }
}

root_test! {
    fn appease_run_in_a_docker_container_manages_the_host_and_its_restarted_container_restores_after_kill_9() {
        appease_in_a_container("--cgroupns=host", &[]);
    }
}

root_test! {
    fn appease_in_a_private_cgroup_namespace_joins_the_hosts_and_manages_it_as_on_the_host() {
        // What containerd gives a pod on a cgroup v2 node (`hostPID: true`, a hostPath
        // /sys/fs/cgroup): its own cgroup namespace. With the two capabilities the
        // manifest adds for it, appease joins PID 1's.
        let logs = appease_in_a_container(
            "--cgroupns=private",
            &["--cap-add=SYS_PTRACE"],
        );
        assert!(
            logs.contains("joined the host's cgroup namespace"),
            "{logs}"
        );
        // Without SYS_PTRACE it cannot open the host's namespace: one line says what to grant.
        let (_dir, engine) = engine("docker-cgroupns");
        // It may end before `docker run` returns (refused) or after (then waited for).
        let refused = match engine.run_image(
                &appease_image(&engine),
                &[
                    "--pid=host",
                    "--cgroupns=private",
                    "--cap-drop=ALL",
                    "--cap-add=SYS_ADMIN",
                    "--cap-add=SYS_NICE",
                    "--security-opt=seccomp=unconfined",
                ],
                &[],
            ) {
            Err(e) => e.to_string(),
            Ok(c) => {
                let code = engine.docker(&["wait", &c.id]).unwrap();
                assert_ne!(code, "0", "appease ran without the host's cgroup namespace");
                engine.log_text(&c.id).unwrap()
            }
        };
        assert!(
            refused.contains("could not join the host's")
                && refused.contains("SYS_PTRACE and SYS_ADMIN"),
            "{refused}"
        );
    }
}

/// The DaemonSet's image as `scripts/image.sh` builds it without a registry (the host's
/// Debian packages and this build's binary), imported into `engine`; its tag.
fn appease_image(engine: &Engine) -> String {
    let tag = "appease:e2e".to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image.sh");
    let out = std::process::Command::new(script)
        .arg(&tag)
        .env("APPEASE_BIN", std::fs::canonicalize(BIN).unwrap())
        .env("DOCKER_HOST", engine.host())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tag
}

/// appease in a Docker container of its image sharing the host's PIDs, in the cgroup namespace
/// `cgroupns` with `caps` added: demotes the host's soakers and elevates its server, restores after
/// `kill -9` of the container when it restarts, and puts everything back on `docker stop`.
/// Returns the container's log.
fn appease_in_a_container(cgroupns: &str, caps: &[&str]) -> String {
    let (dir, engine) = engine("docker-appease");
    let group = format!("appease-e2e-dkd{}", std::process::id());
    // Demotion, and the tests' elevation ladder (engaged from one runnable task per CPU).
    let elevation = test_elevation();
    let cfg = dir.file(
        "batch.toml",
        &format!("{}{elevation}", batch_config(&group)),
    );
    let run_dir = dir.0.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let image = appease_image(&engine);
    let mounts = [
        "/sys/fs/cgroup:/sys/fs/cgroup".to_string(),
        format!("{}:/run/appease", run_dir.display()),
        format!("{}:/etc/appease/appease.toml:ro", cfg.display()),
    ];
    let mut opts = vec![
        "--pid=host",
        cgroupns,
        "--cap-drop=ALL",
        // Docker 20.10 does not know BPF and PERFMON by name: SYS_ADMIN stands for both.
        "--cap-add=SYS_ADMIN",
        "--cap-add=SYS_NICE",
        "--cap-add=DAC_OVERRIDE",
        "--security-opt=seccomp=unconfined",
        "-e",
        "APPEASE_RUN_DIR=/run/appease",
    ];
    opts.extend(caps);
    for m in &mounts {
        opts.extend(["-v", m]);
    }
    // The host's work: a soaker, and a server thread of this test's under load.
    let soakers = Soakers(vec![forking_soaker(), forking_soaker(), forking_soaker()]);
    let cpu_before = cpu_cgroup(soakers.0[0].id()).unwrap();
    let svc = Service::unix(Duration::from_micros(300), Duration::from_millis(20));
    let appease_ctr = engine
        .run_image(
            &image,
            &opts,
            &["daemon", "--config", "/etc/appease/appease.toml"],
        )
        .unwrap();
    let _restore = RestoreAfter(&engine, appease_ctr.id.clone(), run_dir.clone());
    let logs = || engine.log_text(&appease_ctr.id).unwrap_or_default();
    let in_group = |want: bool| {
        soakers.0.iter().all(|s| {
            cpu_cgroup(s.id()).is_some_and(|g| g.starts_with(&format!("/{group}/job-")) == want)
        })
    };
    assert!(
        wait_for(Duration::from_secs(10), || in_group(true)).is_some(),
        "the host's soakers demoted from the container: {}",
        logs()
    );
    // The elevation ends as soon as the soakers are demoted (the load falls), so the
    // audit line, written once the change is made, is what shows it happened.
    let elevated = format!(
        "change=\"elevate\" pid={} tid={}",
        std::process::id(),
        svc.server_tid
    );
    assert!(
        wait_for(Duration::from_secs(5), || logs().contains(&elevated)).is_some(),
        "the host's server elevated from the container: {}",
        logs()
    );
    engine
        .docker(&["kill", "-s", "KILL", &appease_ctr.id])
        .unwrap();
    assert!(
        run_dir.join("journal.jsonl").exists(),
        "the journal outlives the container on the host path"
    );
    assert!(in_group(true), "a kill -9 restores nothing");
    engine.docker(&["start", &appease_ctr.id]).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || logs()
            .contains("restored what a previous daemon left behind"))
        .is_some(),
        "the restarted container restores from the journal: {}",
        logs()
    );
    assert!(
        wait_for(Duration::from_secs(10), || in_group(true)).is_some(),
        "and goes on: {}",
        logs()
    );
    engine.docker(&["stop", &appease_ctr.id]).unwrap();
    let out = logs();
    assert!(!out.contains(" ERROR "), "{out}");
    assert!(in_group(false), "the soakers back where they were");
    assert_eq!(cpu_cgroup(soakers.0[0].id()).unwrap(), cpu_before);
    drop(svc);
    assert!(
        !run_dir.join("journal.jsonl").exists(),
        "nothing left to undo"
    );
    assert!(
        !appease_cgroup::Cgroups::detect()
            .unwrap()
            .exists(&format!("/{group}")),
        "the idle group removed"
    );
    out
}
