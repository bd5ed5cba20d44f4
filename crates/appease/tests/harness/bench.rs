//! Helpers of the bench tests: running `appease bench` and checking what it leaves.

use crate::*;

/// Runs `appease bench ARGS --json` (progress on stderr) and returns its one JSON object.
pub(crate) fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "bench {args:?} failed");
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// PostgreSQL processes started from a bench's private directory, still running.
pub(crate) fn bench_postgres_left() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("postgres") && c.contains("appease-bench-"))
        .collect()
}

/// Processes working in the bench run `pid`'s private directory (its make and compilers),
/// or naming it on their command line: (comm, command line).
pub(crate) fn bench_processes_left(pid: u32) -> Vec<(String, String)> {
    let mark = format!("appease-bench-{pid}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| {
            let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
            let cmd = String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).ok()?)
                .replace('\0', " ");
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (cwd.to_string_lossy().contains(&mark) || cmd.contains(&mark))
                .then(|| (comm.trim().to_string(), cmd))
        })
        .collect()
}
