//! The 2010 customer-appeasement paper's closed forms for the unhappiness one request causes (eqs. 6–27), evaluated
//! as the paper prints them. Two scenarios on one CPU with N − 1 CPU-bound processes:
//! *one request* needing τ of CPU, and *a service call*: the server computes τ1, calls a
//! sleeping service that computes τ2, then computes τ3 and answers (α = 0).
//!
//! The forms are the paper's approximations, not exact schedules: some count one
//! quantum less per round than a real queue, eq. 12 can go negative, eqs. 18 and 26 mix
//! counts with times. `appease sim` gives the exact values; docs/sim.md compares both.

use serde::Serialize;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ParamError {
    #[error("--processes must be at least 2: the server and one other process (got {0})")]
    Processes(u32),
    #[error("{what} must be a positive number of ms (got {value})")]
    NotPositive { what: &'static str, value: f64 },
    #[error("--nice must be an elevation from 1 to 15, as in the paper (got {0})")]
    Nice(u32),
    #[error("--tau-ms takes three times, τ1,τ2,τ3 (got {0})")]
    Tau(usize),
}

/// The scenario's parameters; times in ms.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Params {
    /// N: runnable processes including the one serving the request.
    pub processes: u32,
    /// q: the round-robin quantum and the base quantum of the feedback queues.
    pub quantum_ms: f64,
    /// CFS's sched_latency (sch_lat).
    pub sched_latency_ms: f64,
    /// τ of the one-request scenario.
    pub request_ms: f64,
    /// τ1, τ2, τ3 of the service-call scenario.
    pub tau_ms: [f64; 3],
    /// The elevation RBPE applies (the paper's −nice, as a positive level).
    pub nice: u32,
    /// a_i: processes in feedback queue Q_i when the request arrives, the server
    /// included; queues past the end of the list hold only the server (a_i = 1).
    pub queues: Vec<u32>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            processes: 5,
            quantum_ms: 10.0,
            sched_latency_ms: 20.0,
            request_ms: 30.0,
            tau_ms: [20.0, 20.0, 10.0],
            nice: 5,
            queues: Vec::new(),
        }
    }
}

/// One closed form's value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub policy: &'static str,
    /// "one request" or "service call".
    pub scenario: &'static str,
    /// The paper's equation numbers.
    pub equations: &'static str,
    /// None where the paper's form does not apply to these parameters.
    pub unhappiness_ms: Option<f64>,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unhappiness {
    pub params: Params,
    pub rows: Vec<Row>,
}

/// Quanta a time needs: Z = ⌈τ / q⌉ (at least one).
fn quanta(tau: f64, q: f64) -> f64 {
    (tau / q - 1e-9).ceil().max(1.0)
}

/// The last feedback queue a process needing Z quanta reaches: the smallest x with
/// Σ_{i≤x} 2^i ≥ Z, i.e. eq. 11's log2(Z + 1) − 1 rounded up.
fn last_queue(z: f64) -> u32 {
    let mut x = 0;
    while 2f64.powi(x as i32 + 1) - 1.0 < z {
        x += 1;
    }
    x
}

/// Eq. 12 as printed: q(Σ_{i=0}^{x} 2^i (a_i − 1) − 2^x).
fn mlfq(p: &Params, tau: f64) -> f64 {
    let x = last_queue(quanta(tau, p.quantum_ms));
    let a = |i: u32| p.queues.get(i as usize).copied().unwrap_or(1) as f64;
    let waits: f64 = (0..=x).map(|i| 2f64.powi(i as i32) * (a(i) - 1.0)).sum();
    p.quantum_ms * (waits - 2f64.powi(x as i32))
}

/// Eq. 23's part for one segment: Σ_{i=0}^{Z−2} (N − 1) sch_lat / (N − 1 + 1.25^(nice − i)).
fn rbpe_part(p: &Params, z: f64) -> f64 {
    let others = p.processes as f64 - 1.0;
    (0..(z as i64 - 1).max(0))
        .map(|i| others * p.sched_latency_ms / (others + 1.25f64.powf(p.nice as f64 - i as f64)))
        .sum()
}

