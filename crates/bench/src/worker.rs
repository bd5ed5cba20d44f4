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

/// A single-threaded server: per 1-byte request it burns `cpu` of CPU time and answers
/// with the CPU time it used (u64 ns, little endian). Listens on TCP loopback (printing
/// its port) or on the UNIX socket `unix` (printing the path), and serves one connection
/// at a time until signalled.
pub fn serve(cpu: Duration, unix: Option<&std::path::Path>) -> io::Result<()> {
    set_name(c"bench-server");
    match unix {
        Some(path) => {
            let listener = std::os::unix::net::UnixListener::bind(path)?;
            println!("{}", path.display());
            io::stdout().flush()?;
            for conn in listener.incoming() {
                answer(conn?, cpu);
            }
        }
        None => {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            println!("{}", listener.local_addr()?.port());
            io::stdout().flush()?;
            for conn in listener.incoming() {
                let s = conn?;
                s.set_nodelay(true)?;
                answer(s, cpu);
            }
        }
    }
    Ok(())
}

fn answer(mut s: impl Read + Write, cpu: Duration) {
    let mut b = [0u8; 1];
    while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
        let start = thread_cpu();
        let end = start + cpu;
        while thread_cpu() < end {
            std::hint::spin_loop();
        }
        let used = (thread_cpu() - start).as_nanos() as u64;
        if s.write_all(&used.to_le_bytes()).is_err() {
            break;
        }
    }
}

/// Spins, counting units of work (1,000 loop iterations each), until SIGTERM; then
/// prints the count.
pub fn soak(name: &str) -> io::Result<()> {
    let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
    set_name(&name);
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
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
    println!("{units}");
    Ok(())
}

/// The process name (comm) that ps, top and `appease status` show.
fn set_name(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}
