//! Open-loop load: requests go out on a schedule (fixed or Poisson) whether or not
//! earlier answers came back, and each latency is taken from the request's intended send
//! time, so a slow server (or a starved client) cannot hide queueing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};

use crate::report::LATE_US;
use crate::worker::ANSWER_LEN;

/// What the synthetic server says of a request it answered.
#[derive(Clone, Copy, Debug)]
struct ServerTime {
    cpu_ns: u64,
    cpu_loss_ns: u64,
}

/// How requests are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arrivals {
    /// Every 1/rate seconds (the DESIGN.md experiment).
    Fixed,
    /// Exponential gaps with mean 1/rate, as independent customers send. The seed is
    /// fixed, so every mode sees the same schedule.
    Poisson,
}

impl Arrivals {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "fixed" => Ok(Arrivals::Fixed),
            "poisson" => Ok(Arrivals::Poisson),
            _ => anyhow::bail!("unknown arrivals {s:?}; one of fixed, poisson"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arrivals::Fixed => "fixed",
            Arrivals::Poisson => "Poisson",
        }
    }

    /// Send times after the start: request n goes out at the n-th offset.
    pub fn offsets(self, rate: f64) -> Box<dyn Iterator<Item = Duration> + Send> {
        let period = Duration::from_secs_f64(1.0 / rate);
        match self {
            // Multiplied, not summed: no drift over a long run.
            Arrivals::Fixed => Box::new((0u32..).map(move |n| period * n)),
            Arrivals::Poisson => {
                let mut rng = ChaCha8Rng::seed_from_u64(1);
                let gap = Exp::new(rate).expect("a positive rate");
                Box::new(std::iter::successors(Some(Duration::ZERO), move |t| {
                    Some(*t + Duration::from_secs_f64(gap.sample(&mut rng)))
                }))
            }
        }
    }
}

pub struct ClientResult {
    /// Response time in µs, from intended send time to the answer.
    pub latency_us: Histogram<u64>,
    /// Response time minus the CPU time the server spent on the request, µs
    /// (the 2010 customer-appeasement paper's unhappiness for a single customer with weight 1).
    pub unhappiness_us: Histogram<u64>,
    /// Late requests (`LATE_US`) that would not have been late but for the time the
    /// server lost while on CPU (see `worker::ANSWER_LEN`): no scheduling policy's doing.
    pub late_for_cpu_loss: u64,
    pub sent: u64,
    pub answered: u64,
    pub elapsed: Duration,
    /// From the first intended send to the last answer (the Staircase study's time to finish).
    pub finished: Duration,
}

/// Raises the calling thread's priority (the client must not be what is starved) and
/// gives it back when dropped.
struct Latency {
    tid: u32,
    nice: i32,
}

impl Latency {
    fn enter() -> Self {
        // SAFETY: plain syscalls on the calling thread.
        let tid = unsafe { libc::gettid() } as u32;
        let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
        // SAFETY: as above.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, -10) } != 0 {
            tracing::debug!("client runs at its own priority");
        }
        Latency { tid, nice }
    }
}

impl Drop for Latency {
    fn drop(&mut self) {
        // SAFETY: restoring the calling thread's own nice.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid, self.nice) };
    }
}

/// What is sent and how answers are read.
#[derive(Clone, Debug)]
pub enum Protocol {
    /// 1-byte request; the answer carries the CPU ns the server spent on it and the ns
    /// it lost on CPU meanwhile (`worker::ANSWER_LEN` bytes).
    Synthetic,
    /// HTTP/1.1 GET of these paths in turn, pipelined on one keep-alive connection.
    Http {
        host: String,
        paths: Arc<Vec<String>>,
    },
}

impl Protocol {
    fn request(&self, n: u64) -> Vec<u8> {
        match self {
            Protocol::Synthetic => b"r".to_vec(),
            Protocol::Http { host, paths } => {
                let path = &paths[(n % paths.len() as u64) as usize];
                format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()
            }
        }
    }

