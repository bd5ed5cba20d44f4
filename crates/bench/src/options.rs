//! What a bench run is asked to do: the scenario, its modes and batch, and their parameters.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::{client, fetch, nested, peer, report, worker};

/// How the batch load is handled in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// No batch load at all: the reference.
    Unloaded,
    /// Batch load at nice 0, nothing managed.
    Unmanaged,
    BatchNice19,
    BatchSchedIdle,
    BatchCgroupIdle,
    /// The daemon with the 2010 paper's Table 1 ladder, nice only, no demotion.
    RbpeClassic,
    /// The daemon with its default config and no rules.
    Appease,
    /// The original Ananicy, installed, with its packaged rules (a peer daemon).
    Ananicy,
    /// system76-scheduler, installed, with its packaged configuration (a peer daemon).
    System76Scheduler,
    /// The batch in a top-level group of the smallest weight, not idle (cpu.shares = 2 on
    /// cgroup v1, cpu.weight = 1 on v2): a class between the idle class and nice 19.
    BatchCgroupLow,
    /// nested: the batch's own group (its session scope) made idle by hand.
    BatchGroupIdle,
    /// nested: the batch's branch made idle by hand where it meets the server's branch
    /// (a systemd host's `user.slice`).
    BatchBranchIdle,
}

impl Mode {
    pub const ALL: [Mode; 7] = [
        Mode::Unloaded,
        Mode::Unmanaged,
        Mode::BatchNice19,
        Mode::BatchSchedIdle,
        Mode::BatchCgroupIdle,
        Mode::RbpeClassic,
        Mode::Appease,
    ];

    /// What users run instead of appease; not among the default modes (they must be
    /// installed), asked for by name.
    pub const PEERS: [Mode; 2] = [Mode::Ananicy, Mode::System76Scheduler];

    /// Setups made by hand that only the nested scenario's shapes have.
    pub const NESTED: [Mode; 2] = [Mode::BatchGroupIdle, Mode::BatchBranchIdle];

    /// Setups by hand some scenarios try besides the default ones, asked for by name.
    pub const TRIED: [Mode; 1] = [Mode::BatchCgroupLow];

    /// The batch jobs a run of this mode gets out of `n`: none when unloaded.
    pub fn batch_jobs(self, n: usize) -> usize {
        match self {
            Mode::Unloaded => 0,
            _ => n,
        }
    }

    pub fn peer(self) -> Option<peer::Peer> {
        match self {
            Mode::Ananicy => Some(peer::Peer::Ananicy),
            Mode::System76Scheduler => Some(peer::Peer::System76Scheduler),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Ananicy => "ananicy",
            Mode::System76Scheduler => "system76-scheduler",
            Mode::Unloaded => "unloaded",
            Mode::Unmanaged => "unmanaged",
            Mode::BatchNice19 => "batch-nice19",
            Mode::BatchSchedIdle => "batch-sched-idle",
            Mode::BatchCgroupIdle => "batch-cgroup-idle",
            Mode::BatchCgroupLow => "batch-cgroup-low",
            Mode::RbpeClassic => "rbpe-classic",
            Mode::Appease => "appease",
            Mode::BatchGroupIdle => "batch-group-idle",
            Mode::BatchBranchIdle => "batch-branch-idle",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Mode::ALL
            .into_iter()
            .chain(Mode::PEERS)
            .chain(Mode::NESTED)
            .chain(Mode::TRIED)
            .find(|m| m.name() == s)
            .with_context(|| {
                let names: Vec<_> = Mode::ALL
                    .iter()
                    .chain(&Mode::PEERS)
                    .chain(&Mode::NESTED)
                    .chain(&Mode::TRIED)
                    .map(|m| m.name())
                    .collect();
                format!("unknown mode {s:?}; modes are {}", names.join(", "))
            })
    }
}

/// What the batch load is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Batch {
    /// CPU soakers counting units of work (1,000 loop iterations each).
    #[default]
    Soak,
    /// `make -jN` with gcc over a generated tree of C files, in a loop.
    Compile,
    /// A shell script with an idle helper (`sleep`) that runs N CPU-heavy children at a
    /// time, round after round.
    Script,
    /// The soakers, each in a Docker container of its own (no quota), from an engine the
    /// bench starts.
    Docker,
    /// Soaker jobs of 1, 2 and 4 threads in turn: batch jobs of different sizes, each of
    /// which should get the same CPU.
    Mixed,
}

