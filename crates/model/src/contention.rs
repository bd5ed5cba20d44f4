//! Contention for one shared kernel lock (the design brief's fifth source): N processors
//! each compute for a mean time Z, then hold the lock for a mean time x̄ (exponential),
//! served first come first served. This is the closed machine-repairman queue
//! (finite-source M/M/1//N), solved exactly by mean value analysis.

use serde::Serialize;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error("--cpus must be a whole number from 1 to 100000 (got {0})")]
    Cpus(u64),
    #[error("--demand must be a percentage in (0, 100] (got {0})")]
    Demand(f64),
    #[error("{what} must be a positive number (got {value})")]
    NotPositive { what: &'static str, value: f64 },
    #[error(
        "the measurements are inconsistent: with {cpus} processors at {rate}/s, holding {hold_us} µs \
         and waiting {wait_us} µs leave no time to compute (Little's law gives Z = {z_us:.1} µs < 0)"
    )]
    Inconsistent {
        cpus: u64,
        rate: f64,
        hold_us: f64,
        wait_us: f64,
        z_us: f64,
    },
}

/// The model's outputs for one demand; times are in units of the mean hold time x̄.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Contention {
    pub cpus: u64,
    /// x̄ / (x̄ + Z): the share of time a processor would hold the lock if it were alone.
    pub demand_pct: f64,
    /// Share of time the lock is held.
    pub utilization: f64,
    /// Lock acquisitions per mean hold time (Λ·x̄; equals utilization for one lock).
    pub throughput_per_hold: f64,
    /// Mean time queued for the lock, not holding it, in mean hold times (W / x̄).
    pub wait_per_hold: f64,
    /// N − Λ·W: processors' worth of time not lost waiting.
    pub effective_power: f64,
}

/// Solves the model for `cpus` processors at `demand_pct`.
pub fn solve(cpus: u64, demand_pct: f64) -> Result<Contention, ModelError> {
    if !(1..=100_000).contains(&cpus) {
        return Err(ModelError::Cpus(cpus));
    }
    if !(demand_pct > 0.0 && demand_pct <= 100.0) {
        return Err(ModelError::Demand(demand_pct));
    }
    let d = demand_pct / 100.0;
    // Time unit: x̄ = 1; then Z = (1 − d) / d.
    let z = (1.0 - d) / d;
    // Exact MVA: R(n) = x̄ (1 + Q(n−1)), X(n) = n / (Z + R(n)), Q(n) = X(n) R(n).
    let (mut q, mut r, mut x) = (0.0f64, 0.0f64, 0.0f64);
    for n in 1..=cpus {
        r = 1.0 + q;
        x = n as f64 / (z + r);
        q = x * r;
    }
    let wait = r - 1.0;
    Ok(Contention {
        cpus,
        demand_pct,
        utilization: x,
        throughput_per_hold: x,
        wait_per_hold: wait,
        effective_power: cpus as f64 - x * wait,
    })
}

/// The model checked against measurements of a real system.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    pub cpus: u64,
    /// Derived from the measurements via Little's law.
    pub demand_pct: f64,
    pub measured_effective_power: f64,
    pub predicted_effective_power: f64,
    #[serde(flatten)]
    pub model: ContentionOutputs,
}

/// The model's outputs without the fields `Measured` already carries.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContentionOutputs {
    pub utilization: f64,
    pub throughput_per_hold: f64,
    pub wait_per_hold: f64,
    pub effective_power: f64,
}

