//! BPF probe: reports requests (socket receives returning data), forks, execs and exits.
//!
//! The kernel side filters to one request event per thread per quiet period
//! (`min_gap`), so a busy server costs the daemon a few events a second per thread.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, RingBuffer, RingBufferBuilder};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/probe.skel.rs"));
}
use skel::types::appease_event as RawEvent;
use skel::{ProbeSkel, ProbeSkelBuilder};

/// Storage the loaded BPF object lives in; the caller owns it so the probe can borrow it.
pub type ProbeStorage = MaybeUninit<libbpf_rs::OpenObject>;

const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the kernel exposes no BTF ({KERNEL_BTF} is missing): appease needs a kernel built with CONFIG_DEBUG_INFO_BTF")]
    NoBtf,
    #[error("could not {stage} the BPF probe: {source} (appease needs root, or CAP_BPF and CAP_PERFMON, and a kernel with BPF tracepoints and task storage)")]
    Bpf {
        stage: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
}

/// Socket family of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Unix,
    Inet,
    Inet6,
    Other(u16),
}

impl Family {
    pub fn from_raw(af: u32) -> Self {
        match af as i32 {
            libc::AF_UNIX => Family::Unix,
            libc::AF_INET => Family::Inet,
            libc::AF_INET6 => Family::Inet6,
            other => Family::Other(other as u16),
        }
    }

    /// Local customers (UNIX sockets) are told apart from network ones.
    pub fn is_local(self) -> bool {
        self == Family::Unix
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Request {
        ts_ns: u64,
        cpu_ns: u64,
        pid: u32,
        tid: u32,
        family: Family,
        bytes: u32,
        /// Delivered at once (first request after a quiet spell) rather than at the
        /// reader's next poll (a thread already busy with requests).
        woke: bool,
        comm: String,
    },
    Fork {
        ts_ns: u64,
        pid: u32,
        ppid: u32,
        comm: String,
    },
    Exec {
        ts_ns: u64,
        pid: u32,
        comm: String,
    },
    Exit {
        ts_ns: u64,
        pid: u32,
        tid: u32,
    },
}

/// Kernel-side counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Socket receives that returned data.
    pub socket_reads: u64,
    /// Of those, reported as request events (the rest fell within `min_gap`).
    pub requests: u64,
    /// Events dropped because the ring buffer was full.
    pub lost: u64,
}

#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// At most one request event per thread per this period. The first request after
    /// twice this much quiet wakes the reader at once; later ones wait for its next poll.
    pub min_gap: Duration,
    /// Requests received by this process are not reported (the daemon's own sockets).
    pub ignore_pid: Option<u32>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            min_gap: Duration::from_millis(20),
            ignore_pid: Some(std::process::id()),
        }
    }
}

pub struct Probe<'obj> {
    skel: ProbeSkel<'obj>,
    ring: RingBuffer<'obj>,
    queue: Rc<RefCell<VecDeque<Event>>>,
}

impl<'obj> Probe<'obj> {
    /// Loads and attaches the BPF programs. Nothing is attached on error.
    pub fn load(cfg: &ProbeConfig, storage: &'obj mut ProbeStorage) -> Result<Self, ProbeError> {
        if !Path::new(KERNEL_BTF).exists() {
            return Err(ProbeError::NoBtf);
        }
        route_libbpf_logs();
        let bpf = |stage| move |source| ProbeError::Bpf { stage, source };
        let mut open = ProbeSkelBuilder::default()
            .open(storage)
            .map_err(bpf("open"))?;
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("probe has rodata");
        rodata.min_gap_ns = cfg.min_gap.as_nanos().min(u64::MAX as u128) as u64;
        rodata.wake_after_ns = 2 * rodata.min_gap_ns;
        rodata.self_tgid = cfg.ignore_pid.unwrap_or(0);
        let mut skel = open.load().map_err(bpf("load"))?;
        skel.attach().map_err(bpf("attach"))?;

        let queue = Rc::new(RefCell::new(VecDeque::new()));
        let sink = Rc::clone(&queue);
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&skel.maps.events, move |data: &[u8]| {
                if let Some(ev) = decode(data) {
                    sink.borrow_mut().push_back(ev);
                }
                0
            })
            .map_err(bpf("set up the ring buffer of"))?;
        let ring = builder.build().map_err(bpf("set up the ring buffer of"))?;
        Ok(Probe { skel, ring, queue })
    }

    /// Waits up to `timeout` for events and hands each to `f`.
    pub fn poll(&mut self, timeout: Duration, mut f: impl FnMut(Event)) -> Result<(), ProbeError> {
        match self.ring.poll(timeout) {
            Ok(()) => {}
            // A signal woke us: the caller checks its flags and polls again.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(ProbeError::Bpf {
                    stage: "poll",
                    source,
                })
            }
        }
        // Events submitted without a wakeup are not reported by epoll: drain them too.
        self.ring.consume().map_err(|source| ProbeError::Bpf {
            stage: "consume the events of",
            source,
        })?;
        let mut q = self.queue.borrow_mut();
        while let Some(ev) = q.pop_front() {
            f(ev);
        }
        Ok(())
    }

    /// The ring buffer's epoll fd, for callers that multiplex.
    pub fn epoll_fd(&self) -> i32 {
        self.ring.epoll_fd()
    }

    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for (idx, slot) in [
            (0u32, &mut c.socket_reads),
            (1, &mut c.requests),
            (2, &mut c.lost),
        ] {
            if let Ok(Some(per_cpu)) = self
                .skel
                .maps
                .counters
                .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
            {
                *slot = per_cpu
                    .iter()
                    .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                    .sum();
            }
        }
        c
    }
}

fn comm(raw: &[i8; 16]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn decode(data: &[u8]) -> Option<Event> {
    let mut raw = RawEvent::default();
    plain::copy_from_bytes(&mut raw, data).ok()?;
    let ev = match raw.kind {
        1 => Event::Request {
            ts_ns: raw.ts_ns,
            cpu_ns: raw.cpu_ns,
            pid: raw.pid,
            tid: raw.tid,
            family: Family::from_raw(raw.family),
            bytes: raw.bytes.max(0) as u32,
            woke: raw.woke != 0,
            comm: comm(&raw.comm),
        },
        2 => Event::Fork {
            ts_ns: raw.ts_ns,
            pid: raw.pid,
            ppid: raw.ppid,
            comm: comm(&raw.comm),
        },
        3 => Event::Exec {
            ts_ns: raw.ts_ns,
            pid: raw.pid,
            comm: comm(&raw.comm),
        },
        4 => Event::Exit {
            ts_ns: raw.ts_ns,
            pid: raw.pid,
            tid: raw.tid,
        },
        _ => return None,
    };
    Some(ev)
}

// SAFETY: the event struct is plain old data generated from the program's BTF.
unsafe impl plain::Plain for RawEvent {}

/// libbpf's own messages go through `tracing` instead of straight to stderr.
fn route_libbpf_logs() {
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, |level, msg| {
        let msg = msg.trim_end();
        match level {
            libbpf_rs::PrintLevel::Warn => tracing::warn!(target: "libbpf", "{msg}"),
            libbpf_rs::PrintLevel::Info => tracing::debug!(target: "libbpf", "{msg}"),
            libbpf_rs::PrintLevel::Debug => tracing::trace!(target: "libbpf", "{msg}"),
        }
    })));
}

/// Monotonic clock in ns, the same clock as the events' `ts_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
