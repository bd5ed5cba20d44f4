use std::time::Duration;

use super::*;
use crate::Ladder;
use crate::Step;

mod reads;

const MS: u64 = 1_000_000;

fn params() -> ElevationParams {
    let step = |from, unix, inet, ms| Step {
        from_runnable_per_cpu: from,
        unix_nice: unix,
        inet_nice: inet,
        decay: Duration::from_millis(ms),
    };
    ElevationParams {
        ladder: Ladder::new(vec![
            step(0.0, 0, 0, 0),
            step(1.0, -4, -2, 100),
            step(3.0, -10, -6, 100),
        ])
        .unwrap(),
        min_psi_pct: 1.0,
        budget: Budget {
            cpu_share: 0.5,
            burst: Duration::from_millis(200),
        },
        slice: Some(Duration::from_micros(500)),
        forget_after: Duration::from_secs(10),
        sink: None,
        user_budget: None,
        user_threads_max: 0,
        users_threads_max: 0,
    }
}

fn sinking() -> ElevationParams {
    ElevationParams {
        sink: Some(Sink {
            after_cpu: Duration::from_millis(50),
            levels: 10,
            lift: Some(Duration::from_millis(200)),
        }),
        ..params()
    }
}

/// Sinks thread 7 of process 1 (app 1) at 200 ms; returns the policy.
fn one_sunk() -> ElevationPolicy {
    let mut p = ElevationPolicy::new(sinking());
    p.on_request(0, 1, 1, 7, Source::Unix, 0, load(2.0));
    p.on_request(0, 1, 1, 8, Source::Unix, 0, load(2.0));
    let cpu = |_: u32, tid: u32| Some(if tid == 7 { 60 * MS } else { MS });
    let d = p.on_tick(200 * MS, cpu);
    assert!(d.iter().any(|d| matches!(d, Decision::Sink { tid: 7, .. })));
    p
}

fn tids(d: &[Decision]) -> Vec<(u32, Reason)> {
    d.iter()
        .map(|d| match d {
            Decision::Elevate { tid, reason, .. }
            | Decision::Restore { tid, reason, .. }
            | Decision::Sink { tid, reason, .. } => (*tid, *reason),
        })
        .collect()
}

#[test]
fn a_wait_of_its_application_lifts_a_sunk_thread_until_the_wait_ends() {
    let mut p = one_sunk();
    assert_eq!(p.take_app_changes(), vec![AppChange::Sunk(1, true)]);
    assert!(p.has_sunk(1) && !p.has_sunk(2));
    assert_eq!(p.sunk_apps().collect::<Vec<_>>(), [1]);
    // Another application's wait lifts nothing.
    assert!(p.on_wait(300 * MS, 2).is_empty());
    assert_eq!(
        tids(&p.on_wait(300 * MS, 1)),
        vec![(7, Reason::Lifted)],
        "back to its own nice"
    );
    assert!(p.view().iter().any(|t| t.tid == 7 && t.sunk && t.lifted));
    assert!(p.any_elevated(), "ticks run while lifted");
    // A second wait while lifted changes nothing.
    assert!(p.on_wait(301 * MS, 1).is_empty());
    assert_eq!(
        tids(&p.on_wait_end(310 * MS, 1)),
        vec![(7, Reason::WaitOver)]
    );
    assert!(p.on_wait_end(311 * MS, 1).is_empty(), "once");
    // Its next request brings it back for good; the probe hears it has none sunk.
    assert_eq!(
        tids(&[p
            .on_request(400 * MS, 1, 1, 7, Source::Unix, 60 * MS, load(2.0))
            .unwrap()]),
        vec![(7, Reason::UnixRequest)]
    );
    assert_eq!(p.take_app_changes(), vec![AppChange::Sunk(1, false)]);
    assert!(!p.has_sunk(1) && p.sunk_apps().next().is_none());
    assert!(p.on_wait(500 * MS, 1).is_empty(), "nothing sunk to lift");
}

