//! The bench's result files as the Markdown tables docs/RESULTS.md shows: the page's
//! tables are this output, and a docs test holds them to the files kept in the repository.

use crate::closed_loop::{ClosedLoopResult, Point, Series};
use crate::Mode;

/// The client sweeps' tables, one column per variant of every result (web's `ab` and
/// `ab -k`, db's two sysbench tests), one row per client count: the median completion
/// time of each mode, then appease's over the setup by hand's; then the client's CPU a
/// run, by hand and under appease.
pub fn closed_loop(results: &[ClosedLoopResult]) -> String {
    let series: Vec<&Series> = results.iter().flat_map(|r| &r.series).collect();
    let mut variants: Vec<&str> = Vec::new();
    let mut modes: Vec<Mode> = Vec::new();
    for s in &series {
        if !variants.contains(&s.variant.as_str()) {
            variants.push(&s.variant);
        }
        if !modes.contains(&s.mode) {
            modes.push(s.mode);
        }
    }
    let mut clients: Vec<u32> = results.iter().flat_map(|r| r.clients.clone()).collect();
    clients.sort_unstable();
    clients.dedup();
    let point = |variant: &str, mode: Mode, n: u32| {
        series
            .iter()
            .find(|s| s.variant == variant && s.mode == mode)
            .and_then(|s| s.points.iter().find(|p| p.clients == n))
    };
    // By hand's and appease's figure `f` at a point, and their ratio.
    let pair = |variant: &str, n: u32, f: fn(&Point) -> f64| {
        let hand = f(point(variant, Mode::BatchCgroupIdle, n)?);
        let appease = f(point(variant, Mode::Appease, n)?);
        Some((hand, appease, appease / hand))
    };
    let names: Vec<&str> = modes.iter().map(|m| m.name()).collect();
    let mut out = format!(
        "Completion time in s, {}; in brackets appease's over batch-cgroup-idle's:\n\n",
        names.join(" / ")
    );
    out += &header(&variants);
    for &n in &clients {
        let cells = variants.iter().map(|&v| {
            let times: Vec<String> = modes
                .iter()
                .map(|&m| {
                    point(v, m, n).map_or("–".to_string(), |p| format!("{:.2}", p.completion_s))
                })
                .collect();
            match pair(v, n, |p| p.completion_s) {
                Some((_, _, r)) => format!("{} ({r:.2})", times.join(" / ")),
                None => times.join(" / "),
            }
        });
        out += &row(n, cells);
    }
    out += "\nThe client's CPU a run in s, batch-cgroup-idle / appease (appease's over it):\n\n";
    out += &header(&variants);
    for &n in &clients {
        let cells = variants.iter().map(|&v| {
            pair(v, n, |p| p.client_cpu_s).map_or("–".to_string(), |(h, a, r)| {
                format!("{h:.2} / {a:.2} ({r:.2})")
            })
        });
        out += &row(n, cells);
    }
    out
}

fn header(variants: &[&str]) -> String {
    let mut s = String::from("| clients |");
    for v in variants {
        s += &format!(" {} |", column_name(v));
    }
    s += "\n|---|";
    s += &"---|".repeat(variants.len());
    s + "\n"
}

fn row(clients: u32, cells: impl Iterator<Item = String>) -> String {
    let mut s = format!("| {clients} |");
    for c in cells {
        s += &format!(" {c} |");
    }
    s + "\n"
}

fn column_name(variant: &str) -> &str {
    match variant {
        "ab" => "ab, new connections",
        "ab-k" => "ab -k",
        v => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(variant: &str, times: [(Mode, f64, f64); 2]) -> ClosedLoopResult {
        let series = times
            .iter()
            .map(|&(mode, t, cpu)| {
                serde_json::json!({
                    "variant": variant, "mode": mode.name(), "scalability": null,
                    "points": [{"clients": 4, "runs": 5, "completion_s": t,
                        "completion_min_s": t, "completion_max_s": t, "per_s": 1.0,
                        "min_ms": 1.0, "p95_ms": 1.0, "max_ms": 1.0,
                        "max_minus_min_ms": 0.0, "p95_minus_min_ms": 0.0,
                        "client_cpu_s": cpu, "client_preempted": 0.0, "failed": 0}]
                })
            })
            .collect::<Vec<_>>();
        serde_json::from_value(serde_json::json!({
            "scenario": "db", "client_loop": "closed", "client": "c", "cpus": 2,
            "load_per_cpu": 4.0, "soakers": 8, "batch": "soak", "work_per_run": 5000,
            "unit": "transactions", "rounds": 5, "clients": [4], "scale_base": null,
            "series": series
        }))
        .expect("a closed-loop result")
    }

    #[test]
    fn a_point_shows_each_modes_time_and_appeases_over_by_hands() {
        let r = result(
            "oltp_read_only",
            [
                (Mode::BatchCgroupIdle, 2.0, 1.0),
                (Mode::Appease, 2.2, 1.05),
            ],
        );
        let md = closed_loop(&[r]);
        assert!(md.contains("| clients | oltp_read_only |"), "{md}");
        assert!(md.contains("| 4 | 2.00 / 2.20 (1.10) |"), "{md}");
        assert!(md.contains("| 4 | 1.00 / 1.05 (1.05) |"), "{md}");
        assert!(md.contains("batch-cgroup-idle / appease;"), "{md}");
    }
}
