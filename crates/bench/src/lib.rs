//! `appease bench`: real servers under real batch load, every alternative side by side
//! in one run on the same machine.

pub mod client;
pub mod closed_loop;
mod db;
pub mod docker;
pub mod fetch;
pub mod guard;
pub mod markdown;
pub mod nested;
mod options;
pub mod peer;
mod pipeline;
pub mod plot;
mod procfs;
pub mod report;
pub mod rounds;
mod run;
mod synthetic;
pub mod utilization;
mod web;
pub mod worker;

use std::path::PathBuf;

use anyhow::{bail, Result};

pub use options::{Batch, Mode, Options, Synthetic, MIXED_SIZES, SCENARIOS};
pub(crate) use procfs::{cpu_jiffies, descendants, process_cpu_ns, tree_cpu_ns};
pub use report::{ModeResult, ScenarioResult};
pub(crate) use run::{
    bench_top_group, into_idle_group, into_low_group, make_sched_idle, spawn_server, spawn_worker,
    start_daemon, wait_until, Run,
};
pub(crate) use synthetic::{
    apply_mode, run_latency, scenario_params, spawn_soakers, start_peer, start_server, warm_up,
    Load,
};

/// What a scenario reports.
pub enum Report {
    /// Latency scenarios: one result per batch level.
    Latency(Vec<ScenarioResult>),
    Utilization(utilization::UtilizationResult),
    /// web and db with `--clients`: the closed-loop sweep.
    ClosedLoop(closed_loop::ClosedLoopResult),
    Nested(nested::NestedResult),
    Fetch(fetch::FetchResult),
}

pub fn run(opts: &Options) -> Result<Report> {
    if !SCENARIOS.contains(&opts.scenario.as_str()) {
        bail!(
            "unknown scenario {:?}; scenarios are {}",
            opts.scenario,
            SCENARIOS.join(", ")
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("appease bench needs root: its modes change priorities, policies and cgroups");
    }
    if opts.port.is_some()
        && !(opts.scenario == "web" || opts.scenario == "synthetic" && !opts.unix)
    {
        bail!("--port applies to the TCP servers of the synthetic and web scenarios only");
    }
    if opts.scenario == "utilization" {
        return Ok(Report::Utilization(utilization::run(opts)?));
    }
    if opts.scenario == "nested" {
        return Ok(Report::Nested(nested::run(opts)?));
    }
    if opts.scenario == "fetch" {
        return Ok(Report::Fetch(fetch::run(opts)?));
    }
    if let Some(m) = opts.modes.iter().find(|m| Mode::NESTED.contains(m)) {
        bail!("mode {} applies to the nested scenario only", m.name());
    }
    if !opts.clients.is_empty() {
        return Ok(Report::ClosedLoop(closed_loop::run(opts)?));
    }
    Ok(Report::Latency(run_latency(opts)?))
}

/// Whether `program` is on the PATH.
pub(crate) fn on_path(program: &str) -> bool {
    find_on_path(program).is_some()
}

/// Where `program` is on the PATH.
pub(crate) fn find_on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
