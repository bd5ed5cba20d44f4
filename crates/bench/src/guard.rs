//! A bench killed outright (SIGKILL, the OOM killer) runs no code of its own: what it
//! started would go on (soakers spinning at nice 0, servers, its daemon with the servers
//! it raised), and its groups and directory would stay. So the bench first marks its own
//! environment, which everything it starts inherits, and starts a guardian in a session
//! of its own that waits for the bench's end. If anything with the mark (or started by it)
//! is still running then, the guardian ends it (SIGTERM first: the daemon puts back what
//! it changed, the servers stop on their own terms), then removes the bench's top-level
//! groups and directories. A bench that ended well left nothing: the guardian just exits.
//! Not covered: what a container engine or systemd runs for the bench (docker, nested)
//! and a peer daemon's settings.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The environment variable that marks a bench's processes: its value is the bench's pid.
pub const MARK: &str = "APPEASE_BENCH_RUN";

/// Marks this process's environment and starts `appease bench-guard` for it. Call before
/// any thread or child is started (the environment is changed in place). The returned
/// child must be kept (not waited for) while the bench runs: its standard input is the
/// pipe whose end tells the guardian the bench has gone.
pub fn start(appease: &Path) -> Result<Child> {
    let me = std::process::id();
    // Read here, not by the guardian: the bench may be killed before the guardian runs.
    let since = start_of(me).context("reading the bench's own start time")?;
    // Single-threaded still: nothing reads the environment meanwhile.
    std::env::set_var(MARK, me.to_string());
    let mut cmd = Command::new(appease);
    cmd.args(["bench-guard", &me.to_string(), &since.to_string()])
        .env_remove(MARK)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Out of the bench's process group and terminal: neither a Ctrl-C nor a
            // signal to the group ends it before the bench has gone.
            libc::setsid();
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    cmd.spawn().context("starting the bench's guardian")
}

/// The guardian's whole life: waits for bench `pid`, started at `since` (clock ticks after
/// boot), to go (its standard input closes), then ends what it left running and removes
/// its groups and directories (already gone after a bench that ended well).
pub fn watch(pid: u32, since: u64) -> Result<()> {
    let mut rest = Vec::new();
    // EOF (or an error) once the bench's end of the pipe is closed: it has exited.
    let _gone = std::io::stdin().read_to_end(&mut rest);
    let mut left = left_by(pid, since);
    if !left.is_empty() {
        say(format_args!(
            "the bench (pid {pid}) ended with {} of its processes running: ending them and \
             removing its groups",
            left.len()
        ));
    }
    for (sig, patience) in [(libc::SIGTERM, 10), (libc::SIGKILL, 5)] {
        for &(p, started) in &left {
            signal(p, started, sig);
        }
        let t = Instant::now();
        while !left.is_empty() && t.elapsed() < Duration::from_secs(patience) {
            std::thread::sleep(Duration::from_millis(50));
            left = left_by(pid, since);
        }
    }
    remove_groups(pid);
    // APPEASE_BENCH_KEEP=1 keeps them for a look, as a bench that ends well does.
    if std::env::var_os("APPEASE_BENCH_KEEP").is_none() {
        for name in crate::run::TMP_DIRS {
            let dir = crate::run::tmp_path(name, pid);
            // Only the bench's own: a user may have made one of these names first.
            if appease_actuator::private::check_private_dir(&dir).is_ok() {
                let _best_effort = std::fs::remove_dir_all(dir);
            }
        }
    }
    Ok(())
}

/// The bench whose mark process `pid` carries, if any.
pub fn bench_of(pid: u32) -> Option<u32> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let mark = format!("{MARK}=");
    env.split(|&b| b == 0).find_map(|v| {
        std::str::from_utf8(v.strip_prefix(mark.as_bytes())?)
            .ok()?
            .parse()
            .ok()
    })
}

/// The processes started at or after `since` that carry bench `pid`'s mark, and those
/// that the root ones among them started, as (pid, start time). Anyone can put the mark in
/// a process of their own: a user's marked process is one they could end themselves, and
/// what it started is not followed (a setuid program's child may be root's).
fn left_by(pid: u32, since: u64) -> Vec<(u32, u64)> {
    let me = std::process::id();
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let marked: Vec<u32> = pids
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != me && start_of(p).is_some_and(|s| s >= since))
        .filter(|&p| bench_of(p) == Some(pid))
        .collect();
    let root = |p: &u32| {
        let status = std::fs::read(format!("/proc/{p}/status")).unwrap_or_default();
        appease_cgroup::status_real_uid(&status) == Some(0)
    };
    let roots: Vec<u32> = marked.iter().copied().filter(root).collect();
    let mut all = crate::procfs::descendants(&roots);
    all.extend(marked);
    all.sort_unstable();
    all.dedup();
    // A process gone meanwhile has no start time, and nothing to end.
    all.into_iter()
        .filter_map(|p| Some((p, start_of(p)?)))
        .collect()
}

/// Signals process `pid` if it is still the one that started at `started`: through a
/// pidfd, so that a pid reused after the check is never the one signalled.
fn signal(pid: u32, started: u64, sig: i32) {
    use std::os::fd::AsRawFd;
    let Ok(fd) = appease_actuator::sys::pidfd_open_process(pid) else {
        return; // gone
    };
    if start_of(pid) == Some(started) {
        let none: *const libc::siginfo_t = std::ptr::null();
        // SAFETY: a pidfd we own; no siginfo.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), sig, none, 0) };
    }
}

/// To the bench's standard error, which may be a pipe no one reads any more: the work
/// goes on whether it is read or not.
fn say(what: std::fmt::Arguments) {
    use std::io::Write;
    let _unread = writeln!(std::io::stderr(), "appease bench-guard: {what}");
}

fn start_of(pid: u32) -> Option<u64> {
    appease_cgroup::read_stat(format!("/proc/{pid}/stat")).map(|s| s.start)
}

/// The bench's top-level groups (`appease-bench-PID.*`), their subgroups first.
fn remove_groups(pid: u32) {
    let Ok(cg) = appease_cgroup::Cgroups::detect() else {
        return;
    };
    let prefix = format!("appease-bench-{pid}.");
    let tops = std::fs::read_dir(cg.root()).into_iter().flatten().flatten();
    for top in tops.filter(|e| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
    }) {
        remove_tree(&top.path());
    }
}

/// A group and its subgroups (cgroupfs holds no links). A killed process leaves its group
/// only once reaped, a moment after it has gone from the guardian's scan: removal is
/// retried for a while.
fn remove_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path());
        }
    }
    let remove = || match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    let t = Instant::now();
    let mut result = remove();
    while result.is_err() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        result = remove();
    }
    if let Err(e) = result {
        say(format_args!("could not remove {}: {e}", dir.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marked_processes_started_since_the_bench_are_found_and_no_others() {
        // A bench pid no process has: only these children carry its mark.
        let bench = u32::MAX - 7;
        let spawn = |mark: bool| {
            let mut c = Command::new("sleep");
            c.arg("30");
            if mark {
                c.env(MARK, bench.to_string());
            }
            c.spawn().unwrap()
        };
        let (mut marked, mut plain) = (spawn(true), spawn(false));
        let started = start_of(marked.id()).unwrap();
        assert_eq!(left_by(bench, started), vec![(marked.id(), started)]);
        assert_eq!(left_by(bench, started + 1), vec![], "started before");
        for c in [&mut marked, &mut plain] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(left_by(bench, 0), vec![], "ended");
    }
}
