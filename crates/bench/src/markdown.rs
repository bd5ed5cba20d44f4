//! The bench's result files as the Markdown tables docs/RESULTS.md shows: the page's
//! tables are this output, and a docs test holds them to the files kept in the repository.

use crate::closed_loop::{ClosedLoopResult, Point, Series};
use crate::fetch::{Case, FetchResult, Job, Server};
use crate::report::{self, ModeResult, ScenarioResult};
use crate::utilization::UtilizationResult;
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

/// The table as docs/RESULTS.md shows it: a Markdown row a mode,
/// with late requests, the batch's fairness, frames, analytic queries and downloads as
/// columns where measured (the page says once what each counts); modes that could not run.
pub fn scenario(r: &ScenarioResult) -> String {
    let mut columns = report::table_columns();
    let any = |f: fn(&ModeResult) -> bool| r.modes.iter().any(f);
    if any(|m| m.late.is_some()) {
        columns.push(report::col("late", 0, |_, m| report::opt(m.late)));
        columns.push(report::col("for CPU loss", 0, |_, m| {
            report::opt(m.late_for_cpu_loss)
        }));
    }
    if any(|m| m.batch_jain.is_some()) {
        columns.push(report::col("Jain", 0, |_, m| {
            m.batch_jain.map_or(String::new(), |j| format!("{j:.4}"))
        }));
    }
    if any(|m| m.frames.is_some()) {
        columns.push(report::col("fps", 0, |_, m| {
            m.frames
                .as_ref()
                .map_or(String::new(), |f| format!("{:.2}", f.fps))
        }));
        columns.push(report::col("dropped", 0, |_, m| {
            report::opt(m.frames.as_ref().map(|f| f.dropped))
        }));
    }
    if any(|m| m.analytic.is_some()) {
        columns.push(report::col("analytic queries", 0, |_, m| {
            report::opt(m.analytic.as_ref().map(|a| a.queries))
        }));
        columns.push(report::col("their p50 ms", 0, |_, m| {
            m.analytic
                .as_ref()
                .map_or(String::new(), |a| format!("{:.1}", a.p50_ms))
        }));
    }
    if any(|m| m.download_s.is_some()) {
        columns.push(report::col("download s", 0, |_, m| {
            m.download_s.map_or(String::new(), |d| format!("{d:.3}"))
        }));
    }
    let row = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    // What was run is the section's prose; the command above the table says how.
    let mut s = row(columns.iter().map(|c| c.name.to_string()).collect());
    s += &format!("|{}\n", "---|".repeat(columns.len()));
    for m in &r.modes {
        s += &row(columns.iter().map(|c| (c.cell)(r, m)).collect());
    }
    for n in &r.not_run {
        s += &format!("\n{}\n", wrap(&format!("Not run: {}: {}.", n.mode, n.why)));
    }
    s
}

/// A batch-level sweep (`--load` with several levels) as docs/RESULTS.md shows it: a row a
/// level, each mode's p99 (ms), appease's against by hand's, late requests and the batch's
/// throughput against unmanaged's (its CPUs) by hand and under appease.
pub fn load_sweep(levels: &[ScenarioResult]) -> String {
    let mut s = String::from(
        "| soakers per CPU | unloaded | unmanaged | by hand | appease | appease against by hand | \
         late, by hand / appease | batch, by hand / appease |\n",
    );
    s += &format!("|{}\n", "---|".repeat(8));
    for r in levels {
        let of = |mode| r.modes.iter().find(|m| m.mode == mode);
        let p99 = |mode| of(mode).map_or("–".to_string(), |m| thousands(m.latency_ms.p99));
        let (hand, appease) = (of(Mode::BatchCgroupIdle), of(Mode::Appease));
        let pair = |f: &dyn Fn(&ModeResult) -> String| match (hand, appease) {
            (Some(h), Some(a)) => format!("{} / {}", f(h), f(a)),
            _ => "–".to_string(),
        };
        let ratio = match (hand, appease) {
            (Some(h), Some(a)) => format!(
                "{:+.1} %",
                100.0 * (a.latency_ms.p99 / h.latency_ms.p99 - 1.0)
            ),
            _ => "–".to_string(),
        };
        let late = pair(&|m| report::opt(m.late));
        let batch = match (hand, appease) {
            (Some(h), Some(a)) => {
                let pct = |m| {
                    report::batch_vs_unmanaged(r, m).map_or("?".to_string(), |p| format!("{p:.1}"))
                };
                format!(
                    "{} / {} % ({:.2} / {:.2})",
                    pct(h),
                    pct(a),
                    h.batch_cpus,
                    a.batch_cpus
                )
            }
            _ => "–".to_string(),
        };
        s += &format!(
            "| {} | {} | {} | {} | {} | {ratio} | {late} | {batch} |\n",
            r.load_per_cpu,
            p99(Mode::Unloaded),
            p99(Mode::Unmanaged),
            p99(Mode::BatchCgroupIdle),
            p99(Mode::Appease),
        );
    }
    s
}

