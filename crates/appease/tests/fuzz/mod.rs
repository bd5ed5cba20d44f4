//! The parsers of outside input fed damaged text (proptest): a valid sample with bytes
//! deleted, replaced or inserted, cut short, or plain random bytes. Each must answer with
//! a value or a clear error, never panic; the journal reader must always read. FUZZ_CASES
//! inputs per parser (default 20,000); each prints how many it ran and how long it took.
//! No root needed.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// A valid input damaged at random.
fn damaged(seed: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    let n = seed.len() + 1;
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        proptest::collection::vec((0..n, 0u8..3, any::<u8>()), 1..8).prop_map(move |edits| {
            let mut v = seed.to_vec();
            for (pos, kind, byte) in edits {
                let p = pos.min(v.len());
                match kind {
                    0 if p < v.len() => drop(v.remove(p)),
                    1 if p < v.len() => v[p] = byte,
                    _ => v.insert(p, byte),
                }
            }
            v
        }),
        (0..n).prop_map(move |cut| seed[..cut].to_vec()),
    ]
}

/// Runs `check` over FUZZ_CASES damaged copies of `seed`; a panic fails the test with
/// the smallest input proptest finds that still panics.
fn fuzz(parser: &str, seed: &'static [u8], check: impl Fn(&[u8])) {
    let _g = super::one_at_a_time();
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let t = std::time::Instant::now();
    let result = runner.run(&damaged(seed), |input| {
        check(&input);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{parser}: {e}");
    }
    eprintln!(
        "fuzz {parser}: {cases} inputs in {:.2} s, no panic",
        t.elapsed().as_secs_f64()
    );
}

/// A file of this machine, as a seed that lives as long as the test.
fn seed_from(path: &str) -> &'static [u8] {
    Box::leak(std::fs::read(path).unwrap().into_boxed_slice())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_config_parser_never_panics_on_damaged_configs() {
    let seed = include_bytes!("../../../../config/default.toml");
    fuzz("config", seed, |b| {
        let _clear_error_or_config = appease_config::Config::parse(&text(b), "fuzz.toml");
    });
}

#[test]
fn the_workload_parser_never_panics_on_damaged_workloads() {
    let seed = include_bytes!("../../../../examples/sim/web-db.toml");
    fuzz("sim workload", seed, |b| {
        let _clear_error_or_workload = appease_sim::Workload::parse(&text(b), "fuzz.toml");
    });
}

#[test]
fn the_journal_reader_reads_any_damaged_journal() {
    let seed = concat!(
        r#"{"op":"manage","key":{"pid":10,"tid":11,"start":42},"comm":"srv","orig":{"policy":0,"nice":0,"slice_ns":2800000,"reset_on_fork":false}}"#,
        "\n",
        r#"{"op":"apply","key":{"pid":10,"tid":11,"start":42},"prev":0,"next":-8,"slice_ns":700000,"orig":{"policy":0,"nice":0,"slice_ns":2800000,"reset_on_fork":false}}"#,
        "\n",
        r#"{"op":"group","path":"/appease.batch"}"#,
        "\n",
        r#"{"op":"move","key":{"pid":20,"tid":20,"start":7},"from":"/","to":"/appease.batch"}"#,
        "\n",
        r#"{"op":"group-idle","path":"/docker/abc","idle":false,"weight":"1024"}"#,
        "\n",
    );
    let dir = std::env::temp_dir().join(format!("appease-fuzz-journal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    fuzz("journal", seed.as_bytes(), |b| {
        std::fs::write(dir.join("journal.jsonl"), b).unwrap();
        appease_actuator::journal::read_pending(&dir).expect("a damaged journal still reads");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_proc_parsers_never_panic_on_damaged_proc_text() {
    fuzz("/proc/PID/stat", seed_from("/proc/self/stat"), |b| {
        let t = text(b);
        let _ = appease_actuator::sys::parse_stat(&t);
        let _ = appease_daemon::host::parse_proc_stat(&t, 10_000_000);
        let _ = appease_cgroup::stat_ppid(&t);
    });
    fuzz("/proc/PID/cgroup", seed_from("/proc/self/cgroup"), |b| {
        let t = text(b);
        let _ = appease_cgroup::parse_proc_cgroup(&t, appease_cgroup::Version::V1);
        let _ = appease_cgroup::parse_proc_cgroup(&t, appease_cgroup::Version::V2);
    });
    fuzz("/proc/pressure/cpu", seed_from("/proc/pressure/cpu"), |b| {
        let _ = appease_daemon::host::parse_psi_some_total(&text(b));
    });
    fuzz("/proc/loadavg", seed_from("/proc/loadavg"), |b| {
        let _ = appease_daemon::host::parse_loadavg_running(&text(b));
    });
}
