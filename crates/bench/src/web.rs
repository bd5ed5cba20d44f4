//! The `web` scenario's server: nginx from Debian serving a generated tree of small
//! files, and the 2010 customer-appeasement paper's whole-tree download (wget -r of the site, timed).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{client, wait_until, Run};

const NGINX: &str = "/usr/sbin/nginx";
const WGET: &str = "/usr/bin/wget";
/// The site: 200 files of 0.5 to 16 KiB in 10 directories, with directory listings for
/// a crawler to follow.
const FILES: u32 = 200;
const DIRS: u32 = 10;

/// nginx on loopback `port` (None: a free one), one worker, in the foreground; stopped
/// with SIGTERM with the run.
pub(crate) fn start(
    run: &mut Run,
    tmp: &Path,
    port: Option<u16>,
) -> Result<(client::Target, client::Protocol)> {
    if !Path::new(NGINX).exists() {
        bail!("the web scenario needs nginx ({NGINX} is missing): apt-get install nginx");
    }
    let www = tmp.join("www");
    let mut paths = Vec::new();
    for i in 0..FILES {
        let size = 512 + (i as usize * 7919) % (16 * 1024 - 512);
        let path = format!("/d{}/f{i:03}.html", i % DIRS);
        let file = www.join(&path[1..]);
        std::fs::create_dir_all(file.parent().expect("in a directory"))?;
        std::fs::write(file, vec![b'a' + (i % 26) as u8; size])?;
        paths.push(path);
    }
    // A port someone else listens on would look like nginx being up (connections
    // succeed), so it is checked before nginx starts.
    let port = match port {
        Some(p) => match std::net::TcpListener::bind(("127.0.0.1", p)) {
            Ok(_free) => p,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!(
                "127.0.0.1:{p} is already in use: choose another --port, or leave it out for a free one"
            ),
            Err(e) => bail!("cannot listen on 127.0.0.1:{p}: {e}"),
        },
        None => std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port(),
    };
    let conf = tmp.join("nginx.conf");
    let config = format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {tmp}/nginx.pid;\n\
         error_log {tmp}/nginx-error.log warn;\nworker_rlimit_nofile 4096;\nevents {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  sendfile on;\n  keepalive_requests 100000000;\n  \
         keepalive_timeout 300s;\n  default_type text/html;\n  autoindex on;\n  \
         server {{ listen 127.0.0.1:{port}; root {www}; }}\n}}\n",
        tmp = tmp.display(),
        www = www.display()
    );
    std::fs::write(&conf, config)?;
    let log = std::fs::File::create(tmp.join("nginx.out"))?;
    let child = Command::new(NGINX)
        .args(["-e", &format!("{}/nginx-error.log", tmp.display()), "-c"])
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting nginx")?;
    run.graceful.push(child);
    let nginx = run.graceful.last_mut().expect("just pushed");
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    // Up when it accepts a connection; failed when it exits first (a port in use, a bad
    // config), which it does at once.
    let mut exited = None;
    let up = wait_until(Duration::from_secs(5), || {
        exited = nginx.try_wait().ok().flatten();
        exited.is_some() || std::net::TcpStream::connect(addr).is_ok()
    });
    if up.is_err() || exited.is_some() {
        let err = std::fs::read_to_string(tmp.join("nginx-error.log")).unwrap_or_default();
        let how = exited.map_or("did not start".to_string(), |s| format!("exited ({s})"));
        // Its first emergency says why (a failed bind is retried, then "still could not").
        let why = err
            .lines()
            .find(|l| l.contains("[emerg]"))
            .or_else(|| err.lines().last())
            .unwrap_or("no message");
        bail!("nginx {how} on {addr}: {why}");
    }
    let protocol = client::Protocol::Http {
        host: "localhost".into(),
        paths: Arc::new(paths),
    };
    Ok((client::Target::Tcp(addr), protocol))
}

/// Downloads the whole site as the 2010 customer-appeasement paper did (`wget -r`, one file after another) into
/// `into`, and returns the wall-clock time it took; None when `stop` (Ctrl-C) ended it.
pub(crate) fn download_tree(
    addr: std::net::SocketAddr,
    into: &Path,
    stop: &AtomicBool,
) -> Result<Option<Duration>> {
    if !Path::new(WGET).exists() {
        bail!("the whole-tree download needs wget ({WGET} is missing): apt-get install wget");
    }
    let _fresh = std::fs::remove_dir_all(into);
    std::fs::create_dir_all(into)?;
    let started = Instant::now();
    // The crawler runs in the latency class, like our own client.
    // A server that stops answering must not hang the bench: 10 s per read, one try.
    let mut wget = Command::new("nice")
        .args([
            "-n",
            "-10",
            WGET,
            "-r",
            "-np",
            "-q",
            "--timeout=10",
            "--tries=1",
            "-P",
        ])
        .arg(into)
        .arg(format!("http://{addr}/"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running wget")?;
    let status = loop {
        if let Some(s) = wget.try_wait()? {
            break s;
        }
        if stop.load(Ordering::Relaxed) {
            drop(wget.kill());
            drop(wget.wait());
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    if !status.success() {
        let mut said = String::new();
        drop(std::io::Read::read_to_string(
            wget.stderr.as_mut().expect("piped"),
            &mut said,
        ));
        bail!("wget -r of the site failed ({status}): {}", said.trim());
    }
    let got = walk_files(into);
    if got < FILES as usize {
        bail!("wget -r fetched {got} of the site's {FILES} files");
    }
    Ok(Some(took))
}

/// Regular files under `dir`, except directory listings.
fn walk_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk_files(&p)
            } else {
                (p.file_name() != Some("index.html".as_ref())) as usize
            }
        })
        .sum()
}
