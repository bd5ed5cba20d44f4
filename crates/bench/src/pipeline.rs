//! The `pipeline` scenario: the AIX case study's application of six cooperating processes. A
//! search enters at A, which calls B to F over UNIX sockets, each a separate process
//! doing its part of the work, and answers when all have answered.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::{client, spawn_server, Options, Run};

/// The AIX case study's Figure 3: each process's share of a call's CPU (%) and how often it runs
/// per call. A call makes two searches; A runs once per search.
const FIGURE_3: [(&str, f64, f64); 6] = [
    ("A", 48.0, 2.0),
    ("B", 26.0, 7.0),
    ("C", 16.0, 4.0),
    ("D", 4.0, 4.0),
    ("E", 4.0, 1.0),
    ("F", 2.0, 2.0),
];
const SEARCHES_PER_CALL: f64 = 2.0;

/// (process, CPU ms per invocation, invocations per search) for `search_ms` of CPU
/// per search.
fn stages(search_ms: f64) -> Vec<(&'static str, f64, f64)> {
    FIGURE_3
        .iter()
        .map(|&(name, share, per_call)| {
            let per_search = per_call / SEARCHES_PER_CALL;
            (name, search_ms * share / 100.0 / per_search, per_search)
        })
        .collect()
}

/// Starts B to F, then A calling them; returns where A listens.
pub(crate) fn start(
    run: &mut Run,
    opts: &Options,
    search_ms: f64,
    tmp: &Path,
) -> Result<client::Target> {
    let stages = stages(search_ms);
    // Callees first: A connects to them as it starts.
    let mut calls = Vec::new();
    for &(name, cpu_ms, per_search) in stages[1..].iter() {
        let path = start_stage(run, opts, tmp, name, cpu_ms, &[])?;
        calls.push(format!("{}={per_search}", path.display()));
    }
    let (name, cpu_ms, _) = stages[0];
    let front = start_stage(run, opts, tmp, name, cpu_ms, &calls)?;
    Ok(client::Target::Unix(front))
}

/// One process of the application, as `stage-NAME` on `tmp/stage-NAME.sock`, calling
/// `calls` (SOCKET=TIMES) per request; returns its socket.
fn start_stage(
    run: &mut Run,
    opts: &Options,
    tmp: &Path,
    name: &str,
    cpu_ms: f64,
    calls: &[String],
) -> Result<PathBuf> {
    let comm = format!("stage-{name}");
    let path = tmp.join(format!("{comm}.sock"));
    let _stale = std::fs::remove_file(&path);
    let (cpu, path_arg) = (cpu_ms.to_string(), path.display().to_string());
    let mut args = vec![
        "server", "--cpu-ms", &cpu, "--unix", &path_arg, "--name", &comm,
    ];
    for c in calls {
        args.extend(["--call", c]);
    }
    spawn_server(run, opts, &args)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_gets_figure_3s_split_of_its_cpu() {
        let s = stages(5.0);
        // Work per search adds up to the search's CPU time.
        let total: f64 = s.iter().map(|&(_, ms, n)| ms * n).sum();
        assert!((total - 5.0).abs() < 1e-9, "{total}");
        // A runs once per search with 48 %; B 3.5 times with 26 % in all.
        assert_eq!(s[0], ("A", 2.4, 1.0));
        assert_eq!(s[1].2, 3.5);
        assert!((s[1].1 * s[1].2 - 1.3).abs() < 1e-9);
    }
}
