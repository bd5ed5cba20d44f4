//! The CFS group-scheduling slides' utilization and fairness cases, scaled to this machine:
//! - (2·CPUs − 1) idle-class soakers beside one normal soaker must leave no CPU idle
//!   (the old CFS left CPUs idle here), with SCHED_IDLE tasks and with an idle cgroup;
//! - 48 batch groups of one soaker each must share the CPUs fairly (Jain's index over
//!   their CPU time): as the kernel treats them under one top-level idle group, and as
//!   the appease daemon manages them;
//! - and the case that matters: batch jobs beside a server that receives requests (so the
//!   group is idle, where the kernel herds its tasks): 48 one-soaker jobs, and jobs of 1, 2
//!   and 4 threads, in a hand-made idle group and under appease, with Jain's index per job
//!   and the server's latency (the synthetic scenario's server and client).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::{cpu_jiffies, spawn_worker, Options, Run};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Case {
    pub case: String,
    pub soakers: usize,
    pub groups: usize,
    pub cpu_util_pct: f64,
    /// Jain's fairness index over the soakers' CPU time (1 = perfectly fair).
    pub jain_index: f64,
    /// CPU seconds per soaker: min and max.
    pub min_cpu_s: f64,
    pub max_cpu_s: f64,
    /// CPU seconds of each soaker the index is over, in spawn order.
    #[serde(default)]
    pub cpu_s: Vec<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UtilizationResult {
    pub scenario: String,
    pub cpus: usize,
    pub measure_s: f64,
    pub cases: Vec<Case>,
    /// Batch jobs beside a server receiving requests: 48 one-soaker jobs, then jobs of 1,
    /// 2 and 4 threads (each mode's `batch_jain` is Jain's index over the jobs).
    #[serde(default)]
    pub with_server: Vec<crate::report::ScenarioResult>,
}

/// Jain's fairness index: (Σx)² / (n·Σx²).
pub fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if n == 0.0 || sq == 0.0 {
        return 0.0;
    }
    sum * sum / (n * sq)
}

enum Layout {
    /// n − 1 soakers SCHED_IDLE, one normal.
    SchedIdle,
    /// n − 1 soakers in a top-level idle group, one normal.
    CgroupIdle,
    /// `groups` child groups of one top-level idle group, one soaker each.
    Groups(usize),
    /// All soakers directly in one top-level idle group (what appease does).
    OneIdleGroup,
    /// All soakers SCHED_IDLE in their own group (the reference without groups).
    AllSchedIdle,
    /// One group per soaker under a normal top-level group (batch jobs as a service
    /// manager sets them up), then the appease daemon (default config, or --config)
    /// finds and demotes the soakers.
    Appease,
}

/// Puts each of `pids` in a group of its own, all under one new top-level group (idle or
/// not), which `run` removes at its end.
fn one_group_each(run: &mut Run, pids: &[u32], idle_parent: bool) -> Result<()> {
    let (cg, parent) = crate::bench_top_group(run, "batch", idle_parent)?;
    for (i, &pid) in pids.iter().enumerate() {
        let child = cg.ensure_child_group(&parent, &format!("g{i:02}"), 100)?;
        // Children first: the parent is removed last.
        run.cgroups.insert(0, (cg.clone(), child.clone()));
        cg.move_process(pid, &child)?;
    }
    Ok(())
}

/// Each soaker in a group of its own, under the daemon until it demoted them all (and,
/// with a config that quiets the idle group, until it is quiet).
fn under_appease(run: &mut Run, opts: &Options, pids: &[u32]) -> Result<()> {
    one_group_each(run, pids, false)?;
    let group = opts.batch_group();
    crate::start_daemon(run, opts, None)?;
    let demoted = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|t| t.contains(&group))
    };
    crate::wait_until(Duration::from_secs(30), || pids.iter().all(|&p| demoted(p)))
        .context("the daemon did not demote the soakers within 30 s")?;
    // Measure the daemon's steady state: with nothing receiving requests, the
    // group turns from idle to a normal weighted group after quiet_after_ms.
    let conf = match &opts.config {
        Some(p) => appease_config::Config::load(p)?,
        None => appease_config::Config::default(),
    };
    if let Some(quiet) = conf.quiet_after() {
        let cg = appease_cgroup::Cgroups::detect()?;
        let path = format!("/{}", conf.batch.group);
        let settled = crate::wait_until(quiet + Duration::from_secs(3), || {
            !cg.idle(&path).unwrap_or(true)
        });
        eprintln!(
            "    batch group {}",
            if settled.is_ok() {
                "quiet (a normal weighted group): no requests"
            } else {
                "still idle"
            }
        );
    }
    Ok(())
}

