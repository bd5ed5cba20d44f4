//! What the daemon reads from /proc fed damaged text: a value or none, never a panic.

use appease_daemon::host;
use appease_fuzz::{fuzz, seed_from, text};

#[test]
fn the_proc_parsers_never_panic_on_damaged_proc_text() {
    fuzz("/proc/PID/stat (scan)", seed_from("/proc/self/stat"), |b| {
        let _ = host::parse_proc_stat(&text(b), 10_000_000);
    });
    fuzz("/proc/pressure/cpu", seed_from("/proc/pressure/cpu"), |b| {
        let _ = host::parse_psi_some_total(&text(b));
    });
    fuzz("/proc/loadavg", seed_from("/proc/loadavg"), |b| {
        let _ = host::parse_loadavg_running(&text(b));
    });
}
