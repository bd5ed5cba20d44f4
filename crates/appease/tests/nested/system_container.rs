//! appease inside a system container: a real systemd as PID 1 of a PID and cgroup namespace
//! of their own, on this machine's real CPUs (scripts/systemd-container.sh), its units made
//! by that systemd. The probe reports tasks by the host's numbers; appease must name and
//! change them as the container numbers them, and touch nothing outside it.

use super::*;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/systemd-container.sh"
);

/// The container, ended with everything in it (and its groups and overlay removed) on drop.
struct Container {
    name: String,
    pid1: u32,
    /// What the test started inside (the script's end of it), reaped on drop.
    started: Vec<std::process::Child>,
}

impl Container {
    fn start(tag: &str) -> Self {
        let name = format!("appease-e2e-{tag}{}", std::process::id());
        let out = Command::new(SCRIPT)
            .arg("start")
            .env("SYSTEMD_CONTAINER_NAME", &name)
            .output()
            .unwrap();
        let c = Container {
            pid1: String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0),
            name,
            started: Vec::new(),
        };
        assert!(
            out.status.success() && c.pid1 > 0,
            "the container starts: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    /// `CMD…` inside, in a scope of its own in the container's system.slice.
    fn exec(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SCRIPT);
        cmd.arg("exec")
            .args(args)
            .env("SYSTEMD_CONTAINER_NAME", &self.name);
        cmd
    }

    /// Starts `cmd` (made by `exec`), kept to be reaped with the container.
    fn start_inside(&mut self, cmd: &mut Command) -> &mut std::process::Child {
        self.started.push(cmd.spawn().unwrap());
        self.started.last_mut().unwrap()
    }

    /// The host's number of the process the container numbers `pid`, if it runs.
    fn host_pid(&self, pid: u32) -> Option<u32> {
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid1)).ok()?;
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let host: u32 = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
            let inner: u32 = nspid.split_whitespace().last()?.parse().ok()?;
            (inner == pid && std::fs::read_link(e.path().join("ns/pid")).ok()? == ns)
                .then_some(host)
        })
    }

    /// The host's numbers of the container's processes named `comm`.
    fn host_pids_named(&self, comm: &str) -> Vec<u32> {
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid1)).ok();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
                (name.trim_end() == comm && std::fs::read_link(e.path().join("ns/pid")).ok() == ns)
                    .then_some(pid)
            })
            .collect()
    }

    /// A host process's cpu group as the container sees it (below its root).
    fn group_inside(&self, host_pid: u32) -> Option<String> {
        let g = cpu_cgroup(host_pid)?;
        g.strip_prefix(&format!("/{}", self.name))
            .map(str::to_string)
    }
}

/// The lowest nice among a process's threads (the one that serves is elevated).
fn lowest_nice(pid: u32) -> i32 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| stat_of(t.path().join("stat").to_str()?).map(|s| s.nice))
        .min()
        .unwrap_or(0)
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT)
            .arg("stop")
            .env("SYSTEMD_CONTAINER_NAME", &self.name)
            .status();
        // Ended with the container's PID 1.
        for c in &mut self.started {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

root_test! {
    fn in_a_system_container_it_names_and_changes_the_containers_processes_and_restores_after_a_crash() {
        let mut c = Container::start("sd");
        // A server in a scope of the container's system.slice, soakers in a user's session
        // scope: both units made by the container's systemd.
        let server = c.start_inside(
            c.exec(&[BIN, "bench-worker", "server", "--cpu-ms", "1", "--port", "0"])
                .stdout(Stdio::piped()),
        );
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().expect("the server's port");
        c.start_inside(&mut c.exec(&[
            "systemd-run", "--scope", "--quiet", "--slice=user-0.slice",
            "--unit=session-1.scope", "-p", "CPUWeight=100", "sh", "-c",
            "for i in 1 2 3; do \"$0\" bench-worker soak --name e2e-soak & done; wait", BIN,
        ]));
        // Its run directory where both sides see it: this checkout is bound inside.
        let run = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&c.name);
        std::fs::create_dir_all(&run).unwrap();
        let run_s = run.to_str().unwrap();
        let log = std::fs::File::create(run.join("daemon.log")).unwrap();
        c.start_inside(
            c.exec(&[BIN, "daemon", "--log", "debug"])
                .env("APPEASE_RUN_DIR", run_s)
                .stderr(log),
        );
        let daemon_log = || std::fs::read_to_string(run.join("daemon.log")).unwrap_or_default();
        let soakers = || c.host_pids_named("e2e-soak");
        with_traffic(port, || {
            // Elevated while the soakers load the CPUs (once they are demoted the load is
            // low and the elevation fades, as it should).
            let server_host = c.host_pids_named("bench-server");
            assert_eq!(server_host.len(), 1, "one server");
            let elevated = wait_for(Duration::from_secs(10), || lowest_nice(server_host[0]) < 0);
            assert!(elevated.is_some(), "the serving server elevated: {}", daemon_log());
            let demoted = wait_for(Duration::from_secs(20), || {
                let s = soakers();
                s.len() == 3
                    && s.iter().all(|&p| {
                        c.group_inside(p).is_some_and(|g| g.starts_with("/appease.batch/"))
                    })
            });
            assert!(demoted.is_some(), "the soakers moved to the container's idle group: {}", daemon_log());
        });
        // The status (rewritten every second) names them as the container does.
        let mut st = serde_json::Value::Null;
        let listed = wait_for(Duration::from_secs(5), || {
            st = status_of(&run).expect("the daemon answers");
            let listed: Vec<u32> = st["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| c.host_pid(p["pid"].as_u64()? as u32))
                .collect();
            soakers().iter().all(|s| listed.contains(s))
        });
        assert!(listed.is_some(), "status lists the soakers by the container's numbers: {st}");
        // A crash, then `appease restore` inside: back in their scope, nothing left.
        let daemon = c.host_pid(st["pid"].as_u64().unwrap() as u32).expect("the daemon runs");
        // SAFETY: the daemon this test started, found by its namespace and number.
        unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
        assert!(wait_for(Duration::from_secs(5), || c.host_pid(st["pid"].as_u64().unwrap() as u32).is_none()).is_some());
        let out = c.exec(&[BIN, "restore"]).env("APPEASE_RUN_DIR", run_s).output().unwrap();
        assert!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
        for s in soakers() {
            assert_eq!(
                c.group_inside(s).as_deref(),
                Some("/user.slice/user-0.slice/session-1.scope"),
                "soaker {s} back in its scope"
            );
        }
        assert_eq!(lowest_nice(c.host_pids_named("bench-server")[0]), 0, "the server's nice back");
        assert!(!run.join("journal.jsonl").exists(), "nothing left to undo");
        let _ = std::fs::remove_dir_all(&run);
    }
}
