//! What the probe adds to one socket read, measured in one run: rounds alternate
//! between no probe and the probe loaded, each round timing many 1-byte reads from a
//! pre-filled socket (the reads never block). Prints per-round medians and the
//! difference. Needs root. Run: `cargo bench -p appease-probe --bench read_cost`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use appease_probe::{Probe, ProbeConfig, ProbeStorage};

const READS_PER_ROUND: usize = 100_000;
const ROUNDS: usize = 7;
/// Each round's reads come from this many bytes written up front.
const CHUNK: usize = 20_000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// ns per 1-byte read on `reader`, refilled by `writer` in chunks outside the timing.
fn time_reads(writer: &mut impl Write, reader: &mut impl Read) -> f64 {
    let fill = vec![b'x'; CHUNK];
    let mut b = [0u8; 1];
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < READS_PER_ROUND {
        writer.write_all(&fill).unwrap();
        std::thread::sleep(Duration::from_millis(1)); // let TCP deliver it all
        let start = Instant::now();
        for _ in 0..CHUNK {
            reader.read_exact(&mut b).unwrap();
        }
        total += start.elapsed();
        done += CHUNK;
    }
    total.as_nanos() as f64 / done as f64
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("read_cost: needs root to load the BPF probe");
        std::process::exit(1);
    }
    let (mut ua, mut ub) = UnixStream::pair().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut ta = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut tb, _) = l.accept().unwrap();
    ta.set_nodelay(true).unwrap();

    // The default quiet period: after the first read of a burst, reads only pay the
    // tracepoint and the per-thread filter, which is the common case on a busy server.
    let cfg = ProbeConfig {
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> =
        vec![("unix", vec![], vec![]), ("tcp", vec![], vec![])];
    for round in 0..ROUNDS {
        for with_probe in [false, true] {
            let mut storage = ProbeStorage::uninit();
            let probe = with_probe.then(|| Probe::load(&cfg, &mut storage).expect("probe loads"));
            let u = time_reads(&mut ua, &mut ub);
            let t = time_reads(&mut ta, &mut tb);
            let idx = usize::from(with_probe) + 1;
            for (row, v) in rows.iter_mut().zip([u, t]) {
                if idx == 1 {
                    row.1.push(v)
                } else {
                    row.2.push(v)
                }
            }
            if let Some(p) = &probe {
                let c = p.counters();
                eprintln!(
                    "round {round}: probe saw {} socket reads, reported {} request events",
                    c.socket_reads, c.requests
                );
            }
            drop(probe);
        }
    }
    println!(
        "cost of one 1-byte socket read, median of {ROUNDS} rounds x {READS_PER_ROUND} reads (ns)"
    );
    println!(
        "{:<6} {:>12} {:>12} {:>12}",
        "socket", "no probe", "probe", "added"
    );
    for (name, mut off, mut on) in rows {
        let (a, b) = (median(&mut off), median(&mut on));
        println!("{name:<6} {a:>12.0} {b:>12.0} {:>12.0}", b - a);
    }
}