#[test]
fn a_lift_lasts_at_most_its_time_per_second_so_a_cheater_cannot_stay_lifted() {
    let mut p = one_sunk();
    p.take_app_changes();
    // Waits that never end: lifted for 200 ms, then sunk again.
    assert_eq!(tids(&p.on_wait(1000 * MS, 1)), vec![(7, Reason::Lifted)]);
    let cpu = |_: u32, tid: u32| Some(if tid == 7 { 60 * MS } else { MS });
    assert!(tids(&p.on_tick(1150 * MS, cpu)).iter().all(|d| d.0 != 7));
    assert_eq!(
        tids(&p.on_tick(1201 * MS, cpu))
            .into_iter()
            .filter(|d| d.0 == 7)
            .collect::<Vec<_>>(),
        vec![(7, Reason::LiftSpent)]
    );
    assert_eq!(p.take_app_changes(), vec![AppChange::ResetWaits(1)]);
    // Spent: it refills at 200 ms a second; 100 ms later a lift lasts 20 ms.
    assert_eq!(tids(&p.on_wait(1300 * MS, 1)), vec![(7, Reason::Lifted)]);
    assert!(tids(&p.on_tick(1315 * MS, cpu)).iter().all(|d| d.0 != 7));
    assert!(tids(&p.on_tick(1321 * MS, cpu)).contains(&(7, Reason::LiftSpent)));
    assert!(p.on_wait(1321 * MS, 1).is_empty(), "nothing left");
    // Waits of 9 ms every 10 ms for 5 s, ticks every millisecond: lifted for the
    // full bucket (200 ms) and then 200 ms a second.
    let mut p = one_sunk();
    let (mut lifted_ms, mut since) = (0, None);
    for ms in 10_000..15_000 {
        let now = ms * MS;
        let mut d = p.on_tick(now, cpu);
        if ms % 10 == 0 {
            d.extend(p.on_wait(now, 1));
        } else if ms % 10 == 9 {
            d.extend(p.on_wait_end(now, 1));
        }
        for (_, reason) in tids(&d).into_iter().filter(|d| d.0 == 7) {
            if reason == Reason::Lifted {
                since = Some(ms);
            } else {
                lifted_ms += ms - since.take().expect("lifted before");
            }
        }
    }
    assert!(
        (1150..=1210).contains(&lifted_ms),
        "lifted {lifted_ms} ms in 5 s"
    );
}

#[test]
fn a_wait_the_bucket_refused_is_lifted_once_it_has_refilled_unless_it_ended() {
    let mut p = one_sunk();
    let cpu = |_: u32, tid: u32| Some(if tid == 7 { 60 * MS } else { MS });
    let lifts = |d: &[Decision]| tids(d).into_iter().filter(|d| d.0 == 7).collect::<Vec<_>>();
    // The bucket spent by a wait that outlasts it.
    assert_eq!(lifts(&p.on_wait(1000 * MS, 1)), [(7, Reason::Lifted)]);
    assert_eq!(lifts(&p.on_tick(1201 * MS, cpu)), [(7, Reason::LiftSpent)]);
    // The next wait finds 0.2 ms: refused, but remembered, and ticks keep running; the
    // probe reports no later waiter of this application while one waits.
    assert!(p.on_wait(1202 * MS, 1).is_empty());
    assert!(p.any_elevated(), "ticks run while a refused wait waits");
    assert!(
        lifts(&p.on_tick(1204 * MS, cpu)).is_empty(),
        "0.6 ms: not yet"
    );
    assert_eq!(
        lifts(&p.on_tick(1207 * MS, cpu)),
        [(7, Reason::Lifted)],
        "a millisecond refilled: lifted without another report"
    );
    assert_eq!(lifts(&p.on_wait_end(1208 * MS, 1)), [(7, Reason::WaitOver)]);
    // A refused wait that ends before the refill is forgotten.
    assert!(p.on_wait(1209 * MS, 1).is_empty());
    assert!(p.on_wait_end(1210 * MS, 1).is_empty());
    assert!(lifts(&p.on_tick(1300 * MS, cpu)).is_empty());
    assert!(!p.any_elevated());
    // So is one whose sunk thread surfaced (a new request) meanwhile.
    let mut p = one_sunk();
    p.on_wait(1000 * MS, 1);
    p.on_tick(1201 * MS, cpu);
    assert!(p.on_wait(1202 * MS, 1).is_empty());
    p.on_request(1203 * MS, 1, 1, 7, Source::Unix, 60 * MS, load(2.0));
    assert!(lifts(&p.on_tick(1300 * MS, cpu))
        .iter()
        .all(|d| d.1 != Reason::Lifted));
    // And one of an application that went.
    let mut p = one_sunk();
    p.on_wait(1000 * MS, 1);
    p.on_tick(1201 * MS, cpu);
    assert!(p.on_wait(1202 * MS, 1).is_empty());
    p.forget(7);
    p.forget(8);
    assert!(p.on_tick(1300 * MS, cpu).is_empty());
    assert!(!p.any_elevated());
}

