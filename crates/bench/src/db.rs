//! The `db` scenario's server and client: PostgreSQL from Debian in a private data
//! directory (UNIX socket only, so no port can clash), and pgbench's TPC-B-like
//! transactions at a fixed rate. Latency is pgbench's per-transaction time plus its
//! schedule lag, so, as with our own client, it counts from the intended start.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;

use crate::client::ClientResult;
use crate::{wait_until, Run};

const PGBENCH: &str = "/usr/bin/pgbench";
pub(crate) const PORT: u16 = 5432;
/// pgbench's scale (100,000 accounts each) and clients: four branches for four clients,
/// so their updates rarely wait on one another's row lock.
const SCALE: u32 = 4;
const CLIENTS: u32 = 4;

/// A running PostgreSQL of the bench's.
#[derive(Clone, Debug)]
pub struct Postgres {
    pub(crate) socket_dir: PathBuf,
    /// Where pgbench writes its per-transaction logs.
    log_dir: PathBuf,
}

/// The fresh-connection analytic query: each account joined to the next two of its
/// branch, summed (two hash joins of 400,000 rows a side; about 350 ms alone here).
const FRESH_ANALYTIC_QUERY: &str = "SELECT sum(a.abalance - b.abalance + c.abalance) \
     FROM pgbench_accounts a JOIN pgbench_accounts b ON b.aid = a.aid + 1 AND b.bid = a.bid \
     JOIN pgbench_accounts c ON c.aid = a.aid + 2 AND c.bid = a.bid";

/// The fresh-connection analytic client of `Postgres::start_fresh_analytic`; stopped
/// (after the query under way) when dropped.
pub(crate) struct FreshAnalytic {
    stop: Arc<AtomicBool>,
    /// Each completed query's time in ms, and the failed queries, since the last `take`.
    done: Arc<std::sync::Mutex<(Vec<f64>, u64)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FreshAnalytic {
    /// The queries completed since the last call, each one's time in ms, and how many
    /// failed meanwhile.
    pub(crate) fn take(&self) -> (Vec<f64>, u64) {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for FreshAnalytic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ended = t.join();
        }
    }
}

