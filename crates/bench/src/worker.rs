//! The processes the bench starts: a synthetic server and CPU soakers. They run as
//! `appease bench-worker …` so that each is a real, separate process the scheduler
//! (and appease) sees as such.

use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// CPU time this thread has used.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Another server a server calls while it handles a request, and how many times per
/// request on average (fractions accumulate: 3.5 is 4, 3, 4, 3, ...).
#[derive(Clone, Debug)]
pub struct Call {
    pub unix: std::path::PathBuf,
    pub per_request: f64,
}

impl std::str::FromStr for Call {
    type Err = String;
    /// `PATH=TIMES`, e.g. `/tmp/b.sock=3.5`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (path, times) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("{s:?}: expected SOCKET=TIMES"))?;
        let per_request: f64 = times
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| format!("{s:?}: TIMES must be a number >= 0"))?;
        Ok(Call {
            unix: path.into(),
            per_request,
        })
    }
}

/// A single-threaded server: per 1-byte request it burns `cpu` of CPU time and answers
/// with the CPU time the request used and the time it lost on CPU meanwhile (see
/// [`ANSWER_LEN`]). With `calls`, it burns half, calls those servers in turn (waiting for
/// each answer), burns the other half, and counts their CPU and lost time in its answer: the AIX case study's cooperating processes. Listens on
/// TCP loopback `port` (0: a free one; it prints the port) or on the UNIX socket `unix` (printing the path),
/// and serves one connection at a time until signalled.
pub fn serve(
    cpu: Duration,
    unix: Option<&std::path::Path>,
    port: u16,
    name: &str,
    calls: &[Call],
) -> io::Result<()> {
    set_name(&std::ffi::CString::new(name).map_err(io::Error::other)?);
    let mut callees = calls
        .iter()
        .map(|c| {
            Ok((
                std::os::unix::net::UnixStream::connect(&c.unix)?,
                c.per_request,
                0.0,
            ))
        })
        .collect::<io::Result<Vec<_>>>()?;
    match unix {
        Some(path) => {
            let listener = std::os::unix::net::UnixListener::bind(path)?;
            println!("{}", path.display());
            io::stdout().flush()?;
            for conn in listener.incoming() {
                answer(conn?, cpu, &mut callees);
            }
        }
        None => {
            let listener = TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                io::Error::new(e.kind(), format!("listening on 127.0.0.1:{port}: {e}"))
            })?;
            println!("{}", listener.local_addr()?.port());
            io::stdout().flush()?;
            for conn in listener.incoming() {
                let s = conn?;
                s.set_nodelay(true)?;
                answer(s, cpu, &mut callees);
            }
        }
    }
    Ok(())
}

/// Burns `cpu` of this thread's CPU time; returns the wall time it took beyond that CPU
/// time and beyond its waits on the run queue: time the thread held a CPU the kernel did
/// not count as its own (interrupts, a hypervisor running another guest on that CPU).
/// No scheduling policy of this host controls it; the client tells it apart with it.
/// Without the run-queue waits nothing is lost: a wait is never taken for a loss.
fn spin(cpu: Duration, delays: &mut RunDelay) -> Duration {
    let (wall0, waited0) = (std::time::Instant::now(), delays.read());
    let start = thread_cpu();
    let end = start + cpu;
    let mut now = start;
    while now < end {
        std::hint::spin_loop();
        now = thread_cpu();
    }
    let (Some(waited0), Some(waited1)) = (waited0, delays.read()) else {
        return Duration::ZERO;
    };
    wall0
        .elapsed()
        .saturating_sub(now - start)
        .saturating_sub(waited1.saturating_sub(waited0))
}

/// This thread's time waiting on a run queue so far (the second field of
/// /proc/thread-self/schedstat), read through one open file.
struct RunDelay(Option<std::fs::File>);

impl RunDelay {
    fn open() -> Self {
        RunDelay(std::fs::File::open("/proc/thread-self/schedstat").ok())
    }

    /// None when the kernel does not say (no file, or sched_info off).
    fn read(&mut self) -> Option<Duration> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.0.as_ref()?.read_at(&mut buf, 0).ok()?;
        run_delay_ns(&buf[..n]).map(Duration::from_nanos)
    }
}

