//! /proc/PID/stat (and /proc/PID/task/TID/stat): the one parser of every field appease
//! reads there, and the clock tick its times are counted in. The text is read as bytes:
//! a process names itself what it likes (non-UTF-8 included), and such a name must not
//! make its process look gone.

use std::path::Path;

/// The kernel's flag for a kernel thread (`PF_KTHREAD`, include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// The fields of a stat line appease uses (proc_pid_stat(5)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub comm: String,
    pub ppid: u32,
    /// The session's id (its leader's pid).
    pub session: u32,
    /// The controlling terminal (0: none).
    pub tty_nr: i64,
    pub flags: u64,
    /// utime + stime + cutime + cstime: this process's CPU time and its reaped
    /// children's, in clock ticks.
    pub cpu_ticks: u64,
    /// utime + stime: this task's own CPU time (a thread's, from its task stat), in
    /// clock ticks.
    pub run_ticks: u64,
    pub nice: i32,
    /// Start time in clock ticks after boot: with the PID, the process's identity.
    pub start: u64,
    pub policy: u32,
}

impl ProcStat {
    /// Parses a stat line (its name escaped as [`crate::names::escaped`]).
    pub fn parse(text: impl AsRef<[u8]>) -> Option<Self> {
        let text = text.as_ref();
        let open = text.iter().position(|&b| b == b'(')?;
        let pid = std::str::from_utf8(&text[..open])
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let (comm, f) = stat_fields(text)?;
        // f[0] is field 3 (state).
        let field = |n: usize| f.get(n - 3).copied();
        let num = |n: usize| field(n)?.parse::<u64>().ok();
        Some(ProcStat {
            pid,
            comm,
            ppid: field(4)?.parse().ok()?,
            session: field(6)?.parse().ok()?,
            tty_nr: field(7)?.parse().ok()?,
            flags: num(9)?,
            // Damaged text may hold numbers whose sum overflows: not a stat line.
            cpu_ticks: [15, 16, 17]
                .into_iter()
                .try_fold(num(14)?, |sum, n| sum.checked_add(num(n)?))?,
            run_ticks: num(14)?.checked_add(num(15)?)?,
            nice: field(19)?.parse().ok()?,
            start: num(22)?,
            policy: field(41)?.parse().ok()?,
        })
    }

    pub fn kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// The command name (escaped) and the fields after it, from /proc/PID/stat bytes. The
/// name may hold any byte but NUL, spaces and parentheses included: it ends at the last
/// ')'; what follows is numbers and a state letter.
pub fn stat_fields(text: &[u8]) -> Option<(String, Vec<&str>)> {
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let comm = crate::names::escaped(text.get(open + 1..close)?);
    let rest = std::str::from_utf8(text.get(close + 1..)?).ok()?;
    Some((comm, rest.split_whitespace().collect()))
}

/// The parent pid from /proc/PID/stat bytes (field 4).
pub fn stat_ppid(text: &[u8]) -> Option<u32> {
    stat_fields(text)?.1.get(1)?.parse().ok()
}

/// The value of one `Key:` line of /proc/PID/status bytes (the `Name:` line may hold any
/// byte; the others are text).
pub fn status_value<'a>(text: &'a [u8], key: &str) -> Option<&'a str> {
    text.split(|&b| b == b'\n').find_map(|line| {
        let rest = line.strip_prefix(key.as_bytes())?.strip_prefix(b":")?;
        std::str::from_utf8(rest).ok()
    })
}

/// The real uid from /proc/PID/status bytes ("Uid:\treal\teffective\tsaved\tfs"): who
/// started the process, whatever setuid made it.
pub fn status_real_uid(text: &[u8]) -> Option<u32> {
    status_value(text, "Uid")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A process's resident memory (`VmRSS`), KiB; None once it is gone.
pub fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read(format!("/proc/{pid}/status")).ok()?;
    status_value(&status, "VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Reads and parses a stat file (`/proc/PID/stat`, `/proc/PID/task/TID/stat`).
pub fn read_stat(path: impl AsRef<Path>) -> Option<ProcStat> {
    ProcStat::parse(std::fs::read(path).ok()?)
}

/// A process's parent, from its stat file.
pub fn read_ppid(pid: u32) -> Option<u32> {
    stat_ppid(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// How long one clock tick of /proc's times is on this host (USER_HZ), ns.
pub fn clock_tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    1_000_000_000 / hz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_for_a_live_process_and_none_for_a_gone_one() {
        let own = resident_kib(std::process::id()).unwrap();
        assert!(own > 100, "{own} KiB");
        // Above the largest pid_max Linux allows (2^22).
        assert_eq!(resident_kib(5_000_000), None);
    }

    #[test]
    fn stat_fields_survive_a_command_name_with_spaces_and_parentheses() {
        let text = b"4242 (a (b) c) S 17 4242 4242 0 -1";
        let (comm, f) = stat_fields(text).unwrap();
        assert_eq!(comm, "a (b) c");
        assert_eq!(f[0], "S");
        assert_eq!(stat_ppid(text), Some(17));
        assert_eq!(stat_fields(b"garbage"), None);
    }

    #[test]
    fn a_whole_line_gives_every_field_and_a_kernel_thread_is_known_by_its_flag() {
        let line = "7 (kworker/0:1 (x)) I 2 0 0 0 -1 69238880 0 0 0 0 3 4 5 6 20 0 1 0 \
                    98765 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 0 0 5 \
                    0 0 0";
        let s = ProcStat::parse(line).unwrap();
        assert_eq!((s.pid, s.comm.as_str(), s.ppid), (7, "kworker/0:1 (x)", 2));
        assert_eq!((s.cpu_ticks, s.nice, s.start, s.policy), (18, 0, 98765, 5));
        assert!(s.kernel_thread(), "69238880 has PF_KTHREAD");
        assert_eq!(s.tty_nr, 0);
        assert_eq!(ProcStat::parse(&line[..40]), None, "a cut line is no stat");
    }

    #[test]
    fn a_name_that_is_not_utf8_or_holds_escapes_is_a_process_like_any_other() {
        let line = b"9 (\xff\x1b[2J\n) R 1 9 9 0 -1 4194560 0 0 0 0 3 4 5 6 20 0 1 0 \
                     777 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 0 0 0 \
                     0 0 0";
        let s = ProcStat::parse(line).unwrap();
        assert_eq!((s.pid, s.ppid, s.start), (9, 1, 777));
        assert_eq!(s.comm, "\\xff\\x1b[2J\\x0a");
    }

    #[test]
    fn the_clock_tick_is_the_hosts() {
        assert_eq!(clock_tick_ns(), 10_000_000, "USER_HZ is 100 on Linux");
    }
}
