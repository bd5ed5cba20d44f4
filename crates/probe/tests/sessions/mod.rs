//! A request's process as a scheduling entity: whether it leads a session of its own and
//! runs in that session's autogroup (a connection's worker that called setsid()).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use appease_probe::{Event, Probe, ProbeConfig, ProbeStorage};

use super::{assert_root, collect};

/// A child (`head -c 4`) reading a socket, in a session of its own or not; whether its
/// request's event says it leads its own autogroup.
fn own_autogroup_of_reader(probe: &mut Probe, new_session: bool) -> bool {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut cmd = std::process::Command::new("head");
    cmd.args(["-c", "4"])
        .stdin(std::os::fd::OwnedFd::from(theirs))
        .stdout(std::process::Stdio::null());
    if new_session {
        // SAFETY: setsid is async-signal-safe; the child is a fresh fork.
        unsafe {
            cmd.pre_exec(|| match libc::setsid() {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    (&ours).write_all(b"ping").unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    let own: Vec<bool> = collect(probe, Duration::from_millis(100))
        .into_iter()
        .filter_map(|e| match e {
            Event::Request {
                pid: p,
                own_autogroup,
                ..
            } if p == pid => Some(own_autogroup),
            _ => None,
        })
        .collect();
    assert_eq!(own.len(), 1, "one request of {pid}: {own:?}");
    own[0]
}

#[test]
#[ignore = "needs root (BPF): make test runs it, or as root cargo test -- --include-ignored"]
fn a_request_says_whether_its_process_leads_its_own_autogroup() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let cfg = ProbeConfig {
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).unwrap();
    // A session's own autogroup exists with autogroups on, for a task in the root CPU
    // cgroup (as this test's children are, unless the test runs in a CPU group).
    let autogroups = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|s| s.trim() == "1");
    let root_cpu_group = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .any(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "cpu"))
                && l.ends_with(":/")
        });
    assert!(
        autogroups && root_cpu_group,
        "this test needs autogroups on and the root CPU cgroup (as make test runs it)"
    );
    assert!(own_autogroup_of_reader(&mut probe, true), "its own session");
    assert!(
        !own_autogroup_of_reader(&mut probe, false),
        "the test's session"
    );
}