/// The run-queue wait in a schedstat line ("on-CPU ns, waiting ns, timeslices"). None
/// when unreadable, or when the on-CPU time is 0: a kernel with sched_info off prints
/// "0 0 0" even for a thread that is running.
fn run_delay_ns(schedstat: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(schedstat).ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    let (on_cpu, waited) = (fields.next()??, fields.next()??);
    (on_cpu > 0).then_some(waited)
}

/// Callees: (connection, calls per request, calls owed so far).
type Callees = Vec<(std::os::unix::net::UnixStream, f64, f64)>;

/// The answer to a request: the CPU time it used and the time lost on CPU while it
/// computed (see [`spin`]), callees' included, u64 ns each, little endian.
pub const ANSWER_LEN: usize = 16;

fn answer(mut s: impl Read + Write, cpu: Duration, callees: &mut Callees) {
    let mut b = [0u8; 1];
    let mut delays = RunDelay::open();
    while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
        let start = thread_cpu();
        let mut lost = spin(cpu / 2, &mut delays).as_nanos() as u64;
        let mut theirs = 0u64;
        for (conn, per, owed) in callees.iter_mut() {
            *owed += *per;
            while *owed >= 1.0 {
                *owed -= 1.0;
                let mut got = [0u8; ANSWER_LEN];
                if conn
                    .write_all(b"r")
                    .and_then(|_| conn.read_exact(&mut got))
                    .is_err()
                {
                    return; // a callee is gone: the run is ending
                }
                let (used, their_lost) = got.split_at(8);
                theirs += u64::from_le_bytes(used.try_into().expect("8 bytes"));
                lost += u64::from_le_bytes(their_lost.try_into().expect("8 bytes"));
            }
        }
        lost += spin(cpu - cpu / 2, &mut delays).as_nanos() as u64;
        let used = (thread_cpu() - start).as_nanos() as u64 + theirs;
        let mut reply = [0u8; ANSWER_LEN];
        reply[..8].copy_from_slice(&used.to_le_bytes());
        reply[8..].copy_from_slice(&lost.to_le_bytes());
        if s.write_all(&reply).is_err() {
            break;
        }
    }
}

/// Spins, counting units of work (1,000 loop iterations each), until SIGTERM; then
/// prints the count and the CPU time it used (ns).
pub fn soak(name: &str, threads: usize) -> io::Result<()> {
    let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
    set_name(&name);
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let spin = |stop: &AtomicBool| {
        let mut units: u64 = 0;
        let mut x: u64 = 1;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..1000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
            }
            std::hint::black_box(x);
            units += 1;
        }
        units
    };
    let units: u64 = std::thread::scope(|s| {
        let others: Vec<_> = (1..threads.max(1))
            .map(|_| s.spawn(|| spin(&stop)))
            .collect();
        spin(&stop)
            + others
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .sum::<u64>()
    });
    report(format_args!("{units} {}", cpu_used_ns()));
    Ok(())
}

/// A worker's last line, for the bench that reads it. A bench killed outright reads
/// nothing (its guardian ends the worker): a closed pipe is no error of the worker's.
fn report(line: std::fmt::Arguments) {
    use std::io::Write;
    let _reader_gone = writeln!(std::io::stdout(), "{line}");
}

/// CPU time (user and system) of this process and of every child it reaped, ns: what
/// the batch actually got, whatever it made of it.
fn cpu_used_ns() -> u64 {
    let ns = |who| {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
        tv(u.ru_utime) + tv(u.ru_stime)
    };
    ns(libc::RUSAGE_SELF) + ns(libc::RUSAGE_CHILDREN)
}

