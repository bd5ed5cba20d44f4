//! Results: the interface contract's JSON, and a side-by-side text table.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::ClientResult;
use crate::{Mode, Synthetic};

#[derive(Clone, Debug, Serialize)]
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

#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    pub mode: Mode,
    pub latency_ms: Latency,
    pub requests: u64,
    /// Requests sent but not answered before the run ended.
    pub lost: u64,
    /// Work units (1,000 loop iterations) per second, all soakers together.
    pub batch_throughput: f64,
    pub cpu_util_pct: f64,
    /// seeds/004 unhappiness: time waited beyond the CPU the request needed, ms.
    pub unhappiness_ms: Option<Latency>,
    /// seeds/003 spreads.
    pub max_min_ms: f64,
    pub p95_min_ms: f64,
    pub requests_per_s: f64,
}

impl ModeResult {
    pub fn new(mode: Mode, r: &ClientResult, batch_throughput: f64, cpu_util_pct: f64) -> Self {
        let latency_ms = Latency::from_us(&r.latency_us);
        ModeResult {
            mode,
            requests: r.answered,
            lost: r.sent.saturating_sub(r.answered),
            batch_throughput,
            cpu_util_pct,
            unhappiness_ms: (!r.unhappiness_us.is_empty())
                .then(|| Latency::from_us(&r.unhappiness_us)),
            max_min_ms: latency_ms.max - latency_ms.min,
            p95_min_ms: latency_ms.p95 - latency_ms.min,
            requests_per_s: r.answered as f64 / r.elapsed.as_secs_f64().max(1e-9),
            latency_ms,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub cpus: usize,
    pub load_per_cpu: f64,
    pub soakers: usize,
    pub params: Synthetic,
    pub modes: Vec<ModeResult>,
}

impl ScenarioResult {
    /// The side-by-side table, with ratios against `unloaded` and `unmanaged`.
    pub fn table(&self) -> String {
        let p = &self.params;
        let server = if p.server == "nginx" {
            "nginx from Debian (1 worker) serving 200 static files of 0.5-16 KiB".to_string()
        } else {
            format!(
                "one single-threaded server ({} ms CPU per request)",
                p.cpu_ms
            )
        };
        let mut s = format!(
            "{}: {server}, {} req/s open loop over {}, {} soakers ({} per CPU) on {} CPUs, {} s per mode\n",
            self.scenario,
            p.rate_per_s,
            p.transport.to_uppercase(),
            self.soakers,
            self.load_per_cpu,
            self.cpus,
            p.measure_s
        );
        s += &format!(
            "{:<18} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5} {:>9} {:>12} {:>8} {:>6}\n",
            "mode",
            "mean",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "req",
            "unhappy",
            "batch/s",
            "vs unm.",
            "util%"
        );
        let unmanaged = self
            .modes
            .iter()
            .find(|m| m.mode == Mode::Unmanaged)
            .map(|m| m.batch_throughput);
        for m in &self.modes {
            let l = &m.latency_ms;
            let vs = match (unmanaged, m.mode) {
                (_, Mode::Unloaded) => "-".to_string(),
                (Some(u), _) if u > 0.0 => format!("{:.1}%", 100.0 * m.batch_throughput / u),
                _ => "?".into(),
            };
            s += &format!(
                "{:<18} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>5} {:>9} {:>12.0} {:>8} {:>6.1}\n",
                m.mode.name(),
                l.mean,
                l.p50,
                l.p90,
                l.p99,
                l.p999,
                l.max,
                m.requests,
                m.unhappiness_ms.as_ref().map_or("-".to_string(), |u| format!("{:.2}", u.mean)),
                m.batch_throughput,
                vs,
                m.cpu_util_pct
            );
        }
        s += "latency and unhappiness (mean, beyond the request's own CPU) in ms; batch/s = soaker work units per second\n";
        s
    }
}

/// One CSV row per (load, mode).
pub fn csv(results: &[ScenarioResult]) -> String {
    let mut s = String::from(
        "scenario,load_per_cpu,mode,requests,lost,mean_ms,p50_ms,p90_ms,p95_ms,p99_ms,p999_ms,\
         min_ms,max_ms,unhappiness_mean_ms,batch_throughput,cpu_util_pct\n",
    );
    for r in results {
        for m in &r.modes {
            let l = &m.latency_ms;
            s += &format!(
                "{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.1},{:.2}\n",
                r.scenario,
                r.load_per_cpu,
                m.mode.name(),
                m.requests,
                m.lost,
                l.mean,
                l.p50,
                l.p90,
                l.p95,
                l.p99,
                l.p999,
                l.min,
                l.max,
                m.unhappiness_ms.as_ref().map_or("-".to_string(), |u| format!("{:.2}", u.mean)),
                m.batch_throughput,
                m.cpu_util_pct
            );
        }
    }
    s
}
