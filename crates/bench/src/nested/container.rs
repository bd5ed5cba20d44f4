//! The container shape: a Docker container that runs a server and a build together
//! (`make -j` with gcc, in a loop), beside the measured server on the host. The container
//! shares the host's network and PID namespaces, so the bench reaches its server on
//! loopback and knows the build's host PID; its group is the engine's (`/docker/ID`, the
//! cgroupfs driver), which meets the host's `system.slice` at the root.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use super::Groups;
use crate::client;
use crate::docker::{Container, Engine};

/// The container's own server: 1 ms of CPU per request, 20 requests/s from the bench,
/// enough for the daemon to see it serve.
const OWN_CPU_MS: &str = "1";
const OWN_RATE: f64 = 20.0;

/// A running container of the shape, removed when dropped.
pub(super) struct Running<'e> {
    engine: &'e Engine,
    pub(super) container: Container,
    /// The build's host PID: a shell that waits for the go, then becomes the build.
    pub(super) build: u32,
    port: u16,
    go: std::path::PathBuf,
}

/// Starts the container: its server at once, the build (`jobs` wide, none for 0) when
/// told to go. `work` is mounted as `/work` (the build's sources and the handshake files);
/// `limited` gives it a CPU quota of 1.9 CPUs.
pub(super) fn start<'e>(
    engine: &'e Engine,
    appease: &Path,
    work: &Path,
    jobs: usize,
    limited: bool,
) -> Result<Running<'e>> {
    let bin = appease.canonicalize()?;
    let mount_bin = format!("{}:/appease:ro", bin.display());
    let mount_work = format!("{}:/work", work.display());
    let mut opts = vec![
        "--network=host",
        "--pid=host",
        "-v",
        &mount_bin,
        "-v",
        &mount_work,
    ];
    if limited {
        opts.push("--cpus=1.9");
    }
    let build = if jobs == 0 {
        String::from("echo 0 > /work/build.pid")
    } else {
        format!(
            "(while [ ! -e /work/go ]; do sleep 0.05; done; \
             exec /appease bench-worker compile --dir /work/src --jobs {jobs} < /work/go) & \
             echo $! > /work/build.pid"
        )
    };
    let script = format!(
        "/appease bench-worker server --cpu-ms {OWN_CPU_MS} --port 0 > /work/port & {build}; wait"
    );
    let container = engine.run(&opts, &["/bin/sh", "-c", &script])?;
    let running = |file: &str| -> Result<String> {
        let path = work.join(file);
        crate::wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n'))
        })
        .with_context(|| format!("the container did not write /work/{file} within 20 s"))?;
        Ok(std::fs::read_to_string(&path)?.trim().to_string())
    };
    // Removed on every way out from here.
    let mut guard = Running {
        engine,
        container,
        build: 0,
        port: 0,
        go: work.join("go"),
    };
    guard.port = running("port")?
        .parse()
        .context("the container's server port")?;
    guard.build = running("build.pid")?.parse().context("the build's PID")?;
    Ok(guard)
}

impl Running<'_> {
    /// Starts the build.
    pub(super) fn go(&self) -> Result<()> {
        std::fs::write(&self.go, "go\n").context("starting the container's build")
    }

    /// Load on the container's own server until `SideLoad::finish` (or its drop).
    /// Its client runs in the shape's `client.service`, as the host's server's does.
    pub(super) fn serve(&self, g: &Groups) -> SideLoad {
        let target = client::Target::Tcp(([127, 0, 0, 1], self.port).into());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = super::spawn_client(g, move || {
            client::open_loop(
                &target,
                &client::Protocol::Synthetic,
                client::Arrivals::Fixed,
                OWN_RATE,
                Duration::from_secs(3600),
                Duration::ZERO,
                &flag,
            )
        });
        SideLoad {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.engine.remove(&self.container) {
            eprintln!("warning: removing container {}: {e:#}", self.container.id);
        }
    }
}

/// The load on the container's own server, stopped when finished or dropped.
pub(super) struct SideLoad {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<client::ClientResult>>>,
}

impl SideLoad {
    /// Stops the load and says whether the container's server answered.
    pub(super) fn finish(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let handle = self.handle.take().expect("joined once");
        let r = handle
            .join()
            .map_err(|_| anyhow::anyhow!("the container's client panicked"))??;
        if r.answered == 0 {
            anyhow::bail!("the container's own server answered no request");
        }
        Ok(())
    }
}

impl Drop for SideLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _result_unused_on_error_path = h.join();
        }
    }
}
