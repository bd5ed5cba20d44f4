//! The simulator against the 2010 customer-appeasement paper's scenarios and the kernel's documented behaviour.

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

/// The 2010 customer-appeasement paper's §3: N − 1 CPU-bound processes on one CPU and one sleeping server; one
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
    // the 2010 customer-appeasement paper's eq. 6, q(Z(N − 2) + 1) = 100 ms, counts one quantum less per round:
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
        // 1024 : 1277 -> 44.5 % : 55.5 % ("about 45/55", the 2010 customer-appeasement paper's §3.3).
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

/// The 2010 customer-appeasement paper's §3's second scenario: N − 1 = 3 CPU-bound processes on one CPU; the server
/// computes τ1 = 20 ms, calls a sleeping service that computes τ2 = 20 ms, then computes
/// τ3 = 10 ms and answers (α = 0). The request arrives 5 ms into a 10 ms quantum.
fn service_call() -> String {
    r#"
[sim]
cpus = 1
duration_ms = 5000
[tunables]
quantum_ms = 10.0
sched_latency_ms = 20.0
[[process]]
name = "hog"
count = 3
behavior = "cpu-bound"
[[process]]
name = "server"
serve = { cpu_ms = 30.0, calls = [{ to = "service", after_cpu_ms = 20.0 }] }
[[process]]
name = "service"
serve = { cpu_ms = 20.0 }
[[customer]]
name = "c"
to = "server"
arrivals = { kind = "periodic", period_ms = 100000.0 }
start_ms = 1005.0
"#
    .into()
}

fn paper(policy: &str, equations: &str) -> f64 {
    use appease_model::unhappiness::{evaluate, Params};
    let p = Params {
        processes: 4,
        quantum_ms: 10.0,
        sched_latency_ms: 20.0,
        tau_ms: [20.0, 20.0, 10.0],
        ..Params::default()
    };
    evaluate(&p)
        .unwrap()
        .rows
        .into_iter()
        .find(|r| r.policy == policy && r.equations == equations)
        .and_then(|r| r.unhappiness_ms)
        .unwrap()
}

#[test]
fn round_robin_service_call_waits_a_full_round_per_quantum() {
    let r = sim(&service_call(), "rr");
    assert_eq!(r.requests.count, 1);
    // Exact: τ1 waits 5 + 2·10 then 30 (one round of 3 hogs), the service 30 + 30, τ3 30.
    let u = r.unhappiness.system;
    assert!((u - 145.0).abs() < 1e-6, "{u}");
    // Eq. 7: q((Z1 + Z2 + Z3)(N − 2) + 3) = 10 (5·2 + 3) = 130 counts one process less
    // per round; docs/sim.md explains.
    assert_eq!(paper("rr", "7, 9"), 130.0);
}

#[test]
fn feedback_queues_serve_each_part_of_a_service_call_at_once() {
    // The hogs sank long ago; the server and the service each enter Q0 alone and
    // preempt, so nothing waits. Eq. 13 with a_i = 1 goes negative instead.
    let r = sim(&service_call(), "mlfq");
    assert!(
        r.unhappiness.system.abs() < 1e-6,
        "{}",
        r.unhappiness.system
    );
    assert!(paper("mlfq", "13") < 0.0);
}

#[test]
fn elevation_and_the_ideal_scheduler_cut_the_service_call_unhappiness_of_cfs() {
    let cfs = sim(&service_call(), "cfs").unhappiness.system;
    let rbpe = sim(&service_call(), "cfs-rbpe").unhappiness.system;
    let ideal = sim(&service_call(), "unhappiness").unhappiness.system;
    let rr = sim(&service_call(), "rr").unhappiness.system;
    // Fair sharing among N = 4 makes each ms of work wait up to N − 1 ms; the sleeper's
    // placement ahead of the hogs saves part of that on each of the three wake-ups.
    assert!(cfs > 0.0 && cfs < 3.0 * 50.0, "{cfs}");
    // Eq. 27 < eq. 26: the elevated server and service take more of the CPU.
    assert!(rbpe < cfs, "cfs-rbpe {rbpe} vs cfs {cfs}");
    // Section 4's two-queue scheduler runs whoever holds the request first.
    assert!(ideal.abs() < 1e-6, "{ideal}");
    assert!(cfs < rr, "cfs {cfs} vs rr {rr}");
    // EEVDF places a waking task at the lag it left with (about 0), no sleeper credit:
    // fair sharing throughout, each ms of the 50 waits for the N − 1 = 3 hogs.
    let eevdf = sim(&service_call(), "eevdf").unhappiness.system;
    assert!((eevdf - 150.0).abs() < 7.5, "{eevdf}");
}

