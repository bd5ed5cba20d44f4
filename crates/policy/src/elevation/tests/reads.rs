//! What a tick reads: the threads it asks CPU times for, and requests the probe saw but
//! did not report (a held thread's).

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
            p.note_request(7, 150 * MS, cpu, load(2.0));
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

#[test]
fn an_unreported_request_read_at_the_tick_keeps_an_elevated_thread_from_fading() {
    // A level fades each 50 ms: at 50 ms thread 7 is due to fade, its CPU time read at 0.
    let step = |from, nice, ms| Step {
        from_runnable_per_cpu: from,
        unix_nice: nice,
        inet_nice: nice,
        decay: Duration::from_millis(ms),
    };
    let fast = ElevationParams {
        ladder: Ladder::new(vec![step(0.0, 0, 0), step(1.0, -4, 50)]).unwrap(),
        ..params()
    };
    let fades_at_50 = |note: Option<Nanos>| {
        let mut p = ElevationPolicy::new(fast.clone());
        p.on_request(0, 1, 1, 7, Source::Unix, 0, load(2.0));
        let wanted: Vec<_> = p.cpu_wanted(50 * MS).collect();
        assert_eq!(wanted, [(1, 7)], "due to fade: read, though read 50 ms ago");
        if let Some(at) = note {
            assert_eq!(
                p.note_request(7, at, MS, load(2.0)),
                None,
                "at its level already"
            );
        }
        p.on_tick(50 * MS, |_, _| Some(2 * MS)).iter().any(|d| {
            matches!(
                d,
                Decision::Elevate {
                    tid: 7,
                    reason: Reason::Decay,
                    ..
                }
            )
        })
    };
    assert!(fades_at_50(None), "no request since: it fades");
    assert!(
        !fades_at_50(Some(30 * MS)),
        "a request at 30 ms: it fades from 80 ms"
    );
    assert!(
        fades_at_50(Some(0)),
        "the request it was elevated for changes nothing"
    );
}

#[test]
fn a_held_thread_read_under_a_higher_load_is_raised_as_its_request_would_have_been() {
    let mut p = ElevationPolicy::new(params());
    let first = p.on_request(0, 1, 1, 7, Source::Network, 0, load(1.5));
    assert_eq!(levels(&first), 2);
    // Its later requests unreported; the tick reads one at 50 ms, the load up since.
    let d = p.note_request(7, 50 * MS, MS, load(4.0));
    assert!(
        matches!(
            d,
            Some(Decision::Elevate {
                tid: 7,
                levels: 6,
                reason: Reason::NetworkRequest,
                ..
            })
        ),
        "{d:?}"
    );
    assert_eq!(p.levels(7), 6);
    // Its fade restarts from that request.
    assert!(p.on_tick(149 * MS, |_, _| Some(MS)).is_empty());
    assert_eq!(p.on_tick(150 * MS, |_, _| Some(MS)).len(), 1);
}

#[test]
fn a_request_read_at_the_tick_elevates_no_thread_that_is_not_elevated() {
    let mut p = ElevationPolicy::new(sinking());
    // Watched (a request below the ladder's first step), not elevated.
    assert_eq!(p.on_request(0, 1, 1, 7, Source::Unix, 0, load(0.5)), None);
    assert_eq!(p.note_request(7, 50 * MS, MS, load(4.0)), None);
    assert_eq!(p.levels(7), 0);
    // A sunk one surfaces by its reported request only.
    let mut p = one_sunk();
    assert_eq!(p.note_request(7, 250 * MS, 60 * MS, load(4.0)), None);
    assert_eq!(p.levels(7), 0);
    // An unknown thread: nothing.
    assert_eq!(p.note_request(99, 250 * MS, 0, load(4.0)), None);
}

#[test]
fn a_rise_of_the_load_reads_every_elevated_thread_at_that_tick() {
    let mut p = ElevationPolicy::new(params());
    p.on_load(load(1.5));
    for tid in [7, 8] {
        p.on_request(0, 1, 1, tid, Source::Network, 0, load(1.5));
    }
    let tick = |p: &mut ElevationPolicy, now, l| {
        p.on_load(load(l));
        let wanted: Vec<_> = p.cpu_wanted(now).collect();
        p.on_tick(now, |_, _| Some(0));
        wanted
    };
    // Read 10 ms ago (their requests carried their CPU time), not due to fade.
    assert!(tick(&mut p, 10 * MS, 1.5).is_empty(), "nothing due");
    assert_eq!(
        tick(&mut p, 20 * MS, 4.0),
        [(1, 7), (1, 8)],
        "the ladder stepped up: both read"
    );
    assert!(tick(&mut p, 30 * MS, 4.0).is_empty(), "once, at the rise");
    assert!(tick(&mut p, 40 * MS, 1.5).is_empty(), "a fall reads none");
    p.set_params(params());
    assert_eq!(
        tick(&mut p, 50 * MS, 1.5),
        [(1, 7), (1, 8)],
        "a new ladder: both read again"
    );
}
