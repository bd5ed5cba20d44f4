//! Prometheus metrics at `http://ADDR/metrics`, in the text format node_exporter serves;
//! off unless `--metrics ADDR` or `[metrics] listen` names an address. What happens on
//! the request path (requests, elevations, restores, their latency) is counted by the
//! event loop as it happens, a few atomic adds; the rest is copied from each state the
//! loop publishes, once a second. A thread of its own answers scrapes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use appease_policy::Reason;
use appease_probe::Family;

use crate::status::Status;

/// Read -> elevation latency buckets, seconds: 10 µs to 100 ms.
const LATENCY_BUCKETS: &[f64] = &[
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3,
];

/// Socket families as the requests counter labels them, in [`family_index`] order.
const FAMILIES: [&str; 4] = ["unix", "inet", "inet6", "other"];

fn family_index(f: Family) -> usize {
    match f {
        Family::Unix => 0,
        Family::Inet => 1,
        Family::Inet6 => 2,
        Family::Other(_) => 3,
    }
}

pub struct Metrics {
    registry: Registry,
    /// The labelled counters the request path moves, resolved once: an atomic add each,
    /// no label lookup (indexed by [`family_index`] and `Reason as usize`).
    requests: Vec<IntCounter>,
    elevations: Vec<IntCounter>,
    restores: Vec<IntCounter>,
    latency: Histogram,
    socket_reads: IntCounter,
    lost_events: IntCounter,
    response_reads: IntCounter,
    demotions: IntCounter,
    promotions: IntCounter,
    floor_engagements: IntCounter,
    scans_raised: IntCounter,
    failures: IntCounterVec,
    threads: IntGaugeVec,
    processes: IntGaugeVec,
    group_mode: IntGaugeVec,
    group_share: Gauge,
    runnable: Gauge,
    pressure: Gauge,
    ladder_step: IntGauge,
    scan_seconds: Gauge,
    scan_processes: IntGauge,
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid metric")
}

fn gauge(name: &str, help: &str) -> Gauge {
    Gauge::new(name, help).expect("valid metric")
}

fn int_gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric")
}

fn counter_vec(name: &str, help: &str, label: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric")
}

fn gauge_vec(name: &str, help: &str, label: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric")
}

