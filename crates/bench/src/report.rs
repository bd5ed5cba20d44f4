//! Results: the interface contract's JSON, and a side-by-side text table.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::client::ClientResult;
use crate::{Mode, Synthetic};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub min: f64,
    pub max: f64,
}

impl Latency {
    fn from_us(h: &Histogram<u64>) -> Self {
        let ms = |v: u64| v as f64 / 1000.0;
        Latency {
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            min: ms(h.min()),
            max: ms(h.max()),
        }
    }
}

/// How long beyond its CPU need a request must wait to count as late, µs.
pub const LATE_US: u64 = 1_000;

/// Where the response-time CDF is sampled (percent of requests), dense in the tail.
pub const CDF_PCTS: [f64; 24] = [
    0.0, 1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 92.0, 94.0, 95.0, 96.0,
    97.0, 98.0, 99.0, 99.5, 99.7, 99.9, 99.95, 100.0,
];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModeResult {
    pub mode: Mode,
    pub latency_ms: Latency,
    pub requests: u64,
    /// Requests sent but not answered before the run ended.
    pub lost: u64,
    /// Work units (1,000 loop iterations) per second, all soakers together.
    pub batch_throughput: f64,
    /// CPUs the batch got on average (its CPU time over the time it ran): with
    /// `batch_throughput`, whether a mode gave the batch less CPU or the batch did less
    /// with the same CPU.
    #[serde(default)]
    pub batch_cpus: f64,
    /// Jain's index over the batch jobs' CPU time during the measurement (soaker loads
    /// with two jobs or more): 1 when every job got the same.
    #[serde(default)]
    pub batch_jain: Option<f64>,
    pub cpu_util_pct: f64,
    /// the 2010 customer-appeasement paper unhappiness: time waited beyond the CPU the request needed, ms.
    pub unhappiness_ms: Option<Latency>,
    /// Requests that waited at least `LATE_US` beyond the CPU they needed (where unhappiness
    /// is measured): a request that lost a scheduler tick to other work (4 ms at HZ 250)
    /// counts here. A count of rare events is a steadier yardstick than p99 when two modes
    /// differ by a few such requests in a round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<u64>,
    /// Of `late`, the requests late only for time the server lost while on CPU
    /// (interrupts, a hypervisor's other guests): time the guest's scheduler never saw,
    /// which no mode controls. `late` minus this is what scheduling made late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_for_cpu_loss: Option<u64>,
    /// the Staircase study spreads.
    pub max_min_ms: f64,
    pub p95_min_ms: f64,
    pub requests_per_s: f64,
    /// the Staircase study's time to finish: first intended send to last answer, s.
    #[serde(default)]
    pub time_to_finish_s: f64,
    /// the Staircase study's time per request across concurrent requests (time to finish over
    /// requests answered), ms; its time per request is the mean latency.
    #[serde(default)]
    pub time_per_request_ms: f64,
    /// The response-time CDF: (percent of requests, answered within ms) at `CDF_PCTS`.
    pub cdf_ms: Vec<(f64, f64)>,
    /// The frames scenario: what a viewer sees.
    pub frames: Option<Frames>,
    /// A peer daemon's mode: what it changed on the machine while it ran (the last round's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<crate::peer::PeerReport>,
    /// The web scenario: seconds to download the whole site with wget -r (mean of 3).
    #[serde(default)]
    pub download_s: Option<f64>,
    /// db-analytic-fresh: the analytic queries that ended within the measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytic: Option<Analytic>,
}

/// Analytic queries on fresh connections: how many ended, and their times (connection
/// included), ms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Analytic {
    pub queries: u64,
    pub failed: u64,
    pub p50_ms: f64,
    pub max_ms: f64,
}

