//! The workload file: machine, task groups, processes and customers (TOML).
//!
//! Every error names the file position it comes from: syntax and value errors through
//! toml's spans, cross-references (calls to undefined processes, call cycles, unknown
//! groups) through `Spanned` names.

use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// Calls one request makes at one server (the engine counts them in 16 bits).
pub const MAX_CALLS: usize = u16::MAX as usize;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}, line {line}, column {column}: {message}")]
    At {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Whole { file: String, message: String },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub sim: SimSection,
    #[serde(default)]
    pub tunables: Tunables,
    #[serde(default)]
    pub group: Vec<GroupDef>,
    #[serde(default)]
    pub process: Vec<ProcessDef>,
    #[serde(default)]
    pub customer: Vec<CustomerDef>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSection {
    #[serde(deserialize_with = "cpus")]
    pub cpus: usize,
    #[serde(deserialize_with = "positive_ms")]
    pub duration_ms: f64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "default_policy")]
    pub policy: Spanned<String>,
    /// Share of unhappiness a caller keeps when it calls another process (the 2010 customer-appeasement paper's eq. 1).
    #[serde(default, deserialize_with = "alpha")]
    pub alpha: f64,
}

fn default_policy() -> Spanned<String> {
    Spanned::new(0..0, "cfs".to_string())
}

/// Scheduler parameters; the defaults are the kernel's (CFS/EEVDF scaled for the CPU
/// count as the kernel scales them) and the paper's.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tunables {
    /// rr and mlfq: the quantum q.
    #[serde(deserialize_with = "positive_ms")]
    pub quantum_ms: f64,
    /// mlfq: number of queues (Q0 .. Qm-1, quantum 2^i q).
    #[serde(deserialize_with = "queues")]
    pub mlfq_queues: usize,
    /// cfs: sched_latency and min_granularity before CPU scaling (6 ms, 0.75 ms).
    #[serde(deserialize_with = "positive_ms")]
    pub sched_latency_ms: f64,
    #[serde(deserialize_with = "positive_ms")]
    pub min_granularity_ms: f64,
    #[serde(deserialize_with = "positive_ms")]
    pub wakeup_granularity_ms: f64,
    /// eevdf: base slice before CPU scaling (0.75 ms).
    #[serde(deserialize_with = "positive_ms")]
    pub base_slice_ms: f64,
    /// Periodic load balancing between CPUs.
    #[serde(deserialize_with = "positive_ms")]
    pub balance_ms: f64,
    /// Scale the CFS/EEVDF times by 1 + log2(min(cpus, 8)) as the kernel does.
    pub scale_with_cpus: bool,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            quantum_ms: 10.0,
            mlfq_queues: 8,
            sched_latency_ms: 6.0,
            min_granularity_ms: 0.75,
            wakeup_granularity_ms: 1.0,
            base_slice_ms: 0.75,
            balance_ms: 4.0,
            scale_with_cpus: true,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupDef {
    pub path: Spanned<String>,
    #[serde(default = "default_shares", deserialize_with = "shares")]
    pub shares: u64,
    #[serde(default)]
    pub idle: bool,
}