/// The process name (comm) that ps, top and `appease status` show.
fn set_name(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// C sources the compile load builds: enough functions that one file keeps a compiler
/// busy for a few hundred ms at -O2, like a real project's translation units.
fn write_sources(dir: &std::path::Path, files: usize) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let objs: Vec<String> = (0..files).map(|i| format!("f{i}.o")).collect();
    std::fs::write(
        dir.join("Makefile"),
        format!(
            "all: {objs}\n%.o: %.c\n\t@gcc -O2 -c $< -o $@ && echo built\n",
            objs = objs.join(" ")
        ),
    )?;
    for i in 0..files {
        let mut c = String::from("#include <stdint.h>\n");
        for f in 0..FUNCTIONS_PER_FILE {
            c += &format!(
                "uint64_t f{i}_{f}(uint64_t x, const uint64_t *t, int n) {{\n\
                 \tfor (int k = 0; k < n; k++) {{\n\
                 \t\tswitch ((x ^ t[k]) & 7) {{\n\
                 \t\tcase 0: x = x * {a}u + t[k]; break;\n\
                 \t\tcase 1: x ^= x >> {s}; break;\n\
                 \t\tcase 2: x += t[(k + {f}) % n] << 3; break;\n\
                 \t\tcase 3: x = (x << 7) | (x >> 57); break;\n\
                 \t\tdefault: x -= t[k] * {b}u;\n\
                 \t\t}}\n\t}}\n\treturn x;\n}}\n",
                a = 2 * f + 3,
                b = 5 * f + 1,
                s = f % 31 + 1,
            );
        }
        std::fs::write(dir.join(format!("f{i}.c")), c)?;
    }
    Ok(())
}

