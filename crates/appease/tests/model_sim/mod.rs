//! appease model and appease sim from the command line.

use super::*;

#[test]
fn model_contention_json_has_the_contract_keys() {
    let run = json_of;
    let v = run(&[
        "model",
        "contention",
        "--cpus",
        "2",
        "--demand",
        "50",
        "--json",
    ]);
    for k in [
        "cpus",
        "demand_pct",
        "utilization",
        "throughput_per_hold",
        "wait_per_hold",
        "effective_power",
    ] {
        assert!(v[k].is_number(), "{k}: {v}");
    }
    assert!((v["effective_power"].as_f64().unwrap() - 1.6).abs() < 1e-9);
    let m = run(&[
        "model",
        "contention",
        "--cpus",
        "8",
        "--rate",
        "400000",
        "--hold-us",
        "1",
        "--wait-us",
        "0.5",
        "--json",
    ]);
    for k in [
        "measured_effective_power",
        "predicted_effective_power",
        "demand_pct",
        "effective_power",
    ] {
        assert!(m[k].is_number(), "{k}: {m}");
    }
    let bad = Command::new(BIN)
        .args(["model", "contention", "--cpus", "0", "--demand", "5"])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--cpus"));
}

#[test]
fn model_unhappiness_evaluates_every_closed_form() {
    // CPU-heavy: not beside the timing-sensitive daemon tests.
    let v = json_of(&["model", "unhappiness", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    for policy in ["rr", "mlfq", "cfs", "cfs-rbpe"] {
        for scenario in ["one request", "service call"] {
            assert!(
                rows.iter()
                    .any(|r| r["policy"] == policy && r["scenario"] == scenario),
                "{policy} {scenario}: {v}"
            );
        }
    }
    // eq. 6 with the defaults (N = 5, q = 10 ms, τ = 30 ms).
    assert_eq!(rows[0]["unhappiness_ms"].as_f64(), Some(100.0));
    let text = Command::new(BIN)
        .args(["model", "unhappiness", "--processes", "4"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("7, 9"));
    for (args, named) in [
        (vec!["--tau-ms", "1,2"], "--tau-ms"),
        (vec!["--processes", "1"], "--processes"),
        (vec!["--quantum-ms", "0"], "--quantum-ms"),
    ] {
        fails_saying(
            Command::new(BIN).args(["model", "unhappiness"]).args(&args),
            named,
        );
    }
}

#[test]
fn sim_sweep_reports_the_studys_figures_and_its_scalability_recomputes() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sim/staircase-sweep.toml"
    );
    let r = json_of(&[
        "sim",
        "sweep",
        example,
        "--clients",
        "2,16,64",
        "--requests",
        "2000",
        "--policies",
        "o1,staircase,cfs",
        "--json",
    ]);
    let series = r["series"].as_array().unwrap();
    let policies: Vec<&str> = series
        .iter()
        .map(|s| s["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["o1", "staircase", "cfs"]);
    for s in series {
        assert_eq!(s["points"].as_array().unwrap().len(), 3, "{s}");
        for p in s["points"].as_array().unwrap() {
            for k in [
                "completion_ms",
                "per_s",
                "min_ms",
                "p95_ms",
                "max_ms",
                "max_minus_min_ms",
                "p95_minus_min_ms",
            ] {
                assert!(p[k].is_number(), "{k}: {p}");
            }
            // 2,000 requests of 1 ms of CPU on one CPU: 2 s at the very least.
            assert!(p["completion_ms"].as_f64().unwrap() >= 2000.0, "{p}");
        }
        assert_scalability_recomputes(s, "completion_ms");
    }
    // Same file, same numbers.
    let again = json_of(&[
        "sim",
        "sweep",
        example,
        "--clients",
        "2,16,64",
        "--requests",
        "2000",
        "--policies",
        "o1,staircase,cfs",
        "--json",
    ]);
    assert_eq!(r, again);
    fails_saying(
        Command::new(BIN).args(["sim", "sweep", example, "--policies", "fifo"]),
        "unknown policy \"fifo\"",
    );
    let web_db = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sim/web-db.toml"
    );
    fails_saying(
        Command::new(BIN).args(["sim", "sweep", web_db]),
        "exactly one customer with closed-loop arrivals",
    );
}

#[test]
fn sim_run_and_compare_report_every_key_and_refuse_bad_workloads() {
    // CPU-heavy: not beside the timing-sensitive daemon tests.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sim/web-db.toml"
    );
    let r = json_of(&["sim", "run", example, "--policy", "eevdf", "--json"]);
    for k in ["policy", "events", "events_per_sec", "utilization"] {
        assert!(!r[k].is_null(), "{k}: {r}");
    }
    assert_eq!(r["policy"], "eevdf");
    let p = &r["processes"][0];
    for k in ["name", "cpu_ms", "cpu_share"] {
        assert!(!p[k].is_null(), "processes.{k}: {r}");
    }
    for k in ["count", "mean_ms", "p50_ms", "p99_ms", "max_ms"] {
        assert!(r["requests"][k].is_number(), "requests.{k}: {r}");
    }
    assert!(r["unhappiness"]["system"].is_number());
    assert!(r["unhappiness"]["per_customer"].is_object());

    let dir = TempDir::new("simcli");
    let out = dir.0.join("out");
    let all = json_of(&[
        "sim",
        "compare",
        example,
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, appease_sim::POLICIES);
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    assert!(csv.starts_with("policy,customer,arrive_ms,response_ms,cpu_ms,unhappiness_ms\n"));
    assert!(out.join("compare.json").exists());

    for (text, expect) in [
        ("[sim]\ncpus = 1\nduration_ms = 100\nbogus = 2\n", "line 4"),
        (
            "[sim]\ncpus = 1\nduration_ms = 100\nalpha = 0.7\n[[process]]\nname = \"a\"\nbehavior = \"cpu-bound\"\n",
            "alpha",
        ),
        (
            "[sim]\ncpus = 1\nduration_ms = 100\n[[process]]\nname = \"a\"\nserve = { cpu_ms = 1.0, calls = [{ to = \"nobody\", after_cpu_ms = 0.5 }] }\n",
            "\"nobody\", which is not defined",
        ),
    ] {
        let f = dir.file("bad.toml", text);
        let out = Command::new(BIN)
            .args(["sim", "run"])
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(err.contains("bad.toml") && err.contains(expect), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