impl Batch {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "soak" => Ok(Batch::Soak),
            "compile" => Ok(Batch::Compile),
            "script" => Ok(Batch::Script),
            "docker" => Ok(Batch::Docker),
            "mixed" => Ok(Batch::Mixed),
            _ => bail!("unknown batch load {s:?}; one of soak, compile, script, mixed, docker"),
        }
    }

    /// `n` jobs of it, `load` per CPU, in words.
    pub fn describe(self, n: usize, load: f64) -> String {
        match self {
            Batch::Soak => format!("{n} soakers ({load} per CPU)"),
            Batch::Compile => format!(
                "make -j{n} over {} C files ({load} jobs per CPU)",
                worker::FILES
            ),
            Batch::Script => format!(
                "a shell script with a sleep running {n} CPU-heavy children at a time ({load} per CPU)"
            ),
            Batch::Docker => format!("{n} soakers in Docker containers ({load} per CPU)"),
            Batch::Mixed => format!("{n} soaker jobs of 1, 2 and 4 threads ({load} jobs per CPU)"),
        }
    }

    /// What its throughput counts.
    pub fn unit(self) -> &'static str {
        match self {
            Batch::Soak | Batch::Docker | Batch::Mixed => "work units",
            Batch::Compile => "files compiled",
            Batch::Script => "children finished",
        }
    }
}

/// Threads per job of the mixed load, in turn.
pub const MIXED_SIZES: [usize; 3] = [1, 2, 4];

pub const SCENARIOS: &[&str] = &[
    "synthetic",
    "web",
    "db",
    "db-analytic",
    "db-analytic-fresh",
    "frames",
    "pipeline",
    "utilization",
    "nested",
    "fetch",
];

pub struct Options {
    pub scenario: String,
    pub quick: bool,
    /// Seconds measured per mode and round instead of the scenario's default.
    pub seconds: Option<f64>,
    pub modes: Vec<Mode>,
    /// Batch jobs per CPU; several values sweep.
    pub loads: Vec<f64>,
    /// The `appease` binary (workers and daemon modes run it).
    pub appease: PathBuf,
    /// Config for the `appease` mode instead of the embedded default.
    pub config: Option<PathBuf>,
    /// The synthetic server listens on a UNIX socket instead of TCP loopback.
    pub unix: bool,
    /// The loopback port of the synthetic (TCP) or web server; None: a free one.
    pub port: Option<u16>,
    /// How the client spaces its requests.
    pub arrivals: client::Arrivals,
    pub batch: Batch,
    /// Rounds of every mode; the report gives each metric's median over them.
    pub repeat: usize,
    /// Ctrl-C: stop measuring, clean up, report what was measured.
    pub stop: Arc<AtomicBool>,
    /// web and db: a closed-loop sweep over these client counts instead of the
    /// open-loop run (the Staircase study's scalability test).
    pub clients: Vec<u32>,
    /// The sweep's scalability base (None: the count with the lowest completion time).
    pub scale_base: Option<u32>,
    /// The sweep's requests or transactions per run (None: the scenario's default).
    pub work: Option<u64>,
    /// Peer daemons' programs by mode name (`--peer-bin NAME=PATH`); others from the PATH.
    pub peer_bins: Vec<(String, PathBuf)>,
    /// nested: the host layouts built.
    pub shapes: Vec<nested::Shape>,
    /// nested: the servers measured in them.
    pub servers: Vec<nested::Server>,
    /// fetch: the servers measured.
    pub fetch_servers: Vec<fetch::Server>,
    /// fetch: the batch jobs beside them.
    pub fetch_jobs: Vec<fetch::Job>,
}

impl Options {
    /// The modes that can run here, and those that cannot (peers not installed) with
    /// the message that says how to get them, printed once.
    pub(crate) fn runnable_modes(&self) -> (Vec<Mode>, Vec<report::NotRun>) {
        let mut run = Vec::new();
        let mut not_run = Vec::new();
        for &m in &self.modes {
            match m.peer().map(|p| peer::locate(p, &self.peer_bins)) {
                Some(Err(why)) => {
                    eprintln!("{}: not run: {why}", m.name());
                    not_run.push(report::NotRun {
                        mode: m.name().into(),
                        why,
                    });
                }
                _ => run.push(m),
            }
        }
        (run, not_run)
    }

    /// The largest client count of a closed-loop sweep.
    pub(crate) fn max_clients(&self) -> Option<u32> {
        self.clients.iter().copied().max()
    }

    /// The idle group the appease mode's daemon uses, as it appears in /proc/PID/cgroup.
    pub(crate) fn batch_group(&self) -> String {
        let name = self
            .config
            .as_ref()
            .and_then(|p| appease_config::Config::load(p).ok())
            .map_or_else(|| "appease.batch".to_string(), |c| c.batch.group);
        format!(":/{name}")
    }
}

/// Parameters of the synthetic scenario (the DESIGN.md experiment by default).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Synthetic {
    /// "synthetic" (a server of ours) or "nginx".
    pub server: String,
    /// "tcp" or "unix".
    pub transport: String,
    pub cpu_ms: f64,
    pub rate_per_s: f64,
    pub arrivals: client::Arrivals,
    /// Absent in results from before the compile load: soakers.
    #[serde(default)]
    pub batch: Batch,
    pub measure_s: f64,
    pub warmup_s: f64,
    /// Each metric is the median over this many interleaved rounds.
    pub rounds: usize,
}
