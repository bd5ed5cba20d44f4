//! Simulator speed: events per second on one core, 64 CPUs and 10,000 processes, every
//! policy, on two hosts:
//! - busy: 8,000 CPU hogs (125 runnable per CPU) and 2,000 servers;
//! - typical: 256 hogs, 7,744 daemons that wake every second, and 2,000 servers.
//!
//! Both take 20,000 requests/s of 0.2 ms each. Requests are Poisson.
//! `cargo bench -p appease-sim --bench speed` (target: >= 10 million events/s).
//! Events are those the engine handles: slice ends, arrivals, wake-ups, balancing and
//! policy ticks. Replaced slice ends are never queued, so they are not counted.

const HOSTS: [(&str, &str); 2] = [
    (
        "busy",
        r#"
[[process]]
name = "hog"
count = 8000
behavior = "cpu-bound"
"#,
    ),
    (
        "typical",
        r#"
[[process]]
name = "hog"
count = 256
behavior = "cpu-bound"
[[process]]
name = "daemon"
count = 7744
cycle = { cpu_ms = 0.5, sleep_ms = 1000.0 }
"#,
    ),
];

const COMMON: &str = r#"
[sim]
cpus = 64
duration_ms = 10000
seed = 1
[[process]]
name = "web"
count = 2000
serve = { cpu_ms = 0.2 }
[[customer]]
name = "clients"
to = "web"
arrivals = { kind = "poisson", rate_per_s = 20000.0 }
"#;

fn main() {
    println!("64 CPUs, 10,000 processes, 20,000 requests/s, 10 s simulated; best of 3 runs");
    println!(
        "{:<8} {:<12} {:>10} {:>9} {:>10} {:>9}",
        "host", "policy", "events", "wall ms", "Mevents/s", "answered"
    );
    for (host, processes) in HOSTS {
        let text = format!("{COMMON}{processes}");
        let w = appease_sim::Workload::parse(&text, "speed.toml").expect("valid workload");
        for p in appease_sim::POLICIES {
            // Best of three: the machine is shared.
            let best = (0..3)
                .map(|_| appease_sim::run(&w, Some(p)).expect("runs"))
                .max_by(|a, b| a.events_per_sec.total_cmp(&b.events_per_sec))
                .expect("three runs");
            let r = &best.requests;
            let answered = r.count as f64 / (r.count + r.unfinished).max(1) as f64;
            println!(
                "{:<8} {:<12} {:>10} {:>9.1} {:>10.2} {:>8.1}%",
                host,
                p,
                best.events,
                best.wall_ms,
                best.events_per_sec / 1e6,
                answered * 100.0
            );
        }
    }
}
