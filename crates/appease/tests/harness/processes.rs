//! Soakers, scripts, sessions and the guards that end them and undo what a test set up.

use crate::*;

/// `appease bench-worker soak` under the process name `name` (for rules by name).
pub(crate) fn named_soaker(name: &str) -> std::process::Child {
    Command::new(BIN)
        .args(["bench-worker", "soak", "--name", name])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// A soaker in a new session (no terminal, as under CI even when the tests run from
/// a terminal), which forks a `sleep` child on SIGUSR1.
pub(crate) fn forking_soaker() -> std::process::Child {
    in_new_session("trap 'sleep 60 &' USR1; while :; do :; done")
}

/// `sh -c text` in a session of its own (no terminal, its own process group).
pub(crate) fn in_new_session(text: &str) -> std::process::Child {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", text]).stdout(Stdio::null());
    own_session(&mut cmd).spawn().unwrap()
}

/// `cmd`, to start in a session of its own (setsid), hence its own autogroup.
pub(crate) fn own_session(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    }
}

/// A shell script in a session of its own (no terminal, its own process group), ended
/// with every process of that group.
pub(crate) struct Script(pub(crate) std::process::Child);

impl Script {
    pub(crate) fn start(text: &str) -> Self {
        Script(in_new_session(text))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Its processes now: the script and every descendant.
    pub(crate) fn tree(&self) -> Vec<u32> {
        let mut out = vec![self.pid()];
        let mut i = 0;
        while i < out.len() {
            out.extend(children_of(out[i]));
            i += 1;
        }
        out
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        // SAFETY: the process group this script leads (setsid above).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The kernel makes autogroups while it lives (`sched_autogroup_enabled = 1`); the
/// setting found goes back on drop.
pub(crate) struct AutogroupsOn(pub(crate) String);

impl AutogroupsOn {
    const KNOB: &str = "/proc/sys/kernel/sched_autogroup_enabled";

    pub(crate) fn new() -> Self {
        let was = std::fs::read_to_string(Self::KNOB)
            .expect("a kernel with autogroups (CONFIG_SCHED_AUTOGROUP): /proc/sys/kernel/sched_autogroup_enabled");
        std::fs::write(Self::KNOB, "1").unwrap();
        AutogroupsOn(was.trim().to_string())
    }
}

impl Drop for AutogroupsOn {
    fn drop(&mut self) {
        let _best_effort = std::fs::write(Self::KNOB, &self.0);
    }
}

/// A small tmpfs mounted for a test, unmounted on drop.
pub(crate) struct TinyFs(pub(crate) PathBuf);

impl TinyFs {
    pub(crate) fn mount(at: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs at {}", at.display());
        TinyFs(at.to_path_buf())
    }

    /// Writes zeros until the filesystem is full; returns the file.
    pub(crate) fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        path
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

pub(crate) struct KillOnDrop(pub(crate) u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: ending and reaping our own forked child.
        unsafe {
            libc::kill(self.0 as i32, libc::SIGKILL);
            libc::waitpid(self.0 as i32, std::ptr::null_mut(), 0);
        }
    }
}

/// A private tmux server for one test, ended (with what runs in it) on drop.
pub(crate) struct Tmux(pub(crate) String);

impl Tmux {
    pub(crate) fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .output()
            .expect("tmux (Debian package tmux; make test-deps installs it)")
    }

    pub(crate) fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _already_gone = self.run(&["kill-server"]);
    }
}

/// A top-level cgroup of the test's with half a CPU of quota (`cpu.cfs_quota_us` on
/// v1, `cpu.max` on v2; on v2 also `pids.max`), removed on drop once its processes are.
pub(crate) struct LimitedGroup {
    pub(crate) cg: appease_cgroup::Cgroups,
    pub(crate) path: String,
    pub(crate) procs: Vec<u32>,
}

impl LimitedGroup {
    pub(crate) fn new(tag: &str, pids_max: Option<u32>) -> Self {
        let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
        let path = format!("/appease-e2e-{tag}{}", std::process::id());
        let dir = cg.root().join(&path[1..]);
        std::fs::create_dir(&dir).unwrap();
        let write = |f: &str, v: &str| std::fs::write(dir.join(f), v).unwrap();
        match cg.version() {
            appease_cgroup::Version::V1 => {
                write("cpu.cfs_period_us", "100000");
                write("cpu.cfs_quota_us", "50000");
            }
            appease_cgroup::Version::V2 => {
                write("cpu.max", "50000 100000");
                if let Some(n) = pids_max {
                    write("pids.max", &n.to_string());
                }
            }
        }
        LimitedGroup {
            cg,
            path,
            procs: vec![],
        }
    }