/// Three hogs and a server on one CPU with 10 ms EEVDF slices; 0.2 ms requests, Poisson.
fn protected_hogs(server_slice: &str) -> String {
    format!(
        r#"
[sim]
cpus = 1
duration_ms = 10000
[tunables]
base_slice_ms = 10.0
[[process]]
name = "hog"
count = 3
behavior = "cpu-bound"
[[process]]
name = "server"
serve = {{ cpu_ms = 0.2 }}
{server_slice}
[[customer]]
name = "c"
to = "server"
arrivals = {{ kind = "poisson", rate_per_s = 40.0 }}
"#
    )
}

#[test]
fn eevdf_protects_the_running_slice_unless_the_woken_task_has_a_shorter_one() {
    // RUN_TO_PARITY (Linux 6.17+): a woken server with the hogs' slice, even one with
    // an earlier deadline, waits for the running hog to reach its deadline, up to 10 ms.
    let equal = sim(&protected_hogs(""), "eevdf").requests;
    assert!(equal.p99_ms > 2.0, "p99 {} ms", equal.p99_ms);
    // PREEMPT_SHORT: with a 1 ms slice it preempts at once, so a request takes its
    // 0.2 ms of CPU and little more.
    let short = sim(&protected_hogs("slice_ms = 1.0"), "eevdf").requests;
    assert!(short.p99_ms < 0.5, "p99 {} ms", short.p99_ms);
    assert_eq!(short.count, equal.count);
}

/// N processes, each alone on its CPU, compute (exponential, mean Z) then hold one lock
/// (exponential, mean x̄ = 1 ms): the machine-repairman queue `appease model contention`
/// solves exactly. Ten seeded runs give a 99 % confidence interval that must hold the
/// model's value.
#[test]
fn simulated_machine_repairman_agrees_with_the_contention_model() {
    for (cpus, demand_pct) in [(8u64, 10.0), (4, 30.0)] {
        let model = appease_model::contention::solve(cpus, demand_pct).unwrap();
        let d = demand_pct / 100.0;
        let compute = (1.0 - d) / d;
        let mut waits = Vec::new();
        let mut utils = Vec::new();
        for seed in 1..=10 {
            let text = format!(
                r#"
[sim]
cpus = {cpus}
duration_ms = 20000
seed = {seed}
[[process]]
name = "cpu"
count = {cpus}
lock = {{ name = "kernel", compute_ms = {compute}, hold_ms = 1.0, times = "exponential" }}
"#
            );
            let r = sim(&text, "cfs");
            let l = &r.locks[0];
            assert_eq!(l.contenders, cpus as usize);
            assert!(l.acquisitions > 10_000, "{}", l.acquisitions);
            waits.push(l.wait_per_hold);
            utils.push(l.utilization);
        }
        for (what, xs, expect) in [
            ("wait per hold", &waits, model.wait_per_hold),
            ("lock utilization", &utils, model.utilization),
        ] {
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
            // Student's t, 9 degrees of freedom, two-sided 99 %.
            let half = 3.25 * sd / n.sqrt();
            assert!(
                (mean - expect).abs() <= half,
                "{cpus} CPUs at {demand_pct} %: {what} simulated {mean:.4} ± {half:.4}, model {expect:.4}"
            );
            assert!(
                half < 0.1 * expect,
                "{what}: the interval is too wide to mean anything"
            );
        }
    }
}

#[test]
fn the_workload_parser_never_panics_on_damaged_workloads() {
    let seed = include_bytes!("../../../examples/sim/web-db.toml");
    appease_fuzz::fuzz("sim workload", seed, |b| {
        let text = appease_fuzz::text(b);
        let _clear_error_or_workload = Workload::parse(&text, "fuzz.toml");
    });
}
