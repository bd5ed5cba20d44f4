//! What the probe is loaded with from the config: settings a reload cannot change.

use std::time::Duration;

use appease_config::Config;

/// A thread serves a request for as long as a request may compute before it sinks: its
/// lock waits within that time are a customer's (lifting sunk threads needs them). The
/// probe measures it from the thread's latest request past `min_gap_ms`: never shorter
/// than that.
pub(crate) fn serving_window(cfg: &Config) -> Option<Duration> {
    let sink = &cfg.elevation.sink;
    (cfg.elevation.enabled && sink.after_cpu_ms > 0 && sink.lift_ms > 0)
        .then(|| Duration::from_millis(sink.after_cpu_ms.max(cfg.probe.min_gap_ms).max(10)))
}

/// How often a held thread's requests are reported (`ProbeConfig::held_gap`) while each
/// tick reads the latest request of the elevated threads due (`reads_requests`): once a
/// second, for the batch manager's memory of who serves (a minute). Events for each request
/// of 256 busy connections, even at one per held thread per 40 ms, were most of the
/// daemon's work.
pub(crate) fn held_gap(cfg: &Config, reads_requests: bool) -> Duration {
    match reads_requests {
        true => Duration::from_secs(1).max(reported_held_gap(cfg)),
        false => reported_held_gap(cfg),
    }
}

/// The held gap when a tick cannot read requests (the kernel runs no reader): twice the
/// gap of the rest, and less than half the shortest decay step, so that a busy elevated
/// thread is seen again well before its elevation would fade.
fn reported_held_gap(cfg: &Config) -> Duration {
    let min_gap = Duration::from_millis(cfg.probe.min_gap_ms);
    let shortest_decay = cfg
        .elevation_params()
        .ladder
        .steps()
        .iter()
        .map(|s| s.decay)
        .filter(|d| !d.is_zero())
        .min()
        .unwrap_or(Duration::MAX);
    (2 * min_gap).min(shortest_decay / 2).max(min_gap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_threads_requests_come_twice_as_far_apart_and_well_within_a_decay_step() {
        let with = |toml: &str| held_gap(&Config::parse(toml, "test").unwrap(), false);
        assert_eq!(with(""), Duration::from_millis(40));
        assert_eq!(with("[probe]\nmin_gap_ms = 5\n"), Duration::from_millis(10));
        // A decay step of 50 ms: a busy thread seen every 25 ms at least.
        let fast_decay = "[elevation]\nladder = [\n  { from_runnable_per_cpu = 0.0, unix_nice = 0, inet_nice = 0, decay_ms = 0 },\n  { from_runnable_per_cpu = 1.0, unix_nice = -5, inet_nice = -3, decay_ms = 50 },\n]\n";
        assert_eq!(with(fast_decay), Duration::from_millis(25));
        // Never more often than the others.
        let faster = format!("[probe]\nmin_gap_ms = 30\n{fast_decay}");
        assert_eq!(with(&faster), Duration::from_millis(30));
        // Read at the ticks: once a second, whatever the ladder.
        let read = |toml: &str| held_gap(&Config::parse(toml, "test").unwrap(), true);
        assert_eq!(read(""), Duration::from_secs(1));
        assert_eq!(read(fast_decay), Duration::from_secs(1));
    }
}
