//! A simulated closed-loop client sweep (`appease sim sweep`): the Staircase study's
//! scalability test, run on the simulator so that its O(1) and Staircase policies can be
//! set beside the study's findings and beside the kernel's.
//!
//! The workload file names the server and one closed-loop customer; for N clients the
//! sweep gives the server N instances and the customer N copies, one per instance (as
//! Apache's workers and PostgreSQL's backends each serve one connection), which share a
//! fixed number of requests. Everything else in the file (batch hogs, groups, other
//! customers) runs as written. Completion time is the last answer of the sweep's clients.

use appease_model::scalability::{self, Scalability, Spread};
use serde::Serialize;
use toml::Spanned;

use crate::workload::{Arrivals, Workload};

/// The study's figures for one client count under one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepPoint {
    pub clients: u32,
    /// From the start of the run to the last of the clients' answers.
    pub completion_ms: f64,
    /// Requests answered per second of completion time.
    pub per_s: f64,
    #[serde(flatten)]
    pub spread: Spread,
}

#[derive(Clone, Debug, Serialize)]
pub struct SweepSeries {
    pub policy: String,
    pub points: Vec<SweepPoint>,
    pub scalability: Scalability,
}

#[derive(Clone, Debug, Serialize)]
pub struct SweepReport {
    /// The closed-loop customer and the server it sends to.
    pub customer: String,
    pub server: String,
    /// Requests per run, shared by the clients.
    pub requests: u64,
    pub clients: Vec<u32>,
    pub series: Vec<SweepSeries>,
}

/// The sweep's customer and server, by index; one error naming what is wrong otherwise.
fn closed_customer(w: &Workload) -> Result<(usize, usize), String> {
    let closed: Vec<usize> = (0..w.customer.len())
        .filter(|&c| matches!(w.customer[c].arrivals, Arrivals::Closed { .. }))
        .collect();
    let [c] = closed[..] else {
        return Err(format!(
            "a client sweep needs exactly one customer with closed-loop arrivals \
             (arrivals = {{ kind = \"closed\", think_ms = … }}); the workload has {}",
            closed.len()
        ));
    };
    let server = w.customer[c].to.get_ref();
    let s = w.index_of(server).expect("checked when loaded");
    if w.process[s].count != 1 {
        return Err(format!(
            "the closed-loop customer's server {server:?} must have count = 1: the sweep \
             gives each client an instance of its own"
        ));
    }
    let called = w
        .process
        .iter()
        .flat_map(|p| p.serve.iter())
        .flat_map(|sv| &sv.calls);
    if called.clone().any(|call| call.to.get_ref() == server) {
        return Err(format!(
            "{server:?} is called by another process: the sweep can only multiply a server \
             that customers alone send to"
        ));
    }
    Ok((c, s))
}

/// `w` with `clients` instances of the server, each with a client of its own, sharing
/// `requests` requests.
fn with_clients(w: &Workload, c: usize, s: usize, clients: u32, requests: u64) -> Workload {
    let mut out = w.clone();
    let server = w.process[s].clone();
    let customer = w.customer[c].clone();
    let name = server.name.get_ref().clone();
    out.process.remove(s);
    out.customer.remove(c);
    let n = clients as u64;
    for i in 0..n {
        let mut p = server.clone();
        p.name = Spanned::new(0..0, format!("{name}#{i}"));
        out.process.push(p);
        let mut k = customer.clone();
        k.name = format!("{}#{i}", customer.name);
        k.to = Spanned::new(0..0, format!("{name}#{i}"));
        // The remainder to the first clients: exactly `requests` in all.
        k.max_requests = Some(requests / n + u64::from(i < requests % n));
        out.customer.push(k);
    }
    out
}

/// Runs the sweep under every policy in `policies`; `base` as in the scalability formula.
pub fn sweep(
    w: &Workload,
    clients: &[u32],
    requests: u64,
    policies: &[&str],
    base: Option<u32>,
) -> Result<SweepReport, String> {
    let (c, s) = closed_customer(w)?;
    if clients.is_empty() || clients.contains(&0) {
        return Err("give one or more client counts, each at least 1".into());
    }
    if let Some(&bad) = clients.iter().find(|&&n| n as u64 > requests) {
        return Err(format!(
            "{bad} clients cannot share {requests} requests: give more requests"
        ));
    }
    let mut series = Vec::new();
    for &policy in policies {
        let mut points = Vec::new();
        for &n in clients {
            let wn = with_clients(w, c, s, n, requests);
            let r = crate::run(&wn, Some(policy))?;
            // The sweep's customers are the last n.
            let first = wn.customer.len() - n as usize;
            let mut rt: Vec<f64> = Vec::new();
            let mut last = 0.0f64;
            for rec in r.records.iter().filter(|x| x.customer >= first) {
                rt.push(rec.response_ms);
                last = last.max(rec.arrive_ms + rec.response_ms);
            }
            if (rt.len() as u64) < requests {
                return Err(format!(
                    "{policy}, {n} clients: {} of {requests} requests answered within the \
                     simulated {} ms: raise duration_ms",
                    rt.len(),
                    w.sim.duration_ms
                ));
            }
            rt.sort_by(f64::total_cmp);
            let (min, p95, max) = (rt[0], crate::nearest_rank(&rt, 95.0), rt[rt.len() - 1]);
            points.push(SweepPoint {
                clients: n,
                completion_ms: last,
                per_s: rt.len() as f64 / (last / 1e3).max(1e-9),
                spread: Spread::new(min, p95, max),
            });
        }
        let times: Vec<(u32, f64)> = points
            .iter()
            .map(|p| (p.clients, p.completion_ms))
            .collect();
        let scalability = scalability::scalability(&times, base).map_err(|e| e.to_string())?;
        series.push(SweepSeries {
            policy: policy.to_string(),
            points,
            scalability,
        });
    }
    Ok(SweepReport {
        customer: w.customer[c].name.clone(),
        server: w.process[s].name.get_ref().clone(),
        requests,
        clients: clients.to_vec(),
        series,
    })
}

