//! The chaos harness: the daemon under a realistic mix is killed at random moments and at
//! crash points inside its own code (a test build's failpoints: right after a journal
//! write, before the change it announces, after any record and after one of each path's
//! kind: a pin, another program's group made idle, a thread made idle in place, an
//! autogroup's nice; between two processes of a tree being moved), then restored, by
//! `appease restore` or by the next daemon's start. Some rounds, an administrator changes
//! a group's idle flag and weight and an autogroup's nice between the crash and the
//! restore. After each round every thread of the mix must have its nice, policy, slice
//! and CPUs as before appease, every process its cgroup, the limited groups their flag
//! and weight, the serving sessions their autogroup's nice (or the administrator's
//! values, where one changed them), and no group of appease's may be left.
//!
//! The mix: soakers (two fork, one renames itself every half second between a role's
//! name and another, one whose parent exited), a sleeping process with a role and one in
//! a service, a limited group holding only a soaker (made idle where it is), one holding a
//! soaker beside a busy server (the soaker's threads made idle in place), a server in a
//! session of its own (its autogroup raised beside the idle group), and two server
//! threads of the test itself. Reused thread and process ids are the unit tests'
//! (`a_recycled_tid_is_never_touched`, `a_request_of_a_thread_that_has_exited_...`):
//! forcing one here would take the host's whole id space.
//!
//! `make test` runs a short form; `make chaos` runs hundreds of rounds (CHAOS_ROUNDS) and
//! prints the figures docs/RESULTS.md quotes. CHAOS_SEED replays a run.

use super::*;
use appease_actuator::journal::read_pending;

/// What appease could have changed, as it was before: each thread's (policy, nice,
/// slice) and CPUs, each process's cgroup, and the hierarchy's top-level groups.
#[derive(Clone, Debug, PartialEq)]
struct Snapshot {
    threads: Vec<ThreadState>,
    cgroups: Vec<(u32, String)>,
    top_groups: Vec<String>,
    /// Other programs' groups: (path, idle flag, raw weight).
    groups: Vec<(String, bool, String)>,
    /// (a process, its autogroup's nice) of the serving sessions; None outside the root
    /// CPU cgroup, where the kernel schedules no autogroup (a CI runner's own cgroup).
    autogroups: Vec<(u32, Option<i32>)>,
}

/// What the snapshot reads besides the threads of `pids`.
struct Watched<'a> {
    extra_tids: &'a [(u32, u32)],
    groups: &'a [&'a str],
    sessions: &'a [u32],
}

/// (pid, tid, (policy, nice, slice), CPUs allowed).
type ThreadState = (u32, u32, (u32, i32, u64), Vec<usize>);

fn sched_of(tid: u32) -> Option<(u32, i32, u64)> {
    // struct sched_attr, as far as sched_runtime (the EEVDF slice).
    let mut attr = [0u32; 14];
    attr[0] = 56;
    // SAFETY: the kernel writes at most `size` (56) bytes into `attr`.
    let r = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, attr.as_mut_ptr(), 56u32, 0u32) };
    if r != 0 {
        return None;
    }
    // size, policy, flags (u64), nice, priority, runtime (u64), ...
    let runtime = attr[6] as u64 | (attr[7] as u64) << 32;
    Some((attr[1], attr[4] as i32, runtime))
}