impl Metrics {
    pub fn new() -> Self {
        let requests = counter_vec(
            "requests_total",
            "Request reads the probe reported, by socket family.",
            "family",
        );
        let elevations = counter_vec(
            "elevations_total",
            "Priority changes of request-receiving threads: raises and their fading steps, and long requests set below their own nice (reason long-request), by reason.",
            "reason",
        );
        let restores = counter_vec(
            "restores_total",
            "Threads given their own priority back, by reason.",
            "reason",
        );
        let by_reason = |v: &IntCounterVec| -> Vec<IntCounter> {
            Reason::ALL
                .iter()
                .map(|r| v.with_label_values(&[r.as_str()]))
                .collect()
        };
        let m = Metrics {
            registry: Registry::new_custom(Some("appease".into()), None).expect("valid prefix"),
            requests: FAMILIES
                .iter()
                .map(|f| requests.with_label_values(&[f]))
                .collect(),
            elevations: by_reason(&elevations),
            restores: by_reason(&restores),
            latency: Histogram::with_opts(
                HistogramOpts::new(
                    "elevation_latency_seconds",
                    "Time from a request's socket read in the kernel to its thread's elevation, for requests that woke the daemon.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
            socket_reads: counter("socket_reads_total", "Socket reads the probe saw (before its per-thread rate limit)."),
            lost_events: counter("probe_lost_events_total", "Probe events lost to a full ring buffer."),
            response_reads: counter("response_reads_total", "Reads on the side of a connection its process connected (a client's), past the per-thread rate limit: responses, never requests."),
            demotions: counter("demotions_total", "Processes moved to the idle class (or their threads made SCHED_IDLE)."),
            promotions: counter("promotions_total", "Processes brought back from the idle class."),
            floor_engagements: counter("starvation_floor_engagements_total", "Times the idle group's idle flag was lifted because batch work starved."),
            scans_raised: counter("scans_raised_total", "Scans raised from the idle class to the normal one: normal-class work kept every CPU busy."),
            failures: counter_vec(
                "actuator_failures_total",
                "Changes the kernel or systemd refused, by errno name (or journal, systemd).",
                "cause",
            ),
            threads: gauge_vec(
                "threads",
                "Threads whose priority appease holds changed now: latency (elevated) or role (fixed).",
                "class",
            ),
            processes: gauge_vec(
                "processes",
                "Processes in appease's groups now: batch (idle class) or latency (a service).",
                "class",
            ),
            group_mode: gauge_vec(
                "batch_group_mode",
                "The idle group's mode: 1 for the current one of idle, quiet and floor.",
                "mode",
            ),
            group_share: gauge("batch_group_cpu_share_ratio", "Share of all CPUs the idle group got over the last scan (0 to 1)."),
            runnable: gauge("load_runnable_per_cpu", "Runnable tasks per CPU, smoothed over about a second: the load ladder's input."),
            pressure: gauge("cpu_pressure_some_ratio", "Share of the last second with a task waiting for a CPU (PSI some, 0 to 1)."),
            ladder_step: int_gauge("ladder_step", "The load ladder's step in force (0: uncontended, nothing elevated)."),
            scan_seconds: gauge("scan_duration_seconds", "CPU time of the last process scan (reading and classifying)."),
            scan_processes: int_gauge("scan_processes", "Processes the last scan read."),
        };
        m.register([Box::new(requests), Box::new(elevations), Box::new(restores)]);
        // Every label value known up front: a series at 0 rather than none at all.
        for class in ["latency", "role"] {
            m.threads.with_label_values(&[class]);
        }
        for class in ["batch", "latency"] {
            m.processes.with_label_values(&[class]);
        }
        m
    }

    /// Registers every metric of `self`, with the vectors `with` whose series `self`
    /// holds one by one.
    fn register(&self, with: [Box<dyn prometheus::core::Collector>; 3]) {
        let own: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.latency.clone()),
            Box::new(self.socket_reads.clone()),
            Box::new(self.lost_events.clone()),
            Box::new(self.response_reads.clone()),
            Box::new(self.demotions.clone()),
            Box::new(self.promotions.clone()),
            Box::new(self.floor_engagements.clone()),
            Box::new(self.scans_raised.clone()),
            Box::new(self.failures.clone()),
            Box::new(self.threads.clone()),
            Box::new(self.processes.clone()),
            Box::new(self.group_mode.clone()),
            Box::new(self.group_share.clone()),
            Box::new(self.runnable.clone()),
            Box::new(self.pressure.clone()),
            Box::new(self.ladder_step.clone()),
            Box::new(self.scan_seconds.clone()),
            Box::new(self.scan_processes.clone()),
        ];
        for c in with.into_iter().chain(own) {
            self.registry
                .register(c)
                .expect("each metric registered once");
        }
    }

    /// A request read, by socket family.
    pub fn request(&self, family: Family) {
        self.requests[family_index(family)].inc();
    }

    pub fn elevated(&self, reason: Reason) {
        self.elevations[reason as usize].inc();
    }

    pub fn restored(&self, reason: Reason) {
        self.restores[reason as usize].inc();
    }

    pub fn elevation_latency(&self, us: u64) {
        self.latency.observe(us as f64 / 1e6);
    }