#[test]
fn without_lifting_a_wait_changes_nothing_and_the_probe_is_told_nothing() {
    let mut params = sinking();
    params.sink.as_mut().unwrap().lift = None;
    let mut p = ElevationPolicy::new(params);
    p.on_request(0, 1, 1, 7, Source::Unix, 0, load(2.0));
    p.on_tick(200 * MS, |_, _| Some(60 * MS));
    assert!(p.take_app_changes().is_empty());
    assert!(p.on_wait(300 * MS, 1).is_empty());
    // Turned on by a reload: the probe hears of the sunk application.
    p.set_params(sinking());
    assert_eq!(p.take_app_changes(), vec![AppChange::Sunk(1, true)]);
}

#[test]
fn an_applications_bucket_stays_its_own_when_another_application_goes() {
    fn check<I: SlotIndex>(mut p: ElevationPolicy<I>) {
        for (app, tid) in [(1, 10), (2, 20), (3, 30)] {
            p.on_request(0, app, tid, tid, Source::Network, 0, load(2.0));
        }
        // Application 1 goes (application 3 takes its place in the table).
        p.forget(10);
        // Application 3's thread burns 300 ms: its bucket, not application 2's, is spent.
        let d = p.on_tick(110 * MS, |_, tid| {
            Some(if tid == 30 { 300 * MS } else { 0 })
        });
        assert!(d.contains(&Decision::Restore {
            pid: 30,
            tid: 30,
            reason: Reason::BudgetExhausted
        }));
        let now = 110 * MS;
        assert_eq!(
            p.on_request(now, 3, 31, 31, Source::Network, 0, load(2.0)),
            None
        );
        assert_eq!(
            levels(&p.on_request(now, 2, 21, 21, Source::Network, 0, load(2.0))),
            2
        );
        // A new application 1 starts with a full bucket.
        assert_eq!(
            levels(&p.on_request(now, 1, 11, 11, Source::Network, 0, load(2.0))),
            2
        );
    }
    check(ElevationPolicy::new(params()));
    check(ElevationPolicy::<DenseIndex>::with_index(params()));
}

#[test]
fn workers_forked_per_connection_share_their_servers_budget() {
    let mut p = ElevationPolicy::new(params());
    // Application 100 (a forking server): its worker for one connection burns 300 ms.
    p.on_request(0, 100, 200, 200, Source::Network, 0, load(2.0));
    let now = 110 * MS;
    p.on_tick(now, |_, _| Some(300 * MS));
    // The bucket (200 ms) is spent: a fresh worker of it is not elevated...
    assert_eq!(
        p.on_request(now, 100, 300, 300, Source::Network, 0, load(2.0)),
        None
    );
    // ...while another application's first request is.
    assert_eq!(
        levels(&p.on_request(now, 400, 400, 400, Source::Network, 0, load(2.0))),
        2
    );
    // Per thread, each worker would have started with a full bucket.
    let mut q = ElevationPolicy::new(params());
    assert_eq!(
        levels(&q.on_request(now, 300, 300, 300, Source::Network, 0, load(2.0))),
        2
    );
}

