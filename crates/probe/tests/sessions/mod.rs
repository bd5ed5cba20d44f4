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

#[test]
#[ignore = "needs root (BPF): make test runs it, or as root cargo test -- --include-ignored"]
fn a_processs_cgroup_ids_name_the_groups_proc_shows() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&ProbeConfig::default(), &mut storage).unwrap();
    // A child in a CPU group of its own, in the hierarchy the daemon acts in.
    let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
    let dir = cg
        .root()
        .join(format!("appease-test-ids-{}", std::process::id()));
    std::fs::create_dir(&dir).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    let moved = std::fs::write(dir.join("cgroup.procs"), child.id().to_string());
    let tasks = probe.take_task_iter().unwrap().read().unwrap();
    let group = cg.group_of(child.id());
    let want = group.as_ref().ok().and_then(|g| cg.group_id(g));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir(&dir).unwrap();
    moved.unwrap();
    let group = group.unwrap();
    assert!(group.starts_with("/appease-test-ids-"), "{group}");
    let theirs = tasks
        .iter()
        .find(|t| t.tid == child.id())
        .expect("the child");
    let id = theirs.cgroup_ids.of(cg.version());
    assert!(id > 1, "{:?}", theirs.cgroup_ids);
    assert_eq!(Some(id), want, "the group's id is its directory's inode");
}

#[test]
#[ignore = "needs root (BPF): make test runs it, or as root cargo test -- --include-ignored"]
fn a_worker_forked_before_the_probe_is_given_to_its_server() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&ProbeConfig::default(), &mut storage).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut iter = probe.take_task_iter().unwrap();
    let mut app_of_child = || {
        let tasks = iter.read().unwrap();
        tasks.iter().find(|t| t.tid == pid).map(|t| t.app)
    };
    // This process does not listen: its fork is an application of its own.
    let before = app_of_child();
    probe.set_app(pid, std::process::id()).unwrap();
    let after = app_of_child();
    child.kill().unwrap();
    child.wait().unwrap();
    // A process gone is skipped.
    probe.set_app(pid, std::process::id()).unwrap();
    assert_eq!(before, Some(pid));
    assert_eq!(after, Some(std::process::id()));
}
