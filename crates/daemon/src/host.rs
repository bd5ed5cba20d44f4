//! Readings of the host: CPU count, runnable tasks, CPU pressure, privileges.

use std::fs;

/// Online CPUs.
pub fn cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// Runnable tasks right now, not counting the caller (which is running while it reads).
pub fn runnable() -> Option<u32> {
    parse_loadavg_running(&fs::read_to_string("/proc/loadavg").ok()?)
}

pub fn parse_loadavg_running(text: &str) -> Option<u32> {
    let field = text.split_whitespace().nth(3)?;
    let running: u32 = field.split('/').next()?.parse().ok()?;
    Some(running.saturating_sub(1))
}

/// Cumulative µs during which some task waited for a CPU (None without PSI).
pub fn psi_cpu_some_total_us() -> Option<u64> {
    parse_psi_some_total(&fs::read_to_string("/proc/pressure/cpu").ok()?)
}

pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("total="))?
        .parse()
        .ok()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Raises the soft open-file limit to the hard one: one pidfd per managed thread.
pub fn raise_nofile_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                tracing::debug!("could not raise RLIMIT_NOFILE");
            }
        }
    }
}

/// The daemon runs at nice -20: its work is tiny, and a decision delayed by the very
/// load it manages would come too late to help a request.
pub fn prioritize_self() {
    // SAFETY: plain syscall on the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not raise the daemon's own priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_formats() {
        assert_eq!(
            parse_loadavg_running("0.52 0.30 0.10 5/312 4242\n"),
            Some(4)
        );
        assert_eq!(parse_loadavg_running("garbage"), None);
        let psi = "some avg10=2.01 avg60=1.89 avg300=0.55 total=2048070\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi_some_total(psi), Some(2_048_070));
        assert!(runnable().is_some());
        assert!(cpus() >= 1);
    }
}