#[test]
fn a_long_request_sinks_past_its_cpu_and_its_next_request_brings_it_back() {
    let mut p = ElevationPolicy::new(sinking());
    assert_eq!(
        levels(&p.on_request(0, 1, 1, 7, Source::Unix, 0, load(2.0))),
        4
    );
    // 40 ms of CPU after the read: still the request's work.
    assert!(p
        .on_tick(100 * MS, |_, _| Some(40 * MS))
        .iter()
        .all(|d| !matches!(d, Decision::Sink { .. })));
    // 60 ms: a long request. It loses its elevation and sinks, once.
    let d = p.on_tick(200 * MS, |_, _| Some(60 * MS));
    assert_eq!(
        d,
        vec![Decision::Sink {
            pid: 1,
            tid: 7,
            levels: 10,
            reason: Reason::LongRequest
        }]
    );
    assert_eq!(p.levels(7), 0);
    assert!(p.view()[0].sunk);
    assert!(p.on_tick(900 * MS, |_, _| Some(500 * MS)).is_empty());
    // Its next request: elevated again (which replaces the sinking).
    assert_eq!(
        levels(&p.on_request(1000 * MS, 1, 1, 7, Source::Unix, 600 * MS, load(2.0))),
        4
    );
    assert!(!p.view()[0].sunk);
    // Not elevated on an idle machine, still sunk by a long request, and put back
    // by the next request.
    p.on_request(2000 * MS, 1, 1, 8, Source::Unix, 0, load(0.5));
    let d = p.on_tick(2200 * MS, |_, tid| {
        Some(if tid == 8 { 80 * MS } else { 600 * MS })
    });
    assert!(d.contains(&Decision::Sink {
        pid: 1,
        tid: 8,
        levels: 10,
        reason: Reason::LongRequest
    }));
    assert_eq!(
        p.on_request(2300 * MS, 1, 1, 8, Source::Unix, 80 * MS, load(0.5)),
        Some(Decision::Restore {
            pid: 1,
            tid: 8,
            reason: Reason::Surfaced
        })
    );
}

#[test]
fn short_requests_never_sink_however_many() {
    let mut p = ElevationPolicy::new(sinking());
    let mut cpu = 0;
    for i in 0..200u64 {
        let now = i * 20 * MS;
        p.on_request(now, 1, 1, 7, Source::Network, cpu, load(2.0));
        cpu += 5 * MS; // 5 ms per request, a request every 20 ms: 10 s in all
        let d = p.on_tick(now + 10 * MS, |_, _| Some(cpu));
        assert!(
            d.iter().all(|d| !matches!(d, Decision::Sink { .. })),
            "{d:?}"
        );
    }
}

#[test]
fn without_sinking_no_idle_thread_is_read() {
    let mut p = ElevationPolicy::new(params());
    p.on_request(0, 1, 1, 7, Source::Unix, 0, load(0.5));
    let mut reads = 0;
    p.on_tick(5000 * MS, |_, _| {
        reads += 1;
        Some(0)
    });
    assert_eq!(reads, 0, "not elevated, not watched: no CPU read");
}

fn load(r: f64) -> Load {
    Load {
        runnable_per_cpu: r,
        psi_some_pct: 50.0,
    }
}

fn levels(d: &Option<Decision>) -> u32 {
    match d {
        Some(Decision::Elevate { levels, .. }) => *levels,
        _ => 0,
    }
}

#[test]
fn no_elevation_on_an_idle_machine() {
    let mut p = ElevationPolicy::new(params());
    assert_eq!(p.on_request(0, 1, 1, 1, Source::Unix, 0, load(0.5)), None);
    let calm = Load {
        runnable_per_cpu: 4.0,
        psi_some_pct: 0.1,
    };
    assert_eq!(
        p.on_request(0, 1, 1, 2, Source::Unix, 0, calm),
        None,
        "no one waits: no elevation"
    );
}

#[test]
fn unix_elevates_more_than_network_and_more_under_load() {
    let mut p = ElevationPolicy::new(params());
    let u = p.on_request(0, 1, 1, 1, Source::Unix, 0, load(1.5));
    let n = p.on_request(0, 2, 2, 2, Source::Network, 0, load(1.5));
    let heavy = p.on_request(0, 3, 3, 3, Source::Network, 0, load(4.0));
    assert_eq!((levels(&u), levels(&n), levels(&heavy)), (4, 2, 6));
    assert!(matches!(
        u,
        Some(Decision::Elevate {
            reason: Reason::UnixRequest,
            slice: Some(_),
            ..
        })
    ));
}

#[test]
fn fades_one_level_per_delay_and_re_elevates() {
    let mut p = ElevationPolicy::new(params());
    let cpu = |_, _| Some(0);
    p.on_request(0, 1, 1, 1, Source::Unix, 0, load(2.0));
    assert!(p.on_tick(99 * MS, cpu).is_empty());
    assert_eq!(
        p.on_tick(100 * MS, cpu),
        vec![Decision::Elevate {
            pid: 1,
            tid: 1,
            levels: 3,
            slice: Some(Duration::from_micros(500)),
            reason: Reason::Decay
        }]
    );
    // A new request restores the full elevation and restarts the timer.
    assert_eq!(
        levels(&p.on_request(150 * MS, 1, 1, 1, Source::Unix, 0, load(2.0))),
        4
    );
    assert!(p.on_tick(249 * MS, cpu).is_empty());
    // Ticks that come late apply every missed step at once.
    let d = p.on_tick(450 * MS, cpu);
    assert!(
        matches!(d[..], [Decision::Elevate { levels: 1, .. }]),
        "{d:?}"
    );
    let d = p.on_tick(550 * MS, cpu);
    assert_eq!(
        d,
        vec![Decision::Restore {
            pid: 1,
            tid: 1,
            reason: Reason::Faded
        }]
    );
    assert!(p.on_tick(900 * MS, cpu).is_empty());
}

