//! A local user against the root daemon: each attack run as an unprivileged user the test
//! makes (and removes). Nobody gains from appease what they could not get themselves, and
//! nobody keeps it from starting, restoring or answering. docs/security.md lists them.

use super::*;
use std::os::unix::process::CommandExt;

/// An unprivileged user (a uid from UID_MIN on, no home, no shell), removed when dropped.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn new(tag: &str) -> Self {
        let name = format!("ap-{tag}");
        // One left by a killed run is made again.
        let _ = Command::new("userdel").arg(&name).output();
        let made = Command::new("useradd")
            .args([
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                &name,
            ])
            .output()
            .unwrap();
        assert!(made.status.success(), "useradd {name}: {made:?}");
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        let (uid, gid) = (id("-u"), id("-g"));
        assert!(uid >= 1000, "an unprivileged uid: {uid}");
        TestUser { name, uid, gid }
    }

    /// `program` as this user, in a process group of its own (ended as one).
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.uid(self.uid)
            .gid(self.gid)
            .current_dir("/")
            .process_group(0)
            .stdin(Stdio::null());
        c
    }

    /// A perl script as this user, ended (its whole group) when the guard drops.
    fn perl(&self, script: &str, args: &[&str]) -> ProcessGroup {
        let child = self
            .command("perl")
            .arg("-e")
            .arg(script)
            .args(args)
            .spawn()
            .unwrap();
        ProcessGroup(child)
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// The processes of `uid`, by /proc/PID/status's effective uid.
fn processes_of(uid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read(e.path().join("status")).ok()?;
            let euid: u32 = appease_cgroup::status_value(&status, "Uid")?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (euid == uid).then_some(pid)
        })
        .collect()
}

root_test! {
    fn a_link_planted_where_appease_keeps_a_lock_is_never_followed_and_a_run_directory_a_user_owns_is_refused() {
        let user = TestUser::new("links");
        // The old lock directory anyone may write (/run/lock is 1777): the user plants a link
        // there to a file of root's.
        let victim = TempDir::new("link-victim");
        let target = victim.file("root-owned", "root's data\n");
        let planted = std::path::Path::new("/run/lock/appease");
        // Earlier versions kept their locks here: those files are appease's own.
        if planted.exists() {
            for e in std::fs::read_dir(planted).unwrap().flatten() {
                let _ = std::fs::remove_file(e.path());
            }
            let _ = std::fs::remove_dir(planted);
        }
        let ours = !planted.exists();
        if ours {
            let made = user.command("mkdir").arg(planted).output().unwrap();
            assert!(made.status.success(), "{made:?}");
        }
        let link = planted.join("appease.batch.lock");
        let _ = std::fs::remove_file(&link);
        let linked = user.command("ln").arg("-s").arg(&target).arg(&link).output().unwrap();
        let dir = TempDir::new("links");
        let cfg = dir.file("c.toml", &test_config());
        let mut daemon = Daemon::start(&dir.0, &cfg);
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "root's data\n",
            "the link's target is untouched (planted: {})",
            linked.status.success()
        );
        let lock = std::fs::symlink_metadata("/run/appease/groups/appease.batch.lock").unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(lock.is_file() && lock.uid() == 0 && lock.mode() & 0o777 == 0o600, "{lock:?}");
        let _ = std::fs::remove_file(&link);
        if ours {
            let _ = std::fs::remove_dir(planted);
        }
        // A run directory the user owns, and one that is a link: refused, the path named,
        // nothing written there.
        let theirs = TempDir::new("their-run");
        std::os::unix::fs::chown(&theirs.0, Some(user.uid), Some(user.gid)).unwrap();
        let out = Command::new(BIN)
            .args(["daemon", "--config"])
            .arg(&cfg)
            .env("APPEASE_RUN_DIR", &theirs.0)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "refused: {err}");
        assert!(err.contains(&theirs.0.display().to_string()) && err.contains(&format!("owned by uid {}", user.uid)), "{err}");
        assert_eq!(std::fs::read_dir(&theirs.0).unwrap().count(), 0, "nothing written in it");
        let link_dir = dir.0.join("run-link");
        std::os::unix::fs::symlink(&theirs.0, &link_dir).unwrap();
        let out = appease(&link_dir, &["restore"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("not a directory"), "{err}");
    }
}