fn snapshot(pids: &[u32], w: &Watched) -> Snapshot {
    let mut threads = Vec::new();
    for &pid in pids {
        for e in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(s) = sched_of(tid) {
                threads.push((pid, tid, s, cpus_of(tid)));
            }
        }
    }
    for &(pid, tid) in w.extra_tids {
        threads.push((pid, tid, sched_of(tid).unwrap(), cpus_of(tid)));
    }
    threads.sort();
    let cgroups = pids
        .iter()
        .map(|&p| (p, cpu_cgroup(p).unwrap_or_default()))
        .collect();
    let cg = appease_cgroup::Cgroups::detect().unwrap();
    let root = cg.root().to_path_buf();
    let mut top_groups: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top_groups.sort();
    let groups = w
        .groups
        .iter()
        .map(|g| {
            let weight = cg.weight_raw(g).unwrap_or_default().trim().to_string();
            (g.to_string(), cg.idle(g).unwrap_or(false), weight)
        })
        .collect();
    let autogroups = w
        .sessions
        .iter()
        .map(|&p| {
            let text = std::fs::read_to_string(format!("/proc/{p}/autogroup")).unwrap_or_default();
            (
                p,
                appease_actuator::sys::parse_autogroup(&text).map(|a| a.nice),
            )
        })
        .collect();
    Snapshot {
        threads,
        cgroups,
        top_groups,
        groups,
        autogroups,
    }
}

/// An administrator's `echo NICE > /proc/PID/autogroup` (the kernel takes one autogroup
/// write per 100 ms host-wide: tried for a second).
fn set_autogroup_nice(pid: u32, nice: i32) {
    let path = format!("/proc/{pid}/autogroup");
    let done = wait_for(Duration::from_secs(1), || {
        std::fs::write(&path, nice.to_string()).is_ok()
    });
    assert!(done.is_some(), "{path} takes {nice}");
}

/// A soaker that renames itself (perl sets its comm with `$0`) every half second,
/// between `a` and `b`.
fn renaming_soaker(a: &str, b: &str) -> std::process::Child {
    let mut cmd = Command::new("perl");
    cmd.args([
        "-e",
        &format!("while (1) {{ $0 = int(time * 2) % 2 ? '{a}' : '{b}'; for (1..20000) {{}} }}"),
    ])
    .stdout(std::process::Stdio::null());
    own_session(&mut cmd).spawn().unwrap()
}

/// A process named `name` that sleeps as long as the test runs: a role's or a service's,
/// whose CPU leaves the idle group some (spinning, with the busy server, they would take
/// both CPUs of a small host, and a starved idle group's threads are never spread).
fn named_sleeper(name: &str) -> std::process::Child {
    let mut cmd = Command::new("perl");
    cmd.args(["-e", &format!("$0 = '{name}'; sleep 3600 while 1")])
        .stdout(std::process::Stdio::null());
    own_session(&mut cmd).spawn().unwrap()
}