/// The server binary of the newest PostgreSQL installed the Debian way.
fn server_bin() -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("postgres").exists() && b.join("initdb").exists())
        .collect();
    // Versions are directory names ("15", "16"): the highest number wins.
    found.sort_by_key(|b| {
        b.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().context(
        "the db scenario needs PostgreSQL (no /usr/lib/postgresql/*/bin/postgres): apt-get install postgresql",
    )
}

/// The `postgres` account's uid and gid (PostgreSQL refuses to run as root).
fn postgres_account() -> Result<(u32, u32)> {
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam with a valid C string; the fields are read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!("the db scenario needs the postgres account, which the postgresql package creates: apt-get install postgresql");
    }
    // SAFETY: non-null result of getpwnam.
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// initdb and start a server in `tmp`, owned by the postgres account, stopped with the
/// run (SIGTERM: it shuts down once pgbench has disconnected), and load pgbench's tables.
/// `clients`: the most connections a client will open at once (a closed-loop sweep's
/// largest count), beyond PostgreSQL's default of 100.
pub(crate) fn start(run: &mut Run, tmp: &Path, clients: Option<u32>) -> Result<Postgres> {
    start_with(run, tmp, clients, &|c| Ok(c.spawn()?))
}

/// A process starter: where the server or the client is started (a group of a shape).
pub(crate) type Spawn<'a> = &'a dyn Fn(&mut Command) -> Result<std::process::Child>;

/// As `start`, the server started by `spawn`.
pub(crate) fn start_with(
    run: &mut Run,
    tmp: &Path,
    clients: Option<u32>,
    spawn: Spawn,
) -> Result<Postgres> {
    if !Path::new(PGBENCH).exists() {
        bail!("the db scenario needs pgbench ({PGBENCH} is missing): apt-get install postgresql");
    }
    let bin = server_bin()?;
    let (uid, gid) = postgres_account()?;
    let base = tmp.join("pg");
    let (data, socket_dir, log_dir) = (base.join("data"), base.join("sock"), base.join("log"));
    // A round before this one, kept by APPEASE_BENCH_KEEP, left its cluster: initdb wants
    // an empty directory.
    if base.exists() {
        fs::remove_dir_all(&base).with_context(|| format!("removing {}", base.display()))?;
    }
    for d in [&base, &socket_dir, &log_dir] {
        fs::create_dir_all(d)?;
        std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
    }
    let as_postgres = |program: PathBuf| {
        let mut c = Command::new(program);
        std::os::unix::process::CommandExt::uid(&mut c, uid);
        std::os::unix::process::CommandExt::gid(&mut c, gid);
        c.env("LC_ALL", "C").current_dir(&base).stdin(Stdio::null());
        c
    };
    let init_log = fs::File::create(tmp.join("initdb.log"))?;
    let status = as_postgres(bin.join("initdb"))
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
        .arg(&data)
        .stdout(init_log.try_clone()?)
        .stderr(init_log)
        .status()
        .context("running initdb")?;
    if !status.success() {
        bail!(
            "initdb failed ({status}); see {}",
            tmp.join("initdb.log").display()
        );
    }
    let log = fs::File::create(tmp.join("postgres.log"))?;
    // A bench server, not a durable one: no fsync, and only the UNIX socket.
    let mut server = as_postgres(bin.join("postgres"));
    server
        .arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&socket_dir)
        .args(["-p", &PORT.to_string()])
        .args(["-c", "listen_addresses=", "-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
        // Room for the sweep's clients beside pgbench's and the analytic connection.
        .args([
            "-c",
            &format!("max_connections={}", clients.unwrap_or(0).max(80) + 20),
        ])
        .stdout(log.try_clone()?)
        .stderr(log);
    let server = spawn(&mut server).context("starting postgres")?;
    run.graceful.push(server);
    let pg = Postgres {
        socket_dir,
        log_dir,
    };
    let ready = wait_until(Duration::from_secs(20), || {
        pg.pgbench_cmd()
            .args(["-i", "-q", "-s", &SCALE.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if ready.is_err() {
        let text = fs::read_to_string(tmp.join("postgres.log")).unwrap_or_default();
        bail!(
            "PostgreSQL did not start or pgbench could not load its tables within 20 s: {}",
            text.lines().last().unwrap_or("no message in postgres.log")
        );
    }
    Ok(pg)
}

impl Postgres {
    fn pgbench_cmd(&self) -> Command {
        let mut c = Command::new(PGBENCH);
        c.arg("-h")
            .arg(&self.socket_dir)
            .args(["-p", &PORT.to_string(), "-U", "postgres"])
            .env("PGDATABASE", "postgres")
            .stdin(Stdio::null());
        c
    }

    /// Analytic queries on a connection of their own, back to back, until the run ends:
    /// each scans the accounts ten times over (about a second of one backend's CPU here).
    pub fn start_analytic(&self, run: &mut Run, tmp: &Path) -> Result<()> {
        let script = tmp.join("analytic.sql");
        fs::write(
            &script,
            "SELECT sum(a.abalance + g) FROM pgbench_accounts a, generate_series(1, 10) g;\n",
        )?;
        let child = self
            .pgbench_cmd()
            .args(["-c", "1", "-j", "1", "-n", "-T", "86400", "-f"])
            .arg(&script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting pgbench's analytic client")?;
        // Ended with the server (SIGTERM), so that PostgreSQL, which waits for its clients
        // to leave, shuts down on its own terms.
        run.graceful.push(child);
        Ok(())
    }

    /// Analytic queries each on a fresh connection (a new `psql`, so a new backend
    /// process), back to back until the returned client is dropped: each a self-join of
    /// the accounts, a few hundred ms of one backend's CPU here. Each query's time,
    /// connection included, is kept for the run to read.
    pub fn start_fresh_analytic(&self) -> Result<FreshAnalytic> {
        let psql = server_bin()?.join("psql");
        if !psql.exists() {
            bail!(
                "the fresh-connection analytic client needs {}",
                psql.display()
            );
        }
        let mut cmd = Command::new(psql);
        cmd.arg("-h")
            .arg(&self.socket_dir)
            .args(["-p", &PORT.to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-X", "-q", "-t", "-c", FRESH_ANALYTIC_QUERY])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(std::sync::Mutex::new((Vec::new(), 0)));
        let thread = {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let ok = cmd.status().is_ok_and(|s| s.success());
                    let mut done = done.lock().unwrap_or_else(|p| p.into_inner());
                    if ok {
                        done.0.push(t.elapsed().as_secs_f64() * 1e3);
                    } else {
                        done.1 += 1;
                        drop(done);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
        };
        Ok(FreshAnalytic {
            stop,
            done,
            thread: Some(thread),
        })
    }

    /// Runs pgbench at `rate` transactions/s for `duration` (or until `stop`) and reads
    /// its per-transaction log. pgbench's rate schedule is a Poisson process.
    pub fn run(
        &self,
        rate: f64,
        duration: Duration,
        stop: &Arc<AtomicBool>,
    ) -> Result<ClientResult> {
        self.run_with(rate, duration, stop, &|c| Ok(c.spawn()?))
    }

    /// As `run`, pgbench started by `spawn`.
    pub(crate) fn run_with(
        &self,
        rate: f64,
        duration: Duration,
        stop: &Arc<AtomicBool>,
        spawn: Spawn,
    ) -> Result<ClientResult> {
        for old in fs::read_dir(&self.log_dir)?.flatten() {
            fs::remove_file(old.path())?;
        }
        let prefix = self.log_dir.join("tx");
        let secs = duration.as_secs().max(1).to_string();
        // The client runs in the latency class: it is not what is being starved.
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "-10", PGBENCH])
            .env("PGDATABASE", "postgres")
            .args(self.pgbench_cmd().get_args())
            .args(["-c", &CLIENTS.to_string(), "-j", "2", "-n"])
            .args([
                "-R",
                &rate.to_string(),
                "-T",
                &secs,
                "--log",
                "--log-prefix",
            ])
            .arg(&prefix)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = spawn(&mut cmd).context("starting pgbench")?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() && !stop.load(Ordering::Relaxed) {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _partial_ok = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    bail!("pgbench failed ({status}): {}", err.trim());
                }
                break;
            }
            if stop.load(Ordering::Relaxed) {
                // SAFETY: signalling our own child; pgbench ends and flushes its logs.
                unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let elapsed = started.elapsed();
        let mut latency_us = Histogram::new_with_bounds(1, 600_000_000, 3)?;
        let (mut sent, mut answered) = (0, 0);
        for f in fs::read_dir(&self.log_dir)?.flatten() {
            for line in fs::read_to_string(f.path())?.lines() {
                sent += 1;
                if let Some(us) = total_us(line) {
                    let _clamped = latency_us.record(us.max(1));
                    answered += 1;
                }
            }
        }
        if answered == 0 && !stop.load(Ordering::Relaxed) {
            bail!("pgbench logged no transactions");
        }
        Ok(ClientResult {
            latency_us,
            // pgbench cannot tell the server's CPU time per transaction.
            unhappiness_us: Histogram::new(3)?,
            late_for_cpu_loss: 0,
            sent,
            answered,
            elapsed,
            // pgbench reports no finish time of its own: its run, as it timed it.
            finished: elapsed,
        })
    }
}

/// One line of pgbench's log with `--rate`: `client tx time_us script epoch epoch_us
/// lag_us`. The latency from the intended start is time + lag; failed or skipped
/// transactions have no number there.
fn total_us(line: &str) -> Option<u64> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let time: u64 = f.get(2)?.parse().ok()?;
    let lag: u64 = f.get(6).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some(time + lag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_gives_time_plus_schedule_lag() {
        assert_eq!(total_us("0 17 2043 0 1732270000 123456 310"), Some(2353));
        assert_eq!(total_us("3 4 998 0 1732270000 123456"), Some(998));
        assert_eq!(total_us("0 17 skipped 0 1732270000 123456 310"), None);
        assert_eq!(total_us("0 17 failed 0 1732270000 123456 310"), None);
        assert_eq!(total_us("garbage"), None);
    }
}
