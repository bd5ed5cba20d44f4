//! `appease sim run`, `appease sim compare` and `appease sim sweep`.

use std::path::Path;

use anyhow::{Context, Result};
use appease_sim::{Report, Workload, POLICIES};

fn write_out(dir: &Path, json_name: &str, json: &str, reports: &[Report]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(json_name), json)
        .with_context(|| format!("writing {}", dir.join(json_name).display()))?;
    let mut csv = String::new();
    for (i, r) in reports.iter().enumerate() {
        let text = appease_sim::records_csv(r);
        // One header for all policies.
        csv += if i == 0 {
            &text
        } else {
            text.split_once('\n').map_or("", |x| x.1)
        };
    }
    std::fs::write(dir.join("requests.csv"), csv)
        .with_context(|| format!("writing {}", dir.join("requests.csv").display()))?;
    Ok(())
}

pub fn run(file: &Path, policy: Option<&str>, json: bool, out: Option<&Path>) -> Result<()> {
    let w = Workload::load(file)?;
    let r = appease_sim::run(&w, policy).map_err(anyhow::Error::msg)?;
    let text = serde_json::to_string_pretty(&r)?;
    if let Some(dir) = out {
        write_out(dir, "report.json", &text, std::slice::from_ref(&r))?;
    }
    if json {
        println!("{text}");
    } else {
        print!("{}", appease_sim::table(std::slice::from_ref(&r)));
        for (c, u) in &r.unhappiness.per_customer {
            println!("unhappiness of customer {c}: {u:.3} ms");
        }
        for l in &r.locks {
            println!(
                "lock {}: {} contenders, {} acquisitions, held {:.4} of the time, mean wait {:.4} ms \
                 ({:.4} mean holds), effective power {:.3} CPUs",
                l.name,
                l.contenders,
                l.acquisitions,
                l.utilization,
                l.mean_wait_ms,
                l.wait_per_hold,
                l.effective_power
            );
        }
    }
    Ok(())
}

pub fn compare(file: &Path, json: bool, out: Option<&Path>) -> Result<()> {
    let w = Workload::load(file)?;
    let reports = POLICIES
        .iter()
        .map(|p| appease_sim::run(&w, Some(p)).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let text = serde_json::to_string_pretty(&reports)?;
    if let Some(dir) = out {
        write_out(dir, "compare.json", &text, &reports)?;
    }
    if json {
        println!("{text}");
    } else {
        println!(
            "{}: {} CPUs, {} ms simulated, seed {}",
            file.display(),
            w.sim.cpus,
            w.sim.duration_ms,
            w.sim.seed
        );
        print!("{}", appease_sim::table(&reports));
    }
    Ok(())
}

pub fn sweep(
    file: &Path,
    clients: &[u32],
    requests: u64,
    policies: &[String],
    scale_base: Option<u32>,
    json: bool,
) -> Result<()> {
    let w = Workload::load(file)?;
    let policies: Vec<&str> = if policies.is_empty() {
        POLICIES.to_vec()
    } else {
        policies.iter().map(String::as_str).collect()
    };
    if let Some(bad) = policies.iter().find(|p| !POLICIES.contains(p)) {
        anyhow::bail!("unknown policy {bad:?} (one of {})", POLICIES.join(", "));
    }
    let r = appease_sim::sweep::sweep(&w, clients, requests, &policies, scale_base)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}: {} CPUs; {} requests by {:?} to {:?}, split among the clients, each with an \
             instance of the server of its own (no cost per context switch is simulated)",
            file.display(),
            w.sim.cpus,
            r.requests,
            r.customer,
            r.server
        );
        print!("{}", appease_sim::sweep::table(&r));
    }
    Ok(())
}
