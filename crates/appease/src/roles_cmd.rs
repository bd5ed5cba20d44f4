//! `appease roles suggest FILE`: staggered roles from observed per-call work (the AIX case study).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use appease_policy::roles::{suggest, Observed};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    critical: String,
    #[serde(rename = "process")]
    processes: Vec<Process>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Process {
    name: String,
    share_pct: f64,
    invocations: f64,
}

pub fn suggest_cmd(file: &Path, app: &str, top_nice: i32) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let input: Input = toml::from_str(&text)
        .with_context(|| format!("invalid observations in {}", file.display()))?;
    let observed: Vec<Observed> = input
        .processes
        .into_iter()
        .map(|p| Observed {
            name: p.name,
            share_pct: p.share_pct,
            invocations: p.invocations,
        })
        .collect();
    let ranks = suggest(&observed, &input.critical).map_err(anyhow::Error::msg)?;
    println!(
        "{:<16} {:>6} {:>6} {:>5}  why",
        "process", "share", "rank", "nice"
    );
    for s in &ranks {
        let share = observed
            .iter()
            .find(|o| o.name == s.name)
            .map_or(0.0, |o| o.share_pct);
        println!(
            "{:<16} {:>5.0}% {:>6} {:>5}  {}",
            s.name,
            share,
            s.rank,
            top_nice + s.rank as i32,
            s.why
        );
    }
    println!(
        "\n# For the daemon's config: each process by its executable and owner, as running now \
         (a comm is any process's to choose):"
    );
    println!("[roles]\ntop_nice = {top_nice}");
    for s in &ranks {
        println!("\n{}", role_entry(app, &s.name, s.rank, running(&s.name)));
    }
    Ok(())
}

/// What a running process is known by that its user cannot fake.
#[derive(Debug, PartialEq)]
enum Found {
    /// Its executable and real uid.
    Process {
        exe: PathBuf,
        uid: u32,
    },
    /// A process of that name runs, but its executable cannot be read (another user's).
    Unreadable,
    NotRunning,
}

/// The first running process (lowest pid) whose comm is `name` (its first 15 bytes, as the
/// kernel keeps it), by its /proc/PID/exe and the real uid of /proc/PID/status.
fn running(name: &str) -> Found {
    let comm = comm_of(name);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Found::NotRunning;
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let mut found = Found::NotRunning;
    for pid in pids {
        let Ok(c) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if c.trim_end_matches('\n') != comm {
            continue;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        let uid = std::fs::read(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|t| appease_cgroup::status_real_uid(&t));
        match (exe, uid) {
            (Ok(exe), Some(uid)) => return Found::Process { exe, uid },
            _ => found = Found::Unreadable,
        }
    }
    found
}

/// `name` as the kernel keeps a comm: its first 15 bytes.
fn comm_of(name: &str) -> &str {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// One `[[role]]` entry: by exe and user when the process was found, else by comm with
/// trust_comm and a comment saying what to put instead.
fn role_entry(app: &str, name: &str, rank: u32, found: Found) -> String {
    let head = format!("[[role]]\napp = {app:?}\n");
    match found {
        Found::Process { exe, uid } => format!(
            "{head}exe = {:?}\nuser = \"{uid}\"\nrank = {rank}",
            exe.to_string_lossy()
        ),
        Found::Unreadable | Found::NotRunning => {
            let why = if found == Found::Unreadable {
                "runs, but its executable cannot be read (run this as root)"
            } else {
                "is not running"
            };
            format!(
                "# {name} {why}: replace comm/trust_comm with exe = \"/path/to/{name}\" \
                 and user (a comm is any process's to choose)\n\
                 {head}comm = {:?}\ntrust_comm = true\nrank = {rank}",
                comm_of(name)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_named_by_exe_and_user_else_by_comm_with_a_comment() {
        let found = Found::Process {
            exe: PathBuf::from("/usr/sbin/searchd"),
            uid: 108,
        };
        assert_eq!(
            role_entry("search", "searchd", 0, found),
            "[[role]]\napp = \"search\"\nexe = \"/usr/sbin/searchd\"\nuser = \"108\"\nrank = 0"
        );
        let text = role_entry("search", "indexer", 1, Found::NotRunning);
        assert!(text.starts_with(
            "# indexer is not running: replace comm/trust_comm with exe = \"/path/to/indexer\" \
             and user (a comm is any process's to choose)\n"
        ));
        assert!(text.ends_with("comm = \"indexer\"\ntrust_comm = true\nrank = 1"));
        assert_eq!(
            appease_cgroup::status_real_uid(b"Name:\tx\nUid:\t1000\t0\t0\t0\n"),
            Some(1000)
        );
        assert_eq!(comm_of("a-very-long-process-name"), "a-very-long-pro");
    }
}
