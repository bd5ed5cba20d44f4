//! The control socket, `RUN_DIR/control.sock`: `appease status`, `appease top` and
//! `appease reload` talk to the running daemon here, and nowhere else. One JSON request
//! per connection, one JSON reply. Root, and the members of `[control] group`, only: the
//! socket's mode and owner say so to the kernel, and each peer's credentials are checked
//! again on accept.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::status::Status;

pub const SOCKET: &str = "control.sock";
/// A state older than this means the daemon's loop stopped reporting: a hang.
pub const STALE_AFTER_S: u64 = 5;
/// How long `appease reload` waits for the loop to take the new config.
const RELOAD_WAIT: Duration = Duration::from_secs(10);
/// A client has this long to send its request, and to take the reply, in all.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// A request is one short line: anything longer is refused unread.
const MAX_REQUEST_BYTES: usize = 4096;
/// Clients served at once, each on a thread of its own: a slow or silent one holds its
/// own thread for `PEER_TIMEOUT` at most, never another's; past this many, a client is
/// told to try again.
const MAX_CLIENTS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Status,
    Reload,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The state as the loop published it: shared, not copied, to be serialised.
    Status {
        status: Arc<Status>,
    },
    Reload {
        report: ReloadReport,
    },
    Error {
        message: String,
    },
}

/// What a reload did: applied or refused (the last good config stays), what changed,
/// and what only a restart changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadReport {
    pub config: String,
    pub applied: bool,
    pub error: Option<String>,
    /// Sections or entries that changed and took effect.
    pub changed: Vec<String>,
    /// Keys that changed but keep their old value until the daemon restarts.
    pub needs_restart: Vec<String>,
    /// Parts the kernel refused (the rest is applied).
    pub failed: Vec<String>,
}

/// What the event loop shares with the control and metrics servers.
#[derive(Clone)]
pub struct Shared {
    latest: Arc<Mutex<Option<Arc<Status>>>>,
    reload_flag: Arc<AtomicBool>,
    reload_waiters: Arc<Mutex<Vec<mpsc::Sender<ReloadReport>>>>,
}

impl Shared {
    /// `reload_flag` is the one SIGHUP sets: a reload over the socket is the same reload.
    pub fn new(reload_flag: Arc<AtomicBool>) -> Self {
        Shared {
            latest: Default::default(),
            reload_flag,
            reload_waiters: Default::default(),
        }
    }

    pub fn publish(&self, status: Arc<Status>) {
        *lock(&self.latest) = Some(status);
    }

    pub fn latest(&self) -> Option<Arc<Status>> {
        lock(&self.latest).clone()
    }

    /// Asks the loop for a reload and waits for its report.
    fn reload(&self) -> Option<ReloadReport> {
        let (tx, rx) = mpsc::channel();
        lock(&self.reload_waiters).push(tx);
        self.reload_flag.store(true, Ordering::Relaxed);
        rx.recv_timeout(RELOAD_WAIT).ok()
    }