/// A soaker whose parent exited: reparented (to init, or the nearest subreaper).
fn orphaned_soaker() -> KillOnDrop {
    let mut parent = Command::new("sh")
        .args(["-c", "sh -c 'while :; do :; done' & echo $!"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(parent.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    parent.wait().unwrap();
    KillOnDrop(line.trim().parse().unwrap())
}

/// A small generator for the kill moments (no dependency for one line of arithmetic).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How a round ends the daemon.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// SIGKILL after this many ms.
    After(u64),
    /// The failpoint ends it at its Nth pass.
    At(&'static str, u64),
}

/// The crash points the rounds cycle through, each with the most passes to wait: after
/// any journal record, between two moves of a tree, after a record of one path's kind.
const CRASH_POINTS: [(&str, u64); 6] = [
    ("journal-written", 12),
    ("cgroup-moved", 3),
    ("written-group-idle", 1),
    ("written-autogroup-nice", 2),
    ("written-pin", 3),
    ("written-idle", 1),
];

#[derive(Default, Debug)]
struct Figures {
    rounds: u32,
    timed_kills: u32,
    /// Kills at a crash point, by point.
    fired: std::collections::BTreeMap<&'static str, u32>,
    /// Rounds whose crash point was not reached in 6 s (then killed like a timed round).
    not_reached: std::collections::BTreeMap<&'static str, u32>,
    /// Rounds with an administrator's changes between the crash and the restore.
    admin_changes: u32,
    restored_by_command: u32,
    restored_by_next_start: u32,
    journals_left_by_kills: u32,
    /// Of those, journals with threads pinned to one CPU (the idle group spread).
    journals_with_pins: u32,
    corruptions_tried: u32,
}

root_test! {
    fn chaos_kills_at_random_moments_and_crash_points_leave_nothing_changed() {
        // Seven rounds: every kind of kill (round % 7), each way of putting back (round % 2)
        // and one round with an administrator's changes (round % 5 == 3).
        let rounds: u32 = env_or("CHAOS_ROUNDS", 7);
        let seed: u64 = env_or(
            "CHAOS_SEED",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64,
        );
        eprintln!("chaos: {rounds} rounds, CHAOS_SEED={seed}");
        let mut rng = Lcg(seed);
        let dir = TempDir::new("chaos");
        let tag = std::process::id() % 10_000;
        let group = format!("appease-chaos{}", std::process::id());
        let elevation = test_elevation();
        let cfg = dir.file(
            "chaos.toml",
            &format!(
                "[batch]\ngroup = \"{group}\"\nafter_ms = 300\nscan_ms = 100\nmin_cpus = 0.15\n\
                 [roles]\ntop_nice = -6\n\n\
                 [[role]]\napp = \"chaos\"\ncomm = \"chaos-ra{tag}\"\ntrust_comm = true\nrank = 0\n\n\
                 [[role]]\napp = \"chaos\"\ncomm = \"chaos-rb{tag}\"\ntrust_comm = true\nrank = 1\n\n\
                 [[service]]\nname = \"chaos{tag}\"\ncomm = \"chaos-sv{tag}\"\ntrust_comm = true\n\n{elevation}"
            ),
        );
        // The mix (the module's comment). The test's two server threads receive requests
        // under that load: one often enough to stay elevated, one so seldom that its
        // elevation fades between requests (each request then makes journal writes).
        let _on = AutogroupsOn::new();
        let procs = Soakers(vec![
            forking_soaker(),
            forking_soaker(),
            named_sleeper(&format!("chaos-ra{tag}")),
            renaming_soaker(&format!("chaos-rb{tag}"), &format!("chaos-rn{tag}")),
            named_sleeper(&format!("chaos-sv{tag}")),
            forking_soaker(),
            forking_soaker(),
        ]);
        let orphan = orphaned_soaker();
        let mut whole = LimitedGroup::new("chaosw", None);
        whole.adopt(procs.0[5].id());
        let mut mixed = LimitedGroup::new("chaosm", None);
        let busy = BusyServer::start();
        mixed.adopt(procs.0[6].id());
        mixed.adopt(busy.pid);
        let session = SessionServer::start(&dir.0);
        let mut pids: Vec<u32> = procs.0.iter().map(|c| c.id()).collect();
        pids.extend([orphan.0, busy.pid, session.pid()]);
        let svc = Service::unix(Duration::from_micros(300), Duration::from_millis(10));
        let seldom = Service::unix(Duration::from_micros(300), Duration::from_millis(150));
        let me = std::process::id();
        let watched = Watched {
            extra_tids: &[(me, svc.server_tid), (me, seldom.server_tid)],
            groups: &[&whole.path, &mixed.path],
            sessions: &[session.pid(), me],
        };
        // Once every process of the mix has started all its threads: two readings 200 ms
        // apart agree.
        let mut before = snapshot(&pids, &watched);
        let settled = wait_for(Duration::from_secs(5), || {
            thread::sleep(Duration::from_millis(200));
            let now = snapshot(&pids, &watched);
            std::mem::replace(&mut before, now) == before
        });
        assert!(settled.is_some(), "the mix settles: {before:?}");
        let run_dir = dir.0.join("run");
        let mut figures = Figures::default();
        let mut real_journal: Option<Vec<u8>> = None;
        let started = std::time::Instant::now();
        for round in 0..rounds {
            let round_start = std::time::Instant::now();
            let kill = match round % 7 {
                0 => Kill::After(rng.below(1500)),
                k => {
                    let (point, most) = CRASH_POINTS[k as usize - 1];
                    Kill::At(point, 1 + rng.below(most))
                }
            };
            let mut cmd = Command::new(BIN);
            cmd.args(["daemon", "--config"])
                .arg(&cfg)
                .env("APPEASE_RUN_DIR", &run_dir)
                .stderr(std::fs::File::create(dir.0.join("crashed.log")).unwrap());
            if let Kill::At(point, n) = kill {
                cmd.env("FAILPOINTS", format!("{point}={}*off->return", n - 1));
            }
            let mut daemon = cmd.spawn().unwrap();
            let ended = match kill {
                Kill::After(ms) => {
                    thread::sleep(Duration::from_millis(ms));
                    figures.timed_kills += 1;
                    None
                }
                Kill::At(..) => wait_for(Duration::from_secs(6), || {
                    matches!(daemon.try_wait(), Ok(Some(_)))
                }),
            };
            match (kill, ended) {
                (Kill::At(point, _), Some(_)) => {
                    let status = daemon.wait().unwrap();
                    use std::os::unix::process::ExitStatusExt;
                    assert_eq!(
                        status.signal(),
                        Some(libc::SIGKILL),
                        "round {round}: {kill:?} ended the daemon otherwise: {status:?}"
                    );
                    *figures.fired.entry(point).or_default() += 1;
                }
                (Kill::At(point, _), None) => {
                    *figures.not_reached.entry(point).or_default() += 1;
                    let crashed = std::fs::read_to_string(dir.0.join("crashed.log")).unwrap_or_default();
                    eprintln!("DEBUG not reached {point}: {}", crashed.lines().filter(|l| !l.contains("libbpf")).collect::<Vec<_>>().join("\n"));
                }
                _ => {}
            }
            if matches!(daemon.try_wait(), Ok(None)) {
                // SAFETY: our own child, not reaped yet (its PID is still ours).
                unsafe { libc::kill(daemon.id() as i32, libc::SIGKILL) };
            }
            daemon.wait().unwrap();
            let journal_then =
                std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap_or_default();
            let restore_log;
            if let Ok(j) = std::fs::read(run_dir.join("journal.jsonl")) {
                figures.journals_left_by_kills += 1;
                if read_pending(&run_dir).is_ok_and(|st| !st.pinned.is_empty()) {
                    figures.journals_with_pins += 1;
                }
                if real_journal.as_ref().is_none_or(|r| j.len() > r.len()) {
                    real_journal = Some(j);
                }
            }
            // An administrator's changes after the crash: the group made idle where it
            // is gets its flag off and another weight, the session's autogroup another
            // nice. The restore keeps them.
            let mut expected = before.clone();
            let admin = round % 5 == 3;
            if admin {
                whole.cg.set_idle(&whole.path, false).unwrap();
                whole.cg.set_weight_raw(&whole.path, "512").unwrap();
                expected.groups[0] = (whole.path.clone(), false, "512".into());
                if before.autogroups[0].1.is_some() {
                    set_autogroup_nice(session.pid(), 4);
                    expected.autogroups[0] = (session.pid(), Some(4));
                }
                figures.admin_changes += 1;
            }
            // Put back: by the restore command, or by the next daemon's start.
            if round % 2 == 0 {
                let out = appease(&run_dir, &["restore"]);
                assert!(out.status.success(), "round {round}: restore: {out:?}");
                restore_log = String::from_utf8_lossy(&out.stderr).into_owned();
                figures.restored_by_command += 1;
            } else {
                let mut next = Daemon::start(&run_dir, &cfg);
                let pid = next.pid();
                // Started means restored; stopped at once, it puts back what it did since.
                let ok = next.signal(libc::SIGTERM).success();
                restore_log = next.log_text();
                assert!(ok, "round {round}: {pid}: {restore_log}");
                figures.restored_by_next_start += 1;
            }
            figures.rounds += 1;
            let after = snapshot(&pids, &watched);
            if after != expected {
                let crashed = std::fs::read_to_string(dir.0.join("crashed.log")).unwrap_or_default();
                let tail: Vec<&str> = crashed.lines().filter(|l| !l.contains("libbpf")).collect();
                panic!(
                    "round {round} ({kill:?}, CHAOS_SEED={seed}) left something changed\n\
                     expected: {expected:?}\nafter:    {after:?}\n\
                     journal the kill left:\n{journal_then}\n\
                     the killed daemon's log (end):\n{}\n\
                     the restore's log:\n{restore_log}",
                    tail[tail.len().saturating_sub(25)..].join("\n")
                );
            }
            assert!(
                !run_dir.join("journal.jsonl").exists(),
                "round {round}: a journal left"
            );
            // Progress, for `make chaos`'s long runs.
            eprintln!(
                "chaos: round {}/{rounds} ({kill:?}{}) clean in {:.1} s, {:.0} s so far",
                round + 1,
                if admin { ", an administrator's changes" } else { "" },
                round_start.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
            if admin {
                let (_, _, weight) = &before.groups[0];
                whole.cg.set_weight_raw(&whole.path, weight).unwrap();
                if let (_, Some(nice)) = before.autogroups[0] {
                    set_autogroup_nice(session.pid(), nice);
                }
            }
        }
        // The mix ends first: its spinners would take most of the CPU the reads need.
        drop((svc, seldom, session, busy, orphan, mixed, whole, procs));
        // The longest journal a kill left, damaged every way: read, never a panic; a cut
        // anywhere loses at most the line it cuts (a torn tail, not counted as corrupt).
        // Its first whole lines up to 2,400 bytes: every cut and bit costs a read of the
        // whole, and a longer journal holds only more of the same records.
        let real_journal = real_journal.map(|j| {
            let mut end = 0;
            for (i, _) in j.iter().enumerate().filter(|(_, &b)| b == b'\n') {
                if i + 1 > 2_400 {
                    break;
                }
                end = i + 1;
            }
            let end = if end == 0 { j.len().min(2_400) } else { end };
            j[..end].to_vec()
        });
        if let Some(real) = &real_journal {
            let scratch = dir.0.join("corrupt");
            std::fs::create_dir_all(&scratch).unwrap();
            let file = scratch.join("journal.jsonl");
            let whole = {
                std::fs::write(&file, real).unwrap();
                read_pending(&scratch).unwrap()
            };
            for cut in 0..real.len() {
                std::fs::write(&file, &real[..cut]).unwrap();
                let st = read_pending(&scratch).unwrap();
                assert!(st.corrupt.is_empty(), "cut at {cut}: {:?}", st.corrupt);
                figures.corruptions_tried += 1;
            }
            for bit in 0..real.len() * 8 {
                let mut flipped = real.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                std::fs::write(&file, &flipped).unwrap();
                read_pending(&scratch).unwrap();
                figures.corruptions_tried += 1;
            }
            let mut garbage = b"not a record\n\xff\xfe\n{\"op\":\"nosuch\"}\n".to_vec();
            garbage.extend_from_slice(real);
            garbage.extend_from_slice(b"\n\n{}\n");
            std::fs::write(&file, &garbage).unwrap();
            let st = read_pending(&scratch).unwrap();
            assert_eq!(st.corrupt.len(), 4, "{:?}", st.corrupt);
            assert_eq!(st.len(), whole.len(), "the real lines still read");
            figures.corruptions_tried += 1;
        }
        // Every round was checked above: reaching here, none left anything.
        eprintln!("chaos figures (no round left anything changed): {figures:?}");
        assert!(
            !figures.fired.is_empty() || rounds < 3,
            "no crash point fired: the failpoints are not compiled in ({figures:?})"
        );
    }
}

root_test! {
    fn chaos_kills_while_systemd_units_are_set_and_every_unit_is_put_back() {
        // The unit paths run only under systemd on cgroup v2: in the VM (crates/appease/
        // tests/vm/chaos.sh), CHAOS_UNIT_ROUNDS rounds, sharing the boot of the vm tests.
        in_systemd_vm("chaos.sh");
    }
}
