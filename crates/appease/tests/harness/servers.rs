//! Servers the tests run, with clients that send them requests.

use crate::*;

/// A server thread answering one-byte requests after `cpu` of work, and a client
/// sending one every `period` until stopped.
pub(crate) struct Service {
    pub(crate) server_tid: u32,
    pub(crate) paused: Arc<AtomicBool>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) threads: Vec<JoinHandle<()>>,
}

impl Service {
    pub(crate) fn tcp(cpu: Duration, period: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = move || {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s
        };
        Self::start(move || listener.accept().unwrap().0, client, cpu, period)
    }

    pub(crate) fn unix(cpu: Duration, period: Duration) -> Self {
        let (a, b) = UnixStream::pair().unwrap();
        Self::start(move || b, move || a, cpu, period)
    }

    pub(crate) fn start<S, C>(
        server: impl FnOnce() -> S + Send + 'static,
        client: impl FnOnce() -> C + Send + 'static,
        cpu: Duration,
        period: Duration,
    ) -> Self
    where
        S: Read + Write + 'static,
        C: Read + Write + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let srv = thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut s = server();
            let mut b = [0u8; 1];
            while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
                spin_cpu(cpu);
                if s.write_all(&b).is_err() {
                    break;
                }
            }
        });
        let server_tid = rx.recv().unwrap();
        let paused = Arc::new(AtomicBool::new(false));
        let (st, pa) = (stop.clone(), paused.clone());
        let cli = thread::spawn(move || {
            let mut c = client();
            let mut b = [0u8; 1];
            while !st.load(Ordering::Relaxed) {
                if !pa.load(Ordering::Relaxed)
                    && (c.write_all(b"r").is_err() || c.read_exact(&mut b).is_err())
                {
                    break;
                }
                thread::sleep(period);
            }
            // Dropping the client ends the server's loop.
        });
        Service {
            server_tid,
            paused,
            stop,
            threads: vec![srv, cli],
        }
    }

    /// Stops sending requests; the server thread stays alive but idle.
    pub(crate) fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Two threads answering one-byte requests, each running `work` per request (false
/// ends it), each with a client thread that sends one every `period` until `stop`.
pub(crate) struct ShortRequests {
    pub(crate) threads: Vec<JoinHandle<()>>,
    pub(crate) latencies: Arc<Mutex<Vec<f64>>>,
}

impl ShortRequests {
    pub(crate) fn start(
        period: Duration,
        stop: Arc<AtomicBool>,
        work: impl Fn() -> bool + Clone + Send + 'static,
    ) -> Self {
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (mut client, mut server) = UnixStream::pair().unwrap();
            let (work, stop, lat) = (work.clone(), stop.clone(), latencies.clone());
            threads.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                while server.read_exact(&mut b).is_ok() && work() {
                    if server.write_all(&b).is_err() {
                        break;
                    }
                }
            }));
            threads.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let answered =
                        client.write_all(b"r").is_ok() && client.read_exact(&mut b).is_ok();
                    // A request the end of the run cut short (its server gave up when
                    // the lock went away) waited at least this long: it counts.
                    lat.lock()
                        .unwrap()
                        .push(start.elapsed().as_secs_f64() * 1e3);
                    if !answered {
                        break;
                    }
                    thread::sleep(period);
                }
            }));
        }
        ShortRequests { threads, latencies }
    }

    /// Joins the threads (once `stop` is set and nothing blocks them); the latencies, ms,
    /// sorted.
    pub(crate) fn finish(self) -> Vec<f64> {
        for t in self.threads {
            t.join().unwrap();
        }
        let mut v = std::mem::take(&mut *self.latencies.lock().unwrap());
        v.sort_by(f64::total_cmp);
        v
    }
}

/// A per-connection forking TCP server (Perl, from the base system): each connection's
/// child answers one-byte requests, `h` after 400 ms of work, anything else after 2 ms.
/// Prints its port.
pub(crate) const FORKING_SERVER: &str = r#"
use IO::Socket::INET; use Time::HiRes qw(time); use POSIX ();
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 64,
    ReuseAddr => 1) or die "listen: $!";
$| = 1; print $s->sockport, "\n"; $SIG{CHLD} = 'IGNORE';
while (1) {
    my $c = $s->accept or next;
    if (fork == 0) {
        close $s;
        while (sysread($c, my $b, 1)) {
            my $end = time + ($b eq 'h' ? 0.4 : 0.002);
            1 while time < $end;
            syswrite($c, $b);
        }
        exit 0;
    }
    close $c;
}
"#;