    /// Called by the loop after each reload: everyone who asked hears how it went.
    pub fn reloaded(&self, report: &ReloadReport) {
        for tx in lock(&self.reload_waiters).drain(..) {
            let _asker_gone = tx.send(report.clone());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding it leaves plain data behind: still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server: one thread accepting, one per connection (bounded in number and time).
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The socket, bound and given to its owners (before capabilities are dropped: giving it
/// to a group takes CAP_CHOWN), not served yet (a thread started then would keep them).
pub struct BoundSocket {
    listener: UnixListener,
    path: PathBuf,
    group: Option<u32>,
}

impl BoundSocket {
    /// Binds `dir/control.sock` (the run lock is held: any socket there is a dead
    /// daemon's) for root and `group`.
    pub fn bind(dir: &Path, group: Option<u32>) -> io::Result<Self> {
        let path = dir.join(SOCKET);
        let _stale = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        if let Err(e) = restrict(dir, &path, group) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(BoundSocket {
            listener,
            path,
            group,
        })
    }
}

impl ControlServer {
    /// Answers on `socket` from a thread of its own.
    pub fn start(socket: BoundSocket, shared: Shared) -> io::Result<Self> {
        let BoundSocket {
            listener,
            path,
            group,
        } = socket;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("appease-control".into())
                .spawn(move || serve(listener, group, shared, stop))?
        };
        Ok(ControlServer {
            path,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops answering and removes the socket.
    pub fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept; the thread sees `stop` and ends.
        let _woken = UnixStream::connect(&self.path);
        let _ = thread.join();
        let _gone = std::fs::remove_file(&self.path);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The socket for root and `group` only; the run directory traversable by them only.
fn restrict(dir: &Path, socket: &Path, group: Option<u32>) -> io::Result<()> {
    let (dir_mode, sock_mode) = match group {
        Some(_) => (0o710, 0o660),
        None => (0o700, 0o600),
    };
    for (path, mode) in [(dir, dir_mode), (socket, sock_mode)] {
        if let Some(gid) = group {
            std::os::unix::fs::chown(path, Some(0), Some(gid))?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn serve(listener: UnixListener, group: Option<u32>, shared: Shared, stop: Arc<AtomicBool>) {
    let under_way = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        if under_way.load(Ordering::Relaxed) >= MAX_CLIENTS {
            let reply = Reply::Error {
                message: format!("{MAX_CLIENTS} requests are under way: try again in a second"),
            };
            let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
            send(&mut conn, &reply);
            continue;
        }
        under_way.fetch_add(1, Ordering::Relaxed);
        let (shared, count) = (shared.clone(), under_way.clone());
        let spawned = std::thread::Builder::new()
            .name("appease-client".into())
            .spawn(move || {
                serve_one(conn, group, &shared);
                count.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            under_way.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Sends `reply` whole within `PEER_TIMEOUT` in all, or gives up: a client that takes a
/// large status slowly holds its thread no longer than one that sends nothing.
fn send(conn: &mut UnixStream, reply: &Reply) {
    let Ok(mut bytes) = serde_json::to_vec(reply) else {
        return;
    };
    bytes.push(b'\n');
    let deadline = Instant::now() + PEER_TIMEOUT;
    let mut left = &bytes[..];
    while !left.is_empty() {
        let time = deadline.saturating_duration_since(Instant::now());
        if time.is_zero() || conn.set_write_timeout(Some(time)).is_err() {
            return;
        }
        match conn.write(left) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = &left[n..],
        }
    }
}

/// One client: its credentials checked, its request read within `PEER_TIMEOUT`, answered.
fn serve_one(mut conn: UnixStream, group: Option<u32>, shared: &Shared) {
    let _ = conn.set_write_timeout(Some(PEER_TIMEOUT));
    {
        let reply = match peer(&conn) {
            Ok(p) if allowed(&p, group) => match read_request(&mut conn) {
                Ok(line) => reply_to(&line, shared),
                Err(e) => Reply::Error {
                    message: format!("no request read: {e}"),
                },
            },
            Ok(p) => {
                tracing::warn!(uid = p.uid, pid = p.pid, "control socket: peer refused");
                Reply::Error {
                    message: format!(
                        "uid {} may not use the control socket: root{} only",
                        p.uid,
                        group.map_or(String::new(), |g| format!(" and group {g}"))
                    ),
                }
            }
            Err(e) => Reply::Error {
                message: format!("cannot read the peer's credentials: {e}"),
            },
        };
        send(&mut conn, &reply);
    }
}

/// Reads one request line: at most `MAX_REQUEST_BYTES`, within `PEER_TIMEOUT` in all
/// (a client sending a byte a second is cut off as one sending nothing).
fn read_request(conn: &mut UnixStream) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + PEER_TIMEOUT;
    let mut line = Vec::new();
    let mut buf = [0u8; 512];
    while !line.contains(&b'\n') {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no whole request within {} s", PEER_TIMEOUT.as_secs()),
            ));
        }
        conn.set_read_timeout(Some(left))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        line.extend_from_slice(&buf[..n]);
        if line.len() > MAX_REQUEST_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a request is at most {MAX_REQUEST_BYTES} bytes"),
            ));
        }
    }
    Ok(line)
}

/// A request from a client's bytes, or why they are none.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    serde_json::from_slice::<Request>(line.trim_ascii()).map_err(|e| {
        format!(
            "not a request ({e}): send {{\"request\":\"status\"}} or {{\"request\":\"reload\"}}"
        )
    })
}

/// The reply to a request's bytes (the status, a reload's report, or why not).
fn reply_to(line: &[u8], shared: &Shared) -> Reply {
    match parse_request(line) {
        Ok(Request::Status) => match shared.latest() {
            Some(status) => Reply::Status { status },
            None => Reply::Error {
                message: "the daemon is starting: no state yet, try again in a second".into(),
            },
        },
        Ok(Request::Reload) => match shared.reload() {
            Some(report) => Reply::Reload { report },
            None => Reply::Error {
                message: format!(
                    "the daemon did not reload within {} s: its event loop may be hung",
                    RELOAD_WAIT.as_secs()
                ),
            },
        },
        Err(message) => Reply::Error { message },
    }
}

#[derive(Debug, PartialEq)]
struct Peer {
    pid: i32,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

fn peer(conn: &UnixStream) -> io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a ucred and `len` its size, as SO_PEERCRED requires.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // Supplementary groups: the kernel checked them against the socket's mode already;
    // a peer gone since leaves only its uid and gid to go by.
    let groups = std::fs::read(format!("/proc/{}/status", cred.pid))
        .map(|s| supplementary_groups(&s))
        .unwrap_or_default();
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
        groups,
    })
}