#[test]
fn a_request_once_the_load_has_fallen_fades_at_the_pace_of_the_load_now() {
    let mut p = ElevationPolicy::new(params());
    let cpu = |_, _| Some(0);
    assert_eq!(
        levels(&p.on_request(0, 1, 1, 1, Source::Unix, 0, load(2.0))),
        4
    );
    // Below the first step (the batch went idle): no elevation at this load, so
    // the next tick restores the thread instead of fading it a level per 100 ms.
    assert_eq!(
        p.on_request(30 * MS, 1, 1, 1, Source::Unix, 0, load(0.2)),
        None
    );
    assert_eq!(
        p.on_tick(50 * MS, cpu),
        vec![Decision::Restore {
            pid: 1,
            tid: 1,
            reason: Reason::Faded
        }]
    );
    // A load still on the ladder keeps the slower fade of its own step.
    assert_eq!(
        levels(&p.on_request(60 * MS, 2, 2, 2, Source::Unix, 0, load(2.0))),
        4
    );
    assert_eq!(
        p.on_request(90 * MS, 2, 2, 2, Source::Unix, 0, load(1.2)),
        None
    );
    assert!(p.on_tick(120 * MS, cpu).is_empty());
    assert_eq!(p.levels(2), 4);
}

#[test]
fn repeated_requests_at_same_level_need_no_syscall() {
    let mut p = ElevationPolicy::new(params());
    assert!(p
        .on_request(0, 1, 1, 1, Source::Unix, 0, load(2.0))
        .is_some());
    assert_eq!(
        p.on_request(10 * MS, 1, 1, 1, Source::Unix, 0, load(2.0)),
        None
    );
    // A weaker step does not lower a stronger elevation.
    assert_eq!(
        p.on_request(20 * MS, 1, 1, 1, Source::Network, 0, load(2.0)),
        None
    );
    assert_eq!(p.levels(1), 4);
}

#[test]
fn a_spinning_cheater_loses_its_elevation_and_stays_down() {
    let mut p = ElevationPolicy::new(params());
    // Reads a byte every 5 ms while using the whole CPU.
    let mut elevated_ticks = 0;
    for i in 0..400u64 {
        let now = i * 5 * MS;
        p.on_request(now, 1, 1, 1, Source::Network, now, load(2.0));
        p.on_tick(now, |_, _| Some(now));
        if i >= 100 && p.levels(1) > 0 {
            elevated_ticks += 1;
        }
    }
    assert_eq!(
        elevated_ticks, 0,
        "after its first burst the cheater is never elevated again"
    );
    assert!(p.view()[0].exhausted);
}

#[test]
fn a_server_using_a_fifth_of_a_cpu_keeps_its_elevation() {
    let mut p = ElevationPolicy::new(params());
    // 5 ms of CPU per request, 40 requests/s.
    let mut cpu = 0;
    for i in 0..400u64 {
        let now = i * 25 * MS;
        p.on_request(now, 1, 1, 1, Source::Network, cpu, load(2.0));
        cpu += 5 * MS;
        p.on_tick(now + 5 * MS, |_, _| Some(cpu));
        assert_eq!(p.levels(1), 2, "at {i}");
    }
}

