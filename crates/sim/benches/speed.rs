//! Simulator speed: events per second on one core, 64 CPUs and 10,000 processes
//! (8,000 CPU hogs and 2,000 servers answering 20,000 requests/s), every policy.
//! `cargo bench -p appease-sim --bench speed` (target: >= 10 million events/s).

fn main() {
    let text = r#"
[sim]
cpus = 64
duration_ms = 10000
seed = 1
[[process]]
name = "hog"
count = 8000
behavior = "cpu-bound"
[[process]]
name = "web"
count = 2000
serve = { cpu_ms = 1.0 }
[[customer]]
name = "clients"
to = "web"
arrivals = { kind = "poisson", rate_per_s = 20000.0 }
"#;
    let w = appease_sim::Workload::parse(text, "speed.toml").expect("valid workload");
    println!("64 CPUs, 10,000 processes (8,000 hogs, 2,000 servers, 20,000 req/s), 10 s simulated");
    println!(
        "{:<12} {:>12} {:>10} {:>12}",
        "policy", "events", "wall ms", "Mevents/s"
    );
    for p in appease_sim::POLICIES {
        // Best of three runs: the machine is shared.
        let best = (0..3)
            .map(|_| appease_sim::run(&w, Some(p)).expect("runs"))
            .max_by(|a, b| a.events_per_sec.total_cmp(&b.events_per_sec))
            .expect("three runs");
        println!(
            "{:<12} {:>12} {:>10.1} {:>12.2}",
            p,
            best.events,
            best.wall_ms,
            best.events_per_sec / 1e6
        );
    }
}
