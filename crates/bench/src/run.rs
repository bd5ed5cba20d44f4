//! What one run starts (servers, workers, the daemon, groups) and the guard that ends and
//! undoes all of it on every path.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{descendants, peer, Options};

/// Everything one run started; ended (by pid) and undone when dropped, on every path.
#[derive(Default)]
pub(crate) struct Run {
    pub(crate) children: Vec<Child>,
    /// Servers that must stop on their own terms (nginx stops its workers on SIGTERM).
    pub(crate) graceful: Vec<Child>,
    pub(crate) daemon: Option<Child>,
    /// A peer daemon's mode: stopped, and what it changed put back, last.
    pub(crate) peer: Option<peer::PeerRun>,
    /// Removed in this order once the processes are gone.
    pub(crate) cgroups: Vec<(appease_cgroup::Cgroups, String)>,
    /// Groups of others made idle for the run (the Docker engine's parent): made busy
    /// again at its end.
    pub(crate) reset_idle: Vec<(appease_cgroup::Cgroups, String)>,
    /// systemd units whose CPU quota the run set: reset once its processes are gone.
    pub(crate) quota_resets: Vec<crate::nested::QuotaReset>,
    /// db-analytic-fresh's client: stopped first, while its server still answers.
    pub(crate) analytic: Option<crate::db::FreshAnalytic>,
    pub(crate) tmp: Option<PathBuf>,
}

impl Run {
    /// A run with its directory made (removed with the run).
    pub(crate) fn in_tmp() -> Result<(Run, PathBuf)> {
        let mut run = Run::default();
        let tmp = run.tmp()?;
        Ok((run, tmp))
    }

    /// The run's directory under the system's temporary directory, made on first use.
    pub(crate) fn tmp(&mut self) -> Result<PathBuf> {
        let tmp = private_tmp(TMP)?;
        self.tmp.get_or_insert_with(|| tmp.clone());
        Ok(tmp)
    }
}

/// The names of the bench's directories under the system's temporary directory (each
/// `NAME-PID`): the run's, its Docker engine's, fetch's cases'.
pub(crate) const TMP_DIRS: [&str; 3] = [TMP, DOCKER_TMP, FETCH_TMP];
const TMP: &str = "appease-bench";
pub(crate) const DOCKER_TMP: &str = "appease-bench-docker";
pub(crate) const FETCH_TMP: &str = "appease-bench-fetch";

/// The directory `name` of bench `pid` (one of `TMP_DIRS`).
pub(crate) fn tmp_path(name: &str, pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("{name}-{pid}"))
}