fn run_case(
    opts: &Options,
    name: &str,
    n: usize,
    layout: Layout,
    measure: Duration,
) -> Result<Case> {
    let mut run = Run::default();
    let mut pids = Vec::new();
    for _ in 0..n {
        let c = spawn_worker(&opts.appease, &["soak"])?;
        pids.push(c.id());
        run.children.push(c);
    }
    let groups = match layout {
        Layout::SchedIdle => {
            crate::make_sched_idle(&pids[1..])?;
            0
        }
        Layout::CgroupIdle => {
            crate::into_idle_group(&mut run, &pids[1..])?;
            0
        }
        Layout::OneIdleGroup => {
            crate::into_idle_group(&mut run, &pids)?;
            1
        }
        Layout::AllSchedIdle => {
            crate::make_sched_idle(&pids)?;
            0
        }
        Layout::Appease => {
            under_appease(&mut run, opts, &pids)?;
            1
        }
        Layout::Groups(k) => {
            one_group_each(&mut run, &pids[..k], true)?;
            k
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    let before: Vec<u64> = pids.iter().map(|&p| crate::process_cpu_ns(p)).collect();
    let (busy0, total0) = cpu_jiffies();
    let t = Instant::now();
    while t.elapsed() < measure && !opts.stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (busy1, total1) = cpu_jiffies();
    let used: Vec<f64> = pids
        .iter()
        .zip(&before)
        .map(|(&p, &b)| crate::process_cpu_ns(p).saturating_sub(b) as f64 / 1e9)
        .collect();
    // Soakers in groups all count; with a normal soaker, fairness is among the idle ones.
    let fair_set = match layout {
        Layout::SchedIdle | Layout::CgroupIdle => &used[1..],
        _ => &used[..],
    };
    Ok(Case {
        case: name.to_string(),
        soakers: n,
        groups,
        cpu_util_pct: 100.0 * (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64,
        jain_index: jain(fair_set),
        min_cpu_s: fair_set.iter().copied().fold(f64::INFINITY, f64::min),
        max_cpu_s: fair_set.iter().copied().fold(0.0, f64::max),
        cpu_s: fair_set.to_vec(),
    })
}

/// The modes of the cases beside a server: the hand-made idle group, the peer daemons
/// named in `--modes` (they are never run unless asked for), and appease.
fn with_server_modes(asked: &[crate::Mode]) -> Vec<crate::Mode> {
    std::iter::once(crate::Mode::BatchCgroupIdle)
        .chain(asked.iter().copied().filter(|m| m.peer().is_some()))
        .chain(std::iter::once(crate::Mode::Appease))
        .collect()
}

pub fn run(opts: &Options) -> Result<UtilizationResult> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let measure =
        Duration::from_secs_f64(opts.seconds.unwrap_or(if opts.quick { 5.0 } else { 20.0 }));
    let n = 2 * cpus; // (2·CPUs − 1) idle-class + 1 normal
    let mut cases = Vec::new();
    for (name, layout, count) in [
        (
            "sched-idle: 2*CPUs-1 SCHED_IDLE + 1 normal",
            Layout::SchedIdle,
            n,
        ),
        (
            "cgroup-idle: 2*CPUs-1 in an idle group + 1 normal",
            Layout::CgroupIdle,
            n,
        ),
        (
            "48 one-soaker batch groups under an idle group",
            Layout::Groups(48),
            48,
        ),
        (
            "48 soakers in one idle group (appease's layout)",
            Layout::OneIdleGroup,
            48,
        ),
        (
            "48 soakers SCHED_IDLE, no group (reference)",
            Layout::AllSchedIdle,
            48,
        ),
        (
            "48 one-soaker batch groups, under the appease daemon",
            Layout::Appease,
            48,
        ),
    ] {
        eprintln!("{name}: {} s ...", measure.as_secs());
        cases.push(
            run_case(opts, name, count, layout, measure).with_context(|| format!("case {name}"))?,
        );
    }
    let mut with_server = Vec::new();
    for (batch, jobs) in [(crate::Batch::Soak, 48.0), (crate::Batch::Mixed, 6.0)] {
        if opts.stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        eprintln!(
            "{}, beside a server receiving requests:",
            batch.describe(jobs as usize, jobs / cpus as f64)
        );
        let o = Options {
            scenario: "synthetic".into(),
            quick: opts.quick,
            seconds: opts.seconds,
            modes: with_server_modes(&opts.modes),
            loads: vec![jobs / cpus as f64],
            appease: opts.appease.clone(),
            config: opts.config.clone(),
            unix: false,
            port: None,
            arrivals: crate::client::Arrivals::Fixed,
            batch,
            repeat: opts.repeat,
            stop: opts.stop.clone(),
            clients: Vec::new(),
            scale_base: None,
            work: None,
            peer_bins: opts.peer_bins.clone(),
            shapes: Vec::new(),
            servers: Vec::new(),
            fetch_servers: Vec::new(),
            fetch_jobs: Vec::new(),
        };
        with_server.extend(crate::run_latency(&o)?);
    }
    Ok(UtilizationResult {
        scenario: "utilization".into(),
        cpus,
        measure_s: measure.as_secs_f64(),
        cases,
        with_server,
    })
}

impl UtilizationResult {
    pub fn table(&self) -> String {
        let mut s = format!(
            "utilization: the CFS group-scheduling slides' cases on {} CPUs, {} s each\n{:<52} {:>7} {:>7} {:>8} {:>10} {:>10}\n",
            self.cpus, self.measure_s, "case", "soakers", "util%", "Jain", "min cpu s", "max cpu s"
        );
        for c in &self.cases {
            s += &format!(
                "{:<52} {:>7} {:>7.2} {:>8.4} {:>10.2} {:>10.2}\n",
                c.case, c.soakers, c.cpu_util_pct, c.jain_index, c.min_cpu_s, c.max_cpu_s
            );
        }
        for r in &self.with_server {
            s += "\n";
            s += &r.table();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_asked_for_join_the_cases_beside_a_server() {
        use crate::Mode::*;
        assert_eq!(
            with_server_modes(&crate::Mode::ALL),
            vec![BatchCgroupIdle, Appease]
        );
        assert_eq!(
            with_server_modes(&[Unmanaged, System76Scheduler, Appease, Ananicy]),
            vec![BatchCgroupIdle, System76Scheduler, Ananicy, Appease]
        );
    }

    #[test]
    fn jain_index() {
        assert!((jain(&[1.0, 1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[2.0, 1.0]) - 0.9).abs() < 1e-12);
        assert_eq!(jain(&[]), 0.0);
    }
}
