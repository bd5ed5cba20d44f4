//! The end-to-end tests' harness: daemons under test, servers and their clients,
//! soakers and scripts with the guards that end them, /proc readers, bench and VM
//! helpers. Everything started here is ended by its pid.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

mod bench;
mod daemon;
mod processes;
mod procfs;
mod servers;
mod vm;

pub(crate) use bench::*;
pub(crate) use daemon::*;
pub(crate) use processes::*;
pub(crate) use procfs::*;
pub(crate) use servers::*;
pub(crate) use vm::*;

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time, as root: run without root, a test fails here saying so, never
/// passes silently.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (BPF, priorities, cgroups); run it as root (make test does)"
    );
    one_at_a_time()
}

/// A test's own time, from its turn to its end (pass or panic), appended to
/// `e2e-times.tsv` in cargo's scratch directory for tests: where the run's time goes
/// (`sort -rn target/tmp/e2e-times.tsv`). libtest's own timing would count the wait for
/// the turn as well.
pub(crate) struct Timed {
    name: &'static str,
    start: Instant,
}

impl Timed {
    pub(crate) fn new(name: &'static str) -> Timed {
        Timed {
            name,
            start: Instant::now(),
        }
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        use std::io::Write;
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-times.tsv");
        let line = format!("{:.1}\t{}\n", self.start.elapsed().as_secs_f64(), self.name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        let _best_effort = file.and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// One test at a time, without root: a test that needs none but keeps the CPUs busy
/// (fuzzing, the simulator) must not run beside one that measures the load or a latency.
pub(crate) fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}