    /// Takes one whole answer off the front of `buf`: Some(what the server said of its
    /// CPU, if it says).
    fn take_answer(&self, buf: &mut Vec<u8>) -> Result<Option<Option<ServerTime>>> {
        match self {
            Protocol::Synthetic => {
                if buf.len() < ANSWER_LEN {
                    return Ok(None);
                }
                let word =
                    |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
                let said = ServerTime {
                    cpu_ns: word(0),
                    cpu_loss_ns: word(8),
                };
                buf.drain(..ANSWER_LEN);
                Ok(Some(Some(said)))
            }
            Protocol::Http { .. } => {
                let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    return Ok(None);
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let status = head.split_whitespace().nth(1).unwrap_or("");
                if status != "200" {
                    anyhow::bail!(
                        "the web server answered {:?}",
                        head.lines().next().unwrap_or("")
                    );
                }
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .context("an HTTP answer without Content-Length")?;
                let total = head_end + 4 + len;
                if buf.len() < total {
                    return Ok(None);
                }
                buf.drain(..total);
                Ok(Some(None))
            }
        }
    }
}

/// Where the server listens.
#[derive(Clone, Debug)]
pub enum Target {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// One connection, TCP or UNIX, split into a sending and a receiving half.
fn connect(target: &Target) -> Result<(Box<dyn Write + Send>, Box<dyn Read>)> {
    let timeout = Some(Duration::from_millis(200));
    Ok(match target {
        Target::Tcp(addr) => {
            let tx = TcpStream::connect(addr)
                .with_context(|| format!("connecting to the server at {addr}"))?;
            tx.set_nodelay(true)?;
            let rx = tx.try_clone()?;
            rx.set_read_timeout(timeout)?;
            (Box::new(tx), Box::new(rx))
        }
        Target::Unix(path) => {
            let tx = UnixStream::connect(path)
                .with_context(|| format!("connecting to the server at {}", path.display()))?;
            let rx = tx.try_clone()?;
            rx.set_read_timeout(timeout)?;
            (Box::new(tx), Box::new(rx))
        }
    })
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// When requests are due: `start` plus each offset, until `end`.
struct Schedule {
    start: Instant,
    end: Instant,
    offsets: Box<dyn Iterator<Item = Duration> + Send>,
}

/// The client's sender thread: each request at its due time, its due time handed to
/// the receiver first (the answer cannot overtake it); returns how many it sent.
fn spawn_sender(
    mut schedule: Schedule,
    mut sock: Box<dyn Write + Send>,
    due_tx: mpsc::Sender<Instant>,
    protocol: Protocol,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> Result<thread::JoinHandle<Result<u64>>> {
    // Named so that a scheduler trace tells the client's two threads apart.
    thread::Builder::new()
        .name("bench-sender".into())
        .spawn(move || -> Result<u64> {
            let _prio = Latency::enter();
            let mut sent = 0u64;
            loop {
                let due = schedule.start + schedule.offsets.next().expect("schedules are endless");
                if due >= schedule.end || stop.load(Ordering::Relaxed) {
                    return Ok(sent);
                }
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                due_tx.send(due).ok();
                sock.write_all(&protocol.request(sent))
                    .context("sending a request")?;
                sent += 1;
                count.store(sent, Ordering::Release);
            }
        })
        .context("starting the client's sender thread")
}

/// Sends `rate` requests/s to `addr` for `duration`, then waits up to `drain` for the
/// last answers. `stop` ends the run early (Ctrl-C).
pub fn open_loop(
    target: &Target,
    protocol: &Protocol,
    arrivals: Arrivals,
    rate: f64,
    duration: Duration,
    drain: Duration,
    stop: &Arc<AtomicBool>,
) -> Result<ClientResult> {
    let (tx_sock, mut rx_sock) = connect(target)?;
    let (due_tx, due_rx) = mpsc::channel::<Instant>();
    let start = Instant::now() + Duration::from_millis(20);
    let sent_count = Arc::new(AtomicU64::new(0));
    let schedule = Schedule {
        start,
        end: start + duration,
        offsets: arrivals.offsets(rate),
    };
    let sender = spawn_sender(
        schedule,
        tx_sock,
        due_tx,
        protocol.clone(),
        stop.clone(),
        sent_count.clone(),
    )?;

    let _prio = Latency::enter();
    let mut lat = hist();
    let mut unhappy = hist();
    let mut answered = 0u64;
    let mut late_for_cpu_loss = 0u64;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut chunk = vec![0u8; 1 << 16];
    let mut last_answer = Instant::now();
    loop {
        let sending_done = sender.is_finished();
        if sending_done && answered >= sent_count.load(Ordering::Acquire) {
            break;
        }
        // A read may return part of an answer, or several.
        match rx_sock.read(&mut chunk) {
            Ok(0) => anyhow::bail!("the server closed the connection"),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                let now = Instant::now();
                while let Some(said) = protocol.take_answer(&mut buf)? {
                    let due = due_rx.recv().context("an answer without a request")?;
                    let us = now.saturating_duration_since(due).as_micros() as u64;
                    let _clamped = lat.record(us.max(1));
                    if let Some(t) = said {
                        let waited = us.saturating_sub(t.cpu_ns / 1000);
                        let _clamped = unhappy.record(waited.max(1));
                        if late_only_for_cpu_loss(waited, t.cpu_loss_ns / 1000) {
                            late_for_cpu_loss += 1;
                        }
                    }
                    answered += 1;
                    last_answer = now;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        // Ctrl-C interrupts the read; the stop flag ends the loop.
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if (sending_done && last_answer.elapsed() > drain) || stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(e) => return Err(e).context("reading an answer"),
        }
    }
    let sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender thread panicked"))??;
    Ok(ClientResult {
        latency_us: lat,
        unhappiness_us: unhappy,
        late_for_cpu_loss,
        sent,
        answered,
        elapsed: start.elapsed(),
        finished: last_answer.saturating_duration_since(start),
    })
}

/// Whether a request that waited `waited_us` beyond its CPU is late (`LATE_US`) only
/// because of the `lost_us` its server lost while on CPU.
fn late_only_for_cpu_loss(waited_us: u64, lost_us: u64) -> bool {
    waited_us >= LATE_US && waited_us.saturating_sub(lost_us) < LATE_US
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_late_for_cpu_loss_only_when_without_it_it_would_be_on_time() {
        assert!(!late_only_for_cpu_loss(999, 999), "not late at all");
        assert!(late_only_for_cpu_loss(1_000, 1), "999 µs without the loss");
        assert!(!late_only_for_cpu_loss(1_000, 0), "late without any loss");
        assert!(
            !late_only_for_cpu_loss(5_000, 4_000),
            "still 1 ms late without it"
        );
        assert!(late_only_for_cpu_loss(5_000, 4_001));
        assert!(
            late_only_for_cpu_loss(2_000, 3_000),
            "a loss beyond the wait"
        );
    }

    #[test]
    fn fixed_arrivals_are_evenly_spaced() {
        let t: Vec<Duration> = Arrivals::Fixed.offsets(40.0).take(4).collect();
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(t, vec![ms(0), ms(25), ms(50), ms(75)]);
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_the_spread_of_a_poisson_process() {
        let n = 20_000;
        let t: Vec<f64> = Arrivals::Poisson
            .offsets(40.0)
            .take(n + 1)
            .map(|d| d.as_secs_f64())
            .collect();
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / n as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
        // Exponential gaps: mean 1/rate, coefficient of variation 1 (fixed gaps: 0).
        assert!((mean - 0.025).abs() < 0.025 * 0.03, "mean gap {mean}");
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "coefficient of variation {cv}");
        let again: Vec<f64> = Arrivals::Poisson
            .offsets(40.0)
            .take(n + 1)
            .map(|d| d.as_secs_f64())
            .collect();
        assert_eq!(t, again, "every mode sees the same schedule");
    }
}
