//! The watched threads' CPU times at each tick. With hundreds of busy connections each
//! tick asked for hundreds of threads, and a read of each one's schedstat file (a system
//! call and the kernel's formatting of the file) was the daemon's largest cost after the
//! events themselves. The probe reads them all in the kernel in one call before the tick;
//! a thread the tick asks for beyond those, or every thread on a kernel that cannot run the
//! probe's reader, is read through its file as before.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use appease_actuator::sys::ThreadCpu;
use appease_actuator::{ThreadLookup, ThreadNow};
use appease_config::Config;
use appease_probe::{Probe, ThreadCpuTime};

use crate::probe_settings::held_gap;

type Thread = (u32, u32);

/// A thread's CPU time, and the time and CPU time of its latest request (0: none seen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Times {
    cpu_ns: u64,
    request_ns: u64,
    request_cpu_ns: u64,
}

#[derive(Default)]
pub struct ThreadTimes {
    /// This tick's answers, read ahead, or None once the thread is gone.
    ahead: HashMap<Thread, Option<Times>>,
    /// Each thread's start as first read, and when it was last read: an answer with
    /// another start is of a thread that took the ID since, and reads as gone.
    starts: HashMap<Thread, (u64, Instant)>,
    /// Through files, for the rest.
    files: ThreadCpu,
    /// The kernel refused the probe's reader once: files only from then on.
    refused: bool,
    /// Whether the reader ran when the probe was last given its held gap (None: none
    /// given since start or the last reload).
    held_gap_read: Option<bool>,
}

impl ThreadTimes {
    /// Reads the CPU times of `threads` (pid, tid) ahead of a tick, in one call.
    pub fn read_ahead(&mut self, probe: &mut Probe, threads: &[Thread]) {
        self.ahead.clear();
        if self.refused || threads.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut answers = Vec::with_capacity(threads.len());
        let read = probe.threads_cpu(
            &threads.iter().map(|&(_, tid)| tid).collect::<Vec<_>>(),
            |_, answer| answers.push(answer),
        );
        if let Err(e) = read {
            tracing::info!(error = %e, "threads' CPU times are read from /proc");
            self.refused = true;
            return;
        }
        for (&thread, answer) in threads.iter().zip(answers) {
            let cpu = self.checked(thread, answer, now);
            self.ahead.insert(thread, cpu);
        }
    }

    /// A thread's CPU time as the kernel answered it, if that is still the thread first
    /// read under its ID in its process.
    fn checked(
        &mut self,
        thread: Thread,
        answer: Option<ThreadCpuTime>,
        now: Instant,
    ) -> Option<Times> {
        let Some(a) = answer.filter(|a| a.pid == thread.0) else {
            self.starts.remove(&thread);
            return None;
        };
        let (start, used) = self.starts.entry(thread).or_insert((a.start_boot_ns, now));
        *used = now;
        if *start != a.start_boot_ns {
            // The watched thread is gone; should the new one be watched, it is read anew.
            self.starts.remove(&thread);
            return None;
        }
        Some(Times {
            cpu_ns: a.cpu_ns,
            request_ns: a.request_ns,
            request_cpu_ns: a.request_cpu_ns,
        })
    }

    /// The thread's CPU time: read ahead this tick, or read now.
    pub fn get(&mut self, pid: u32, tid: u32) -> Option<u64> {
        match self.ahead.get(&(pid, tid)) {
            Some(&answer) => answer.map(|t| t.cpu_ns),
            None => self.files.read(pid, tid),
        }
    }

    /// The threads read ahead this tick with the time and CPU time of their latest
    /// request (requests of a held thread are not all reported).
    pub fn latest_requests(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        self.ahead
            .iter()
            .filter_map(|(&(_, tid), answer)| match answer {
                Some(t) if t.request_ns > 0 => Some((tid, t.request_ns, t.request_cpu_ns)),
                _ => None,
            })
    }

