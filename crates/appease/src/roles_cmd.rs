//! `appease roles suggest FILE`: staggered roles from observed per-call work (the AIX case study).

use std::path::Path;

use anyhow::{Context, Result};
use appease_policy::roles::{suggest, Observed};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    critical: String,
    #[serde(rename = "process")]
    processes: Vec<Process>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Process {
    name: String,
    share_pct: f64,
    invocations: f64,
}

pub fn suggest_cmd(file: &Path, app: &str, top_nice: i32) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let input: Input = toml::from_str(&text)
        .with_context(|| format!("invalid observations in {}", file.display()))?;
    let observed: Vec<Observed> = input
        .processes
        .into_iter()
        .map(|p| Observed {
            name: p.name,
            share_pct: p.share_pct,
            invocations: p.invocations,
        })
        .collect();
    let ranks = suggest(&observed, &input.critical).map_err(anyhow::Error::msg)?;
    println!(
        "{:<16} {:>6} {:>6} {:>5}  why",
        "process", "share", "rank", "nice"
    );
    for s in &ranks {
        let share = observed
            .iter()
            .find(|o| o.name == s.name)
            .map_or(0.0, |o| o.share_pct);
        println!(
            "{:<16} {:>5.0}% {:>6} {:>5}  {}",
            s.name,
            share,
            s.rank,
            top_nice + s.rank as i32,
            s.why
        );
    }
    println!("\n# For the daemon's config (match by comm; adjust to cgroup/unit as needed):");
    println!("[roles]\ntop_nice = {top_nice}");
    for s in &ranks {
        println!(
            "\n[[role]]\napp = {app:?}\ncomm = {:?}\nrank = {}",
            s.name, s.rank
        );
    }
    Ok(())
}
