//! Damaged copies of valid inputs, for the tests that feed appease's parsers of outside
//! input (the config, workload files, the journal, /proc) what a damaged disk, an edit
//! or a newer kernel may give them: a valid sample with bytes deleted, replaced or
//! inserted, cut short, or plain random bytes. Each parser must answer with a value or
//! a clear error, never panic. FUZZ_CASES inputs per parser (default 20,000); each run
//! prints how many it ran and how long it took.

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
pub fn fuzz(parser: &str, seed: &'static [u8], check: impl Fn(&[u8])) {
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
pub fn seed_from(path: &str) -> &'static [u8] {
    Box::leak(std::fs::read(path).unwrap().into_boxed_slice())
}

/// The bytes as text, as a parser of text files reads them.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parser_that_panics_on_damage_is_caught() {
        let caught = std::panic::catch_unwind(|| {
            fuzz("fragile", b"key = 1\n", |b| {
                assert!(text(b).contains('='), "fragile: no '='");
            })
        });
        assert!(caught.is_err(), "a cut-short or random input has no '='");
    }
}
