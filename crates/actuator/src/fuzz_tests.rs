//! What the actuator reads from outside fed damaged text: the journal always reads (a
//! damaged line is skipped and counted), a thread's /proc stat gives a value or none.

use appease_fuzz::{fuzz, seed_from};

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
        crate::journal::read_pending(&dir).expect("a damaged journal still reads");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_stat_parser_never_panics_on_damaged_proc_text() {
    fuzz(
        "/proc/PID/stat (actuator)",
        seed_from("/proc/self/stat"),
        |b| {
            let _ = crate::sys::parse_stat(b);
        },
    );
}