root_test! {
    fn a_user_cannot_hold_appeases_locks_to_keep_it_from_starting_or_restoring() {
        let user = TestUser::new("locks");
        let dir = TempDir::new("user-locks");
        let cfg = dir.file("c.toml", &test_config());
        // Both locks exist (a daemon ran).
        let mut daemon = Daemon::start(&dir.0, &cfg);
        assert!(daemon.signal(libc::SIGTERM).success());
        // The user tries to take each lock as `flock -x` would: open, then lock.
        let hold = "open(my $f, '<', $ARGV[0]) or exit 3; flock($f, 2) or exit 4; print \"held\\n\"; sleep 30";
        for lock in [
            "/run/appease/groups/appease.batch.lock".to_string(),
            dir.0.join("daemon.lock").display().to_string(),
        ] {
            let out = user.command("perl").args(["-e", hold, &lock]).output().unwrap();
            assert_eq!(out.status.code(), Some(3), "{lock}: the user cannot even open it: {out:?}");
        }
        // So a daemon starts, and a restore runs, whatever the user does meanwhile.
        let mut daemon = Daemon::start(&dir.0, &cfg);
        assert!(daemon.signal(libc::SIGTERM).success());
        let out = appease(&dir.0, &["restore"]);
        assert!(out.status.success(), "{out:?}");
    }
}

root_test! {
    fn a_user_forking_socket_readers_runs_elevated_on_no_more_than_the_users_bound() {
        let user = TestUser::new("fork");
        let dir = TempDir::new("user-bound");
        // The default config: the bound is half a CPU for all of a user's threads.
        let cfg = dir.file("c.toml", "");
        let _root_soakers = Soakers::start(2);
        let daemon = Daemon::start(&dir.0, &cfg);
        // 16 processes, each reading a byte from its own socketpair every 20 ms and
        // spinning in between: each its own application with a budget of its own.
        let script = r#"
            use Socket; use Time::HiRes qw(time);
            for (1..16) {
                next if fork();
                socketpair(my $a, my $b, AF_UNIX, SOCK_STREAM, 0) or die;
                while (1) {
                    syswrite($a, "x"); sysread($b, my $buf, 1);
                    my $t = time + 0.02; 1 while time < $t;
                }
            }
            sleep 1000;
        "#;
        let _forks = user.perl(script, &[]);
        thread::sleep(Duration::from_secs(3));
        // Over 20 s: each of the user's processes sampled every 100 ms, its CPU counted as
        // elevated for the intervals it began at a negative nice.
        let read = |pid: u32| -> Option<(i32, u64)> {
            let nice = stat_of(&format!("/proc/{pid}/stat"))?.nice;
            let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
            Some((nice, text.split_whitespace().next()?.parse().ok()?))
        };
        let mut last: std::collections::HashMap<u32, (i32, u64)> = Default::default();
        let (mut elevated_ns, mut all_ns) = (0u64, 0u64);
        let secs = 20.0;
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < secs {
            for pid in processes_of(user.uid) {
                let Some(now) = read(pid) else { continue };
                if let Some(&(nice, cpu)) = last.get(&pid) {
                    let used = now.1.saturating_sub(cpu);
                    all_ns += used;
                    if nice < 0 {
                        elevated_ns += used;
                    }
                }
                last.insert(pid, now);
            }
            thread::sleep(Duration::from_millis(100));
        }
        let elapsed = start.elapsed().as_secs_f64();
        let (elevated, all) = (elevated_ns as f64 / 1e9 / elapsed, all_ns as f64 / 1e9 / elapsed);
        eprintln!(
            "the user's CPU: {all:.2} CPUs in all, {elevated:.3} CPUs at a negative nice (bound 0.5), over {elapsed:.1} s"
        );
        assert!(all > 1.0, "the user's 16 spinners ran: {all:.2} CPUs");
        assert!(elevated > 0.05, "elevated at all (the rule is measured): {elevated:.3}");
        assert!(
            elevated <= 0.6,
            "at most the user's bound (0.5 CPU) at a negative nice, plus a burst: {elevated:.3} CPUs; {}",
            daemon.log_text()
        );
    }
}