/// Eqs. 17/24 and 20/25: zero when the request fits in the first slice, else no form.
fn first_slice(tau: f64, slice: f64, name: &str, at: &str) -> (Option<f64>, String) {
    if tau <= slice {
        (
            Some(0.0),
            format!("τ ≤ {name} = {slice:.3} ms{at}: answered within the first slice"),
        )
    } else {
        (
            None,
            format!("τ > {name} = {slice:.3} ms{at}: the paper gives no form for this case"),
        )
    }
}

/// Each parameter within what the closed forms take.
fn check(p: &Params) -> Result<(), ParamError> {
    if p.processes < 2 {
        return Err(ParamError::Processes(p.processes));
    }
    for (what, value) in [
        ("--quantum-ms", p.quantum_ms),
        ("--sched-latency-ms", p.sched_latency_ms),
        ("--request-ms", p.request_ms),
        ("--tau-ms τ1", p.tau_ms[0]),
        ("--tau-ms τ2", p.tau_ms[1]),
        ("--tau-ms τ3", p.tau_ms[2]),
    ] {
        if !(value > 0.0 && value.is_finite()) {
            return Err(ParamError::NotPositive { what, value });
        }
    }
    if !(1..=15).contains(&p.nice) {
        return Err(ParamError::Nice(p.nice));
    }
    Ok(())
}