/// Kills every process below this one and reaps them (make's own SIGTERM handling ends
/// its shells, not the gcc under them). As subreaper, orphans stay below us until then.
fn end_tree() {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        // SAFETY: reaping our own children, without blocking.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        let left = crate::descendants(&[std::process::id()]);
        if left.is_empty() {
            return;
        }
        for pid in left {
            // SAFETY: processes this worker started (directly or not).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A worker whose load is a tree of processes: named `name`, set to end on SIGTERM (the
/// flag returned), and the subreaper of its tree: orphans below it (a gcc whose make is
/// gone) become its children, not init's, so that `end_tree` can find, end and reap them,
/// and their CPU time counts in its own.
fn tree_worker(name: &std::ffi::CStr) -> io::Result<Arc<AtomicBool>> {
    set_name(name);
    // SAFETY: prctl with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    Ok(stop)
}

/// Waits for the bench's line on stdin: it has set the worker's priority or group by
/// then, which every process the worker starts inherits.
fn wait_for_go() -> io::Result<()> {
    let mut go = String::new();
    io::stdin().read_line(&mut go)?;
    Ok(())
}

const FUNCTIONS_PER_FILE: usize = 60;
/// Files in the compile load's tree.
pub const FILES: usize = 64;

/// A real parallel C compile as batch load: generates a source tree in `dir` and runs
/// `make -B -j JOBS` over it again and again until SIGTERM; then prints how many files
/// it compiled and the CPU time the build used (ns). It starts compiling only after a
/// line on stdin, so the bench can first set its priority or group, which every make and
/// gcc it forks then inherits.
pub fn compile(dir: &std::path::Path, jobs: usize) -> io::Result<()> {
    use std::io::BufRead;
    let stop = tree_worker(c"bench-compile")?;
    write_sources(dir, FILES)?;
    // gcc's temporary files go in the tree, which the bench removes: a compiler ended
    // mid-file leaves its `.s` behind, and in /tmp they piled up run after run.
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    wait_for_go()?;
    let mut built: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        // In our process group: a Ctrl-C at the terminal reaches make and gcc too.
        let mut make = std::process::Command::new("make")
            .args(["-s", "-B", "-j", &jobs.to_string(), "-C"])
            .arg(dir)
            .env("TMPDIR", &tmp)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let out = make.stdout.take().expect("piped");
        let mut signalled = false;
        for line in io::BufReader::new(out).lines() {
            if line? == "built" {
                built += 1;
            }
            if stop.load(Ordering::Relaxed) && !signalled {
                end_tree();
                signalled = true;
            }
        }
        if signalled {
            break; // make was reaped with the rest
        }
        let status = make.wait()?;
        if !status.success() && !stop.load(Ordering::Relaxed) {
            return Err(io::Error::other(format!("make failed: {status}")));
        }
    }
    report(format_args!("{built} {}", cpu_used_ns()));
    Ok(())
}

/// One CPU-heavy child of the script load: `units` units of work (as the soaker's), then
/// it exits.
pub fn burn(units: u64) {
    set_name(c"bench-burn");
    let mut x: u64 = 1;
    for _ in 0..units {
        for _ in 0..1000 {
            // Opaque at each step: the compiler would fold a thousand steps of this
            // recurrence into one.
            x = std::hint::black_box(x)
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
    }
    std::hint::black_box(x);
}

/// Units of work per child of the script load: about a quarter of a second of CPU here.
pub const BURN_UNITS: u64 = 250_000;

/// Batch work as scripts drive it: a shell script that keeps an idle helper (a `sleep`,
/// as a watchdog or a logger would be) and runs `jobs` CPU-heavy children at a time,
/// round after round, waiting for each round. Starts after a line on stdin (as `compile`);
/// on SIGTERM prints how many children finished and the CPU time the tree used (ns).
pub fn script(appease: &std::path::Path, jobs: usize) -> io::Result<()> {
    use std::io::BufRead;
    let stop = tree_worker(c"bench-script")?;
    wait_for_go()?;
    let text = format!(
        "sleep 2147483 &\n\
         while :; do\n\
         \tpids=; i=0\n\
         \twhile [ $i -lt {jobs} ]; do\n\
         \t\t\"$APPEASE\" bench-worker burn --units {BURN_UNITS} & pids=\"$pids $!\"; i=$((i+1))\n\
         \tdone\n\
         \twait $pids\n\
         \techo round\n\
         done\n"
    );
    let mut sh = std::process::Command::new("sh")
        .args(["-c", &text])
        .env("APPEASE", appease)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let out = sh.stdout.take().expect("piped");
    let mut rounds: u64 = 0;
    for line in io::BufReader::new(out).lines() {
        if line? == "round" {
            rounds += 1;
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    end_tree();
    report(format_args!("{} {}", rounds * jobs as u64, cpu_used_ns()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_a_socket_and_how_often() {
        let c: Call = "/tmp/x=y/b.sock=3.5".parse().unwrap();
        assert_eq!(c.unix, std::path::Path::new("/tmp/x=y/b.sock"));
        assert_eq!(c.per_request, 3.5);
        assert!("b.sock".parse::<Call>().is_err());
        assert!("b.sock=-1".parse::<Call>().is_err());
        assert!("b.sock=lots".parse::<Call>().is_err());
    }

    #[test]
    fn the_run_queue_wait_is_the_second_schedstat_field() {
        assert_eq!(run_delay_ns(b"79047 61742 2\n"), Some(61742));
        assert_eq!(run_delay_ns(b""), None);
        assert_eq!(run_delay_ns(b"79047"), None);
        assert_eq!(run_delay_ns(b"1 x 2"), None);
        assert_eq!(run_delay_ns(b"0 0 0\n"), None, "sched_info off");
    }

    /// Pins the calling thread to CPU 0.
    /// Pins the calling thread to `cpu`.
    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t with one CPU set, for the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                0
            );
        }
    }

    /// The first CPU this thread may run on (a cpuset may leave out CPU 0).
    fn first_allowed_cpu() -> usize {
        // SAFETY: sched_getaffinity fills the zeroed set it is given.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &set))
                .expect("a CPU to run on")
        }
    }

    #[test]
    fn without_the_run_queue_waits_nothing_counts_as_lost() {
        // Waits the kernel does not report could otherwise be taken for losses.
        assert_eq!(
            spin(Duration::from_millis(5), &mut RunDelay(None)),
            Duration::ZERO
        );
    }

    #[test]
    fn time_waiting_behind_another_thread_is_not_time_lost_on_cpu() {
        // A spinner shares one CPU with the measured spin, which then waits on the run
        // queue about as long as it runs: that wait is the scheduler's, not lost.
        let cpu = first_allowed_cpu();
        let stop = Arc::new(AtomicBool::new(false));
        let rival = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_to(cpu);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        pin_to(cpu);
        let mut delays = RunDelay::open();
        let before = delays.read().expect("the run-queue wait is readable");
        let wall = std::time::Instant::now();
        let lost = spin(Duration::from_millis(30), &mut delays);
        let wall = wall.elapsed();
        let waited = delays.read().expect("readable").saturating_sub(before);
        stop.store(true, Ordering::Relaxed);
        rival.join().unwrap();
        assert!(
            waited >= Duration::from_millis(5),
            "shared a CPU: waited {waited:?} in {wall:?}"
        );
        assert!(
            lost < waited / 4,
            "lost {lost:?}, waited {waited:?}, in {wall:?}"
        );
    }
}