root_test! {
    fn a_user_unit_named_like_a_system_unit_and_a_process_renamed_to_a_rules_comm_match_nothing() {
        let user = TestUser::new("rules");
        let Ok(cg) = appease_cgroup::Cgroups::detect() else {
            panic!("needs a CPU cgroup hierarchy");
        };
        // A comm alone cannot name a role.
        let dir = TempDir::new("user-rules");
        let bad = dir.file("bad.toml", "[[role]]\napp = \"x\"\ncomm = \"e2e-role\"\nrank = 0\n");
        fails_saying(Command::new(BIN).args(["check-config"]).arg(&bad), "trust_comm");
        // A role for the system's unit, and one for root's processes of a name.
        let unit = "appease-e2e-svc.service";
        let cfg = dir.file(
            "c.toml",
            &format!(
                "{}\n[[role]]\napp = \"svc\"\nunit = \"{unit}\"\nrank = 0\n[[role]]\napp = \"named\"\ncomm = \"e2e-role\"\nuser = \"root\"\nrank = 0\n[batch]\nscan_ms = 200\n",
                test_elevation()
            ),
        );
        let system = format!("/system.slice/{unit}");
        let user_unit = format!(
            "/user.slice/user-{uid}.slice/user@{uid}.service/app.slice/{unit}",
            uid = user.uid
        );
        let _made = MadeGroups::new(&[&system, &user_unit]);
        let spin = "$0 = 'e2e-role'; open(my $c, '>', '/proc/self/comm'); print $c 'e2e-role'; close $c; 1 while 1";
        let in_system = ProcessGroup(Command::new("perl").args(["-e", spin]).process_group(0).spawn().unwrap());
        let theirs_in_unit = user.perl("1 while 1", &[]);
        let theirs_renamed = user.perl(spin, &[]);
        cg.move_process(in_system.0.id(), &system).unwrap();
        cg.move_process(theirs_in_unit.0.id(), &user_unit).unwrap();
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let nice = |pid: u32| stat_of(&format!("/proc/{pid}/stat")).map_or(99, |s| s.nice);
        assert!(
            wait_for(Duration::from_secs(5), || nice(in_system.0.id()) == -5).is_some(),
            "the system unit's process (root, named e2e-role) has its role: {}",
            daemon.log_text()
        );
        thread::sleep(Duration::from_secs(1));
        assert_eq!(nice(theirs_in_unit.0.id()), 0, "the user's unit with the system unit's name: no role");
        assert_eq!(nice(theirs_renamed.0.id()), 0, "the user's process renamed to the role's comm: no role");
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(nice(in_system.0.id()), 0, "put back");
        drop((in_system, theirs_in_unit, theirs_renamed));
    }
}

