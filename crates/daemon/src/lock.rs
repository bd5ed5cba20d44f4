//! One daemon (or one `appease restore`) at a time per run directory, and one daemon per
//! idle group whatever its run directory: two daemons sharing `/appease.batch` would each
//! move out, on exit, what the other had demoted. The locks are files only root can open
//! (mode 0600, in directories only root can write, never through a link): no other user
//! can hold one to keep appease from starting or restoring.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appease_actuator::private::{self, Access};

const FILE: &str = "daemon.lock";
/// The idle groups' locks: under /run, which only root may write (not /run/lock, which
/// anyone may).
const GROUP_LOCKS_PARENT: &str = "/run/appease";
const GROUP_LOCKS: &str = "/run/appease/groups";
/// The kernel's flag of a task on its way out (`PF_EXITING`, include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// Held for the daemon's lifetime; the file stays (removing it would race a new holder).
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes the lock, or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let dir = private::private_dir(dir)
            .with_context(|| format!("the run directory {}", dir.display()))?;
        let file = lock_file(&dir.join(FILE), "an appease daemon is already running")?;
        Ok(RunLock { _file: file })
    }

    /// Takes the lock, waiting up to `patience` for a holder that is exiting (a daemon
    /// killed a moment ago still detaches its probe); returns how long it waited. A
    /// holder that is not exiting is reported at once.
    pub fn acquire_after_exit(dir: &Path, patience: Duration) -> Result<(Self, Duration)> {
        let start = Instant::now();
        loop {
            match Self::acquire(dir) {
                Ok(lock) => return Ok((lock, start.elapsed())),
                Err(e) => {
                    // No pid to read: the holder let go meanwhile, or has not written it
                    // yet; either way, worth another try.
                    let exiting = Self::holder(dir).is_none_or(exiting);
                    if !exiting || start.elapsed() >= patience {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Takes the lock on the idle group `name` (its top-level name in the CPU hierarchy),
    /// held in `/run/appease/groups`, or says which daemon holds it.
    pub fn acquire_group(name: &str) -> Result<Self> {
        let mut dir = std::path::PathBuf::new();
        for d in [GROUP_LOCKS_PARENT, GROUP_LOCKS] {
            dir = private::private_dir(Path::new(d))
                .with_context(|| format!("the idle groups' lock directory {d}"))?;
        }
        let path = dir.join(format!("{}.lock", name.replace('/', "%")));
        let what = format!("another appease daemon uses the idle group /{name} (set [batch] group to another name to run a second one)");
        Ok(RunLock {
            _file: lock_file(&path, &what)?,
        })
    }

    /// The pid of the daemon holding the lock, if one does.
    pub fn holder(dir: &Path) -> Option<u32> {
        match state(&dir.join(FILE)) {
            Lock::Held(pid) => pid,
            Lock::Free => None,
        }
    }

    /// The daemons acting on this host, as (idle group, pid if written yet): each holds
    /// its idle group's lock (a dry run, which changes nothing, holds none). A holder on
    /// its way out is waited for up to `patience`.
    pub fn acting_daemons(patience: Duration) -> Vec<(String, Option<u32>)> {
        let start = Instant::now();
        loop {
            let held = group_lock_holders();
            let settled = held.iter().all(|(_, pid)| pid.is_some_and(|p| !exiting(p)));
            if settled || start.elapsed() >= patience {
                return held;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[derive(Debug, PartialEq)]
enum Lock {
    Free,
    /// By the pid written in it, unless its holder has not written it yet.
    Held(Option<u32>),
}

/// Whether the lock file at `path` is held (a missing file is a free lock).
fn state(path: &Path) -> Lock {
    let Ok(mut file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return Lock::Free;
    };
    // SAFETY: valid fd owned by `file`.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        return Lock::Free;
    }
    let mut pid = String::new();
    let _unwritten_yet = file.read_to_string(&mut pid);
    Lock::Held(pid.trim().parse().ok())
}

/// The held locks of `GROUP_LOCKS`, as (idle group, holder's pid).
fn group_lock_holders() -> Vec<(String, Option<u32>)> {
    let Ok(entries) = std::fs::read_dir(GROUP_LOCKS) else {
        return Vec::new();
    };
    let mut held: Vec<_> = entries
        .flatten()
        .filter_map(|e| {
            let name = e
                .file_name()
                .to_str()?
                .strip_suffix(".lock")?
                .replace('%', "/");
            match state(&e.path()) {
                Lock::Held(pid) => Some((name, pid)),
                Lock::Free => None,
            }
        })
        .collect();
    held.sort();
    held
}

/// Whether process `pid` is on its way out (or gone already).
fn exiting(pid: u32) -> bool {
    appease_cgroup::read_stat(format!("/proc/{pid}/stat")).is_none_or(|s| s.flags & PF_EXITING != 0)
}

/// Opens `path` (private: see `appease_actuator::private`) and takes an exclusive lock on
/// it, writing our pid into it; or fails with `busy` and the holder's pid.
fn lock_file(path: &Path, busy: &str) -> Result<File> {
    let mut file = private::open_private(path, Access::ReadWrite)
        .with_context(|| format!("opening the lock {}", path.display()))?;
    // A few tries: `state` (another process asking whether a daemon runs) holds a shared
    // lock on a free file for a moment, and must not keep a daemon from starting.
    let mut tries = 0;
    // SAFETY: valid fd owned by `file`.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
        tries += 1;
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) && tries < 10 {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut pid = String::new();
            let _best_effort = file.read_to_string(&mut pid);
            bail!("{busy} (pid {}, lock {})", pid.trim(), path.display());
        }
        return Err(err).with_context(|| format!("locking {}", path.display()));
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_and_a_gone_one_is_not_waited_for() {
        let dir = std::env::temp_dir().join(format!("appease-lock-{}", std::process::id()));
        let _fresh = std::fs::remove_dir_all(&dir);
        let first = RunLock::acquire(&dir).unwrap();
        assert_eq!(RunLock::holder(&dir), Some(std::process::id()));
        let e = RunLock::acquire(&dir).err().unwrap().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        // This process is not exiting: reported at once, not after the patience.
        let t = Instant::now();
        assert!(RunLock::acquire_after_exit(&dir, Duration::from_secs(5)).is_err());
        assert!(t.elapsed() < Duration::from_secs(2));
        drop(first);
        let (_again, waited) = RunLock::acquire_after_exit(&dir, Duration::from_secs(5)).unwrap();
        assert!(waited < Duration::from_secs(1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_lock_is_held_while_its_file_is_locked_and_free_once_let_go_or_missing() {
        let dir = std::env::temp_dir().join(format!("appease-lock-state-{}", std::process::id()));
        let _fresh = std::fs::remove_dir_all(&dir);
        let path = private::private_dir(&dir).unwrap().join("g.lock");
        assert_eq!(state(&path), Lock::Free, "missing");
        let held = lock_file(&path, "busy").unwrap();
        assert_eq!(state(&path), Lock::Held(Some(std::process::id())));
        drop(held);
        assert_eq!(state(&path), Lock::Free, "let go: the file stays");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