impl Analytic {
    pub fn new(mut times_ms: Vec<f64>, failed: u64) -> Self {
        times_ms.sort_by(f64::total_cmp);
        Analytic {
            queries: times_ms.len() as u64,
            failed,
            p50_ms: times_ms.get(times_ms.len() / 2).copied().unwrap_or(0.0),
            max_ms: times_ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// A player's frames (the 2010 customer-appeasement paper's Figs 3–4): a frame not decoded within its period after
/// it arrived misses its display time and is dropped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Frames {
    /// Frames shown on time per second of video.
    pub fps: f64,
    pub dropped: u64,
    pub dropped_pct: f64,
}

impl Frames {
    /// Frames of `r`, sent at `fps`, that were not decoded within one frame period.
    pub fn new(r: &ClientResult, fps: f64) -> Self {
        let period_us = (1e6 / fps) as u64;
        let late = r.latency_us.len() - r.latency_us.count_between(1, period_us);
        let dropped = late + r.sent.saturating_sub(r.answered);
        Frames {
            fps: fps * (r.sent - dropped) as f64 / r.sent.max(1) as f64,
            dropped,
            dropped_pct: 100.0 * dropped as f64 / r.sent.max(1) as f64,
        }
    }
}

impl ModeResult {
    pub fn new(mode: Mode, r: &ClientResult, batch_throughput: f64, cpu_util_pct: f64) -> Self {
        let latency_ms = Latency::from_us(&r.latency_us);
        ModeResult {
            mode,
            requests: r.answered,
            lost: r.sent.saturating_sub(r.answered),
            batch_throughput,
            batch_cpus: 0.0,
            batch_jain: None,
            cpu_util_pct,
            unhappiness_ms: (!r.unhappiness_us.is_empty())
                .then(|| Latency::from_us(&r.unhappiness_us)),
            late: (!r.unhappiness_us.is_empty()).then(|| {
                r.unhappiness_us
                    .count_between(LATE_US, r.unhappiness_us.max().max(LATE_US))
            }),
            late_for_cpu_loss: (!r.unhappiness_us.is_empty()).then_some(r.late_for_cpu_loss),
            max_min_ms: latency_ms.max - latency_ms.min,
            p95_min_ms: latency_ms.p95 - latency_ms.min,
            requests_per_s: r.answered as f64 / r.elapsed.as_secs_f64().max(1e-9),
            time_to_finish_s: r.finished.as_secs_f64(),
            time_per_request_ms: 1e3 * r.finished.as_secs_f64() / r.answered.max(1) as f64,
            cdf_ms: CDF_PCTS
                .iter()
                .map(|&p| (p, r.latency_us.value_at_percentile(p) as f64 / 1000.0))
                .collect(),
            frames: None,
            download_s: None,
            analytic: None,
            peer: None,
            latency_ms,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub cpus: usize,
    pub load_per_cpu: f64,
    pub soakers: usize,
    pub params: Synthetic,
    pub modes: Vec<ModeResult>,
    /// Modes asked for that could not run (a peer daemon not installed), and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<NotRun>,
}

/// A mode that was asked for and could not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NotRun {
    pub mode: String,
    pub why: String,
}

impl ScenarioResult {
    /// The side-by-side table, with ratios against `unloaded` and `unmanaged`.
    pub fn table(&self) -> String {
        self.heading() + &self.mode_rows() + &self.extra_tables()
    }

    /// What was measured.
    fn server_description(&self) -> String {
        let p = &self.params;
        match p.server.as_str() {
            "nginx" => {
                "nginx from Debian (1 worker) serving 200 static files of 0.5-16 KiB in 10 directories"
                    .to_string()
            }
            "pipeline" => format!(
                "the AIX case study's six cooperating processes A-F (Figure 3's split), {} ms of CPU per search",
                p.cpu_ms
            ),
            "player" => format!(
                "a {} fps player of our own, decoding each frame on {} ms of CPU",
                p.rate_per_s, p.cpu_ms
            ),
            "postgresql" => {
                "PostgreSQL from Debian, pgbench TPC-B-like transactions (scale 4, 4 clients)"
                    .to_string()
            }
            _ => format!(
                "one single-threaded server ({} ms CPU per request)",
                p.cpu_ms
            ),
        }
    }

    /// What was run, in a line.
    fn description(&self) -> String {
        let p = &self.params;
        let server = self.server_description();
        format!(
            "{}: {server}, {} req/s open loop ({} arrivals) over {}, {} on {} CPUs, \
             {} s per mode, median of {} round(s)",
            self.scenario,
            p.rate_per_s,
            p.arrivals.name(),
            p.transport.to_uppercase(),
            p.batch.describe(self.soakers, self.load_per_cpu),
            self.cpus,
            p.measure_s,
            p.rounds
        )
    }

    /// The run's description and the columns' names.
    fn heading(&self) -> String {
        let mut s = self.description() + "\n";
        s += &table_line(table_columns().iter().map(|c| (c, c.name.to_string())));
        s
    }

    /// One row per mode, and what the columns count.
    fn mode_rows(&self) -> String {
        let mut s = String::new();
        let columns = table_columns();
        for m in &self.modes {
            s += &table_line(columns.iter().map(|c| (c, (c.cell)(self, m))));
        }
        s += &format!(
            "latency and unhappiness (mean, beyond the request's own CPU) in ms; batch/s = {} per second; \
             b.CPUs = CPUs the batch got on average\n",
            self.params.batch.unit()
        );
        s
    }

    /// The tables only some runs have: late requests, fairness, downloads, what peers
    /// changed, modes not run, frames.
    fn extra_tables(&self) -> String {
        let mut s = String::new();
        if self.modes.iter().any(|m| m.late.is_some()) {
            s += "\nlate requests (median per round): waited >= 1 ms beyond their CPU; of them, late only \
                  for time the server lost while on CPU (interrupts, the hypervisor: no mode's doing)\n";
            s += &format!("{:<18} {:>7} {:>12}\n", "mode", "late", "for CPU loss");
            for m in &self.modes {
                if let Some(n) = m.late {
                    let lost = m
                        .late_for_cpu_loss
                        .map_or("-".to_string(), |l| l.to_string());
                    s += &format!("{:<18} {:>7} {:>12}\n", m.mode.name(), n, lost);
                }
            }
        }
        if self.modes.iter().any(|m| m.batch_jain.is_some()) {
            s += "\nfairness among the batch jobs while the server received requests (Jain's index over each job's CPU time)\n";
            for m in &self.modes {
                if let Some(j) = m.batch_jain {
                    s += &format!("{:<18} {:>7.4}\n", m.mode.name(), j);
                }
            }
        }
        if self.modes.iter().any(|m| m.download_s.is_some()) {
            s += "\nwhole-tree download (wget -r of the site, mean of 3), s\n";
            for m in &self.modes {
                if let Some(d) = m.download_s {
                    s += &format!("{:<18} {:>7.3}\n", m.mode.name(), d);
                }
            }
        }
        for m in &self.modes {
            if let Some(peer) = &m.peer {
                s += &format!(
                    "\nwhat {} ({}) changed while it ran:\n",
                    m.mode.name(),
                    peer.bin
                );
                if peer.changed.is_empty() {
                    s += "  nothing\n";
                }
                for line in &peer.changed {
                    s += &format!("  {line}\n");
                }
                if !peer.changed_before_end.is_empty() {
                    s += &format!(
                        "  and before the end, no longer at it (sampled every {} s):\n",
                        crate::peer::SAMPLE_EVERY.as_secs()
                    );
                }
                for line in &peer.changed_before_end {
                    s += &format!("  {line}\n");
                }
            }
        }
        for n in &self.not_run {
            s += &format!("\nnot run: {}: {}\n", n.mode, n.why);
        }
        if self.modes.iter().any(|m| m.analytic.is_some()) {
            s += &format!(
                "\nanalytic queries on fresh connections (median per round)\n{:<18} {:>7} {:>9} {:>9} {:>7}\n",
                "mode", "queries", "p50 ms", "max ms", "failed"
            );
            for m in &self.modes {
                if let Some(a) = &m.analytic {
                    s += &format!(
                        "{:<18} {:>7} {:>9.1} {:>9.1} {:>7}\n",
                        m.mode.name(),
                        a.queries,
                        a.p50_ms,
                        a.max_ms,
                        a.failed
                    );
                }
            }
        }
        if self.modes.iter().any(|m| m.frames.is_some()) {
            s += &format!(
                "\n{:<18} {:>7} {:>9} {:>9}\n",
                "frames", "fps", "dropped", "dropped%"
            );
            for m in &self.modes {
                if let Some(f) = &m.frames {
                    s += &format!(
                        "{:<18} {:>7.2} {:>9} {:>9.2}\n",
                        m.mode.name(),
                        f.fps,
                        f.dropped,
                        f.dropped_pct
                    );
                }
            }
        }
        s
    }
}

/// One CSV row per (load, mode).
pub fn csv(results: &[ScenarioResult]) -> String {
    let columns = csv_columns();
    let mut s = columns.iter().map(|c| c.name).collect::<Vec<_>>().join(",") + "\n";
    for r in results {
        for m in &r.modes {
            s += &columns
                .iter()
                .map(|c| (c.cell)(r, m))
                .collect::<Vec<_>>()
                .join(",");
            s += "\n";
        }
    }
    s
}

/// One column of the per-mode rows: its name, its width in the table (0: left-aligned
/// to 18), and how a mode's cell reads. The table's and the CSV's header and rows come
/// from the same lists, so they cannot drift apart.
pub(crate) struct Column {
    pub(crate) name: &'static str,
    width: usize,
    pub(crate) cell: Box<Cell>,
}

/// A mode's cell of a column, from the scenario's result and the mode's.
pub(crate) type Cell = dyn Fn(&ScenarioResult, &ModeResult) -> String;

/// A latency column: the CSV's name, the table's (None: not in the table), the value in
/// ms.
type LatencyColumn = (&'static str, Option<&'static str>, fn(&Latency) -> f64);

pub(crate) fn col(
    name: &'static str,
    width: usize,
    cell: impl Fn(&ScenarioResult, &ModeResult) -> String + 'static,
) -> Column {
    Column {
        name,
        width,
        cell: Box::new(cell),
    }
}

/// A table line: each cell padded to its column's width.
fn table_line<'a>(cells: impl Iterator<Item = (&'a Column, String)>) -> String {
    let padded: Vec<String> = cells
        .map(|(c, v)| match c.width {
            0 => format!("{v:<18}"),
            w => format!("{v:>w$}"),
        })
        .collect();
    padded.join(" ") + "\n"
}

fn unhappiness_cell(m: &ModeResult) -> String {
    m.unhappiness_ms
        .as_ref()
        .map_or("-".to_string(), |u| format!("{:.2}", u.mean))
}

/// Mode `m`'s batch throughput against unmanaged's, percent (None without an unmanaged
/// batch to compare with).
pub fn batch_vs_unmanaged(r: &ScenarioResult, m: &ModeResult) -> Option<f64> {
    let unmanaged = r
        .modes
        .iter()
        .find(|m| m.mode == Mode::Unmanaged)
        .map(|m| m.batch_throughput)?;
    (unmanaged > 0.0).then(|| 100.0 * m.batch_throughput / unmanaged)
}

/// The batch's throughput against unmanaged's, as the table shows it.
fn vs_unmanaged(r: &ScenarioResult, m: &ModeResult) -> String {
    match (m.mode, batch_vs_unmanaged(r, m)) {
        (Mode::Unloaded, _) => "-".to_string(),
        (_, Some(pct)) => format!("{pct:.1}%"),
        (_, None) => "?".into(),
    }
}

/// The latency columns, in order.
const LATENCIES: &[LatencyColumn] = &[
    ("mean_ms", Some("mean"), |l| l.mean),
    ("p50_ms", Some("p50"), |l| l.p50),
    ("p90_ms", Some("p90"), |l| l.p90),
    ("p95_ms", None, |l| l.p95),
    ("p99_ms", Some("p99"), |l| l.p99),
    ("p999_ms", Some("p99.9"), |l| l.p999),
    ("min_ms", None, |l| l.min),
    ("max_ms", Some("max"), |l| l.max),
];

/// A column of a number, formatted to `decimals`.
fn number(
    name: &'static str,
    width: usize,
    decimals: usize,
    value: impl Fn(&ModeResult) -> f64 + 'static,
) -> Column {
    col(name, width, move |_, m| format!("{:.decimals$}", value(m)))
}

pub(crate) fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

/// The table's columns.
pub(crate) fn table_columns() -> Vec<Column> {
    let mut c = vec![col("mode", 0, |_, m| m.mode.name().to_string())];
    for &(_, name, value) in LATENCIES {
        if let Some(name) = name {
            c.push(number(name, 7, 2, move |m| value(&m.latency_ms)));
        }
    }
    c.extend([
        col("req", 5, |_, m| m.requests.to_string()),
        col("unhappy", 9, |_, m| unhappiness_cell(m)),
        // Files compiled per second are few; work units are millions.
        col("batch/s", 12, |_, m| match m.batch_throughput < 100.0 {
            true => format!("{:.2}", m.batch_throughput),
            false => format!("{:.0}", m.batch_throughput),
        }),
        col("vs unm.", 8, vs_unmanaged),
        number("b.CPUs", 6, 2, |m| m.batch_cpus),
        number("util%", 6, 1, |m| m.cpu_util_pct),
    ]);
    c
}

/// The CSV's columns.
fn csv_columns() -> Vec<Column> {
    let mut c = vec![
        col("scenario", 0, |r, _| r.scenario.clone()),
        col("load_per_cpu", 0, |r, _| r.load_per_cpu.to_string()),
        col("mode", 0, |_, m| m.mode.name().to_string()),
        col("requests", 0, |_, m| m.requests.to_string()),
        col("lost", 0, |_, m| m.lost.to_string()),
    ];
    for &(name, _, value) in LATENCIES {
        c.push(number(name, 0, 3, move |m| value(&m.latency_ms)));
    }
    c.extend([
        number("max_min_ms", 0, 3, |m| m.max_min_ms),
        number("p95_min_ms", 0, 3, |m| m.p95_min_ms),
        col("unhappiness_mean_ms", 0, |_, m| unhappiness_cell(m)),
        number("requests_per_s", 0, 1, |m| m.requests_per_s),
        number("time_to_finish_s", 0, 3, |m| m.time_to_finish_s),
        number("time_per_request_ms", 0, 4, |m| m.time_per_request_ms),
        number("batch_throughput", 0, 1, |m| m.batch_throughput),
        number("cpu_util_pct", 0, 2, |m| m.cpu_util_pct),
        number("batch_cpus", 0, 3, |m| m.batch_cpus),
        col("batch_jain", 0, |_, m| {
            m.batch_jain.map_or(String::new(), |j| format!("{j:.4}"))
        }),
        col("late", 0, |_, m| opt(m.late)),
        col("late_for_cpu_loss", 0, |_, m| opt(m.late_for_cpu_loss)),
    ]);
    c
}

pub(crate) fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_latency(ls: &[&Latency]) -> Latency {
    let m = |f: fn(&Latency) -> f64| median_of(ls.iter().map(|l| f(l)).collect());
    Latency {
        mean: m(|l| l.mean),
        p50: m(|l| l.p50),
        p90: m(|l| l.p90),
        p95: m(|l| l.p95),
        p99: m(|l| l.p99),
        p999: m(|l| l.p999),
        min: m(|l| l.min),
        max: m(|l| l.max),
    }
}

/// Each metric's median over rounds of the same mode (one round: itself).
pub fn median(runs: &[ModeResult]) -> ModeResult {
    if runs.len() == 1 {
        return runs[0].clone();
    }
    let m = |f: fn(&ModeResult) -> f64| median_of(runs.iter().map(f).collect());
    let lat: Vec<&Latency> = runs.iter().map(|r| &r.latency_ms).collect();
    let unhappy: Vec<&Latency> = runs
        .iter()
        .filter_map(|r| r.unhappiness_ms.as_ref())
        .collect();
    let latency_ms = median_latency(&lat);
    ModeResult {
        mode: runs[0].mode,
        requests: runs.iter().map(|r| r.requests).sum::<u64>() / runs.len() as u64,
        lost: runs.iter().map(|r| r.lost).max().unwrap_or(0),
        batch_throughput: m(|r| r.batch_throughput),
        batch_cpus: m(|r| r.batch_cpus),
        batch_jain: runs
            .iter()
            .map(|r| r.batch_jain)
            .collect::<Option<Vec<f64>>>()
            .map(median_of),
        cpu_util_pct: m(|r| r.cpu_util_pct),
        unhappiness_ms: (unhappy.len() == runs.len()).then(|| median_latency(&unhappy)),
        late: runs
            .iter()
            .map(|r| r.late.map(|n| n as f64))
            .collect::<Option<Vec<f64>>>()
            .map(|v| median_of(v).round() as u64),
        late_for_cpu_loss: runs
            .iter()
            .map(|r| r.late_for_cpu_loss.map(|n| n as f64))
            .collect::<Option<Vec<f64>>>()
            .map(|v| median_of(v).round() as u64),
        max_min_ms: m(|r| r.max_min_ms),
        p95_min_ms: m(|r| r.p95_min_ms),
        requests_per_s: m(|r| r.requests_per_s),
        time_to_finish_s: m(|r| r.time_to_finish_s),
        time_per_request_ms: m(|r| r.time_per_request_ms),
        // Point by point, like every other metric.
        cdf_ms: (0..runs[0].cdf_ms.len())
            .map(|i| {
                let pct = runs[0].cdf_ms[i].0;
                (pct, median_of(runs.iter().map(|r| r.cdf_ms[i].1).collect()))
            })
            .collect(),
        frames: runs[0].frames.as_ref().map(|_| {
            let fr: Vec<&Frames> = runs.iter().filter_map(|r| r.frames.as_ref()).collect();
            Frames {
                fps: median_of(fr.iter().map(|f| f.fps).collect()),
                dropped: median_of(fr.iter().map(|f| f.dropped as f64).collect()) as u64,
                dropped_pct: median_of(fr.iter().map(|f| f.dropped_pct).collect()),
            }
        }),
        download_s: runs[0]
            .download_s
            .map(|_| median_of(runs.iter().filter_map(|r| r.download_s).collect())),
        analytic: runs[0].analytic.as_ref().map(|_| {
            let a: Vec<&Analytic> = runs.iter().filter_map(|r| r.analytic.as_ref()).collect();
            let med = |f: &dyn Fn(&Analytic) -> f64| median_of(a.iter().map(|x| f(x)).collect());
            Analytic {
                queries: med(&|x| x.queries as f64).round() as u64,
                failed: a.iter().map(|x| x.failed).sum(),
                p50_ms: med(&|x| x.p50_ms),
                max_ms: med(&|x| x.max_ms),
            }
        }),
        peer: runs.last().and_then(|r| r.peer.clone()),
        latency_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lat(x: f64) -> Latency {
        Latency {
            mean: x,
            p50: x,
            p90: x,
            p95: x,
            p99: x,
            p999: x,
            min: x,
            max: x,
        }
    }

    fn result(x: f64) -> ModeResult {
        ModeResult {
            mode: Mode::Appease,
            latency_ms: lat(x),
            requests: 100,
            lost: 0,
            batch_throughput: x * 10.0,
            batch_cpus: x / 10.0,
            batch_jain: None,
            cpu_util_pct: 99.0,
            unhappiness_ms: Some(lat(x / 2.0)),
            late: Some(x as u64),
            late_for_cpu_loss: Some(x as u64 / 2),
            max_min_ms: 0.0,
            p95_min_ms: 0.0,
            requests_per_s: 40.0,
            time_to_finish_s: x,
            time_per_request_ms: x / 100.0,
            cdf_ms: vec![(50.0, x), (99.0, 2.0 * x)],
            frames: Some(Frames {
                fps: x,
                dropped: x as u64,
                dropped_pct: x,
            }),
            download_s: Some(x / 10.0),
            analytic: Some(Analytic::new(vec![x * 30.0, x * 10.0, x * 20.0], 1)),
            peer: None,
        }
    }

    #[test]
    fn analytic_queries_give_their_median_and_slowest_and_none_is_zero() {
        let a = Analytic::new(vec![300.0, 100.0, 200.0, 400.0], 2);
        assert_eq!(
            (a.queries, a.failed, a.p50_ms, a.max_ms),
            (4, 2, 300.0, 400.0)
        );
        let none = Analytic::new(Vec::new(), 0);
        assert_eq!((none.queries, none.p50_ms, none.max_ms), (0, 0.0, 0.0));
    }

    #[test]
    fn median_over_rounds() {
        let m = median(&[result(5.0), result(9.0), result(6.0)]);
        assert_eq!(m.latency_ms, lat(6.0));
        assert_eq!(m.batch_throughput, 60.0);
        assert_eq!(m.batch_cpus, 0.6);
        assert_eq!(m.unhappiness_ms, Some(lat(3.0)));
        // Each round's median (x * 20) and slowest (x * 30), then their medians; the
        // failures of all rounds.
        let a = m.analytic.unwrap();
        assert_eq!(
            (a.queries, a.p50_ms, a.max_ms, a.failed),
            (3, 120.0, 180.0, 3)
        );
        assert_eq!(m.late, Some(6));
        assert_eq!(m.late_for_cpu_loss, Some(3));
        assert_eq!(m.cdf_ms, vec![(50.0, 6.0), (99.0, 12.0)]);
        assert_eq!(m.frames.as_ref().map(|f| f.dropped), Some(6));
        assert_eq!(m.download_s, Some(0.6));
        assert_eq!((m.time_to_finish_s, m.time_per_request_ms), (6.0, 0.06));
        let m = median(&[result(5.0), result(7.0)]);
        assert_eq!(m.latency_ms.p99, 6.0);
        assert!(median_of(vec![]).is_nan());
    }

    #[test]
    fn jain_over_the_jobs_is_the_median_of_the_rounds_that_have_it() {
        let with = |x: f64, j: Option<f64>| ModeResult {
            batch_jain: j,
            ..result(x)
        };
        let m = median(&[
            with(5.0, Some(0.5)),
            with(6.0, Some(0.9)),
            with(7.0, Some(0.99)),
        ]);
        assert_eq!(m.batch_jain, Some(0.9));
        assert_eq!(
            median(&[with(5.0, Some(0.5)), with(6.0, None)]).batch_jain,
            None
        );
    }

    /// A level stopped (Ctrl-C) before it measured anything is left out of the plots: its
    /// empty axis once made the SVG writer run without end.
    fn synthetic_params() -> Synthetic {
        Synthetic {
            server: "synthetic".into(),
            transport: "tcp".into(),
            cpu_ms: 5.0,
            rate_per_s: 40.0,
            arrivals: crate::client::Arrivals::Fixed,
            batch: crate::Batch::Soak,
            measure_s: 1.0,
            warmup_s: 1.0,
            rounds: 1,
        }
    }

    #[test]
    fn plots_leave_out_a_level_with_nothing_measured() {
        let params = synthetic_params();
        let level = |load: f64, modes: Vec<ModeResult>| ScenarioResult {
            scenario: "synthetic".into(),
            cpus: 2,
            load_per_cpu: load,
            soakers: 2,
            params: params.clone(),
            modes,
            not_run: Vec::new(),
        };
        let plots = crate::plot::all(&[level(1.0, vec![result(5.0)]), level(2.0, vec![])]).unwrap();
        let names: Vec<&str> = plots.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["cdf.svg"]);
        assert!(crate::plot::all(&[level(1.0, vec![])]).unwrap().is_empty());
    }

    #[test]
    fn the_csv_and_the_table_have_a_cell_under_every_column_name() {
        let r = ScenarioResult {
            scenario: "synthetic".into(),
            cpus: 2,
            load_per_cpu: 4.0,
            soakers: 8,
            params: synthetic_params(),
            modes: vec![result(5.0), result(6.0)],
            not_run: Vec::new(),
        };
        let text = csv(std::slice::from_ref(&r));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "scenario,load_per_cpu,mode,requests,lost,mean_ms,p50_ms,p90_ms,p95_ms,p99_ms,\
             p999_ms,min_ms,max_ms,max_min_ms,p95_min_ms,unhappiness_mean_ms,requests_per_s,\
             time_to_finish_s,time_per_request_ms,batch_throughput,cpu_util_pct,batch_cpus,\
             batch_jain,late,late_for_cpu_loss"
        );
        assert_eq!(lines.len(), 3);
        for row in &lines[1..] {
            assert_eq!(row.split(',').count(), 25, "{row}");
            assert!(row.starts_with("synthetic,4,"), "{row}");
        }
        let table = r.table();
        let header = table.lines().nth(1).unwrap();
        let names = "mode mean p50 p90 p99 p99.9 max req unhappy batch/s vs unm. b.CPUs util%";
        assert_eq!(
            header.split_whitespace().collect::<Vec<_>>().join(" "),
            names
        );
        let row = table.lines().nth(2).unwrap();
        assert_eq!(
            row.len(),
            header.len(),
            "cells as wide as their columns:\n{header}\n{row}"
        );
    }
}