/// The unhappiness a request causes under each policy, by the closed forms.
pub fn evaluate(p: &Params) -> Result<Unhappiness, ParamError> {
    check(p)?;
    let n = p.processes as f64;
    let q = p.quantum_ms;
    let tau: f64 = p.tau_ms.iter().sum();
    let zs = p.tau_ms.map(|t| quanta(t, q));
    let mut rows = Vec::new();
    let mut row = |policy, scenario, equations, v: Option<f64>, note: String| {
        rows.push(Row {
            policy,
            scenario,
            equations,
            unhappiness_ms: v,
            note,
        })
    };

    // Round robin.
    let z = quanta(p.request_ms, q);
    row(
        "rr",
        "one request",
        "6, 8",
        Some(q * (z * (n - 2.0) + 1.0)),
        format!("Z = {z} quanta"),
    );
    row(
        "rr",
        "service call",
        "7, 9",
        Some(q * ((zs[0] + zs[1] + zs[2]) * (n - 2.0) + 3.0)),
        format!("Z1, Z2, Z3 = {}, {}, {} quanta", zs[0], zs[1], zs[2]),
    );

    // Feedback queues.
    row(
        "mlfq",
        "one request",
        "11, 12",
        Some(mlfq(p, p.request_ms)),
        format!("reaches Q{}", last_queue(z)),
    );
    row(
        "mlfq",
        "service call",
        "13",
        Some(p.tau_ms.iter().map(|&t| mlfq(p, t)).sum()),
        "eq. 12 for each of the three parts".into(),
    );

    // CFS.
    let slice = p.sched_latency_ms / n;
    let (v, note) = first_slice(p.request_ms, slice, "q(N)", "");
    row("cfs", "one request", "14, 17, 24", v, note);
    row(
        "cfs",
        "service call",
        "18",
        Some((n - 1.0) * (tau / slice - 3.0) - tau),
        format!("q(N) = {slice:.3} ms; the first term counts slices, not ms"),
    );
    row(
        "cfs",
        "service call",
        "26",
        Some((n - 1.0) * (tau / p.sched_latency_ms - 3.0) - tau),
        "eq. 18 as eq. 26 reprints it, with sch_lat where eq. 18 has q(N)".into(),
    );

    // CFS with request-based priority elevation.
    let boost = 1.25f64.powf(p.nice as f64);
    let elevated = boost * p.sched_latency_ms / (n - 1.0 + boost);
    let at = format!(" at nice −{}", p.nice);
    let (v, note) = first_slice(p.request_ms, elevated, "q(Pj, N)", &at);
    row("cfs-rbpe", "one request", "19, 20, 25", v, note);
    let rz = p.tau_ms.map(|t| quanta(t, elevated));
    let assumption = if rz.iter().any(|&z| z > p.nice as f64 + 1.0) {
        format!("; the paper assumes Z ≤ nice + 1 = {}", p.nice + 1)
    } else {
        String::new()
    };
    row(
        "cfs-rbpe",
        "service call",
        "23, 27",
        Some(rz.iter().map(|&z| rbpe_part(p, z)).sum::<f64>() - tau),
        format!(
            "Z1, Z2, Z3 = {}, {}, {} elevated slices of {elevated:.3} ms{assumption}",
            rz[0], rz[1], rz[2]
        ),
    );
    Ok(Unhappiness {
        params: p.clone(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(u: &Unhappiness, policy: &str, eq: &str) -> Option<f64> {
        u.rows
            .iter()
            .find(|r| r.policy == policy && r.equations == eq)
            .unwrap()
            .unhappiness_ms
    }

    #[test]
    fn round_robin_forms_match_hand_evaluation() {
        // N = 5, q = 10, τ = 30 → Z = 3: 10 (3·3 + 1) = 100.
        let u = evaluate(&Params::default()).unwrap();
        assert_eq!(value(&u, "rr", "6, 8"), Some(100.0));
        // Z1..3 = 2, 2, 1: 10 (5·3 + 3) = 180.
        assert_eq!(value(&u, "rr", "7, 9"), Some(180.0));
    }

    #[test]
    fn feedback_queue_form_counts_the_queues_waited_in() {
        // τ = 30 ms = 3 quanta → x = 1 (1 + 2 quanta). a = [3, 2]:
        // 10 (1·2 + 2·1 − 2) = 20.
        let p = Params {
            queues: vec![3, 2],
            ..Params::default()
        };
        let u = evaluate(&p).unwrap();
        assert_eq!(value(&u, "mlfq", "11, 12"), Some(20.0));
        // Alone in every queue the printed form goes negative.
        let u = evaluate(&Params::default()).unwrap();
        assert_eq!(value(&u, "mlfq", "11, 12"), Some(-20.0));
        assert_eq!(last_queue(1.0), 0);
        assert_eq!(last_queue(3.0), 1);
        assert_eq!(last_queue(4.0), 2);
    }

    #[test]
    fn cfs_minimum_is_zero_only_within_the_first_slice() {
        let p = Params {
            request_ms: 4.0,
            ..Params::default()
        };
        // q(5) = 4 ms.
        let u = evaluate(&p).unwrap();
        assert_eq!(value(&u, "cfs", "14, 17, 24"), Some(0.0));
        let u = evaluate(&Params::default()).unwrap();
        assert_eq!(value(&u, "cfs", "14, 17, 24"), None);
        // Eq. 18: 4 (50 / 4 − 3) − 50 = −12.
        assert_eq!(value(&u, "cfs", "18"), Some(-12.0));
    }

    #[test]
    fn elevation_lowers_the_service_call_form() {
        let u = evaluate(&Params::default()).unwrap();
        let rbpe = value(&u, "cfs-rbpe", "23, 27").unwrap();
        // A larger elevation gives the server longer slices, so fewer and shorter waits.
        let more = evaluate(&Params {
            nice: 10,
            ..Params::default()
        })
        .unwrap();
        assert!(value(&more, "cfs-rbpe", "23, 27").unwrap() < rbpe);
        // Nice 5: slice 1.25^5·20 / (4 + 1.25^5) = 8.66 ms; Z = 3, 3, 2; hand-summed.
        let b = |i: f64| 4.0 * 20.0 / (4.0 + 1.25f64.powf(5.0 - i));
        let hand = (b(0.0) + b(1.0)) * 2.0 + b(0.0) - 50.0;
        assert!((rbpe - hand).abs() < 1e-9, "{rbpe} vs {hand}");
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = evaluate(&Params {
            processes: 1,
            ..Params::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("--processes"));
        let e = evaluate(&Params {
            tau_ms: [1.0, -2.0, 1.0],
            ..Params::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("τ2"), "{e}");
        let e = evaluate(&Params {
            nice: 20,
            ..Params::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("--nice"));
    }
}
