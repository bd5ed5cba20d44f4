//! One daemon (or one `appease restore`) at a time per run directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

const FILE: &str = "daemon.lock";

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
        let path = dir.join(FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: valid fd owned by `file`.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _best_effort = file.read_to_string(&mut pid);
                bail!(
                    "an appease daemon is already running (pid {}, lock {})",
                    pid.trim(),
                    path.display()
                );
            }
            return Err(err).with_context(|| format!("locking {}", path.display()));
        }
        file.set_len(0)?;
        file.rewind()?;
        write!(file, "{}", std::process::id())?;
        Ok(RunLock { _file: file })
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