    pub(crate) fn adopt(&mut self, pid: u32) {
        self.cg.move_process(pid, &self.path).unwrap();
        self.procs.push(pid);
    }
}

impl Drop for LimitedGroup {
    fn drop(&mut self) {
        for p in self.cg.processes(&self.path).unwrap_or_default() {
            // SAFETY: ending processes this test started in its own group.
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
        let gone = wait_for(Duration::from_secs(5), || {
            self.cg.processes(&self.path).is_ok_and(|p| p.is_empty())
        });
        assert!(gone.is_some(), "processes left in {}", self.path);
        // An emptied cgroup can still be busy for a moment.
        wait_for(Duration::from_secs(2), || {
            self.cg.remove(&self.path).is_ok()
        });
        assert!(!self.cg.exists(&self.path), "{} removed", self.path);
    }
}

/// Cgroups the test made, emptied on drop; those of their ancestors that the test made
/// too are removed with them, never one the host had (a v1 host's `/system.slice`).
pub(crate) struct MadeGroups {
    pub(crate) cg: appease_cgroup::Cgroups,
    pub(crate) paths: Vec<String>,
    /// Every group this made, ancestors included.
    made: Vec<String>,
}

impl MadeGroups {
    pub(crate) fn new(paths: &[&str]) -> Self {
        let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
        let mut made = Vec::new();
        for p in paths {
            let mut at = String::new();
            for part in p[1..].split('/') {
                at = format!("{at}/{part}");
                if !cg.exists(&at) {
                    std::fs::create_dir(cg.root().join(&at[1..])).unwrap();
                    made.push(at.clone());
                }
            }
        }
        MadeGroups {
            cg,
            paths: paths.iter().map(|p| p.to_string()).collect(),
            made,
        }
    }
}

impl Drop for MadeGroups {
    fn drop(&mut self) {
        for p in &self.paths {
            for pid in self.cg.processes_below(p).unwrap_or_default() {
                // SAFETY: ending processes this test started in its own groups.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let mut all = self.made.clone();
        all.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
        for p in all {
            wait_for(Duration::from_secs(3), || self.cg.remove(&p).is_ok());
        }
    }
}

/// Has a `forking_soaker` fork a `sleep` and returns its pid. An idle-class shell beside
/// a spinning server runs rarely: it is given time.
pub(crate) fn fork_a_sleep(soaker: u32) -> u32 {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(soaker as i32, libc::SIGUSR1) };
    let mut kids = vec![];
    assert!(wait_for(Duration::from_secs(15), || {
        kids = children_of(soaker);
        !kids.is_empty()
    })
    .is_some());
    kids[0]
}

/// A soaker alone in the container cgroup `ctr` (made by the test, its weight as first
/// read returned) and a daemon that has made the container idle. Bound left to right,
/// dropped right to left.
pub(crate) fn container_made_idle(
    ctr: &str,
    tag: &str,
) -> (MadeGroups, String, Soakers, TempDir, Daemon) {
    let made = MadeGroups::new(&[ctr]);
    let weight = made.cg.weight_raw(ctr).unwrap();
    let soakers = Soakers(vec![soaker_in(&made.cg, ctr)]);
    let dir = TempDir::new(tag);
    let cfg = dir.file(
        "batch.toml",
        &batch_config(&format!("appease-e2e-{tag}{}", std::process::id())),
    );
    let daemon = Daemon::start(&dir.0, &cfg);
    assert!(
        wait_for(Duration::from_secs(8), || made
            .cg
            .idle(ctr)
            .unwrap_or(false))
        .is_some(),
        "the container made idle: {}",
        daemon.log_text()
    );
    (made, weight, soakers, dir, daemon)
}

/// A soaker started straight into `group`.
pub(crate) fn soaker_in(cg: &appease_cgroup::Cgroups, group: &str) -> std::process::Child {
    let child = forking_soaker();
    cg.move_process(child.id(), group).unwrap();
    child
}