/// Milliseconds as the page writes them: two decimals, whole numbers with separators
/// from 1,000 up.
pub fn thousands(ms: f64) -> String {
    if ms < 1000.0 {
        return format!("{ms:.2}");
    }
    let digits = format!("{:.0}", ms);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The utilization scenario as docs/RESULTS.md shows it: a row a case without a server
/// (its CPUs' use, Jain's index over the soakers, their least and most CPU time), then a
/// row a batch beside the server and mode: the server's p99 (ms), its late requests, Jain's
/// index over the jobs, the CPUs the batch got and how busy the CPUs were.
pub fn utilization(r: &UtilizationResult) -> String {
    let mut s = String::from("| case | CPU util | Jain | min / max CPU s |\n|---|---|---|---|\n");
    for c in &r.cases {
        s += &format!(
            "| {} | {:.2} % | {:.4} | {:.2} / {:.2} |\n",
            c.case, c.cpu_util_pct, c.jain_index, c.min_cpu_s, c.max_cpu_s
        );
    }
    if r.with_server.is_empty() {
        return s;
    }
    s += "\n| beside the server | mode | p99 | late | Jain over the jobs | b.CPUs | CPU util |\n";
    s += &format!("|{}\n", "---|".repeat(7));
    for level in &r.with_server {
        let batch = level
            .params
            .batch
            .describe(level.soakers, level.load_per_cpu);
        for m in &level.modes {
            let jain = m.batch_jain.map_or("–".to_string(), |j| format!("{j:.4}"));
            s += &format!(
                "| {batch} | {} | {} | {} | {jain} | {:.2} | {:.1} % |\n",
                m.mode.name(),
                thousands(m.latency_ms.p99),
                report::opt(m.late),
                m.batch_cpus,
                m.cpu_util_pct
            );
        }
    }
    s
}

/// The fetch scenario as docs/RESULTS.md shows it: a row a job and server, its p99 in each
/// mode (ms, medians over the rounds), appease's against by hand's, and the job's pace
/// against unmanaged's under by hand and under appease.
pub fn fetch(r: &FetchResult) -> String {
    let mut s = String::from(
        "| job beside server | rounds | unloaded p99 | unmanaged p99 | by hand p99 | appease p99 | \
         appease / by hand | batch, by hand | batch, appease |\n",
    );
    s += &format!("|{}\n", "---|".repeat(9));
    for c in &r.cases {
        let of = |mode| c.mode(mode);
        let p99 = |mode| of(mode).map_or("–".to_string(), |m| format!("{:.2}", m.median.p99_ms));
        let batch = |mode| {
            of(mode)
                .and_then(|m| m.batch_pct)
                .map_or("–".to_string(), |b| format!("{b:.1} %"))
        };
        let ratio = of(Mode::Appease)
            .and_then(|m| m.p99_vs_by_hand)
            .map_or("–".to_string(), |r| format!("{r:.2}"));
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {ratio} | {} | {} |\n",
            fetch_case_name(c),
            c.modes.first().map_or(0, |m| m.rounds.len()),
            p99(Mode::Unloaded),
            p99(Mode::Unmanaged),
            p99(Mode::BatchCgroupIdle),
            p99(Mode::Appease),
            batch(Mode::BatchCgroupIdle),
            batch(Mode::Appease),
        );
    }
    s
}

/// "dump beside PostgreSQL", as the page names a fetch case.
fn fetch_case_name(c: &Case) -> String {
    let job = match c.job {
        Job::Etl => "ETL",
        job => job.name(),
    };
    let server = match c.server {
        Server::Db => "PostgreSQL",
        Server::Web => "nginx",
    };
    format!("{job} beside {server}")
}

/// `text` broken at spaces into lines of at most 120 characters (a longer word stands
/// alone), as the results page keeps its prose.
pub fn wrap(text: &str) -> String {
    const WIDTH: usize = 120;
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= WIDTH => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_the_page_writes_them() {
        assert_eq!(thousands(6.2449), "6.24");
        assert_eq!(thousands(999.994), "999.99");
        assert_eq!(thousands(26_706.4), "26,706");
        assert_eq!(thousands(113_705.0), "113,705");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn prose_is_wrapped_at_120_characters_between_words() {
        let text = "word ".repeat(60);
        let wrapped = wrap(&text);
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 120),
            "{wrapped}"
        );
        assert_eq!(wrapped.split_whitespace().count(), 60);
        assert_eq!(wrapped.lines().next().unwrap().len(), 119);
        let long = "x".repeat(130);
        assert_eq!(wrap(&format!("a {long} b")), format!("a\n{long}\nb"));
    }

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