/// From a measured lock request rate Λ (per second), mean hold x̄ and mean wait W (µs)
/// on N processors: Z = N/Λ − W − x̄, the demand, the measured effective power N − Λ·W,
/// and what the model predicts for that demand.
pub fn from_measurements(
    cpus: u64,
    rate_per_s: f64,
    hold_us: f64,
    wait_us: f64,
) -> Result<Measured, ModelError> {
    if !(1..=100_000).contains(&cpus) {
        return Err(ModelError::Cpus(cpus));
    }
    for (what, value) in [("--rate", rate_per_s), ("--hold-us", hold_us)] {
        if !(value > 0.0 && value.is_finite()) {
            return Err(ModelError::NotPositive { what, value });
        }
    }
    if !(wait_us >= 0.0 && wait_us.is_finite()) {
        return Err(ModelError::NotPositive {
            what: "--wait-us",
            value: wait_us,
        });
    }
    let rate_per_us = rate_per_s / 1e6;
    let z_us = cpus as f64 / rate_per_us - wait_us - hold_us;
    if z_us < 0.0 {
        return Err(ModelError::Inconsistent {
            cpus,
            rate: rate_per_s,
            hold_us,
            wait_us,
            z_us,
        });
    }
    let demand_pct = 100.0 * hold_us / (hold_us + z_us);
    let m = solve(cpus, demand_pct)?;
    Ok(Measured {
        cpus,
        demand_pct,
        measured_effective_power: cpus as f64 - rate_per_us * wait_us,
        predicted_effective_power: m.effective_power,
        model: ContentionOutputs {
            utilization: m.utilization,
            throughput_per_hold: m.throughput_per_hold,
            wait_per_hold: m.wait_per_hold,
            effective_power: m.effective_power,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Product form: p0 = 1 / Σ_k N!/(N−k)! ρ^k with ρ = x̄/Z; U = 1 − p0.
    fn product_form_utilization(n: u64, d: f64) -> f64 {
        let rho = d / (1.0 - d);
        let (mut term, mut sum) = (1.0f64, 1.0f64);
        for k in 1..=n {
            term *= (n - k + 1) as f64 * rho;
            sum += term;
        }
        1.0 - 1.0 / sum
    }

    #[test]
    fn one_processor_never_waits() {
        let c = solve(1, 30.0).unwrap();
        assert!(
            close(c.utilization, 0.3)
                && close(c.wait_per_hold, 0.0)
                && close(c.effective_power, 1.0)
        );
    }

    #[test]
    fn two_processors_at_half_demand_by_hand() {
        // MVA by hand: R(2) = 1.5, X(2) = 2 / 2.5 = 0.8, W = 0.5, N − ΛW = 1.6.
        let c = solve(2, 50.0).unwrap();
        assert!(
            close(c.utilization, 0.8)
                && close(c.wait_per_hold, 0.5)
                && close(c.effective_power, 1.6),
            "{c:?}"
        );
    }

    #[test]
    fn mva_agrees_with_the_product_form() {
        for n in [1, 2, 4, 8, 16, 64] {
            for d in [1.0, 5.0, 10.0, 25.0, 50.0, 90.0] {
                let c = solve(n, d).unwrap();
                let u = product_form_utilization(n, d / 100.0);
                assert!(
                    (c.utilization - u).abs() < 1e-9,
                    "N={n} d={d}: {} vs {u}",
                    c.utilization
                );
                // Little's law for the whole system: N = Λ (Z + W + x̄).
                let z = (1.0 - d / 100.0) / (d / 100.0);
                assert!(
                    (c.throughput_per_hold * (z + c.wait_per_hold + 1.0) - n as f64).abs() < 1e-6
                );
            }
        }
    }

    #[test]
    fn saturation_and_light_load_limits() {
        let heavy = solve(64, 50.0).unwrap();
        assert!(
            heavy.utilization > 0.999 && heavy.effective_power < 2.1,
            "{heavy:?}"
        );
        let light = solve(64, 0.01).unwrap();
        assert!(light.effective_power > 63.99);
    }

    #[test]
    fn measurements_round_trip_through_the_model() {
        // Generate "measurements" from the model and recover the demand and power.
        let m = solve(8, 10.0).unwrap();
        let hold_us = 20.0;
        let rate = m.throughput_per_hold / hold_us * 1e6;
        let wait_us = m.wait_per_hold * hold_us;
        let r = from_measurements(8, rate, hold_us, wait_us).unwrap();
        assert!((r.demand_pct - 10.0).abs() < 1e-6, "{r:?}");
        assert!((r.measured_effective_power - r.predicted_effective_power).abs() < 1e-6);
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(solve(0, 10.0), Err(ModelError::Cpus(0)));
        assert!(matches!(solve(4, 0.0), Err(ModelError::Demand(_))));
        assert!(matches!(solve(4, 120.0), Err(ModelError::Demand(_))));
        assert!(matches!(
            from_measurements(4, -1.0, 5.0, 1.0),
            Err(ModelError::NotPositive { what: "--rate", .. })
        ));
        let e = from_measurements(2, 1e6, 5.0, 5.0).unwrap_err().to_string();
        assert!(e.contains("inconsistent"), "{e}");
    }
}
