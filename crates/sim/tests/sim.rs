//! The simulator against seeds/004's scenarios and the kernel's documented behaviour.

use appease_sim::{run, Report, Workload};

fn sim(text: &str, policy: &str) -> Report {
    let w = Workload::parse(text, "test.toml").unwrap();
    run(&w, Some(policy)).unwrap()
}

fn share(r: &Report, name: &str) -> f64 {
    r.processes
        .iter()
        .find(|p| p.name == name)
        .unwrap()
        .cpu_share
}

/// seeds/004 §3: N − 1 CPU-bound processes on one CPU and one sleeping server; one
/// request needing `cpu_ms`, arriving `at_ms` (10 ms quanta start at 0).
fn one_request(hogs: usize, cpu_ms: f64, at_ms: f64) -> String {
    format!(
        r#"
[sim]
cpus = 1
duration_ms = 5000
[tunables]
quantum_ms = 10.0
[[process]]
name = "hog"
count = {hogs}
behavior = "cpu-bound"
[[process]]
name = "server"
serve = {{ cpu_ms = {cpu_ms} }}
[[customer]]
name = "c"
to = "server"
arrivals = {{ kind = "periodic", period_ms = 100000.0 }}
start_ms = {at_ms}
"#
    )
}

#[test]
fn round_robin_unhappiness_is_the_queue_wait_of_every_quantum() {
    // N = 5 (4 hogs + the server), q = 10 ms, Z = 3 quanta, arriving 5 ms into a quantum.
    let r = sim(&one_request(4, 30.0, 1005.0), "rr");
    assert_eq!(r.requests.count, 1);
    let u = r.unhappiness.system;
    // Exact: the rest of the running quantum, the other N − 2 hogs queued ahead, then
    // N − 1 quanta of waiting before each of the Z − 1 later quanta:
    // (q − 5) + (N − 2)q + (Z − 1)(N − 1)q = 5 + 30 + 80 = 115 ms.
    assert!((u - 115.0).abs() < 1e-6, "{u}");
    // seeds/004 eq. 6, q(Z(N − 2) + 1) = 100 ms, counts one quantum less per round:
    // docs/sim.md explains the difference; the test pins the simulated value.
    let paper = 10.0 * (3.0 * 3.0 + 1.0);
    assert!(u > paper);
}

#[test]
fn mlfq_serves_a_fresh_request_ahead_of_hogs_that_sank() {
    // The hogs have sunk to the lowest queue by t = 1 s; the server enters Q0 alone
    // (a_0 = 1) and preempts: no unhappiness (eq. 10 with a_i = 1 has no waiting term).
    let r = sim(&one_request(4, 30.0, 1005.0), "mlfq");
    assert!(
        r.unhappiness.system.abs() < 1e-6,
        "{}",
        r.unhappiness.system
    );
}

#[test]
fn cfs_shares_follow_the_nice_weight_table() {
    let text = r#"
[sim]
cpus = 1
duration_ms = 20000
[[process]]
name = "a"
nice = 0
behavior = "cpu-bound"
[[process]]
name = "b"
nice = -1
behavior = "cpu-bound"
"#;
    for policy in ["cfs", "eevdf"] {
        let r = sim(text, policy);
        let (a, b) = (share(&r, "a"), share(&r, "b"));
        // 1024 : 1277 -> 44.5 % : 55.5 % ("about 45/55", seeds/004 §3.3).
        assert!(
            (a - 0.445).abs() < 0.01 && (b - 0.555).abs() < 0.01,
            "{policy}: {a} {b}"
        );
    }
}

#[test]
fn cfs_sleeper_wakes_first_so_a_short_request_sees_no_unhappiness() {
    // τ ≤ q(N): eq. 17, U_min = 0.
    let r = sim(&one_request(4, 0.5, 1005.0), "cfs");
    assert!(r.unhappiness.system < 0.01, "{}", r.unhappiness.system);
    // A long request (τ = 30 ms > q(N)) waits under CFS; elevation (the daemon's own
    // policy) and the ideal scheduler cut it (eqs. 26 vs 27, §4).
    let text = one_request(4, 30.0, 1005.0);
    let cfs = sim(&text, "cfs").unhappiness.system;
    let rbpe = sim(&text, "cfs-rbpe").unhappiness.system;
    let ideal = sim(&text, "unhappiness").unhappiness.system;
    assert!(cfs > 20.0, "cfs {cfs}");
    assert!(rbpe < cfs, "cfs-rbpe {rbpe} < cfs {cfs}");
    assert!(ideal < 1e-6, "the ideal two-queue scheduler: {ideal}");
}

