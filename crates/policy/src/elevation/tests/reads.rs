//! What a tick reads: the threads it asks CPU times for, and requests the probe saw but
//! did not report.

use super::*;

#[test]
fn the_threads_read_ahead_of_a_tick_are_those_it_asks_for() {
    let mut p = ElevationPolicy::new(sinking());
    for tid in [7, 8, 9] {
        p.on_request(0, 1, 1, tid, Source::Unix, 0, load(2.0));
    }
    // Thread 9's CPU time came with a later request: not read again at the next tick.
    p.on_request(150 * MS, 1, 1, 9, Source::Unix, MS, load(2.0));
    let mut asked_at_all = 0;
    for now in [50 * MS, 200 * MS, 260 * MS, 400 * MS] {
        let mut wanted: Vec<_> = p.cpu_wanted(now).collect();
        let mut asked = Vec::new();
        p.on_tick(now, |pid, tid| {
            asked.push((pid, tid));
            Some(MS)
        });
        wanted.sort_unstable();
        asked.sort_unstable();
        assert_eq!(wanted, asked, "at {} ms", now / MS);
        asked_at_all += asked.len();
    }
    assert!(asked_at_all > 0, "no tick asked for any thread's CPU time");
}

#[test]
fn a_long_request_is_timed_from_the_latest_request_the_probe_saw() {
    // Thread 7's reported request at 10 ms of CPU; by the tick it has 70 ms: long...
    let at_tick = |noted: Option<u64>| {
        let mut p = ElevationPolicy::new(sinking());
        p.on_request(0, 1, 1, 7, Source::Unix, 10 * MS, load(2.0));
        if let Some(cpu) = noted {
            p.note_request_cpu(7, cpu);
        }
        p.on_tick(200 * MS, |_, _| Some(70 * MS))
            .iter()
            .any(|d| matches!(d, Decision::Sink { tid: 7, .. }))
    };
    assert!(at_tick(None), "70 ms of CPU since its request: sunk");
    // ...unless an unreported request came at 40 ms: 30 ms since, not long.
    assert!(!at_tick(Some(40 * MS)));
    // An older request's time changes nothing.
    assert!(at_tick(Some(5 * MS)));
}