fn default_shares() -> u64 {
    1024
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedClass {
    #[default]
    Normal,
    Batch,
    Idle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Behavior {
    /// Runs forever.
    CpuBound,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessDef {
    pub name: Spanned<String>,
    #[serde(default = "one", deserialize_with = "count")]
    pub count: usize,
    #[serde(default, deserialize_with = "nice")]
    pub nice: i32,
    #[serde(default)]
    pub sched: SchedClass,
    pub group: Option<Spanned<String>>,
    /// eevdf: a custom slice (sched_attr.sched_runtime).
    #[serde(default, deserialize_with = "optional_ms")]
    pub slice_ms: Option<f64>,
    pub behavior: Option<Behavior>,
    /// Serves requests one at a time, in arrival order.
    pub serve: Option<Serve>,
    /// Computes then sleeps, forever (an interactive or periodic task).
    pub cycle: Option<Cycle>,
    /// Computes, then takes a lock and computes holding it, forever.
    pub lock: Option<LockUse>,
}

fn one() -> usize {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Serve {
    #[serde(deserialize_with = "non_negative_ms")]
    pub cpu_ms: f64,
    #[serde(default)]
    pub calls: Vec<Call>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    pub to: Spanned<String>,
    /// The caller blocks on the call after this much of its own CPU time.
    #[serde(deserialize_with = "non_negative_ms")]
    pub after_cpu_ms: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cycle {
    #[serde(deserialize_with = "positive_ms")]
    pub cpu_ms: f64,
    #[serde(deserialize_with = "positive_ms")]
    pub sleep_ms: f64,
}

/// A process that computes for `compute_ms`, then waits (asleep, first come first
/// served) for the lock `name` and computes `hold_ms` holding it. N of them on N CPUs
/// with exponential times are the machine-repairman queue of `appease model contention`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockUse {
    pub name: String,
    #[serde(deserialize_with = "positive_ms")]
    pub compute_ms: f64,
    #[serde(deserialize_with = "positive_ms")]
    pub hold_ms: f64,
    #[serde(default)]
    pub times: Times,
}

/// How the times of a `lock` process are drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Times {
    /// Exactly the given times.
    #[default]
    Fixed,
    /// Exponentially distributed with the given means (the seeded RNG draws them).
    Exponential,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Socket {
    #[default]
    Inet,
    Unix,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomerDef {
    pub name: String,
    /// W(c) in the 2010 customer-appeasement paper's eqs. 3-5.
    #[serde(default = "unit_weight", deserialize_with = "weight")]
    pub weight: f64,
    /// w^k: the weight of each of its requests.
    #[serde(default = "unit_weight", deserialize_with = "weight")]
    pub request_weight: f64,
    pub to: Spanned<String>,
    #[serde(default)]
    pub socket: Socket,
    pub arrivals: Arrivals,
    /// First request at this time.
    #[serde(default, deserialize_with = "non_negative_ms")]
    pub start_ms: f64,
    /// At most this many requests.
    pub max_requests: Option<u64>,
}

fn unit_weight() -> f64 {
    1.0
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Arrivals {
    Poisson {
        #[serde(deserialize_with = "rate")]
        rate_per_s: f64,
    },
    Periodic {
        #[serde(deserialize_with = "positive_ms")]
        period_ms: f64,
    },
    /// The next request `think_ms` after the answer to the last one.
    Closed {
        #[serde(deserialize_with = "non_negative_ms")]
        think_ms: f64,
    },
}

impl Workload {
    pub fn load(path: &Path) -> Result<Workload, WorkloadError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Read {
            file: file.clone(),
            source,
        })?;
        Workload::parse(&text, &file)
    }

    /// Parses and checks; `file` names the source in errors.
    pub fn parse(text: &str, file: &str) -> Result<Workload, WorkloadError> {
        let at = |span: Option<Range<usize>>, message: String| match span {
            Some(s) => {
                let (line, column) = line_col(text, s.start);
                WorkloadError::At {
                    file: file.to_string(),
                    line,
                    column,
                    message,
                }
            }
            None => WorkloadError::Whole {
                file: file.to_string(),
                message,
            },
        };
        let w: Workload =
            toml::from_str(text).map_err(|e| at(e.span(), e.message().trim().to_string()))?;
        w.check().map_err(|(span, msg)| at(span, msg))?;
        Ok(w)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.process.iter().position(|p| p.name.get_ref() == name)
    }

    fn check(&self) -> Result<(), (Option<Range<usize>>, String)> {
        let policy = self.sim.policy.get_ref();
        if !crate::POLICIES.contains(&policy.as_str()) {
            return Err((
                Some(self.sim.policy.span()),
                format!(
                    "unknown policy {policy:?} (one of {})",
                    crate::POLICIES.join(", ")
                ),
            ));
        }
        let paths = self.check_groups()?;
        if self.process.is_empty() {
            return Err((None, "no [[process]]: nothing to simulate".into()));
        }
        for (i, p) in self.process.iter().enumerate() {
            let name = p.name.get_ref();
            if self.process[..i].iter().any(|q| q.name.get_ref() == name) {
                return Err((
                    Some(p.name.span()),
                    format!("process {name:?} is defined twice"),
                ));
            }
            if let Some(g) = &p.group {
                if !paths.contains(g.get_ref()) {
                    return Err((
                        Some(g.span()),
                        format!("process {name:?}: group {:?} is not defined", g.get_ref()),
                    ));
                }
            }
            let kinds = p.behavior.is_some() as u8
                + p.serve.is_some() as u8
                + p.cycle.is_some() as u8
                + p.lock.is_some() as u8;
            if kinds != 1 {
                return Err((
                    Some(p.name.span()),
                    format!(
                        "process {name:?} needs exactly one of behavior = \"cpu-bound\", serve = {{ .. }}, cycle = {{ .. }} or lock = {{ .. }}"
                    ),
                ));
            }
            if let Some(s) = &p.serve {
                self.check_calls(p, s)?;
            }
        }
        self.check_cycles()?;
        self.check_customers()
    }

    /// The groups' paths, each checked (a parent before its children).
    fn check_groups(&self) -> Result<Vec<String>, (Option<Range<usize>>, String)> {
        let mut paths = Vec::new();
        for g in &self.group {
            let p = g.path.get_ref();
            if !p.starts_with('/') || p.len() < 2 || p.ends_with('/') {
                return Err((
                    Some(g.path.span()),
                    format!("group path {p:?} must look like \"/name\" or \"/a/b\""),
                ));
            }
            if paths.contains(p) {
                return Err((Some(g.path.span()), format!("group {p:?} is defined twice")));
            }
            if let Some(parent) = p.rsplit_once('/').map(|(a, _)| a).filter(|a| !a.is_empty()) {
                if !paths.iter().any(|q| q == parent) {
                    return Err((
                        Some(g.path.span()),
                        format!("group {p:?}: its parent {parent:?} must be defined before it"),
                    ));
                }
            }
            paths.push(p.clone());
        }
        Ok(paths)
    }

    /// A server's calls: few enough, in order within its CPU time, to servers.
    fn check_calls(&self, p: &ProcessDef, s: &Serve) -> Result<(), (Option<Range<usize>>, String)> {
        let name = p.name.get_ref();
        if s.calls.len() > MAX_CALLS {
            return Err((
                Some(p.name.span()),
                format!(
                    "process {name:?} makes {} calls per request; at most {MAX_CALLS} are supported",
                    s.calls.len()
                ),
            ));
        }
        let mut last = 0.0;
        for c in &s.calls {
            if c.after_cpu_ms > s.cpu_ms || c.after_cpu_ms < last {
                return Err((
                    Some(c.to.span()),
                    format!(
                        "process {name:?}: calls must come in order within its cpu_ms ({} ms), after_cpu_ms = {}",
                        s.cpu_ms, c.after_cpu_ms
                    ),
                ));
            }
            last = c.after_cpu_ms;
            self.check_server(&c.to, &format!("process {name:?} calls"))?;
        }
        Ok(())
    }

    /// Each customer sends to a process that serves.
    fn check_customers(&self) -> Result<(), (Option<Range<usize>>, String)> {
        for c in &self.customer {
            self.check_server(&c.to, &format!("customer {:?} sends to", c.name))?;
        }
        Ok(())
    }

    /// `to` names a process that serves requests; `who` says who sends it some.
    fn check_server(
        &self,
        to: &Spanned<String>,
        who: &str,
    ) -> Result<(), (Option<Range<usize>>, String)> {
        let name = to.get_ref();
        let refused = |what: &str| (Some(to.span()), format!("{who} {name:?}, which {what}"));
        match self.index_of(name).map(|i| self.process[i].serve.is_some()) {
            None => Err(refused("is not defined")),
            Some(false) => Err(refused("serves no requests")),
            Some(true) => Ok(()),
        }
    }

    /// A call cycle would block every process on it forever.
    fn check_cycles(&self) -> Result<(), (Option<Range<usize>>, String)> {
        // 0 = unvisited, 1 = on the stack, 2 = done.
        fn visit(
            w: &Workload,
            i: usize,
            state: &mut [u8],
            stack: &mut Vec<usize>,
        ) -> Result<(), (Option<Range<usize>>, String)> {
            state[i] = 1;
            stack.push(i);
            for c in w.process[i].serve.iter().flat_map(|s| &s.calls) {
                let j = w.index_of(c.to.get_ref()).expect("checked before");
                if state[j] == 1 {
                    let from = stack.iter().position(|&k| k == j).unwrap_or(0);
                    let mut names: Vec<&str> = stack[from..]
                        .iter()
                        .map(|&k| w.process[k].name.get_ref().as_str())
                        .collect();
                    names.push(w.process[j].name.get_ref());
                    return Err((
                        Some(c.to.span()),
                        format!("call cycle: {}", names.join(" -> ")),
                    ));
                }
                if state[j] == 0 {
                    visit(w, j, state, stack)?;
                }
            }
            stack.pop();
            state[i] = 2;
            Ok(())
        }
        let mut state = vec![0u8; self.process.len()];
        for i in 0..self.process.len() {
            if state[i] == 0 {
                visit(self, i, &mut state, &mut Vec::new())?;
            }
        }
        Ok(())
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

appease_config::validators! {
    positive_ms: f64, |v| v.is_finite() && *v > 0.0, "{v} ms: a time here must be > 0";
    non_negative_ms: f64, |v| v.is_finite() && *v >= 0.0, "{v} ms: a time cannot be negative";
    alpha: f64, |v| (0.0..0.5).contains(v), "alpha {v} is outside [0, 0.5)";
    cpus: usize, |v| (1..=4096).contains(v), "{v} CPUs is outside 1..=4096";
    count: usize, |v| (1..=1_000_000).contains(v), "count {v} is outside 1..=1000000";
    queues: usize, |v| (1..=32).contains(v), "{v} queues is outside 1..=32";
    nice: i32, |v| (-20..=19).contains(v), "nice {v} is outside -20..=19";
    shares: u64, |v| (2..=262_144).contains(v), "shares {v} is outside 2..=262144";
    weight: f64, |v| v.is_finite() && *v >= 0.0, "weight {v} must be >= 0";
    rate: f64, |v| v.is_finite() && *v > 0.0, "rate {v} per second must be > 0";
}

fn optional_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    positive_ms(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[sim]
cpus = 1
duration_ms = 1000
[[process]]
name = "web"
serve = { cpu_ms = 5.0, calls = [{ to = "db", after_cpu_ms = 2.0 }] }
[[process]]
name = "db"
serve = { cpu_ms = 3.0 }
[[customer]]
name = "remote"
to = "web"
arrivals = { kind = "poisson", rate_per_s = 40.0 }
"#;

    fn err(text: &str) -> String {
        Workload::parse(text, "w.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_issue_example_parses_with_defaults() {
        let w = Workload::parse(BASE, "w.toml").unwrap();
        assert_eq!(w.sim.policy.get_ref(), "cfs");
        assert_eq!(w.sim.alpha, 0.0);
        assert_eq!(w.process[1].count, 1);
        assert_eq!(w.customer[0].socket, Socket::Inet);
    }

    #[test]
    fn errors_name_the_position() {
        let e = err(&BASE.replace("cpus = 1", "cpus = 1\nbogus = 3"));
        assert!(e.contains("w.toml, line 4") && e.contains("bogus"), "{e}");
        let e = err(&BASE.replace("to = \"db\"", "to = \"dbx\""));
        assert!(
            e.contains("line 7") && e.contains("\"dbx\", which is not defined"),
            "{e}"
        );
        let e = err(&BASE.replace("cpu_ms = 3.0", "cpu_ms = -3.0"));
        assert!(
            e.contains("line 10") && e.contains("cannot be negative"),
            "{e}"
        );
        let e = err(&BASE.replace("duration_ms = 1000", "duration_ms = 1000\nalpha = 0.5"));
        assert!(
            e.contains("line 5") && e.contains("alpha 0.5 is outside [0, 0.5)"),
            "{e}"
        );
        let e = err(&BASE.replace("[sim]", "[sim]\npolicy = \"fifo\""));
        assert!(e.contains("line 3") && e.contains("unknown policy"), "{e}");
    }

    #[test]
    fn call_cycles_are_refused_with_the_cycle_spelled_out() {
        let text = BASE.replace(
            "serve = { cpu_ms = 3.0 }",
            "serve = { cpu_ms = 3.0, calls = [{ to = \"web\", after_cpu_ms = 1.0 }] }",
        );
        let e = err(&text);
        assert!(
            e.contains("call cycle: web -> db -> web") && e.contains("line 10"),
            "{e}"
        );
        let e = err(&BASE.replace("to = \"db\"", "to = \"web\""));
        assert!(e.contains("call cycle: web -> web"), "{e}");
    }

    #[test]
    fn more_calls_per_request_than_the_engine_counts_are_refused() {
        let calls = vec!["{ to = \"db\", after_cpu_ms = 1.0 }"; MAX_CALLS + 1].join(", ");
        let e = err(&BASE.replace(
            "calls = [{ to = \"db\", after_cpu_ms = 2.0 }]",
            &format!("calls = [{calls}]"),
        ));
        assert!(
            e.contains("line 6") && e.contains("makes 65536 calls per request; at most 65535"),
            "{e}"
        );
    }

    #[test]
    fn processes_need_one_behavior_and_groups_must_exist() {
        let e = err(&BASE.replace(
            "serve = { cpu_ms = 3.0 }",
            "behavior = \"cpu-bound\"\nserve = { cpu_ms = 3.0 }",
        ));
        assert!(e.contains("exactly one of"), "{e}");
        let e = err(&BASE.replace("name = \"db\"", "name = \"db\"\ngroup = \"/batch\""));
        assert!(e.contains("group \"/batch\" is not defined"), "{e}");
    }
}
