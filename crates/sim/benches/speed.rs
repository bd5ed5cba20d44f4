//! Simulator speed: events per second on one core, 64 CPUs and 10,000 processes, every
//! policy, on two hosts:
//! - busy: 8,000 CPU hogs (125 runnable per CPU) and 2,000 servers;
//! - typical: 256 hogs, 7,744 daemons that wake every second, and 2,000 servers.
//!
//! Both take 20,000 requests/s of 0.2 ms each. Requests are Poisson.
//! `cargo bench -p appease-sim --bench speed` (target: >= 10 million events/s);
//! `cargo bench -p appease-sim --bench speed -- cfs eevdf` runs only those policies.
//! Events are those the engine handles: slice ends, arrivals, wake-ups, balancing and
//! policy ticks. Replaced slice ends are never queued, so they are not counted.

/// The two hosts, as files a user can run with `appease sim` too.
const HOSTS: [(&str, &str); 2] = [
    (
        "busy",
        include_str!("../../../examples/sim/speed-busy.toml"),
    ),
    (
        "typical",
        include_str!("../../../examples/sim/speed-typical.toml"),
    ),
];

fn main() {
    // Policy names after `--` run only those (cargo adds `--bench` itself).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    println!("64 CPUs, 10,000 processes, 20,000 requests/s, 10 s simulated; best of 3 runs");
    println!(
        "{:<8} {:<12} {:>10} {:>9} {:>10} {:>9}",
        "host", "policy", "events", "wall ms", "Mevents/s", "answered"
    );
    for (host, text) in HOSTS {
        let w = appease_sim::Workload::parse(text, host).expect("valid workload");
        for p in appease_sim::POLICIES {
            if !only.is_empty() && !only.iter().any(|o| o == p) {
                continue;
            }
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