#[test]
fn sched_idle_tasks_and_idle_groups_get_only_what_normal_tasks_leave() {
    let text = |layout: &str| {
        format!(
            r#"
[sim]
cpus = 1
duration_ms = 20000
[[group]]
path = "/batch"
idle = true
[[process]]
name = "normal"
behavior = "cpu-bound"
[[process]]
name = "batch"
count = 3
{layout}
behavior = "cpu-bound"
"#
        )
    };
    for policy in ["cfs", "eevdf"] {
        // Three SCHED_IDLE tasks: weight 3 each against 1024.
        let r = sim(&text("sched = \"idle\""), policy);
        let n = share(&r, "normal");
        assert!(
            (n - 1024.0 / 1033.0).abs() < 0.005,
            "{policy} sched idle: {n}"
        );
        assert!(
            share(&r, "batch") > 0.0,
            "idle tasks are not starved entirely"
        );
        // An idle group: the group entity weighs 3, whatever it holds.
        let r = sim(&text("group = \"/batch\""), policy);
        let n = share(&r, "normal");
        assert!(
            (n - 1024.0 / 1027.0).abs() < 0.005,
            "{policy} idle group: {n}"
        );
    }
}

#[test]
fn group_shares_split_the_cpu_between_groups_then_between_their_tasks() {
    let text = r#"
[sim]
cpus = 1
duration_ms = 20000
[[group]]
path = "/a"
shares = 1024
[[group]]
path = "/b"
shares = 1024
[[process]]
name = "two"
count = 2
group = "/a"
behavior = "cpu-bound"
[[process]]
name = "one"
group = "/b"
behavior = "cpu-bound"
"#;
    let r = sim(text, "cfs");
    assert!(
        (share(&r, "two") - 0.5).abs() < 0.01,
        "{}",
        share(&r, "two")
    );
    assert!(
        (share(&r, "one") - 0.5).abs() < 0.01,
        "{}",
        share(&r, "one")
    );
}

#[test]
fn alpha_moves_unhappiness_between_caller_and_callee_but_not_the_total() {
    let text = |alpha: f64| {
        format!(
            r#"
[sim]
cpus = 1
duration_ms = 10000
alpha = {alpha}
[[process]]
name = "hog"
count = 3
behavior = "cpu-bound"
[[process]]
name = "web"
serve = {{ cpu_ms = 5.0, calls = [{{ to = "db", after_cpu_ms = 2.0 }}] }}
[[process]]
name = "db"
serve = {{ cpu_ms = 3.0 }}
[[customer]]
name = "remote"
to = "web"
arrivals = {{ kind = "poisson", rate_per_s = 20.0 }}
"#
        )
    };
    let a = sim(&text(0.0), "cfs");
    let b = sim(&text(0.4), "cfs");
    // Eq. 2 hands the callee's share back on the answer: a request's total is its
    // response time minus the CPU it got, whatever alpha.
    assert!(a.requests.count > 150);
    assert!((a.unhappiness.system - b.unhappiness.system).abs() < 1e-6 * a.unhappiness.system);
    for rec in &a.records {
        assert!((rec.response_ms - rec.cpu_ms - rec.unhappiness_ms).abs() < 1e-6);
        assert!(
            (rec.cpu_ms - 8.0).abs() < 1e-9,
            "every request got its 5 + 3 ms"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sim/web-db.toml"
    ))
    .unwrap();
    for policy in appease_sim::POLICIES {
        let a = sim(&text, policy);
        let b = sim(&text, policy);
        assert_eq!(a.events, b.events, "{policy}");
        assert_eq!(a.unhappiness.system, b.unhappiness.system, "{policy}");
        assert!(a.requests.count > 50, "{policy}: every policy answers");
        assert!(a.utilization > 0.99, "{policy}: hogs keep the CPU busy");
    }
    let other = sim(&text.replace("seed = 1", "seed = 2"), "cfs");
    assert_ne!(
        other.unhappiness.system,
        sim(&text, "cfs").unhappiness.system
    );
}

#[test]
fn tasks_spread_over_cpus_and_servers_use_idle_ones() {
    let text = r#"
[sim]
cpus = 4
duration_ms = 5000
[[process]]
name = "hog"
count = 4
behavior = "cpu-bound"
"#;
    for policy in appease_sim::POLICIES {
        let r = sim(text, policy);
        assert!(r.utilization > 0.99, "{policy}: {}", r.utilization);
    }
}