#[cfg(test)]
mod frame_tests {
    use super::*;

    #[test]
    fn a_frame_later_than_its_period_or_never_decoded_is_dropped() {
        let mut h = Histogram::new_with_bounds(1, 600_000_000, 3).unwrap();
        for us in [10_000, 39_000, 40_000, 41_000, 90_000] {
            h.record(us).unwrap();
        }
        let r = ClientResult {
            latency_us: h,
            unhappiness_us: Histogram::new(3).unwrap(),
            late_for_cpu_loss: 0,
            sent: 6,
            answered: 5,
            elapsed: std::time::Duration::from_secs(2),
            finished: std::time::Duration::from_millis(1500),
        };
        // the Staircase study: 5 answers in 1.5 s from the first send to the last answer.
        let m = ModeResult::new(Mode::Appease, &r, 0.0, 50.0);
        assert_eq!(m.time_to_finish_s, 1.5);
        assert_eq!(m.time_per_request_ms, 300.0);
        assert_eq!(m.requests_per_s, 2.5);
        assert_eq!(m.max_min_ms, m.latency_ms.max - m.latency_ms.min);
        let f = Frames::new(&r, 25.0);
        // 41 and 90 ms are late; one frame never came back.
        assert_eq!(f.dropped, 3);
        assert_eq!(f.fps, 12.5);
        assert_eq!(f.dropped_pct, 50.0);
        // No unhappiness measured: no late count either.
        assert_eq!(m.late, None);
    }

    #[test]
    fn a_request_that_waited_a_millisecond_or_more_beyond_its_cpu_is_late() {
        let mut unhappy = Histogram::new_with_bounds(1, 600_000_000, 3).unwrap();
        for us in [40, 90, 999, 1_000, 4_100, 30_000] {
            unhappy.record(us).unwrap();
        }
        let r = ClientResult {
            latency_us: unhappy.clone(),
            unhappiness_us: unhappy,
            late_for_cpu_loss: 1,
            sent: 6,
            answered: 6,
            elapsed: std::time::Duration::from_secs(1),
            finished: std::time::Duration::from_secs(1),
        };
        let m = ModeResult::new(Mode::Appease, &r, 0.0, 50.0);
        assert_eq!(m.late, Some(3));
        assert_eq!(m.late_for_cpu_loss, Some(1), "as the client counted it");
    }
}
