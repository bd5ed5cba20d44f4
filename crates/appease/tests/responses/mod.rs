//! Responses are not requests: what a process reads on a connection it made (a dump
//! reading a database, a download, a load generator) elevates nothing, and a tree of such
//! readers that soaks CPU is batch as a whole; a server that calls another keeps its
//! elevation by what it accepted.

use super::*;

/// The batch tests' config (trees judged every 200 ms, demoted after 2 s, into `group`,
/// feeders into a group of the least weight), and every request elevates (a ladder of one
/// step from no load), fading 50 ms per level.
fn always_elevating_config(group: &str) -> String {
    format!(
        "{}feeders = \"least-weight\"\n[elevation]\ntick_ms = 10\n{}",
        batch_config(group),
        ladder(&[(0.0, -8, -4, 50)])
    )
}

/// A forking TCP server: each connection's child reads a request line and answers with
/// 8 MB of varied text. Prints its port.
const STREAMING_SERVER: &str = r#"
use IO::Socket::INET;
$SIG{CHLD} = 'IGNORE';
my $l = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1', LocalPort => 0, ReuseAddr => 1) or die;
$| = 1;
print $l->sockport(), "\n";
my $chunk = join('', map { chr(32 + ($_ * 7919 % 95)) } 0 .. 65535);
while (my $c = $l->accept()) {
    if (fork() == 0) {
        <$c>;
        syswrite($c, $chunk) for 1 .. 128;
        exit 0;
    }
    close $c;
}
"#;

/// The status's threads (elevated or sunk) whose name is one of `comms`.
fn threads_listed(st: &serde_json::Value, comms: &[&str]) -> Vec<String> {
    st["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| comms.contains(&t["comm"].as_str().unwrap_or("")))
        .map(|t| t.to_string())
        .collect()
}

root_test! {
    fn a_download_piped_into_a_compressor_is_never_elevated_and_its_loop_is_demoted_as_one_tree() {
        let dir = TempDir::new("responses");
        let group = format!("appease-e2e-resp-{}", std::process::id());
        let cfg = dir.file("resp.toml", &always_elevating_config(&group));
        let (server, port) = perl_server(STREAMING_SERVER);
        let daemon = Daemon::start(&dir.0, &cfg);
        // The nightly job's shape: a loop that downloads (a request line out, 8 MB of
        // responses in) and compresses, each download a few tenths of a second. No terminal:
        // a script, as cron or CI runs it.
        let script = format!(
            "while :; do exec 3<>/dev/tcp/127.0.0.1/{port}; echo get >&3; \
             cat <&3 | gzip -6 > /dev/null; exec 3<&-; done"
        );
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &script]).stdout(Stdio::null());
        let job = Soakers(vec![own_session(&mut cmd).spawn().unwrap()]);
        let loop_pid = job.0[0].id();

        // Sampled while the job runs: its readers are never elevated. It feeds on a
        // server's responses: its group is the feeders', of the least weight, not idle.
        let feeders = format!("/{group}-feeders");
        let mut elevated = Vec::new();
        let demoted = wait_for(Duration::from_secs(12), || {
            let st = daemon.status_json();
            elevated.extend(threads_listed(&st, &["cat", "gzip", "bash"]));
            in_idle_group(loop_pid, &feeders)
        });
        let st = daemon.status_json();
        assert!(
            demoted.is_some(),
            "the download loop was demoted as a tree: {}\n{st}",
            daemon.log_text()
        );
        eprintln!("download loop demoted after {demoted:?} (after_ms = 2000)");
        let cg = appease_cgroup::Cgroups::detect().unwrap();
        let least = match cg.version() {
            appease_cgroup::Version::V1 => "2",
            appease_cgroup::Version::V2 => "1",
        };
        assert_eq!(
            (cg.idle(&feeders).ok(), cg.weight_raw(&feeders).ok()),
            (Some(false), Some(least.to_string())),
            "the feeders' group: not idle, of the least weight"
        );
        // The status is published once a second.
        let mut roots: Vec<u64> = Vec::new();
        let listed = wait_for(Duration::from_secs(3), || {
            roots = daemon.status_json()["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["tree"].as_u64())
                .collect();
            roots.contains(&u64::from(loop_pid))
        });
        assert!(
            listed.is_some(),
            "the loop is the tree's root, not one of its short-lived children: {roots:?}"
        );
        // Its children, born in the group, stay there; the readers are still not elevated.
        thread::sleep(Duration::from_millis(600));
        let st = daemon.status_json();
        elevated.extend(threads_listed(&st, &["cat", "gzip", "bash"]));
        let kids = children_of(loop_pid);
        assert!(
            kids.iter()
                .all(|&k| in_idle_group(k, &feeders) || cpu_cgroup(k).is_none()),
            "the loop's children are in the feeders' group"
        );
        let why = st["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["pid"].as_u64() == Some(u64::from(loop_pid)))
            .map(|p| p["why"].to_string());
        assert!(
            why.as_ref().is_some_and(|w| w.contains("reads responses")),
            "the status says why: {why:?}"
        );
        assert!(
            elevated.is_empty(),
            "a reader of responses was elevated: {elevated:?}"
        );
        assert!(
            st["probe"]["response_reads"].as_u64().unwrap_or(0) > 0,
            "the downloads' reads were seen as responses: {}",
            st["probe"]
        );
        // The job's whole session ends (the loop, and the download and compressor it was
        // running), then the daemon: every process it moved or that was born in its group is
        // gone or back, and the group with it.
        // SAFETY: the loop leads a session and process group of its own, started by this test.
        unsafe { libc::kill(-(loop_pid as i32), libc::SIGKILL) };
        let kids_gone = wait_for(Duration::from_secs(5), || {
            kids.iter()
                .all(|&k| !std::path::Path::new(&format!("/proc/{k}")).exists())
        });
        drop((job, server, daemon));
        assert!(kids_gone.is_some(), "the job's processes ended");
        assert!(
            !cg.exists(&feeders) && !cg.exists(&format!("/{group}")),
            "the batch groups are removed at exit"
        );
    }
}

/// A TCP server thread answering each one-byte request after `cpu` of work.
fn backend(cpu: Duration) -> (std::net::SocketAddr, u32, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 1];
        while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
            spin_cpu(cpu);
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    (addr, rx.recv().unwrap(), h)
}