#[test]
fn exhausted_thread_recovers_once_it_stops_burning() {
    let mut p = ElevationPolicy::new(params());
    p.on_request(0, 1, 1, 1, Source::Unix, 0, load(2.0));
    assert!(!p.spent(1), "a fresh bucket");
    // 600 ms of CPU within the first 100 ms (several threads' worth: a clear overrun).
    let d = p.on_tick(100 * MS, |_, _| Some(600 * MS));
    assert_eq!(
        d,
        vec![Decision::Restore {
            pid: 1,
            tid: 1,
            reason: Reason::BudgetExhausted
        }]
    );
    assert_eq!(
        p.on_request(110 * MS, 1, 1, 1, Source::Unix, 600 * MS, load(2.0)),
        None
    );
    // Idle from then on: the bucket (clamped at -200 ms) refills at 0.5/s to full in 0.8 s, at 900 ms.
    assert_eq!(
        p.on_request(700 * MS, 1, 1, 1, Source::Unix, 600 * MS, load(2.0)),
        None
    );
    // Spent: the daemon lets its requests wait for a tick rather than wake it.
    assert!(p.spent(1));
    assert!(p
        .on_request(1000 * MS, 1, 1, 1, Source::Unix, 600 * MS, load(2.0))
        .is_some());
    assert!(!p.spent(1), "refilled");
    assert!(!p.spent(2), "a thread not watched has no budget spent");
}

#[test]
fn a_budget_emptied_by_a_request_ends_the_elevation_on_the_next_tick() {
    let mut p = ElevationPolicy::new(params());
    p.on_request(0, 1, 1, 1, Source::Unix, 0, load(2.0));
    // The next request shows 600 ms of CPU used in 10 ms.
    assert_eq!(
        p.on_request(10 * MS, 1, 1, 1, Source::Unix, 600 * MS, load(2.0)),
        None
    );
    assert_eq!(
        p.on_tick(20 * MS, |_, _| Some(600 * MS)),
        vec![Decision::Restore {
            pid: 1,
            tid: 1,
            reason: Reason::BudgetExhausted
        }]
    );
}

#[test]
fn every_thread_fades_on_time_while_others_come_and_go() {
    fades_on_time(ElevationPolicy::new(params()));
    fades_on_time(ElevationPolicy::<DenseIndex>::with_index(params()));
}

fn fades_on_time<I: SlotIndex>(mut p: ElevationPolicy<I>) {
    // Thread i gets its request at i·10 ms; 1, 4 and 7 are forgotten (each removal
    // moves another thread's state), 9 has exited by its first CPU-time read.
    for tid in 1..=10u32 {
        p.on_request(
            tid as u64 * 10 * MS,
            tid,
            tid,
            tid,
            Source::Unix,
            0,
            load(2.0),
        );
    }
    for tid in [1, 4, 7] {
        p.forget(tid);
    }
    let mut seen: Vec<(u64, u32, u32)> = Vec::new();
    for tick in 0..=100u64 {
        let now = tick * 10 * MS;
        for d in p.on_tick(now, |_, tid| (tid != 9).then_some(0)) {
            match d {
                Decision::Elevate { tid, levels, .. } => seen.push((now, tid, levels)),
                Decision::Restore { tid, .. } => seen.push((now, tid, 0)),
                Decision::Sink { .. } => panic!("sinking is off here: {d:?}"),
            }
        }
    }
    seen.sort();
    let mut expected = Vec::new();
    for tid in [2u32, 3, 5, 6, 8, 10] {
        // Elevated 4 levels, one level less every 100 ms.
        for (k, levels) in [3, 2, 1, 0].into_iter().enumerate() {
            expected.push(((tid as u64 * 10 + 100 * (k as u64 + 1)) * MS, tid, levels));
        }
    }
    expected.sort();
    assert_eq!(seen, expected);
    assert_eq!(p.tracked(), 6, "idle threads are kept for forget_after");
    p.on_request(2_000 * MS, 10, 10, 10, Source::Unix, 0, load(2.0));
    assert_eq!(p.levels(10), 4);
    assert_eq!(p.levels(2), 0);
}

#[test]
fn a_dense_index_finds_what_was_set_and_nothing_else() {
    let mut d = DenseIndex::default();
    assert_eq!(d.get(0), None);
    d.set(7, 3);
    d.set(2, 0);
    assert_eq!(
        (d.get(7), d.get(2), d.get(5), d.get(100)),
        (Some(3), Some(0), None, None)
    );
    d.unset(7);
    d.unset(100); // never set: nothing to do
    assert_eq!((d.get(7), d.get(2)), (None, Some(0)));
}

