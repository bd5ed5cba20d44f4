//! Daemons under test with the configs the tests share, and what they report.

use crate::*;

/// Short fades so the tests run in seconds; otherwise the default's shape. Batch
/// demotion is off: these tests need the soakers competing at nice 0.
pub(crate) fn test_config() -> String {
    format!("[batch]\nenabled = false\n{}", test_elevation())
}

/// `test_config`'s elevation: its ladder engages from one runnable thread per CPU.
pub(crate) fn test_elevation() -> String {
    // The budget: far below what a spinning thread gets beside 2 soakers (~2/3 of a
    // CPU), far above what the test servers use (~1/10): robust on a noisy machine.
    format!(
        "[elevation]\ntick_ms = 10\n[elevation.budget]\ncpu_share = 0.3\nburst_ms = 200\n{}",
        ladder(&[(0.0, 0, 0, 0), (1.0, -8, -4, 50)])
    )
}

/// A daemon with `test_config` under `soakers` CPU soakers, once it reports the load
/// (servers started after this find the ladder engaged). Bound left to right, dropped
/// right to left: the daemon stops first.
pub(crate) fn loaded(name: &str, soakers: usize) -> (TempDir, PathBuf, Soakers, Daemon) {
    loaded_with(name, soakers, "")
}

/// As `loaded`, with `extra` appended to `test_config`.
pub(crate) fn loaded_with(
    name: &str,
    soakers: usize,
    extra: &str,
) -> (TempDir, PathBuf, Soakers, Daemon) {
    let dir = TempDir::new(name);
    let cfg = dir.file("test.toml", &format!("{}{extra}", test_config()));
    let soak = Soakers::start(soakers);
    let daemon = Daemon::start(&dir.0, &cfg);
    // About one time constant of the runnable EMA.
    let want = 0.6 * soakers as f64 / host_cpus() as f64;
    let seen = wait_for(Duration::from_secs(5), || {
        daemon.status_json()["load"]["runnable_per_cpu"]
            .as_f64()
            .unwrap_or(0.0)
            >= want
    });
    assert!(
        seen.is_some(),
        "the daemon never reported the load: {}",
        daemon.log_text()
    );
    (dir, cfg, soak, daemon)
}

pub(crate) fn batch_config(group: &str) -> String {
    format!(
        r#"
[batch]
group = "{group}"
after_ms = 2000
scan_ms = 200
"#
    )
}

/// A daemon with the batch config plus `extra` ([batch] keys), and one soaker it has
/// demoted: (run dir, the group's path, the soaker, the daemon).
pub(crate) fn demoted_soaker(name: &str, extra: &str) -> (TempDir, String, Soakers, Daemon) {
    let dir = TempDir::new(name);
    let group = format!("appease-e2e-{name}{}", std::process::id());
    let cfg = dir.file(
        &format!("{name}.toml"),
        &format!("{}{extra}", batch_config(&group)),
    );
    let soakers = Soakers(vec![forking_soaker()]);
    let pid = soakers.0[0].id();
    let home = cpu_cgroup(std::process::id());
    let daemon = Daemon::start(&dir.0, &cfg);
    let gpath = format!("/{group}");
    assert!(
        wait_for(Duration::from_secs(8), || in_idle_group(pid, &gpath)).is_some(),
        "demoted (running now: {:?}; status: {}): {}",
        running_processes(),
        daemon.status_json()["batch"],
        daemon.log_text()
    );
    // The soaker alone: this process started the daemon, so it (and whatever runs it)
    // supervises the daemon and is never part of a batch tree.
    assert_eq!(
        cpu_cgroup(std::process::id()),
        home,
        "{}",
        daemon.log_text()
    );
    // The daemon logs the move after it is made: wait for the line.
    let moved = format!("root={pid} moved=1");
    assert!(
        wait_for(Duration::from_secs(3), || daemon
            .log_text()
            .contains(&moved))
        .is_some(),
        "{}",
        daemon.log_text()
    );
    (dir, gpath, soakers, daemon)
}

/// GET http://ADDR/metrics: the body.
pub(crate) fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// A sample's value in a scrape.
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// The daemon's audit lines (JSON logs): the `fields` of each.
pub(crate) fn audit_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["fields"].clone())
        .filter(|f| f["change"].is_string())
        .collect()
}

/// The soaker and the server under one half-CPU limit, a daemon, and the soaker
/// demoted in place. Bound left to right, dropped right to left: the daemon stops first.
/// A run directory and a batch config for soakers under a CPU limit, and the idle
/// group's name: under half a CPU (shared with a server, or not), a soaker can want only
/// about a quarter of one (a throttled task is not even waiting), so the threshold is
/// lowered to match.
pub(crate) fn limited_batch_config(tag: &str) -> (TempDir, PathBuf, String) {
    let dir = TempDir::new(tag);
    let batch_group = format!("appease-e2e-{tag}b{}", std::process::id());
    let cfg = dir.file(
        "batch.toml",
        &format!("{}min_cpus = 0.15\n", batch_config(&batch_group)),
    );
    (dir, cfg, batch_group)
}

pub(crate) fn demoted_under_a_limit(
    tag: &str,
    pids_max: Option<u32>,
) -> (LimitedGroup, TempDir, Soakers, BusyServer, Daemon, String) {
    let mut limited = LimitedGroup::new(tag, pids_max);
    let (dir, cfg, batch_group) = limited_batch_config(tag);
    let soakers = Soakers(vec![forking_soaker()]);
    let soaker = soakers.0[0].id();
    let server = BusyServer::start();
    limited.adopt(soaker);
    limited.adopt(server.pid);
    let daemon = Daemon::start(&dir.0, &cfg);
    let idle = wait_for(Duration::from_secs(8), || policy_of(soaker, soaker) == 5);
    assert!(
        idle.is_some(),
        "soaker demoted in place: {}",
        daemon.log_text()
    );
    (limited, dir, soakers, server, daemon, batch_group)
}