/// `FORKING_SERVER` whose children each call `setsid()` first, as PostgreSQL's backends
/// do: each in a session, hence an autogroup, of its own.
pub(crate) fn session_forking_server() -> String {
    FORKING_SERVER.replace("close $s;\n", "close $s; POSIX::setsid();\n")
}

/// A new connection to the forking server `server_pid` at `addr`, and the child that
/// serves it (one not in `known`).
pub(crate) fn connect_child(addr: &str, server_pid: u32, known: &[u32]) -> (TcpStream, u32) {
    let c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let mut child = None;
    wait_for(Duration::from_secs(3), || {
        child = children_of(server_pid)
            .into_iter()
            .find(|p| !known.contains(p));
        child.is_some()
    })
    .expect("a child per connection");
    (c, child.unwrap())
}

/// One request `b` on `c`, and its answer.
pub(crate) fn ask(c: &mut TcpStream, b: &[u8]) {
    c.write_all(b).unwrap();
    let mut r = [0u8; 1];
    c.read_exact(&mut r).unwrap();
}

/// A perl server that prints its port first; ended on drop, also when an assertion
/// fails (its children end with their connections).
pub(crate) fn perl_server(script: &str) -> (Soakers, String) {
    let mut child = Command::new("perl")
        .args(["-e", script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("perl runs");
    let out = child.stdout.take().unwrap();
    let server = Soakers(vec![child]);
    let mut port = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut port).unwrap();
    (server, port.trim().to_string())
}

/// A request-serving process in a session of its own (`appease bench-worker server` on
/// a UNIX socket, 1 ms of CPU a request) and a thread of this test sending it a request
/// every 20 ms. Its own session, so its own autogroup: the kernel gives none to a process
/// of the first session (under CI the tests may run in it), and /proc/PID/autogroup is
/// then empty.
pub(crate) struct SessionServer {
    pub(crate) server: Soakers,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) client: Option<JoinHandle<()>>,
}

impl SessionServer {
    pub(crate) fn start(dir: &std::path::Path) -> Self {
        let socket = dir.join("server.sock");
        let mut cmd = Command::new(BIN);
        cmd.args(["bench-worker", "server", "--cpu-ms", "1", "--unix"])
            .arg(&socket)
            .stdout(Stdio::piped());
        let mut child = own_session(&mut cmd).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let server = Soakers(vec![child]);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).unwrap();
        let mut conn = UnixStream::connect(line.trim()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let client = thread::spawn(move || {
            let mut answer = [0u8; appease_bench::worker::ANSWER_LEN];
            while !st.load(Ordering::Relaxed) {
                if conn.write_all(b"r").is_err() || conn.read_exact(&mut answer).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        SessionServer {
            server,
            stop,
            client: Some(client),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.server.0[0].id()
    }
}

impl Drop for SessionServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(c) = self.client.take() {
            let _ = c.join();
        }
    }
}

pub(crate) fn fork_spinning_receiver(socket: &UnixStream) -> u32 {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    // SAFETY: the child only spins and calls recv, forever: async-signal-safe.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut buf = [0u8; 64];
        loop {
            spin_cpu(Duration::from_millis(20));
            // SAFETY: valid buffer; non-blocking receive.
            unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        }
    }
    child as u32
}

/// Writes a one-byte request to a socket every 50 ms until dropped.
pub(crate) struct Feeder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Feeder {
    pub(crate) fn start(mut socket: UnixStream) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let _ = socket.write_all(b"q");
                thread::sleep(Duration::from_millis(50));
            }
        });
        Feeder {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A forked copy of this process that spins and takes what waits on its socket every
/// 20 ms, fed a request every 50 ms: busy, and receiving requests (never batch).
pub(crate) struct BusyServer {
    pub(crate) pid: u32,
    feeder: Option<Feeder>,
}

impl BusyServer {
    pub(crate) fn start() -> Self {
        let (a, b) = UnixStream::pair().unwrap();
        let child = fork_spinning_receiver(&b);
        BusyServer {
            pid: child,
            feeder: Some(Feeder::start(a)),
        }
    }
}

impl Drop for BusyServer {
    fn drop(&mut self) {
        drop(self.feeder.take()); // the requests stop first
        drop(KillOnDrop(self.pid));
    }
}
