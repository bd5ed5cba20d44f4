//! `appease status`: what the running daemon manages and why.

use std::path::Path;

use anyhow::{bail, Result};
use appease_daemon::control::{self, ClientError, Reply, Request};
use appease_daemon::status::Status;

/// The running daemon's state, from its control socket; a clear error when none runs.
pub fn fetch(dir: &Path) -> Result<(Status, Option<u64>)> {
    match control::status(dir) {
        Ok(s) => Ok(s),
        Err(e @ ClientError::NotRunning(_)) => {
            let leftovers = appease_actuator::journal::read_pending(dir)
                .map(|p| p.len())
                .unwrap_or(0);
            if leftovers > 0 {
                bail!("{e}, and its journal lists {leftovers} changed thread(s): run `appease restore`");
            }
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// How old a stale state is, said plainly.
pub fn stale_warning(status: &Status, age: u64) -> String {
    format!(
        "the daemon (pid {}) last reported {age} s ago: its event loop is stuck or starved; \
         what follows may be out of date",
        status.pid
    )
}

pub fn show(dir: &Path, json: bool) -> Result<()> {
    let (status, stale) = fetch(dir)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_status(&status);
    }
    if let Some(age) = stale {
        bail!("{}", stale_warning(&status, age));
    }
    Ok(())
}

/// `appease reload`: the daemon reads its config again and says what it did.
pub fn reload(dir: &Path) -> Result<()> {
    let report = match control::request(dir, Request::Reload)? {
        Reply::Reload { report } => report,
        other => bail!("unexpected reply from the daemon: {other:?}"),
    };
    if let Some(e) = &report.error {
        bail!("reload refused; the daemon keeps its last good config: {e}");
    }
    println!("reloaded {}", report.config);
    if report.changed.is_empty() {
        println!("nothing changed");
    }
    for c in &report.changed {
        println!("applied: {c}");
    }
    for k in &report.needs_restart {
        println!("needs a restart (running value kept): {k}");
    }
    for f in &report.failed {
        println!("failed: {f}");
    }
    if !report.failed.is_empty() {
        bail!("part of the config could not be applied (see above)");
    }
    Ok(())
}

fn print_status(status: &Status) {
    let now = appease_actuator::now_secs();
    println!(
        "appease daemon pid {}, up {}s, config {}{}",
        status.pid,
        now.saturating_sub(status.started),
        status.config,
        if status.dry_run {
            " (dry run: nothing is changed)"
        } else {
            ""
        }
    );
    let h = &status.layout;
    println!(
        "host: {}{}{}{}; {}",
        h.kind,
        h.cpu_hierarchy
            .as_deref()
            .map(|p| format!(" at {p}"))
            .unwrap_or_default(),
        h.container
            .as_deref()
            .map(|c| format!(", appease runs in a {c} container"))
            .unwrap_or_default(),
        h.sched_ext
            .as_deref()
            .map(|s| format!(", sched_ext {s} loaded"))
            .unwrap_or_default(),
        h.effects
    );
    let l = &status.load;
    let idle = if l.idle_group_runnable > 0 {
        format!(
            " (and {} waiting in idle groups, not counted)",
            l.idle_group_runnable
        )
    } else {
        String::new()
    };
    println!(
        "load: {:.2} runnable/CPU{idle} on {} CPUs, CPU pressure {:.1} % -> ladder step {} (unix {}, inet {}, fade {} ms/level)",
        l.runnable_per_cpu, status.cpus, l.psi_some_pct, l.ladder_step, l.unix_nice, l.inet_nice, l.decay_ms
    );
    println!(
        "probe: {} socket reads, {} request events, {} lost, {} over users' bounds; {} reads of responses (a client's side){}",
        status.probe.socket_reads,
        status.probe.request_events,
        status.probe.lost_events,
        status.probe.throttled_events,
        status.probe.response_reads,
        if status.probe.lock_wait_hook {
            "; lock waits watched (an application has sunk threads or demoted trees)"
        } else {
            ""
        }
    );
    let (lat, def) = (
        &status.elevation_latency_us,
        &status.deferred_elevation_latency_us,
    );
    println!(
        "read -> elevation: p50 {} us, p99 {} us, max {} us ({} elevations); \
         {} more from already busy threads, read at the next tick (p99 {} us)",
        lat.p50, lat.p99, lat.max, lat.count, def.count, def.p99
    );
    let a = &status.actuator;
    println!(
        "changes: {} applied, {} restored, {} left alone, {} failed",
        a.changes, a.restores, a.hands_off, a.failures
    );
    println!(
        "{} thread(s) watched, {} changed:",
        status.watched,
        status.threads.len()
    );
    print_threads(status, now);
    print_autogroups(status, now);
    print_processes(status, now);
}

fn print_autogroups(status: &Status, now: u64) {
    for s in &status.autogroups {
        let pids: Vec<String> = s.pids.iter().map(u32::to_string).collect();
        println!(
            "session autogroup-{} (serving: {}): nice {} (was {}), {}, {}s ago",
            s.autogroup,
            pids.join(" "),
            s.nice,
            s.original_nice,
            s.why,
            now.saturating_sub(s.since)
        );
    }
}

fn print_threads(status: &Status, now: u64) {
    if status.threads.is_empty() {
        return;
    }
    println!(
        "{:>7} {:>7} {:<16} {:<8} {:>5} {:>5} {:>7} {:>9}  {:<16} SINCE",
        "PID", "TID", "COMM", "CLASS", "NICE", "ORIG", "SLICE", "BUDGET", "WHY"
    );
    for t in &status.threads {
        println!(
            "{:>7} {:>7} {:<16} {:<8} {:>5} {:>5} {:>5}us {:>7.0}ms  {:<16} {}s ago",
            t.pid,
            t.tid,
            t.comm,
            t.class,
            t.nice,
            t.original_nice,
            t.slice_us,
            t.budget_ms,
            t.why,
            now.saturating_sub(t.since)
        );
    }
}

/// The idle group's mode, said plainly.
pub fn mode_text(mode: Option<appease_policy::group_mode::GroupMode>) -> &'static str {
    use appease_policy::group_mode::GroupMode;
    match mode {
        Some(GroupMode::Idle) | None => "idle (cpu.idle = 1)",
        Some(GroupMode::Quiet) => "quiet (no requests lately: a normal weighted group)",
        Some(GroupMode::Floor) => "floor (starved: small weight)",
    }
}

fn print_processes(status: &Status, now: u64) {
    let a = &status.actuator;
    if let Some(b) = &status.batch {
        let mode = mode_text(b.mode);
        println!(
            "batch group: {mode}; {:.1} % of all CPUs over the last scan; starvation floor engaged {} time(s){}; {} busy thread(s) kept one CPU each",
            b.share_pct,
            b.floor_lifts,
            if b.floor_lifted { ", engaged now" } else { "" },
            b.pinned
        );
    }
    println!(
        "{} process(es) in the idle class ({} demoted, {} promoted so far)",
        status
            .processes
            .iter()
            .filter(|p| p.class == "batch")
            .count(),
        a.demotions,
        a.promotions
    );
    if status.processes.is_empty() {
        return;
    }
    println!(
        "{:>7} {:<16} {:<6} {:<16} {:<24} {:>7}  {:<32} {:<10} SINCE",
        "PID", "COMM", "CLASS", "GROUP", "FROM", "TREE", "WHY", "HOW"
    );
    // Group paths are read raw (a delegated user names its groups): shown escaped, never
    // as terminal control. Names are escaped where they are read.
    let shown = appease_cgroup::names::escaped_str;
    for p in &status.processes {
        println!(
            "{:>7} {:<16} {:<6} {:<16} {:<24} {:>7}  {:<32} {:<10} {}s ago",
            p.pid,
            p.comm,
            p.class,
            shown(&p.group),
            shown(&p.original_group),
            p.tree,
            p.why,
            p.placement,
            now.saturating_sub(p.since)
        );
    }
}