    /// Copies what the published state holds.
    pub fn update(&self, st: &Status) {
        raise_to(&self.socket_reads, st.probe.socket_reads);
        raise_to(&self.lost_events, st.probe.lost_events);
        raise_to(&self.response_reads, st.probe.response_reads);
        raise_to(&self.demotions, st.actuator.demotions);
        raise_to(&self.promotions, st.actuator.promotions);
        for (cause, &n) in &st.actuator.failures_by_cause {
            raise_to(&self.failures.with_label_values(&[cause]), n);
        }
        for class in ["latency", "role"] {
            let n = st.threads.iter().filter(|t| t.class == class).count();
            self.threads.with_label_values(&[class]).set(n as i64);
        }
        for class in ["batch", "latency"] {
            let n = st.processes.iter().filter(|p| p.class == class).count();
            self.processes.with_label_values(&[class]).set(n as i64);
        }
        self.runnable.set(st.load.runnable_per_cpu);
        self.pressure.set(st.load.psi_some_pct / 100.0);
        self.ladder_step.set(st.load.ladder_step as i64);
        if let Some(b) = &st.batch {
            raise_to(&self.floor_engagements, b.floor_lifts);
            raise_to(&self.scans_raised, b.scans_raised);
            self.group_share.set(b.share_pct / 100.0);
            let now = b.mode.map(|m| format!("{m:?}").to_lowercase());
            for mode in ["idle", "quiet", "floor"] {
                let on = now.as_deref() == Some(mode);
                self.group_mode.with_label_values(&[mode]).set(on as i64);
            }
            self.scan_seconds.set(b.scan.cpu_us as f64 / 1e6);
            self.scan_processes.set(b.scan.processes as i64);
        }
    }

    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _in_memory = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A counter that mirrors a count kept elsewhere (which only grows).
fn raise_to(c: &IntCounter, value: u64) {
    let now = c.get();
    if value > now {
        c.inc_by(value - now);
    }
}

/// The HTTP server: `/metrics` and nothing else.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Self> {
        let server = Arc::new(
            tiny_http::Server::http(addr)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("listening on {addr} for metrics"))?,
        );
        let thread = {
            let server = server.clone();
            std::thread::Builder::new()
                .name("appease-metrics".into())
                .spawn(move || serve(&server, &metrics))?
        };
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
        Ok(MetricsServer {
            server,
            thread: Some(thread),
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, metrics: &Metrics) {
    for req in server.incoming_requests() {
        let response = match (req.method(), req.url()) {
            (tiny_http::Method::Get, "/metrics") => {
                let header = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    TextEncoder::new().format_type().as_bytes(),
                )
                .expect("a valid header");
                tiny_http::Response::from_data(metrics.render()).with_header(header)
            }
            _ => tiny_http::Response::from_data(&b"appease: metrics are at /metrics\n"[..])
                .with_status_code(404),
        };
        let _client_gone = req.respond(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchView;
    use crate::status::ThreadStatus;

    #[test]
    fn counters_follow_the_state_and_never_go_back() {
        let m = Metrics::new();
        m.request(Family::Unix);
        m.request(Family::Inet);
        m.request(Family::Inet);
        m.elevated(Reason::UnixRequest);
        m.restored(Reason::Faded);
        m.elevation_latency(40);
        let mut st = Status::default();
        st.probe.socket_reads = 7;
        st.actuator.failures_by_cause.insert("EPERM".into(), 2);
        st.load.psi_some_pct = 25.0;
        st.batch = Some(BatchView {
            share_pct: 40.0,
            floor_lifts: 3,
            ..Default::default()
        });
        st.threads.push(ThreadStatus {
            pid: 1,
            tid: 1,
            comm: "x".into(),
            class: "latency".into(),
            nice: -3,
            original_nice: 0,
            levels: 3,
            slice_us: 500,
            budget_ms: 1.0,
            why: "unix-request".into(),
            since: 0,
        });
        m.update(&st);
        st.probe.socket_reads = 5; // a count never goes down
        m.update(&st);
        let text = String::from_utf8(m.render()).unwrap();
        for line in [
            "appease_requests_total{family=\"inet\"} 2",
            "appease_requests_total{family=\"inet6\"} 0",
            "appease_elevations_total{reason=\"unix-request\"} 1",
            "appease_restores_total{reason=\"faded\"} 1",
            "appease_elevation_latency_seconds_bucket{le=\"0.00005\"} 1",
            "appease_elevation_latency_seconds_count 1",
            "appease_socket_reads_total 7",
            "appease_actuator_failures_total{cause=\"EPERM\"} 2",
            "appease_cpu_pressure_some_ratio 0.25",
            "appease_batch_group_cpu_share_ratio 0.4",
            "appease_starvation_floor_engagements_total 3",
            "appease_threads{class=\"latency\"} 1",
            "# TYPE appease_elevation_latency_seconds histogram",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }
}
