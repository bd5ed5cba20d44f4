//! The `web` scenario's server: nginx from Debian serving a generated tree of small
//! files, and seeds/004's whole-tree download (wget -r of the site, timed).

use std::path::Path;
use std::process::{Command, Stdio};
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

/// nginx on a free loopback port, one worker, in the foreground; stopped with SIGTERM
/// with the run.
pub(crate) fn start(run: &mut Run, tmp: &Path) -> Result<(client::Target, client::Protocol)> {
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let conf = tmp.join("nginx.conf");
    let config = format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {tmp}/nginx.pid;\n\
         error_log {tmp}/nginx-error.log warn;\nevents {{ worker_connections 256; }}\n\
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
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    if wait_until(Duration::from_secs(5), || {
        std::net::TcpStream::connect(addr).is_ok()
    })
    .is_err()
    {
        let err = std::fs::read_to_string(tmp.join("nginx-error.log")).unwrap_or_default();
        bail!(
            "nginx did not start on {addr}: {}",
            err.lines().last().unwrap_or("no message")
        );
    }
    let protocol = client::Protocol::Http {
        host: "localhost".into(),
        paths: Arc::new(paths),
    };
    Ok((client::Target::Tcp(addr), protocol))
}

/// Downloads the whole site as seeds/004 did (`wget -r`, one file after another) into
/// `into`, and returns the wall-clock time it took.
pub(crate) fn download_tree(addr: std::net::SocketAddr, into: &Path) -> Result<Duration> {
    if !Path::new(WGET).exists() {
        bail!("the whole-tree download needs wget ({WGET} is missing): apt-get install wget");
    }
    let _fresh = std::fs::remove_dir_all(into);
    std::fs::create_dir_all(into)?;
    let started = Instant::now();
    // The crawler runs in the latency class, like our own client.
    let out = Command::new("nice")
        .args(["-n", "-10", WGET, "-r", "-np", "-q", "-P"])
        .arg(into)
        .arg(format!("http://{addr}/"))
        .stdin(Stdio::null())
        .output()
        .context("running wget")?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!(
            "wget -r of the site failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let got = walk_files(into);
    if got < FILES as usize {
        bail!("wget -r fetched {got} of the site's {FILES} files");
    }
    Ok(took)
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
