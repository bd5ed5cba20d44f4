//! The servers the nested scenario measures, each with its own client, started in the
//! shape's `server.service` (the client in `client.service`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{spawn_client, spawn_in, Groups};
use crate::{client, Options, Run};

/// The server measured, with its own client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// The bench's own (5 ms of CPU per request, 40 requests/s open loop over TCP).
    Synthetic,
    /// redis-server, driven by redis-benchmark (`-c 4`, GET, runs of 20,000).
    Redis,
    /// PostgreSQL from Debian, driven by pgbench (TPC-B-like, 4 clients, 100
    /// transactions/s, Poisson arrivals), as in the db scenario.
    Postgres,
}

impl Server {
    pub const ALL: [Server; 3] = [Server::Synthetic, Server::Redis, Server::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            Server::Synthetic => "synthetic",
            Server::Redis => "redis",
            Server::Postgres => "postgresql",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Server::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .with_context(|| {
                format!("unknown server {s:?}; servers are synthetic, redis, postgresql")
            })
    }

    /// A round is slow when its p99 is above this: more than half a scheduler tick (4 ms
    /// at HZ=250) beyond the request's own work, so that some requests waited for a tick
    /// or for the batch. (At 1 ms beyond the synthetic server's 5 ms, 3 or 4 of 8 rounds
    /// with no batch at all counted as slow.)
    pub(super) fn slow_above_ms(self) -> f64 {
        match self {
            Server::Synthetic => SYNTHETIC_CPU_MS + 2.0,
            Server::Redis => 1.0,
            Server::Postgres => PGBENCH_SLOW_MS,
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Server::Synthetic => {
                "the bench's server, 5 ms of CPU per request, 40 requests/s open loop over TCP"
            }
            Server::Redis => "redis-server, redis-benchmark -c 4 -t get, runs of 20,000",
            Server::Postgres => {
                "PostgreSQL, pgbench's TPC-B-like transactions, 4 clients, 100/s Poisson"
            }
        }
    }
}

pub(super) const SYNTHETIC_CPU_MS: f64 = 5.0;
const SYNTHETIC_RATE: f64 = 40.0;
/// pgbench's transactions per second (the db scenario's rate).
const PGBENCH_RATE: f64 = 100.0;
/// A transaction takes about a millisecond unloaded here: slow is half a tick beyond.
const PGBENCH_SLOW_MS: f64 = 3.0;

/// A free TCP port on loopback.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// The server of one run and how to load it.
pub(super) enum Target {
    Synthetic(client::Target),
    Redis(u16),
    Postgres(crate::db::Postgres),
}

pub(super) fn start_server(
    run: &mut Run,
    opts: &Options,
    g: &Groups,
    server: Server,
    tmp: &Path,
) -> Result<Target> {
    match server {
        Server::Postgres => {
            // PostgreSQL runs as its own account, which may not write the group's
            // cgroup.procs before its exec: the postmaster is moved as soon as it is
            // started, and whatever it forked before that once it is up (the backends it
            // forks later are born in its group).
            let postmaster = std::cell::Cell::new(0);
            let pg = crate::db::start_with(run, tmp, None, &|c| {
                let child = c.spawn()?;
                postmaster.set(child.id());
                g.cg.move_process(child.id(), &g.server)?;
                Ok(child)
            })?;
            for pid in crate::descendants(&[postmaster.get()]) {
                // One that ended meanwhile has nothing left to move.
                if let Err(e) = g.cg.move_process(pid, &g.server) {
                    if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                        return Err(e).context("moving PostgreSQL's processes to its group");
                    }
                }
            }
            Ok(Target::Postgres(pg))
        }
        Server::Synthetic => {
            let cpu = SYNTHETIC_CPU_MS.to_string();
            let mut cmd = Command::new(&opts.appease);
            cmd.args(["bench-worker", "server", "--cpu-ms", &cpu, "--port", "0"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = spawn_in(g, &g.server, &mut cmd)?;
            let mut line = String::new();
            let read = std::io::BufRead::read_line(
                &mut std::io::BufReader::new(child.stdout.as_mut().expect("piped")),
                &mut line,
            );
            run.children.push(child);
            read.context("reading the server's port")?;
            let port: u16 = line
                .trim()
                .parse()
                .context("the server did not report its port")?;
            Ok(Target::Synthetic(client::Target::Tcp(
                ([127, 0, 0, 1], port).into(),
            )))
        }
        Server::Redis => {
            let port = free_port()?;
            let p = port.to_string();
            let mut cmd = Command::new("redis-server");
            // A cache on loopback that writes nothing to disk.
            cmd.args(["--port", &p, "--bind", "127.0.0.1", "--save", ""])
                .args("--appendonly no --daemonize no --loglevel warning".split(' '))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            let child = spawn_in(g, &g.server, &mut cmd)?;
            run.graceful.push(child);
            crate::wait_until(Duration::from_secs(10), || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            })
            .context("redis-server did not accept connections within 10 s")?;
            // A key for the GETs.
            let set = Command::new("redis-cli")
                .args(["-p", &p, "set", "key:__rand_int__", "x"])
                .output()
                .context("running redis-cli")?;
            if !set.status.success() {
                bail!(
                    "redis-cli set failed: {}",
                    String::from_utf8_lossy(&set.stderr)
                );
            }
            Ok(Target::Redis(port))
        }
    }
}