root_test! {
    fn a_server_calling_another_stays_elevated_by_what_it_accepted_and_its_load_generator_gets_nothing() {
        let dir = TempDir::new("proxy");
        let group = format!("appease-e2e-proxy-{}", std::process::id());
        let cfg = dir.file("proxy.toml", &always_elevating_config(&group));
        let daemon = Daemon::start(&dir.0, &cfg);
        // A front server that, for each request, asks a backend over a connection of its
        // own (a web server calling its database) and answers; a load generator driving it.
        let (back_addr, back_tid, back) = backend(Duration::from_micros(300));
        let front_l = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front_l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let front = thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut up = TcpStream::connect(back_addr).unwrap();
            up.set_nodelay(true).unwrap();
            let (mut s, _) = front_l.accept().unwrap();
            let mut b = [0u8; 1];
            while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
                if up.write_all(&b).is_err() || up.read_exact(&mut b).is_err() {
                    break;
                }
                if s.write_all(&b).is_err() {
                    break;
                }
            }
        });
        let front_tid = rx.recv().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let st = stop.clone();
        let generator = thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut c = TcpStream::connect(front_addr).unwrap();
            c.set_nodelay(true).unwrap();
            let mut b = [0u8; 1];
            while !st.load(Ordering::Relaxed) {
                if c.write_all(b"r").is_err() || c.read_exact(&mut b).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(5));
            }
        });
        let gen_tid = rx.recv().unwrap();

        let both = wait_for(Duration::from_secs(3), || {
            nice_of(front_tid) == -4 && nice_of(back_tid) == -4
        });
        // For 2 s: the front and the backend stay elevated, the generator never is.
        let (mut front_low, mut gen_high, mut samples) = (0, 0, 0);
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            samples += 1;
            front_low += usize::from(nice_of(front_tid) != -4);
            gen_high += usize::from(nice_of(gen_tid) != 0);
            thread::sleep(Duration::from_millis(20));
        }
        let log = daemon.log_text();
        drop(daemon);
        let after_exit = [front_tid, back_tid, gen_tid].map(nice_of);
        stop.store(true, Ordering::Relaxed);
        let _ = generator.join();
        let _ = front.join();
        let _ = back.join();
        assert!(
            both.is_some(),
            "the front server and its backend are elevated by their requests\n{log}"
        );
        assert_eq!(
            front_low, 0,
            "the front server kept its elevation while it also read its backend's responses ({samples} samples)"
        );
        assert_eq!(
            gen_high, 0,
            "the load generator, which reads only responses, was elevated in {gen_high} of {samples} samples"
        );
        assert_eq!(after_exit, [0, 0, 0], "put back at exit");
    }
}

root_test! {
    fn bench_fetch_quick_runs_a_dump_loop_beside_postgresql_in_every_mode_and_cleans_up() {
        // The appease mode fails unless the daemon demotes the dump's loop within 30 s.
        let v = bench_json(&[
            "fetch", "--quick", "--seconds", "3", "--server", "db", "--job", "dump",
        ]);
        assert_eq!(v["scenario"], "fetch");
        let case = &v["cases"][0];
        assert_eq!(case["server"], "db");
        assert_eq!(case["job"], "dump");
        let modes = case["modes"].as_array().unwrap();
        let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["unloaded", "unmanaged", "batch-cgroup-idle", "appease"]
        );
        for m in modes {
            assert!(m["p99_ms"].as_f64().unwrap() > 0.0, "{m}");
            if m["mode"] != "unloaded" {
                assert!(
                    m["jobs_per_min"].as_f64().unwrap() > 0.0,
                    "the dump loop completed dumps: {m}"
                );
            }
        }
        assert_eq!(modes[2]["p99_vs_by_hand"].as_f64(), Some(1.0));
        assert_eq!(bench_postgres_left(), Vec::<String>::new());
        let loops_left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains("pg_dump -h") && c.contains("appease-bench-fetch-"))
            .collect();
        assert_eq!(loops_left, Vec::<String>::new());
    }
}