fn supplementary_groups(proc_status: &[u8]) -> Vec<u32> {
    appease_cgroup::status_value(proc_status, "Groups")
        .map(|g| {
            g.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn allowed(p: &Peer, group: Option<u32>) -> bool {
    p.uid == 0 || group.is_some_and(|g| p.gid == g || p.groups.contains(&g))
}

/// Why a client could not talk to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no appease daemon is running (no control socket at {0})")]
    NotRunning(PathBuf),
    #[error("permission denied on {0}: the control socket is for root and the group named in [control] group")]
    Denied(PathBuf),
    #[error("the daemon at {0} did not answer within {1} s: it is hung or stopped")]
    NoAnswer(PathBuf, u64),
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("talking to the daemon at {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Sends one request to the daemon whose run directory is `dir`.
pub fn request(dir: &Path, req: Request) -> Result<Reply, ClientError> {
    let path = dir.join(SOCKET);
    // A status is at hand at once; a reload takes the loop's turn.
    let wait = match req {
        Request::Status => PEER_TIMEOUT,
        Request::Reload => RELOAD_WAIT + PEER_TIMEOUT,
    };
    let io_err = |source: io::Error| match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning(path.clone())
        }
        io::ErrorKind::PermissionDenied => ClientError::Denied(path.clone()),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            ClientError::NoAnswer(path.clone(), wait.as_secs())
        }
        _ => ClientError::Io {
            path: path.clone(),
            source,
        },
    };
    let mut conn = UnixStream::connect(&path).map_err(io_err)?;
    conn.set_read_timeout(Some(wait)).map_err(io_err)?;
    let mut line = serde_json::to_string(&req).expect("a request serializes");
    line.push('\n');
    conn.write_all(line.as_bytes()).map_err(io_err)?;
    let mut reply = String::new();
    BufReader::new(&conn)
        .read_line(&mut reply)
        .map_err(io_err)?;
    match serde_json::from_str(&reply) {
        Ok(Reply::Error { message }) => Err(ClientError::Refused(message)),
        Ok(r) => Ok(r),
        Err(e) => Err(ClientError::Io {
            path,
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        }),
    }
}

/// The daemon's state, or why there is none; `stale` tells how old it is when it is
/// older than [`STALE_AFTER_S`].
pub fn status(dir: &Path) -> Result<(Status, Option<u64>), ClientError> {
    match request(dir, Request::Status)? {
        Reply::Status { status } => {
            let age = appease_actuator::now_secs().saturating_sub(status.updated);
            let status = Arc::try_unwrap(status).unwrap_or_else(|s| (*s).clone());
            Ok((status, (age > STALE_AFTER_S).then_some(age)))
        }
        other => Err(ClientError::Refused(format!("unexpected reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_or_trickling_client_never_holds_the_socket_from_another() {
        let dir =
            std::env::temp_dir().join(format!("appease-control-silent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shared = Shared::new(Default::default());
        shared.publish(Arc::new(Status::default()));
        let server = ControlServer::start(BoundSocket::bind(&dir, None).unwrap(), shared).unwrap();
        let path = dir.join(SOCKET);
        // Holders: silent ones, and one sending a byte every half second.
        let silent: Vec<_> = (0..3)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let trickle = std::thread::spawn({
            let path = path.clone();
            move || {
                let mut c = UnixStream::connect(&path).unwrap();
                for b in b"{\"request\"" {
                    if c.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        });
        let t = Instant::now();
        super::status(&dir).expect("status beside silent clients");
        assert!(
            t.elapsed() < PEER_TIMEOUT,
            "answered in {:?}, not after the others' timeouts",
            t.elapsed()
        );
        // Too long a request is refused without reading it all.
        let mut big = UnixStream::connect(&path).unwrap();
        let _ = big.write_all(&vec![b' '; MAX_REQUEST_BYTES + 10]);
        let mut reply = String::new();
        let _ = big.read_to_string(&mut reply);
        assert!(reply.contains("at most 4096 bytes"), "{reply}");
        drop(silent);
        trickle.join().unwrap();
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_request_parser_answers_any_bytes() {
        appease_fuzz::fuzz(
            "control socket request",
            b"{\"request\":\"status\"}\n",
            |b| {
                let _ = parse_request(b);
            },
        );
        assert_eq!(
            parse_request(b" {\"request\":\"reload\"}\n"),
            Ok(Request::Reload)
        );
    }

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            pid: 1,
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn root_and_group_members_only() {
        assert!(allowed(&peer(0, 0, &[]), None));
        assert!(allowed(&peer(0, 5, &[]), Some(4)));
        assert!(!allowed(&peer(1000, 1000, &[4, 27]), None));
        assert!(
            allowed(&peer(1000, 1000, &[4, 27]), Some(4)),
            "by supplementary group"
        );
        assert!(allowed(&peer(1000, 4, &[]), Some(4)), "by primary group");
        assert!(!allowed(&peer(1000, 1000, &[27]), Some(4)));
    }

    #[test]
    fn groups_come_from_proc_status() {
        let s = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 \nNSpid:\t9\n";
        assert_eq!(supplementary_groups(s.as_bytes()), vec![4, 24, 27]);
        assert_eq!(supplementary_groups(b"Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(supplementary_groups(b""), Vec::<u32>::new());
    }

    #[test]
    fn status_and_reload_round_trip_over_a_real_socket() {
        let dir = std::env::temp_dir().join(format!("appease-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let shared = Shared::new(flag.clone());
        let socket = BoundSocket::bind(&dir, None).unwrap();
        let mut server = ControlServer::start(socket, shared.clone()).unwrap();
        // Before the first status: a clear "starting".
        match request(&dir, Request::Status) {
            Err(ClientError::Refused(m)) => assert!(m.contains("starting"), "{m}"),
            other => panic!("{other:?}"),
        }
        shared.publish(Arc::new(Status {
            pid: 42,
            updated: appease_actuator::now_secs(),
            ..Default::default()
        }));
        let (st, stale) = status(&dir).unwrap();
        assert_eq!((st.pid, stale), (42, None));
        shared.publish(Arc::new(Status {
            pid: 42,
            updated: appease_actuator::now_secs() - 60,
            ..Default::default()
        }));
        let (_, stale) = status(&dir).unwrap();
        assert!(stale.is_some_and(|age| age >= 60), "{stale:?}");
        // A reload: the flag is raised, the loop's report comes back to the asker.
        let loop_side = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                while !flag.swap(false, Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                shared.reloaded(&ReloadReport {
                    applied: true,
                    changed: vec!["[batch]".into()],
                    ..Default::default()
                });
            })
        };
        match request(&dir, Request::Reload).unwrap() {
            Reply::Reload { report } => assert_eq!(report.changed, vec!["[batch]"]),
            other => panic!("{other:?}"),
        }
        loop_side.join().unwrap();
        server.stop();
        assert!(matches!(
            request(&dir, Request::Status),
            Err(ClientError::NotRunning(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