/// `NAME-PID` under the system's temporary directory, the bench's own: refused if it is a
/// link or someone else's (the name is easy to guess, and root writes in it). Mode 0755:
/// the servers that run as their own users (PostgreSQL) keep their data below it.
pub(crate) fn private_tmp(name: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp_path(name, std::process::id());
    let dir = appease_actuator::private::private_dir(&dir)
        .with_context(|| format!("the bench's directory {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

impl Drop for Run {
    fn drop(&mut self) {
        drop(self.analytic.take());
        let peer = self.peer.take();
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signalling our own child; it restores everything it changed.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _exit_status_logged_by_daemon = d.wait();
        }
        // Only those still running: a reaped child's pid may belong to someone else now.
        for c in &mut self.graceful {
            if matches!(c.try_wait(), Ok(None)) {
                // SAFETY: signalling our own running child.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        for c in &mut self.graceful {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _already_gone = c.kill();
            let _reaped = c.wait();
        }
        // A compile load's make and gcc first: orphaned, they would keep running and
        // keep the bench's cgroup busy. One walk of /proc for all children.
        let roots: Vec<u32> = self.children.iter().map(|c| c.id()).collect();
        for pid in descendants(&roots) {
            // SAFETY: processes our own children started, ended with the run.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for c in &mut self.children {
            let _already_gone = c.kill();
            let _reaped = c.wait();
        }
        for (cg, group) in self.reset_idle.drain(..) {
            if let Err(e) = cg.set_idle(&group, false) {
                if cg.exists(&group) {
                    eprintln!("warning: {group} left idle: {e}");
                }
            }
        }
        self.quota_resets.clear();
        for (cg, group) in self.cgroups.drain(..) {
            // Killed compilers leave the group only once they are reaped (by init,
            // their parent gone): until then removal fails as busy.
            let mut result = cg.remove(&group);
            let t = Instant::now();
            while result.is_err() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
                result = cg.remove(&group);
            }
            if let Err(e) = result {
                tracing::warn!(error = %e, "could not remove the bench's cgroup {group}");
            }
        }
        // After the run's processes are gone: the peer's cgroups are empty by then.
        if let Some(p) = peer {
            let name = p.peer.name();
            for failed in p.stop_and_restore() {
                tracing::warn!("could not put back what {name} changed: {failed}");
            }
        }
        if let Some(dir) = self.tmp.take() {
            // APPEASE_BENCH_KEEP=1 keeps the daemon's log and config for a look.
            if std::env::var_os("APPEASE_BENCH_KEEP").is_none() {
                let _best_effort = std::fs::remove_dir_all(dir);
            } else {
                eprintln!("    kept {}", dir.display());
            }
        }
    }
}

pub(crate) fn spawn_worker(appease: &Path, args: &[&str]) -> Result<Child> {
    worker_command(appease, args, Stdio::inherit())
}

fn worker_command(appease: &Path, args: &[&str], stderr: Stdio) -> Result<Child> {
    Command::new(appease)
        .arg("bench-worker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {} bench-worker", appease.display()))
}

/// Starts `appease bench-worker ARGS` (a server) and returns the line where it says it
/// listens, which it prints once it accepts connections.
pub(crate) fn spawn_server(run: &mut Run, opts: &Options, args: &[&str]) -> Result<String> {
    let mut server = worker_command(&opts.appease, args, Stdio::piped())?;
    let mut line = String::new();
    let read = BufReader::new(server.stdout.as_mut().expect("piped")).read_line(&mut line);
    let mut stderr = server.stderr.take().expect("piped");
    run.children.push(server);
    if read.is_err() || line.is_empty() {
        // It closed its stdout by exiting: its own last words say why.
        let mut said = String::new();
        drop(stderr.read_to_string(&mut said));
        let why = said.lines().last().unwrap_or("it exited without a message");
        bail!(
            "the server `{}` did not start: {}",
            args.join(" "),
            why.trim_start_matches("appease: error: ")
        );
    }
    // Anything it says later goes where ours goes.
    std::thread::spawn(move || drop(std::io::copy(&mut stderr, &mut std::io::stderr())));
    Ok(line.trim().to_string())
}

/// Starts `appease daemon` for a run (ended with the run) and waits until it reports
/// itself running. Its config is `text`, else the one `--config` names, else the
/// embedded default.
pub(crate) fn start_daemon(run: &mut Run, opts: &Options, text: Option<String>) -> Result<()> {
    let tmp = run.tmp()?;
    let text = match (text, &opts.config) {
        (Some(text), _) => text,
        (None, Some(path)) => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        (None, None) => String::new(),
    };
    let cfg = tmp.join("daemon.toml");
    std::fs::write(&cfg, text)?;
    let run_dir = tmp.join("run");
    let log = std::fs::File::create(tmp.join("daemon.log"))?;
    let child = Command::new(&opts.appease)
        .args(["daemon", "--log", "debug", "--config"])
        .arg(cfg)
        .env("APPEASE_RUN_DIR", &run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting appease daemon")?;
    let pid = child.id();
    run.daemon = Some(child);
    // Up once its control socket answers with its state.
    wait_until(Duration::from_secs(10), || {
        Command::new(&opts.appease)
            .args(["status", "--json"])
            .env("APPEASE_RUN_DIR", &run_dir)
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| {
                o.status.success()
                    && String::from_utf8_lossy(&o.stdout).contains(&format!("\"pid\": {pid},"))
            })
    })
    .with_context(|| {
        format!(
            "the daemon did not start; see {}",
            tmp.join("daemon.log").display()
        )
    })
}

/// Our own children (the soakers) to SCHED_IDLE; they end with the run.
pub(crate) fn make_sched_idle(pids: &[u32]) -> Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    for &pid in pids {
        // SAFETY: our own children, ended with the run.
        if unsafe { libc::sched_setscheduler(pid as i32, libc::SCHED_IDLE, &param) } != 0 {
            bail!("SCHED_IDLE for {pid}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A top-level group of the bench's, `appease-bench-PID.SUFFIX`, removed with the run.
pub(crate) fn bench_top_group(
    run: &mut Run,
    suffix: &str,
    idle: bool,
) -> Result<(appease_cgroup::Cgroups, String)> {
    let cg = appease_cgroup::Cgroups::detect()?;
    let name = format!("appease-bench-{}.{suffix}", std::process::id());
    let group = cg.ensure_top_group(&name, idle, 100)?;
    run.cgroups.push((cg.clone(), group.clone()));
    Ok((cg, group))
}

/// Our own children into a top-level idle group of the bench's, removed with the run.
pub(crate) fn into_idle_group(run: &mut Run, pids: &[u32]) -> Result<()> {
    let (cg, group) = bench_top_group(run, "idle", true)?;
    move_all(&cg, &group, pids)
}

/// Our own children into a top-level group of the smallest weight the kernel takes (not
/// idle), removed with the run.
pub(crate) fn into_low_group(run: &mut Run, pids: &[u32]) -> Result<()> {
    let (cg, group) = bench_top_group(run, "low", false)?;
    cg.set_weight(&group, appease_cgroup::LEAST_WEIGHT)?;
    move_all(&cg, &group, pids)
}

fn move_all(cg: &appease_cgroup::Cgroups, group: &str, pids: &[u32]) -> Result<()> {
    for &pid in pids {
        cg.move_process(pid, group)?;
    }
    Ok(())
}

pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("timed out after {timeout:?}")
}