#[test]
fn both_indexes_give_the_same_decisions() {
    // Requests, ticks, exits and forgetting in a pseudo-random order, so that slots
    // are reused and moved many times.
    let mut hashed = ElevationPolicy::new(params());
    let mut dense = ElevationPolicy::<DenseIndex>::with_index(params());
    let mut x: u64 = 99;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let mut decisions = 0;
    for step in 0..20_000u64 {
        let now = step * MS;
        let tid = (next() % 50) as u32;
        match next() % 10 {
            0 => {
                hashed.forget(tid);
                dense.forget(tid);
            }
            1 => {
                // Threads whose id ends in 7 have exited.
                let cpu = |_, tid: u32| (tid % 10 != 7).then_some(now / 3);
                let (a, b) = (hashed.on_tick(now, cpu), dense.on_tick(now, cpu));
                decisions += a.len();
                assert_eq!(a, b, "tick at {now}");
            }
            k => {
                let source = if k % 2 == 0 {
                    Source::Unix
                } else {
                    Source::Network
                };
                let l = load((next() % 5) as f64);
                let a = hashed.on_request(now, tid, tid, tid, source, now / 2, l);
                let b = dense.on_request(now, tid, tid, tid, source, now / 2, l);
                decisions += a.is_some() as usize;
                assert_eq!(a, b, "request at {now}");
            }
        }
        assert_eq!(hashed.view(), dense.view(), "step {step}");
    }
    assert!(decisions > 1_000, "{decisions} decisions");
}

#[test]
fn a_reload_applies_the_new_forget_after_to_threads_already_watched() {
    let mut p = ElevationPolicy::new(params());
    // Watched (for its budget) but not elevated: an idle machine.
    p.on_request(0, 1, 1, 1, Source::Unix, 0, load(0.5));
    assert_eq!(p.tracked(), 1);
    p.set_params(ElevationParams {
        forget_after: Duration::from_secs(1),
        ..params()
    });
    p.on_tick(999 * MS, |_, _| Some(0));
    assert_eq!(p.tracked(), 1);
    p.on_tick(1_000 * MS, |_, _| Some(0));
    assert_eq!(
        p.tracked(),
        0,
        "forgotten after the new 1 s, not the old 10 s"
    );
}

#[test]
fn gone_threads_and_idle_threads_are_forgotten() {
    let mut p = ElevationPolicy::new(params());
    p.on_request(0, 1, 1, 1, Source::Unix, 0, load(2.0));
    p.on_request(0, 2, 2, 2, Source::Unix, 0, load(2.0));
    let d = p.on_tick(10 * MS, |_, _| {
        panic!("CPU time known from the request events")
    });
    assert!(d.is_empty());
    let d = p.on_tick(100 * MS, |_, tid| (tid == 1).then_some(0));
    assert!(
        d.iter().all(|d| !matches!(
            d,
            Decision::Restore { tid: 2, .. } | Decision::Elevate { tid: 2, .. }
        )),
        "a vanished thread needs no restore: {d:?}"
    );
    assert_eq!(p.tracked(), 1);
    p.on_tick(20 * MS * 1000, |_, _| Some(0));
    assert_eq!(p.tracked(), 0, "faded and idle for forget_after");
}

/// 16 applications (one process each) of one user, each thread reading a byte every 20 ms
/// and spinning, 2 CPUs: the CPU their threads run elevated over 20 s, in CPUs.
fn elevated_cpus_of_sixteen_spinners(user: Option<u32>) -> f64 {
    let budget = Budget {
        cpu_share: 0.5,
        burst: Duration::from_millis(200),
    };
    let mut p = ElevationPolicy::new(ElevationParams {
        user_budget: Some(budget),
        ..params()
    });
    let (n, step) = (16u32, 20 * MS);
    let mut cpu = vec![0u64; n as usize];
    let mut elevated_ns = 0u64;
    let mut now = 0;
    while now < 20_000 * MS {
        for i in 0..n {
            let tid = 100 + i;
            // Each gets 2/16 of a CPU.
            let used = step * 2 / n as u64;
            if p.levels(tid) > 0 {
                elevated_ns += used;
            }
            cpu[i as usize] += used;
            p.on_user_request(
                now,
                tid,
                user,
                tid,
                tid,
                Source::Unix,
                cpu[i as usize],
                load(4.0),
            );
        }
        p.on_tick(now, |_, tid| Some(cpu[(tid - 100) as usize]));
        now += step;
    }
    elevated_ns as f64 / (20_000 * MS) as f64
}

