//! Servers with a session per connection. A worker forked by a listening server that
//! calls `setsid()` for its connection (PostgreSQL's backends) is, outside any CPU
//! cgroup, an autogroup of its own: one top-level entity per connection, alone in it, so
//! its nice acts on nothing. What an elevation gives it is then its short slice and its
//! autogroup's raise, and both act on every other session on the host, its own client's
//! first: a client on the server's host was preempted at each of its requests and took
//! up to 1.3 times as long as beside the idle group made by hand (docs/findings.md, "A
//! client's demand"). Such a worker keeps its elevation's nice (it orders it in a CPU
//! group, should it move to one) but neither the slice nor the raise.

use std::collections::HashMap;

use crate::batch::Process;

/// The slice of such a worker's sunk thread (a long request): its nice acts on nothing,
/// but a slice longer than the kernel's lets every woken task of a shorter one preempt it.
pub const SUNK_SLICE: std::time::Duration = std::time::Duration::from_millis(6);

/// Beyond this many processes known, the answers are read again (exits forget their
/// own; this bounds what lost exit events leave).
const MAX_KNOWN: usize = 1 << 16;

#[derive(Default)]
pub struct ConnectionSessions {
    /// pid -> (start, whether it is a connection's own session), read once per process.
    known: HashMap<u32, (u64, bool)>,
}

impl ConnectionSessions {
    /// Whether process `(pid, start)` of application `app` (its listening ancestor, or
    /// itself) is a worker in a session and autogroup of its own: as the probe saw it
    /// (`own_autogroup`) at the process's first request, then remembered until it exits.
    pub fn check(&mut self, (pid, start): Process, app: u32, own_autogroup: bool) -> bool {
        if app == pid || app == 1 {
            // The server itself, a process serving on its own, or a service: under a pid
            // a worker may have had before (its exit unseen).
            self.known.remove(&pid);
            return false;
        }
        if let Some(&(s, own)) = self.known.get(&pid) {
            if s == start {
                return own;
            }
        }
        if self.known.len() >= MAX_KNOWN {
            // The workers stay known (an elevation between requests must not give one
            // the short slice); the rest are read again at their next request.
            self.known.retain(|_, &mut (_, own)| own);
            if self.known.len() >= MAX_KNOWN {
                self.known.clear();
            }
        }
        self.known.insert(pid, (start, own_autogroup));
        own_autogroup
    }

    /// Whether `pid` was found to be a connection's own session.
    pub fn contains(&self, pid: u32) -> bool {
        self.known.get(&pid).is_some_and(|&(_, own)| own)
    }

    pub fn forget(&mut self, pid: u32) {
        self.known.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_itself_is_never_a_connection_session() {
        let mut s = ConnectionSessions::default();
        // A server that leads its own session (started by a shell, or setsid) serves
        // every connection: not one connection's worker.
        assert!(!s.check((40, 0), 40, true));
        assert!(!s.contains(40));
        // Its worker, in a session of its own, is.
        assert!(s.check((41, 0), 40, true));
        assert!(s.contains(41));
    }

    #[test]
    fn a_remembered_answer_is_for_the_same_process_only() {
        let mut s = ConnectionSessions::default();
        s.known.insert(42, (7, true));
        assert!(s.contains(42));
        assert!(s.check((42, 7), 2, false), "remembered, not taken again");
        // Another process under the pid (another start) is taken as the probe sees it.
        s.known.insert(4_999_999, (7, true));
        assert!(!s.check((4_999_999, 8), 2, false));
        assert!(!s.contains(4_999_999));
        s.forget(42);
        assert!(!s.contains(42));
        // A service PID 1 started is no connection's worker.
        s.known.insert(44, (7, true));
        assert!(!s.check((44, 7), 1, true));
        // A server (its own application) under a worker's old pid is not taken for it.
        s.known.insert(43, (7, true));
        assert!(!s.check((43, 9), 43, true));
        assert!(!s.contains(43));
    }
}
