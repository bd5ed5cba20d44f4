//! A Docker engine of the bench's own, for batch work in real containers: Debian's
//! `dockerd` with a private data root and socket, no bridge and no iptables rules, and
//! containers with no network (nothing leaves loopback). Its one image is made here, with
//! no registry: an empty root into which the host's `/usr` (Debian's packages) is mounted
//! read-only. Dropping the engine removes every container, stops `dockerd` and removes the
//! `docker` cgroups it made, so nothing is left for the next test (the cgroup v2 switch
//! refuses while any v1 `cpu` group exists).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The image every container runs: the host's `/usr`, read-only.
pub const IMAGE: &str = "appease-host-usr:1";

/// Where the cgroupfs driver puts containers, below every hierarchy's root.
pub const PARENT: &str = "docker";

pub struct Engine {
    dockerd: Child,
    dir: PathBuf,
    host: String,
    /// `PARENT` groups that existed before the engine started (another engine's): kept.
    existed: Vec<PathBuf>,
}

/// One running container: its id and the host PID of its first process.
#[derive(Clone, Debug)]
pub struct Container {
    pub id: String,
    pub pid: u32,
}

impl Container {
    /// Its group in the CPU hierarchy, as `/proc/PID/cgroup` names it.
    pub fn group(&self) -> String {
        format!("/{PARENT}/{}", self.id)
    }
}

impl Engine {
    /// Starts `dockerd` (cgroupfs driver) with everything of its own below `dir`.
    pub fn start(dir: &Path) -> Result<Engine> {
        for program in ["dockerd", "docker", "tar"] {
            if !crate::on_path(program) {
                bail!("Docker is not installed ({program} is missing): apt-get install docker.io");
            }
        }
        // Root's own (dockerd writes its state there), never through a link.
        let dir = &appease_actuator::private::private_dir(dir)
            .with_context(|| format!("the engine's directory {}", dir.display()))?;
        let existed = parent_groups();
        let sock = dir.join("docker.sock");
        let log = std::fs::File::create(dir.join("dockerd.log"))?;
        let dockerd = Command::new("dockerd")
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
            .args(["--exec-opt", "native.cgroupdriver=cgroupfs"])
            .arg("--data-root")
            .arg(dir.join("root"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", sock.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting dockerd")?;
        let mut engine = Engine {
            dockerd,
            dir: dir.to_path_buf(),
            host: format!("unix://{}", sock.display()),
            existed,
        };
        let t = Instant::now();
        while engine.docker(&["version"]).is_err() {
            if t.elapsed() > Duration::from_secs(30) || engine.dockerd.try_wait()?.is_some() {
                bail!(
                    "dockerd did not start; see {}",
                    dir.join("dockerd.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        engine.import_image()?;
        Ok(engine)
    }

    /// The docker command line, against this engine.
    pub fn docker(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running docker")?;
        if !out.status.success() {
            bail!(
                "docker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `docker run -d` of `cmd` in the host's-`/usr` image, with `opts` (no network unless
    /// they say).
    pub fn run(&self, opts: &[&str], cmd: &[&str]) -> Result<Container> {
        let mut with_usr = vec!["-v", "/usr:/usr:ro"];
        with_usr.extend(opts);
        self.run_image(IMAGE, &with_usr, cmd)
    }

    /// `docker run -d` of `cmd` (none: the image's own) in `image`, with `opts`.
    pub fn run_image(&self, image: &str, opts: &[&str], cmd: &[&str]) -> Result<Container> {
        let mut args = vec!["run", "-d"];
        if !opts.iter().any(|o| o.starts_with("--network")) {
            args.push("--network=none");
        }
        args.extend(opts);
        args.push(image);
        args.extend(cmd);
        let id = self.docker(&args)?;
        let pid = self.docker(&["inspect", "-f", "{{.State.Pid}}", &id])?;
        let pid: u32 = pid
            .parse()
            .with_context(|| format!("the PID of container {id}: {pid:?}"))?;
        if pid == 0 {
            bail!(
                "container {id} ended at once: {}",
                self.log_text(&id).unwrap_or_default()
            );
        }
        Ok(Container { id, pid })
    }

    /// The engine's address, as `DOCKER_HOST` gives it to other Docker clients.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Waits for a container to end and returns what it printed on standard output.
    pub fn output(&self, c: &Container) -> Result<String> {
        self.docker(&["wait", &c.id])?;
        self.docker(&["logs", &c.id])
    }

    /// What a container wrote on standard error (a daemon's log), then standard output.
    pub fn log_text(&self, id: &str) -> Result<String> {
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(["logs", id])
            .stdin(Stdio::null())
            .output()
            .context("running docker logs")?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }

    /// Removes a container, ending it first.
    pub fn remove(&self, c: &Container) -> Result<()> {
        self.docker(&["rm", "-f", &c.id]).map(drop)
    }

    /// The image: an empty root with the merged-/usr links, the host's /usr mounted into it.
    fn import_image(&self) -> Result<()> {
        let root = self.dir.join("image");
        for d in ["usr", "proc", "sys", "dev", "etc", "tmp", "run"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            let path = root.join(link);
            if path.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(to, path)?;
            }
        }
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .context("running tar")?;
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(["import", "-", IMAGE])
            .stdin(tar.stdout.take().expect("piped"))
            .output()
            .context("running docker import")?;
        tar.wait()?;
        if !out.status.success() {
            bail!(
                "docker import: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// Every hierarchy's top-level `docker` group that exists now.
fn parent_groups() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(PARENT))
        .filter(|p| p.is_dir())
        .collect()
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Ok(ids) = self.docker(&["ps", "-aq"]) {
            for id in ids.split_whitespace() {
                let _gone_already = self.docker(&["rm", "-f", id]);
            }
        }
        // SAFETY: signalling our own child; it unmounts and ends its containerd.
        unsafe { libc::kill(self.dockerd.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) && matches!(self.dockerd.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _already_gone = self.dockerd.kill();
        let _reaped = self.dockerd.wait();
        // The first container made them (runc, in every hierarchy); runc removed each
        // container's own group when the container went.
        for p in parent_groups() {
            if !self.existed.contains(&p) {
                let t = Instant::now();
                while std::fs::remove_dir(&p).is_err() && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        // dockerd leaves the host network's namespace mounted in its exec root when
        // a container used it (`--network=host`): unmounted, deepest first, then removed.
        for m in mounts_below(&self.dir) {
            if let Ok(path) = std::ffi::CString::new(m.into_os_string().into_encoded_bytes()) {
                // SAFETY: umount2 of a path of the engine's own directory.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let _best_effort = std::fs::remove_dir_all(&self.dir);
    }
}

/// Mount points at or below `dir`, deepest first (from /proc/self/mountinfo, whose fifth
/// field is the mount point, with spaces as `\040`).
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found
}