    /// Gives the probe the held gap for `cfg`: long while the kernel runs the probe's
    /// reader (a held thread's latest request is read at the ticks), short once it refused
    /// it. At start, one read of this thread says which.
    pub fn sync_held_gap(&mut self, probe: &mut Probe, cfg: &Config) {
        // Once given, the gap changes only with a reload or a refusal: ticks pass here.
        if self.held_gap_read == Some(!self.refused) {
            return;
        }
        if self.held_gap_read.is_none() && !self.refused {
            let me = std::process::id();
            if let Err(e) = probe.threads_cpu(&[me], |_, _| {}) {
                tracing::info!(error = %e, "threads' CPU times are read from /proc");
                self.refused = true;
            }
        }
        probe.set_held_gap(held_gap(cfg, !self.refused));
        self.held_gap_read = Some(!self.refused);
    }

    /// A reload: the next tick gives the probe the held gap of the new config.
    pub fn config_changed(&mut self) {
        self.held_gap_read = None;
    }

    /// The probe as the actuator's check of a thread it first takes charge of (one call
    /// in the kernel instead of the thread's stat file), while the kernel runs the reader.
    pub fn lookup<'a, 'p>(
        &'a mut self,
        probe: &'a mut Probe<'p>,
        clock_tick_ns: u64,
    ) -> Lookup<'a, 'p> {
        Lookup {
            probe,
            clock_tick_ns,
            refused: &mut self.refused,
        }
    }

    /// Forgets what belongs to threads not read for `idle` (no longer watched).
    pub fn forget_unread(&mut self, idle: Duration) {
        self.starts.retain(|_, (_, used)| used.elapsed() < idle);
        self.files.close_unread(idle);
    }
}

pub struct Lookup<'a, 'p> {
    probe: &'a mut Probe<'p>,
    clock_tick_ns: u64,
    refused: &'a mut bool,
}

impl ThreadLookup for Lookup<'_, '_> {
    fn thread_now(&mut self, tid: u32) -> Option<Option<ThreadNow>> {
        if *self.refused {
            return None;
        }
        let mut answer = None;
        if let Err(e) = self.probe.threads_cpu(&[tid], |_, a| answer = a) {
            tracing::info!(error = %e, "threads are read from /proc");
            *self.refused = true;
            return None;
        }
        Some(answer.map(|a| ThreadNow {
            pid: a.pid,
            start: a.start_boot_ns / self.clock_tick_ns,
            kernel_thread: a.kernel_thread,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(pid: u32, start_boot_ns: u64, cpu_ns: u64) -> Option<ThreadCpuTime> {
        Some(ThreadCpuTime {
            pid,
            start_boot_ns,
            cpu_ns,
            request_cpu_ns: 1,
            request_ns: 2,
            kernel_thread: false,
        })
    }

    fn times(cpu_ns: u64) -> Option<Times> {
        Some(Times {
            cpu_ns,
            request_ns: 2,
            request_cpu_ns: 1,
        })
    }

    #[test]
    fn a_thread_that_took_a_watched_ones_id_reads_as_that_one_gone() {
        let mut t = ThreadTimes::default();
        let now = Instant::now();
        assert_eq!(t.checked((10, 11), time(10, 500, 7), now), times(7));
        assert_eq!(t.checked((10, 11), time(10, 500, 9), now), times(9));
        // Another thread of the same process under the ID: another start.
        assert_eq!(t.checked((10, 11), time(10, 800, 1), now), None);
        // Which, watched in its turn, is read as itself.
        assert_eq!(t.checked((10, 11), time(10, 800, 2), now), times(2));
        // A thread of another process under it, or none at all.
        assert_eq!(t.checked((20, 21), time(20, 5, 3), now), times(3));
        assert_eq!(t.checked((20, 21), time(30, 5, 3), now), None);
        assert_eq!(t.checked((20, 21), None, now), None);
        assert!(!t.starts.contains_key(&(20, 21)));
    }

    #[test]
    fn a_thread_not_read_ahead_is_read_from_its_file() {
        let mut t = ThreadTimes::default();
        t.ahead.insert((1, 1), None);
        assert_eq!(t.get(1, 1), None, "the kernel's answer stands");
        // This thread, not read ahead: its schedstat file answers.
        let (pid, tid) = (std::process::id(), std::process::id());
        assert!(t.get(pid, tid).is_some_and(|ns| ns > 0));
    }
}
