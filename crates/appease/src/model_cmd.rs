//! `appease model`: the closed forms.

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum ModelCommand {
    /// N processors contending for one lock (machine-repairman queue, exact MVA). Give
    /// --demand, or measurements (--rate, --hold-us, --wait-us) to compare with the model.
    Contention {
        #[arg(long)]
        cpus: u64,
        /// Share of time a processor would hold the lock if it were alone, percent.
        #[arg(long, conflicts_with_all = ["rate", "hold_us", "wait_us"], required_unless_present = "rate")]
        demand: Option<f64>,
        /// Measured lock acquisitions per second, all processors together.
        #[arg(long, requires_all = ["hold_us", "wait_us"])]
        rate: Option<f64>,
        /// Measured mean hold time, µs.
        #[arg(long)]
        hold_us: Option<f64>,
        /// Measured mean wait (queueing only), µs.
        #[arg(long)]
        wait_us: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// the 2010 customer-appeasement paper's closed forms (eqs. 6–27): the unhappiness one request causes under
    /// round robin, feedback queues, CFS and CFS with request-based elevation.
    Unhappiness {
        /// N: runnable processes, the server included.
        #[arg(long, default_value_t = 5)]
        processes: u32,
        /// q: round-robin quantum, base quantum of the feedback queues.
        #[arg(long, default_value_t = 10.0)]
        quantum_ms: f64,
        /// CFS's sched_latency.
        #[arg(long, default_value_t = 20.0)]
        sched_latency_ms: f64,
        /// τ of the one-request scenario.
        #[arg(long, default_value_t = 30.0)]
        request_ms: f64,
        /// τ1,τ2,τ3 of the service-call scenario.
        #[arg(long, value_delimiter = ',', default_value = "20,20,10")]
        tau_ms: Vec<f64>,
        /// RBPE's elevation level (1..=15).
        #[arg(long, default_value_t = 5)]
        nice: u32,
        /// a_0,a_1,…: processes in each feedback queue when the request arrives, the
        /// server included (default: the server alone).
        #[arg(long, value_delimiter = ',')]
        queues: Vec<u32>,
        #[arg(long)]
        json: bool,
    },
}

/// Runs one of the models.
pub(crate) fn run(command: ModelCommand) -> Result<()> {
    match command {
        ModelCommand::Contention {
            cpus,
            demand,
            rate,
            hold_us,
            wait_us,
            json,
        } => contention(
            cpus,
            demand,
            rate.zip(hold_us).zip(wait_us).map(|((r, h), w)| (r, h, w)),
            json,
        ),
        ModelCommand::Unhappiness {
            processes,
            quantum_ms,
            sched_latency_ms,
            request_ms,
            tau_ms,
            nice,
            queues,
            json,
        } => {
            let tau: [f64; 3] = tau_ms
                .as_slice()
                .try_into()
                .map_err(|_| appease_model::unhappiness::ParamError::Tau(tau_ms.len()))?;
            unhappiness(
                &appease_model::unhappiness::Params {
                    processes,
                    quantum_ms,
                    sched_latency_ms,
                    request_ms,
                    tau_ms: tau,
                    nice,
                    queues,
                },
                json,
            )
        }
    }
}

fn unhappiness(p: &appease_model::unhappiness::Params, json: bool) -> Result<()> {
    let u = appease_model::unhappiness::evaluate(p)?;
    if json {
        println!("{}", serde_json::to_string(&u)?);
        return Ok(());
    }
    println!(
        "Closed forms of the 2010 customer-appeasement paper: N = {} processes, q = {} ms, sched_latency = {} ms, \
         τ = {} ms, τ1,τ2,τ3 = {},{},{} ms, elevation nice −{}",
        p.processes,
        p.quantum_ms,
        p.sched_latency_ms,
        p.request_ms,
        p.tau_ms[0],
        p.tau_ms[1],
        p.tau_ms[2],
        p.nice
    );
    println!(
        "{:<9} {:<13} {:<11} {:>12}  note",
        "policy", "scenario", "eqs.", "unhappy ms"
    );
    for r in &u.rows {
        let v = r
            .unhappiness_ms
            .map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
        println!(
            "{:<9} {:<13} {:<11} {:>12}  {}",
            r.policy, r.scenario, r.equations, v, r.note
        );
    }
    println!("(`appease sim` gives the exact values; docs/sim.md compares them)");
    Ok(())
}

fn contention(
    cpus: u64,
    demand: Option<f64>,
    measured: Option<(f64, f64, f64)>,
    json: bool,
) -> Result<()> {
    use appease_model::contention::{from_measurements, solve};
    match (demand, measured) {
        (Some(d), _) => {
            let c = solve(cpus, d)?;
            if json {
                println!("{}", serde_json::to_string(&c)?);
            } else {
                println!(
                    "{} CPUs at {:.2} % demand: lock utilization {:.4}, {:.4} acquisitions per hold time, \
                     mean wait {:.4} hold times, effective power {:.3} CPUs",
                    c.cpus, c.demand_pct, c.utilization, c.throughput_per_hold, c.wait_per_hold, c.effective_power
                );
            }
        }
        (None, Some((rate, hold, wait))) => {
            let m = from_measurements(cpus, rate, hold, wait)?;
            if json {
                println!("{}", serde_json::to_string(&m)?);
            } else {
                println!(
                    "{} CPUs: derived demand {:.3} %; effective power measured {:.3} CPUs, model {:.3} CPUs \
                     (lock utilization {:.4}, mean wait {:.4} hold times)",
                    m.cpus,
                    m.demand_pct,
                    m.measured_effective_power,
                    m.predicted_effective_power,
                    m.model.utilization,
                    m.model.wait_per_hold
                );
            }
        }
        (None, None) => anyhow::bail!("give --demand, or --rate, --hold-us and --wait-us"),
    }
    Ok(())
}