/// One redis-benchmark run: (requests/s, p50 ms, p99 ms).
fn redis_benchmark(g: &Groups, port: u16) -> Result<(f64, f64, f64)> {
    let p = port.to_string();
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &p])
        .args("-c 4 -n 20000 -t get --csv".split(' '))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let child = spawn_in(g, &g.client, &mut cmd)?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_redis_csv(&text).with_context(|| format!("reading redis-benchmark's output: {text:?}"))
}

/// A client run's result, or None when it failed because the bench is stopping: a
/// terminal's Ctrl-C reaches redis-benchmark too, which then prints only its header, and
/// the bench reports what it measured rather than that run's error.
fn unless_stopped<T>(run: Result<T>, stopping: bool) -> Result<Option<T>> {
    match run {
        Err(_) if stopping => Ok(None),
        run => run.map(Some),
    }
}

/// redis-benchmark's `--csv` answer: a header, then `"GET","rps","avg",…` with the
/// columns it names.
fn parse_redis_csv(text: &str) -> Option<(f64, f64, f64)> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()?
        .split(',')
        .map(|f| f.trim_matches('"').to_string())
        .collect();
    let row: Vec<f64> = lines
        .next()?
        .split(',')
        .map(|f| f.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    let col = |name: &str| {
        let i = header.iter().position(|h| h == name)?;
        row.get(i).copied().filter(|v| v.is_finite())
    };
    Some((col("rps")?, col("p50_latency_ms")?, col("p99_latency_ms")?))
}

/// A client's run as (requests/s, p50 ms, p99 ms).
fn figures(r: &client::ClientResult) -> (f64, f64, f64) {
    let ms = |q: f64| r.latency_us.value_at_quantile(q) as f64 / 1000.0;
    (
        r.answered as f64 / r.elapsed.as_secs_f64().max(1e-9),
        ms(0.5),
        ms(0.99),
    )
}

/// Load on the server for `duration` (or until `stop`): (requests/s, p50 ms, p99 ms). For
/// redis, the median of its runs' figures; for the others, the run's own.
pub(super) fn measure(
    g: &Groups,
    target: &Target,
    duration: Duration,
    drain: Duration,
    stop: &Arc<AtomicBool>,
) -> Result<(f64, f64, f64)> {
    match target {
        Target::Synthetic(t) => {
            let (t, stop) = (t.clone(), stop.clone());
            let client = spawn_client(g, move || {
                client::open_loop(
                    &t,
                    &client::Protocol::Synthetic,
                    client::Arrivals::Fixed,
                    SYNTHETIC_RATE,
                    duration,
                    drain,
                    &stop,
                )
            });
            let r = client
                .join()
                .map_err(|_| anyhow::anyhow!("the client's thread panicked"))??;
            Ok(figures(&r))
        }
        Target::Postgres(pg) => Ok(figures(&pg.run_with(
            PGBENCH_RATE,
            duration,
            stop,
            &|c| spawn_in(g, &g.client, c),
        )?)),
        Target::Redis(port) => {
            let t = Instant::now();
            let (mut rps, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
            while t.elapsed() < duration && !stop.load(Ordering::Relaxed) {
                let run = redis_benchmark(g, *port);
                let Some((a, b, c)) = unless_stopped(run, stop.load(Ordering::Relaxed))? else {
                    break;
                };
                rps.push(a);
                p50.push(b);
                p99.push(c);
            }
            Ok((
                crate::report::median_of(rps),
                crate::report::median_of(p50),
                crate::report::median_of(p99),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_cut_short_by_ctrl_c_ends_the_mode_and_any_other_failure_is_an_error() {
        let failed = || Err::<u8, _>(anyhow::anyhow!("reading redis-benchmark's output"));
        assert_eq!(unless_stopped(failed(), true).unwrap(), None);
        assert!(unless_stopped(failed(), false).is_err());
        assert_eq!(unless_stopped(Ok(7), false).unwrap(), Some(7));
        assert_eq!(unless_stopped(Ok(7), true).unwrap(), Some(7));
    }

    #[test]
    fn redis_benchmark_csv_is_read_by_its_column_names() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"GET\",\"83333.34\",\"0.040\",\"0.016\",\"0.039\",\"0.055\",\"0.079\",\"3.895\"\n";
        assert_eq!(parse_redis_csv(text), Some((83333.34, 0.039, 0.079)));
        assert_eq!(parse_redis_csv("\"test\",\"rps\"\n"), None, "no row");
        assert_eq!(parse_redis_csv(""), None);
    }

    #[test]
    fn a_round_is_slow_when_its_tail_waited_for_more_than_the_requests_own_work() {
        assert_eq!(Server::Redis.slow_above_ms(), 1.0);
        assert_eq!(Server::Synthetic.slow_above_ms(), 7.0);
        assert_eq!(Server::Postgres.slow_above_ms(), 3.0);
    }
}