root_test! {
    fn a_process_with_an_odd_name_is_demoted_restored_and_shown_escaped() {
        let user = TestUser::new("names");
        let dir = TempDir::new("odd-names");
        let group = format!("appease-e2e-names{}", std::process::id());
        let cfg = dir.file("c.toml", &batch_config(&group));
        // Not UTF-8, a terminal escape (clear screen), a newline.
        let spin = r#"open(my $c, '>', '/proc/self/comm'); print $c "\xff\e[2J\nodd"; close $c; 1 while 1"#;
        let soaker = user.perl(spin, &[]);
        let pid = soaker.0.id();
        let home = cpu_cgroup(pid);
        let renamed = wait_for(Duration::from_secs(5), || {
            std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c == b"\xff\x1b[2J\nodd\n")
        });
        assert!(renamed.is_some(), "the kernel keeps the bytes");
        let mut daemon = Daemon::start(&dir.0, &cfg);
        let gpath = format!("/{group}");
        assert!(
            wait_for(Duration::from_secs(10), || in_idle_group(pid, &gpath)).is_some(),
            "demoted like any soaker: {}",
            daemon.log_text()
        );
        // The status is published about once a second: the next one lists it.
        let mut text = Vec::new();
        wait_for(Duration::from_secs(3), || {
            text = appease(&dir.0, &["status"]).stdout;
            text.windows(6).any(|w| w == b"x0aodd")
        });
        assert!(!text.contains(&0x1b) && !text.contains(&0xff), "no raw escape or byte in status");
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(r"\xff\x1b[2J\x0aodd"), "shown escaped: {text}\n{}", daemon.log_text());
        let json = appease(&dir.0, &["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert!(v.to_string().contains(r"\\xff\\x1b[2J\\x0aodd"), "escaped in the JSON: {v}");
        assert!(daemon.signal(libc::SIGTERM).success());
        assert_eq!(cpu_cgroup(pid), home, "restored: {}", daemon.full_log());
        let raw_in_log = std::fs::read(dir.0.read_dir().unwrap().flatten().find(|e| e.file_name().to_string_lossy().starts_with("daemon-")).unwrap().path()).unwrap();
        assert!(!raw_in_log.contains(&0x1b), "no raw escape in the daemon's log");
    }
}

root_test! {
    fn a_forged_journal_entry_or_a_journal_in_a_users_directory_is_refused_and_nothing_written() {
        let user = TestUser::new("journal");
        let dir = TempDir::new("forged");
        // A directory outside the CPU hierarchy that a group entry with `..` would name.
        let canary = TempDir::new("canary");
        let Ok(cg) = appease_cgroup::Cgroups::detect() else {
            panic!("needs a CPU cgroup hierarchy");
        };
        let up = "/..".repeat(cg.root().components().count());
        let forged = format!("{up}{}", canary.0.display());
        let run = dir.0.join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(
            run.join("journal.jsonl"),
            format!(
                "{{\"op\":\"group\",\"path\":{forged:?}}}\n{{\"op\":\"unit-idle\",\"unit\":\"../../etc/x.service\",\"orig\":100,\"transient\":true,\"dropin\":null}}\n"
            ),
        )
        .unwrap();
        let out = appease(&run, &["restore"]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(canary.0.exists(), "the directory the forged entry names is still there: {text}");
        assert!(!out.status.success() && text.contains("not a cgroup path"), "refused, said: {text}");
        // A run directory the user owns, with a journal in it: not read at all.
        let theirs = dir.0.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join("journal.jsonl"), format!("{{\"op\":\"group\",\"path\":{forged:?}}}\n")).unwrap();
        std::os::unix::fs::chown(&theirs, Some(user.uid), Some(user.gid)).unwrap();
        let out = appease(&theirs, &["restore"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("owned by uid {}", user.uid)), "{err}");
        assert!(canary.0.exists());
    }
}

root_test! {
    fn silent_clients_on_the_control_socket_do_not_keep_status_from_answering() {
        let user = TestUser::new("socket");
        let dir = TempDir::new("silent");
        let cfg = dir.file("c.toml", &format!("{}[control]\ngroup = \"{}\"\n", test_config(), user.name));
        let daemon = Daemon::start(&dir.0, &cfg);
        let sock = dir.0.join("control.sock");
        // The group's member connects and says nothing, three times over.
        let silent = "use IO::Socket::UNIX; my @c = map { IO::Socket::UNIX->new(Peer => $ARGV[0]) or exit 3 } 1..3; print \"connected\\n\"; sleep 20";
        let mut holders = user.perl(silent, &[&sock.display().to_string()]);
        let _ = &mut holders;
        thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let out = appease(&dir.0, &["status"]);
        assert!(out.status.success(), "{out:?}: {}", daemon.log_text());
        assert!(t.elapsed() < Duration::from_secs(2), "answered in {:?}", t.elapsed());
        assert!(holders.0.try_wait().unwrap().is_none(), "the silent clients were connected meanwhile");
    }
}

root_test! {
    fn a_directory_made_first_under_the_benchs_guessable_name_is_refused_and_left_as_it_was() {
        let user = TestUser::new("benchdir");
        // The bench's directory is /tmp/appease-bench-PID: the user makes one for each of
        // the next pids, with a file of theirs in it.
        let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let made: Vec<PathBuf> = (last + 1..last + 400)
            .map(|p| std::env::temp_dir().join(format!("appease-bench-{p}")))
            .filter(|d| !d.exists())
            .collect();
        // One mkdir for all (a process each would use up the pids made for).
        let script = "mkdir \"$@\" && for d in \"$@\"; do echo theirs > \"$d/mine\"; done";
        let out = user.command("sh").args(["-c", script, "sh"]).args(&made).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        // The appease mode writes the daemon's config in the bench's directory.
        let bench = Command::new(BIN)
            .args(["bench", "synthetic", "--quick", "--modes", "appease"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let dir = std::env::temp_dir().join(format!("appease-bench-{}", bench.id()));
        let out = bench.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let theirs = made.contains(&dir);
        let entries = std::fs::read_dir(&dir).map_or(0, |d| d.count());
        let kept = std::fs::read_to_string(dir.join("mine")).unwrap_or_default();
        for d in &made {
            let _ = std::fs::remove_dir_all(d);
        }
        assert!(theirs, "the bench's pid fell outside the {} made", made.len());
        assert!(!out.status.success(), "refused: {err}");
        assert!(
            err.contains(&format!("the bench's directory {}", dir.display()))
                && err.contains(&format!("owned by uid {}", user.uid)),
            "{err}"
        );
        // Nothing written in it, nothing removed from it (the guardian included).
        assert_eq!((entries, kept.as_str()), (1, "theirs\n"));
    }
}