/// One line per policy and client count.
pub fn table(r: &SweepReport) -> String {
    let mut s = format!(
        "{:<12} {:>7} {:>13} {:>9}{} {:>7}\n",
        "policy",
        "clients",
        "completion ms",
        "per s",
        Spread::headings(),
        "scal."
    );
    for series in &r.series {
        for p in &series.points {
            let scal = if series.scalability.base == p.clients {
                "base".to_string()
            } else {
                format!("{:.3}", series.scalability.values[&p.clients])
            };
            s += &format!(
                "{:<12} {:>7} {:>13.1} {:>9.1}{} {:>7}\n",
                series.policy,
                p.clients,
                p.completion_ms,
                p.per_s,
                p.spread.columns(),
                scal
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[sim]
cpus = 1
duration_ms = 5000
seed = 3

[[process]]
name = "hog"
count = 2
behavior = "cpu-bound"

[[process]]
name = "web"
serve = { cpu_ms = 1.0 }

[[customer]]
name = "ab"
to = "web"
arrivals = { kind = "closed", think_ms = 0.0 }
"#;

    #[test]
    fn clients_share_the_requests_each_with_a_server_of_its_own() {
        let w = Workload::parse(FILE, "t.toml").unwrap();
        let (c, s) = closed_customer(&w).unwrap();
        let w4 = with_clients(&w, c, s, 4, 10);
        let sent: Vec<u64> = w4
            .customer
            .iter()
            .map(|k| k.max_requests.unwrap())
            .collect();
        assert_eq!(sent, [3, 3, 2, 2]);
        let targets: Vec<&str> = w4
            .customer
            .iter()
            .map(|k| k.to.get_ref().as_str())
            .collect();
        assert_eq!(targets, ["web#0", "web#1", "web#2", "web#3"]);
        assert_eq!(w4.process.len(), 5); // the hogs and four servers
    }

    #[test]
    fn on_one_cpu_with_hogs_more_clients_finish_sooner_under_cfs() {
        // Each runnable server instance weighs as much as a hog: with 2 clients the
        // servers get half the CPU, with 8 four fifths, so the fixed work ends sooner.
        let w = Workload::parse(FILE, "t.toml").unwrap();
        let r = sweep(&w, &[2, 8], 1000, &["cfs"], None).unwrap();
        let p = &r.series[0].points;
        assert!(p[1].completion_ms < p[0].completion_ms, "{p:?}");
        // A thousand 1 ms requests need a second of CPU at least.
        assert!(p[1].completion_ms >= 1000.0);
        let sc = &r.series[0].scalability;
        assert_eq!(sc.base, 8);
        let expect = (p[0].completion_ms / p[1].completion_ms) / (2.0 / 8.0);
        assert!((sc.values[&2] - expect).abs() < 1e-9);
    }

    #[test]
    fn bad_sweeps_are_refused_with_the_reason() {
        let w = Workload::parse(FILE, "t.toml").unwrap();
        let e = sweep(&w, &[2], 1000, &["cfs"], Some(4)).unwrap_err();
        assert!(e.contains("scale base 4"), "{e}");
        let e = sweep(&w, &[2000], 1000, &["cfs"], None).unwrap_err();
        assert!(e.contains("cannot share"), "{e}");
        let e = sweep(&w, &[2], 100_000, &["cfs"], None).unwrap_err();
        assert!(e.contains("raise duration_ms"), "{e}");
        let open = FILE.replace(
            r#"{ kind = "closed", think_ms = 0.0 }"#,
            r#"{ kind = "poisson", rate_per_s = 10.0 }"#,
        );
        let w = Workload::parse(&open, "t.toml").unwrap();
        let e = sweep(&w, &[2], 10, &["cfs"], None).unwrap_err();
        assert!(
            e.contains("exactly one customer with closed-loop arrivals"),
            "{e}"
        );
    }
}
