//! One daemon (or one `appease restore`) at a time per run directory, and one daemon per
//! idle group whatever its run directory: two daemons sharing `/appease.batch` would each
//! move out, on exit, what the other had demoted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

const FILE: &str = "daemon.lock";
const GROUP_LOCKS: &str = "/run/lock/appease";

/// Held for the daemon's lifetime; the file stays (removing it would race a new holder).
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes the lock, or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let file = lock_file(&dir.join(FILE), "an appease daemon is already running")?;
        Ok(RunLock { _file: file })
    }

    /// Takes the lock on the idle group `name` (its top-level name in the CPU hierarchy),
    /// held in `/run/lock/appease`, or says which daemon holds it.
    pub fn acquire_group(name: &str) -> Result<Self> {
        let dir = Path::new(GROUP_LOCKS);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{}.lock", name.replace('/', "%")));
        let what = format!("another appease daemon uses the idle group /{name} (set [batch] group to another name to run a second one)");
        Ok(RunLock {
            _file: lock_file(&path, &what)?,
        })
    }

    /// The pid of the daemon holding the lock, if one does.
    pub fn holder(dir: &Path) -> Option<u32> {
        let path = dir.join(FILE);
        let file = File::open(&path).ok()?;
        // SAFETY: valid fd owned by `file`.
        let free = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
        if free {
            return None;
        }
        fs::read_to_string(&path).ok()?.trim().parse().ok()
    }
}

/// Opens `path` and takes an exclusive lock on it, writing our pid into it; or fails
/// with `busy` and the holder's pid.
fn lock_file(path: &Path, busy: &str) -> Result<File> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: valid fd owned by `file`.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
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
