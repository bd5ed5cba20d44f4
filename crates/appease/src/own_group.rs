//! A terminal's Ctrl-C signals its whole foreground process group. Every server, client and
//! daemon the bench starts would be in it and die of SIGINT mid-round, and the bench would
//! fail instead of stopping as asked and reporting what it measured. So, started from a
//! terminal, the bench runs as a child in a process group of its own (with everything it
//! starts), and the process the terminal knows passes SIGINT and SIGTERM on to that child
//! alone, and a hang-up as SIGTERM: the bench then stops the way it does for either.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Set in the child: it is the bench itself.
const CHILD: &str = "APPEASE_BENCH_OWN_GROUP";

/// Runs this same command line as a child in a process group of its own when this process
/// is in a terminal's foreground group, and returns the exit code to end with; None where
/// no terminal's Ctrl-C can reach the bench's processes (a script, CI) or in the child.
pub(crate) fn rerun_in_own_group() -> Result<Option<i32>> {
    if std::env::var_os(CHILD).is_some() {
        // A write to the terminal from a background group stops the writer under `stty
        // tostop` unless it ignores SIGTTOU; the bench's reports must get through.
        // SAFETY: setting a signal's disposition, before any thread is started.
        unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
        return Ok(None);
    }
    if !in_terminal_foreground() {
        return Ok(None);
    }
    let exe = std::env::current_exe().context("finding the appease binary")?;
    // Registered before the child starts, so that no Ctrl-C falls between the two.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing signal handlers")?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD, "1")
        .process_group(0)
        // A background group that reads the terminal is stopped: nothing of the bench's
        // reads its standard input.
        .stdin(Stdio::null())
        .spawn()
        .context("starting the bench in a process group of its own")?;
    let pid = child.id() as i32;
    let handle = signals.handle();
    let forward = std::thread::spawn(move || {
        for sig in signals.forever() {
            let to = if sig == SIGHUP { SIGTERM } else { sig };
            // SAFETY: signalling our own child, reaped only once this thread has stopped.
            unsafe { libc::kill(pid, to) };
        }
    });
    // Its end, without reaping it: its pid stays its own while a signal may be passed on.
    loop {
        // SAFETY: a zeroed siginfo_t is valid for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waiting on our own child with a valid siginfo_t.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as u32,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    handle.close();
    let _forwarder_ended = forward.join();
    let status = child.wait().context("waiting for the bench")?;
    use std::os::unix::process::ExitStatusExt;
    Ok(Some(
        status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
    ))
}

/// True when this process is in the foreground process group of its controlling terminal.
fn in_terminal_foreground() -> bool {
    let Ok(tty) = std::fs::File::open("/dev/tty") else {
        return false; // no controlling terminal
    };
    use std::os::fd::AsRawFd;
    // SAFETY: plain queries on an open descriptor and of this process.
    unsafe { libc::tcgetpgrp(tty.as_raw_fd()) == libc::getpgrp() }
}
