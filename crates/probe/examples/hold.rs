//! Loads the request probe and drains its events, nothing else, until SIGTERM or SIGINT:
//! isolates the probe's cost from the daemon's loop in latency experiments, e.g.
//! `cargo run --release -p appease-probe --example hold & appease bench synthetic
//! --modes batch-cgroup-idle`. Root needed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use appease_probe::{Probe, ProbeConfig, ProbeStorage};

fn main() {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).expect("signal handler");
    }
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&ProbeConfig::default(), &mut storage).expect("probe loads");
    let mut events = 0u64;
    while !stop.load(Ordering::Relaxed) {
        probe
            .poll(Duration::from_secs(1), |_| events += 1)
            .expect("poll");
    }
    eprintln!("{events} events");
}