#[test]
fn a_users_threads_run_elevated_on_at_most_the_users_share_however_many_applications() {
    let as_a_user = elevated_cpus_of_sixteen_spinners(Some(1000));
    let as_system_services = elevated_cpus_of_sixteen_spinners(None);
    assert!(
        as_a_user <= 0.5 + 0.2 / 20.0,
        "one user's 16 applications: {as_a_user:.3} CPUs elevated"
    );
    assert!(as_a_user > 0.1, "elevated at all: {as_a_user:.3}");
    assert!(
        as_system_services > 1.5,
        "each application its own bucket: {as_system_services:.3} CPUs elevated"
    );
}

#[test]
fn a_user_who_ends_each_thread_and_starts_another_gets_no_fresh_bucket() {
    let mut p = ElevationPolicy::new(ElevationParams {
        user_budget: Some(Budget {
            cpu_share: 0.5,
            burst: Duration::from_millis(200),
        }),
        ..params()
    });
    let user = Some(1000);
    // One thread, elevated, spends the user's bucket, then exits.
    assert!(p
        .on_user_request(0, 1, user, 1, 1, Source::Unix, 0, load(4.0))
        .is_some());
    let d = p.on_tick(1000 * MS, |_, _| Some(1000 * MS));
    assert!(
        tids(&d).contains(&(1, Reason::BudgetExhausted))
            || tids(&d).contains(&(1, Reason::UserBudgetExhausted)),
        "{d:?}"
    );
    p.forget(1);
    // A new process of the same user: its application's bucket is full, its user's not.
    assert_eq!(
        p.on_user_request(1010 * MS, 2, user, 2, 2, Source::Unix, 0, load(4.0)),
        None,
        "not elevated: the user's bucket is still empty"
    );
    // Another user is not held back by it.
    assert!(p
        .on_user_request(1010 * MS, 3, Some(1001), 3, 3, Source::Unix, 0, load(4.0))
        .is_some());
}

#[test]
fn a_users_threads_are_watched_a_bounded_number_at_a_time() {
    let mut p = ElevationPolicy::new(ElevationParams {
        user_budget: Some(Budget {
            cpu_share: 0.5,
            burst: Duration::from_millis(200),
        }),
        user_threads_max: 2,
        users_threads_max: 3,
        ..params()
    });
    let req = |p: &mut ElevationPolicy, uid, tid| {
        p.on_user_request(0, tid, Some(uid), tid, tid, Source::Unix, 0, load(4.0))
    };
    assert!(req(&mut p, 1000, 1).is_some());
    assert!(req(&mut p, 1000, 2).is_some());
    assert_eq!(req(&mut p, 1000, 3), None, "a third thread of one user");
    assert!(req(&mut p, 1001, 4).is_some(), "another user's");
    assert_eq!(req(&mut p, 1002, 5), None, "a fourth of all users'");
    assert!(
        p.on_request(0, 6, 6, 6, Source::Unix, 0, load(4.0))
            .is_some(),
        "root's and system accounts' are not counted"
    );
    assert_eq!(p.tracked(), 4);
}

#[test]
fn a_users_thread_is_read_only_while_elevated_a_services_also_for_a_long_request() {
    let mut p = ElevationPolicy::new(ElevationParams {
        user_budget: Some(Budget {
            cpu_share: 0.5,
            burst: Duration::from_millis(200),
        }),
        ..sinking()
    });
    // Below the ladder's first step: tracked, not elevated.
    assert_eq!(
        p.on_user_request(0, 1, Some(1000), 1, 1, Source::Unix, 0, load(0.1)),
        None
    );
    assert_eq!(p.on_request(0, 2, 2, 2, Source::Unix, 0, load(0.1)), None);
    assert_eq!(p.tracked(), 2);
    let mut read = Vec::new();
    p.on_tick(150 * MS, |_, tid| {
        read.push(tid);
        Some(0)
    });
    assert_eq!(read, [2], "the service's thread only");
    // Elevated, the user's thread is read again (its user's bucket pays).
    assert!(p
        .on_user_request(200 * MS, 1, Some(1000), 1, 1, Source::Unix, 0, load(4.0))
        .is_some());
    read.clear();
    p.on_tick(350 * MS, |_, tid| {
        read.push(tid);
        Some(0)
    });
    assert!(read.contains(&1), "{read:?}");
}
