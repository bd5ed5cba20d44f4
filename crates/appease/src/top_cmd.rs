//! `appease top`: a live view of what the running daemon has changed and why: the
//! machine's load, CPU pressure and the batch group's share at the top, then every
//! elevated thread and every demoted (or placed) process with its class, nice, group,
//! CPU use, reason and age. It reads the daemon's state through the control socket, as
//! `appease status` does; CPU use is measured here, from /proc, between two refreshes.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use appease_cgroup::procstat::{clock_tick_ns, ProcStat};
use appease_daemon::control::{self, ClientError};
use appease_daemon::status::Status;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::{DefaultTerminal, Frame};

/// What the rows are ordered by (`s` cycles through them, `r` reverses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// CPU use, highest first.
    Cpu,
    Pid,
    /// Nice, most favoured first.
    Nice,
    /// Class, then CPU use.
    Class,
    /// Command name.
    Comm,
    /// How long ago the change was made, newest first.
    Since,
}

impl SortKey {
    const ALL: [SortKey; 6] = [
        SortKey::Cpu,
        SortKey::Pid,
        SortKey::Nice,
        SortKey::Class,
        SortKey::Comm,
        SortKey::Since,
    ];

    fn name(self) -> &'static str {
        match self {
            SortKey::Cpu => "cpu",
            SortKey::Pid => "pid",
            SortKey::Nice => "nice",
            SortKey::Class => "class",
            SortKey::Comm => "comm",
            SortKey::Since => "since",
        }
    }

    fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }
}

/// The classes a row can have, in the order `f` cycles through them (None: all).
const CLASSES: [&str; 4] = ["latency", "role", "batch", "service"];

/// One line of the table: an elevated thread or a demoted (or placed) process.
#[derive(Clone, Debug, PartialEq)]
pub struct TopRow {
    pub pid: u32,
    /// None for a process row (all its threads).
    pub tid: Option<u32>,
    pub comm: String,
    pub class: String,
    pub nice: Option<i32>,
    pub group: String,
    /// Percent of one CPU since the last refresh (None on the first).
    pub cpu_pct: Option<f64>,
    pub why: String,
    pub since: u64,
}

/// The rows the daemon's state describes: threads it changed, then processes it moved
/// or demoted in place. `read` gives a task's current stat (pid, tid): its nice.
pub fn rows_of(
    status: &Status,
    read: impl Fn(u32, Option<u32>) -> Option<ProcStat>,
) -> Vec<TopRow> {
    // Group paths are read raw (a delegated user names its groups): shown escaped, never
    // as terminal control. Names are escaped where they are read.
    let shown = appease_cgroup::names::escaped_str;
    let threads = status.threads.iter().map(|t| TopRow {
        pid: t.pid,
        tid: Some(t.tid),
        comm: t.comm.clone(),
        class: t.class.clone(),
        nice: Some(t.nice),
        group: String::new(),
        cpu_pct: None,
        why: t.why.clone(),
        since: t.since,
    });
    let processes = status.processes.iter().map(|p| TopRow {
        pid: p.pid,
        tid: None,
        comm: p.comm.clone(),
        // A latency service's processes are placed in its group: class "service" here,
        // apart from elevated threads.
        class: match p.class.as_str() {
            "latency" => "service".to_string(),
            c => c.to_string(),
        },
        nice: (p.pid != 0)
            .then(|| read(p.pid, None))
            .flatten()
            .map(|s| s.nice),
        group: shown(&p.group),
        cpu_pct: None,
        why: p.why.clone(),
        since: p.since,
    });
    threads.chain(processes).collect()
}

/// CPU use between refreshes, per task, from its /proc times.
#[derive(Default)]
pub struct CpuMeter {
    last: HashMap<(u32, Option<u32>), (u64, Instant)>,
}

impl CpuMeter {
    /// Percent of one CPU each row's task used since the last call that saw it.
    pub fn measure(
        &mut self,
        rows: &mut [TopRow],
        now: Instant,
        read: impl Fn(u32, Option<u32>) -> Option<ProcStat>,
    ) {
        let tick_ns = clock_tick_ns() as f64;
        let mut seen = HashMap::new();
        for r in rows.iter_mut() {
            if r.pid == 0 {
                continue; // a cgroup made idle in place: no one task
            }
            let Some(stat) = read(r.pid, r.tid) else {
                continue;
            };
            // A thread's own time; a process's with its reaped children's (a build).
            let ticks = if r.tid.is_some() {
                stat.run_ticks
            } else {
                stat.cpu_ticks
            };
            let key = (r.pid, r.tid);
            if let Some(&(before, then)) = self.last.get(&key) {
                let secs = now.saturating_duration_since(then).as_secs_f64();
                if secs > 0.0 && ticks >= before {
                    r.cpu_pct = Some((ticks - before) as f64 * tick_ns / 1e9 / secs * 100.0);
                }
            }
            seen.insert(key, (ticks, now));
        }
        self.last = seen;
    }
}

/// A task's stat from /proc (thread or whole process).
pub fn read_stat(pid: u32, tid: Option<u32>) -> Option<ProcStat> {
    let path = match tid {
        Some(tid) => format!("/proc/{pid}/task/{tid}/stat"),
        None => format!("/proc/{pid}/stat"),
    };
    appease_cgroup::read_stat(path)
}

/// The cgroup a process is in (cpu controller on v1, the unified path on v2).
fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V1)
        .or_else(|| appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V2))
}

/// Orders and filters rows as the view asks.
pub fn arrange(rows: &mut Vec<TopRow>, sort: SortKey, reverse: bool, class: Option<&str>) {
    if let Some(c) = class {
        rows.retain(|r| r.class == c);
    }
    let cpu = |r: &TopRow| r.cpu_pct.unwrap_or(-1.0);
    rows.sort_by(|a, b| {
        let by = match sort {
            SortKey::Cpu => cpu(b).total_cmp(&cpu(a)),
            SortKey::Pid => (a.pid, a.tid).cmp(&(b.pid, b.tid)),
            SortKey::Nice => a.nice.unwrap_or(i32::MAX).cmp(&b.nice.unwrap_or(i32::MAX)),
            SortKey::Class => a.class.cmp(&b.class).then(cpu(b).total_cmp(&cpu(a))),
            SortKey::Comm => a.comm.cmp(&b.comm),
            SortKey::Since => b.since.cmp(&a.since),
        };
        by.then((a.pid, a.tid).cmp(&(b.pid, b.tid)))
    });
    if reverse {
        rows.reverse();
    }
}

/// The view's state between frames.
struct View {
    sort: SortKey,
    reverse: bool,
    class: Option<&'static str>,
    status: Option<Status>,
    /// The daemon's state is this many seconds old (its loop is stuck).
    stale: Option<u64>,
    /// Why there is no state now (the daemon stopped while the view ran).
    error: Option<String>,
    rows: Vec<TopRow>,
    cpu: CpuMeter,
    groups: HashMap<u32, String>,
}

impl View {
    fn new(sort: SortKey, class: Option<&'static str>) -> Self {
        View {
            sort,
            reverse: false,
            class,
            status: None,
            stale: None,
            error: None,
            rows: Vec::new(),
            cpu: CpuMeter::default(),
            groups: HashMap::new(),
        }
    }

    fn refresh(&mut self, dir: &Path) {
        match control::status(dir) {
            Ok((status, stale)) => {
                let mut rows = rows_of(&status, read_stat);
                self.cpu.measure(&mut rows, Instant::now(), read_stat);
                // A thread's group is its process's cgroup, read here (once per process).
                let mut groups = HashMap::new();
                for r in rows.iter_mut().filter(|r| r.tid.is_some()) {
                    let g = groups
                        .entry(r.pid)
                        .or_insert_with(|| {
                            self.groups
                                .remove(&r.pid)
                                .or_else(|| cgroup_of(r.pid))
                                .unwrap_or_default()
                        })
                        .clone();
                    r.group = g;
                }
                self.groups = groups;
                self.rows = rows;
                self.status = Some(status);
                self.stale = stale;
                self.error = None;
            }
            Err(e) => {
                self.error = Some(e.to_string());
                self.rows.clear();
            }
        }
    }

    fn key(&mut self, code: KeyCode, modifiers: KeyModifiers) -> bool {
        match code {
            KeyCode::Char('q') | KeyCode::Esc => return false,
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => return false,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('r') => self.reverse = !self.reverse,
            KeyCode::Char('f') => {
                self.class = match self.class {
                    None => Some(CLASSES[0]),
                    Some(c) => {
                        let i = CLASSES.iter().position(|&k| k == c).unwrap_or(0);
                        CLASSES.get(i + 1).copied()
                    }
                }
            }
            _ => {}
        }
        true
    }

    fn draw(&self, frame: &mut Frame) {
        let [head, table, foot] = Layout::vertical([
            Constraint::Length(4),
            Constraint::Min(1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        frame.render_widget(Paragraph::new(self.header()), head);
        let mut rows = self.rows.clone();
        arrange(&mut rows, self.sort, self.reverse, self.class);
        let now = appease_actuator::now_secs();
        let body = rows.iter().map(|r| {
            Row::new([
                Cell::from(r.pid.to_string()),
                Cell::from(r.tid.map_or("-".into(), |t| t.to_string())),
                Cell::from(r.comm.clone()),
                Cell::from(r.class.clone()),
                Cell::from(r.nice.map_or("-".into(), |n| n.to_string())),
                Cell::from(r.cpu_pct.map_or("-".into(), |c| format!("{c:.1}"))),
                Cell::from(r.group.clone()),
                Cell::from(format!("{}s", now.saturating_sub(r.since))),
                Cell::from(r.why.clone()),
            ])
        });
        let widths = [
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(16),
            Constraint::Length(8),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Length(28),
            Constraint::Length(7),
            Constraint::Min(10),
        ];
        let heads = [
            "PID", "TID", "COMM", "CLASS", "NICE", "CPU%", "GROUP", "SINCE", "WHY",
        ];
        let t = Table::new(body, widths)
            .header(Row::new(heads).style(Style::new().add_modifier(Modifier::REVERSED)));
        frame.render_widget(t, table);
        let filter = self.class.unwrap_or("all");
        let help = format!(
            "q quit  s sort ({}{})  r reverse  f class ({filter})",
            self.sort.name(),
            if self.reverse { ", reversed" } else { "" }
        );
        frame.render_widget(Paragraph::new(help).dim(), foot);
    }

    fn header(&self) -> Vec<Line<'static>> {
        let Some(s) = &self.status else {
            return vec![Line::from("appease top: waiting for the daemon")];
        };
        let up = appease_actuator::now_secs().saturating_sub(s.started);
        let mut lines = vec![Line::from(format!(
            "appease daemon pid {}, up {up}s, {} CPUs, config {}{}",
            s.pid,
            s.cpus,
            s.config,
            if s.dry_run { " (dry run)" } else { "" }
        ))];
        let l = &s.load;
        lines.push(Line::from(format!(
            "load {:.2} runnable/CPU, CPU pressure {:.1} %, ladder step {} (unix {}, inet {})",
            l.runnable_per_cpu, l.psi_some_pct, l.ladder_step, l.unix_nice, l.inet_nice
        )));
        let elevated = s.threads.len();
        let demoted = s.processes.iter().filter(|p| p.class == "batch").count();
        lines.push(Line::from(match &s.batch {
            Some(b) => format!(
                "batch group {}, {:.1} % of the CPUs; {elevated} thread(s) changed, {demoted} process(es) demoted",
                crate::status_cmd::mode_text(b.mode),
                b.share_pct
            ),
            None => format!("batch demotion off; {elevated} thread(s) changed"),
        }));
        if let Some(e) = &self.error {
            lines.push(Line::from(format!("no state: {e}")).red());
        } else if let Some(age) = self.stale {
            lines.push(Line::from(crate::status_cmd::stale_warning(s, age)).red());
        }
        lines
    }
}

/// Runs the view until `q` (or Esc, Ctrl-C).
pub fn run(dir: &Path, every: Duration, sort: SortKey, class: Option<String>) -> Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("appease top needs a terminal; `appease status` (or `status --json`) is for scripts");
    }
    let class = match class.as_deref() {
        None | Some("all") => None,
        Some(c) => match CLASSES.iter().find(|&&k| k == c) {
            Some(&k) => Some(k),
            None => bail!("unknown class {c:?}: one of all, {}", CLASSES.join(", ")),
        },
    };
    // No daemon: one clear error before the screen is taken over.
    if let Err(e @ ClientError::NotRunning(_)) = control::status(dir) {
        return Err(e.into());
    }
    let mut view = View::new(sort, class);
    // Puts the terminal back on every way out, a panic included.
    let mut terminal = ratatui::init();
    let result = event_loop(&mut terminal, &mut view, dir, every);
    ratatui::restore();
    result
}

fn event_loop(
    terminal: &mut DefaultTerminal,
    view: &mut View,
    dir: &Path,
    every: Duration,
) -> Result<()> {
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            view.refresh(dir);
            next = Instant::now() + every;
        }
        terminal.draw(|f| view.draw(f))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                if k.kind == KeyEventKind::Press && !view.key(k.code, k.modifiers) {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use appease_daemon::status::{ProcessStatus, ThreadStatus};

    fn stat(nice: i32, run: u64, all: u64) -> ProcStat {
        ProcStat {
            pid: 1,
            comm: "x".into(),
            ppid: 0,
            session: 1,
            tty_nr: 0,
            flags: 0,
            cpu_ticks: all,
            run_ticks: run,
            nice,
            start: 1,
            policy: 0,
        }
    }

    fn status() -> Status {
        let thread = |pid, tid, class: &str, nice, since| ThreadStatus {
            pid,
            tid,
            comm: format!("t{tid}"),
            class: class.into(),
            nice,
            original_nice: 0,
            levels: 0,
            slice_us: 0,
            budget_ms: 0.0,
            why: "unix-request".into(),
            since,
        };
        let process = |pid, class: &str| ProcessStatus {
            pid,
            comm: format!("p{pid}"),
            class: class.into(),
            group: "/appease.batch".into(),
            original_group: "/".into(),
            tree: pid,
            why: "cpu-soaker".into(),
            since: 5,
            placement: "moved".into(),
        };
        Status {
            threads: vec![
                thread(10, 11, "latency", -8, 7),
                thread(20, 20, "role", 5, 9),
            ],
            processes: vec![process(30, "batch"), process(40, "latency")],
            ..Status::default()
        }
    }

    #[test]
    fn rows_cover_threads_and_processes_with_the_nice_read_now() {
        let rows = rows_of(&status(), |pid, tid| {
            assert_eq!(tid, None, "only processes' nice is read");
            Some(stat(pid as i32 / 10, 0, 0))
        });
        let got: Vec<_> = rows
            .iter()
            .map(|r| (r.pid, r.tid, r.class.as_str(), r.nice))
            .collect();
        assert_eq!(
            got,
            vec![
                (10, Some(11), "latency", Some(-8)),
                (20, Some(20), "role", Some(5)),
                (30, None, "batch", Some(3)),
                (40, None, "service", Some(4)),
            ]
        );
    }

    #[test]
    fn cpu_use_is_the_time_used_between_two_refreshes() {
        let hz = 1e9 / clock_tick_ns() as f64;
        let mut rows = rows_of(&status(), |_, _| None);
        let mut meter = CpuMeter::default();
        let t0 = Instant::now();
        meter.measure(&mut rows, t0, |_, _| Some(stat(0, 100, 1000)));
        assert!(
            rows.iter().all(|r| r.cpu_pct.is_none()),
            "nothing to compare yet"
        );
        // Two seconds later: threads used half a CPU (own time), processes a whole one
        // (with their reaped children's).
        let later = t0 + Duration::from_secs(2);
        let (run, all) = (100 + hz as u64, 1000 + 2 * hz as u64);
        meter.measure(&mut rows, later, |_, _| Some(stat(0, run, all)));
        for r in &rows {
            let want = if r.tid.is_some() { 50.0 } else { 100.0 };
            let got = r.cpu_pct.unwrap();
            assert!((got - want).abs() < 1.0, "{r:?}: {got}");
        }
    }

    #[test]
    fn rows_sort_by_each_key_and_filter_by_class() {
        let mut rows = rows_of(&status(), |_, _| None);
        for (r, cpu) in rows.iter_mut().zip([30.0, 10.0, 99.0, 1.0]) {
            r.cpu_pct = Some(cpu);
        }
        let order = |sort, reverse, class| {
            let mut v = rows.clone();
            arrange(&mut v, sort, reverse, class);
            v.iter().map(|r| r.pid).collect::<Vec<_>>()
        };
        assert_eq!(order(SortKey::Cpu, false, None), [30, 10, 20, 40]);
        assert_eq!(order(SortKey::Cpu, true, None), [40, 20, 10, 30]);
        assert_eq!(order(SortKey::Pid, false, None), [10, 20, 30, 40]);
        assert_eq!(order(SortKey::Nice, false, None), [10, 20, 30, 40]);
        assert_eq!(order(SortKey::Since, false, None), [20, 10, 30, 40]);
        assert_eq!(order(SortKey::Class, false, None), [30, 10, 20, 40]);
        assert_eq!(order(SortKey::Cpu, false, Some("batch")), [30]);
        assert_eq!(order(SortKey::Cpu, false, Some("service")), [40]);
        // Every key is reached by cycling.
        let mut k = SortKey::Cpu;
        let mut seen = vec![k];
        for _ in 1..SortKey::ALL.len() {
            k = k.next();
            seen.push(k);
        }
        assert_eq!(seen, SortKey::ALL);
        assert_eq!(k.next(), SortKey::Cpu);
    }

    #[test]
    fn keys_sort_reverse_filter_and_quit() {
        let mut v = View::new(SortKey::Cpu, None);
        assert!(v.key(KeyCode::Char('s'), KeyModifiers::NONE));
        assert_eq!(v.sort, SortKey::Pid);
        assert!(v.key(KeyCode::Char('r'), KeyModifiers::NONE));
        assert!(v.reverse);
        let mut classes = Vec::new();
        for _ in 0..=CLASSES.len() {
            v.key(KeyCode::Char('f'), KeyModifiers::NONE);
            classes.push(v.class);
        }
        assert_eq!(
            classes,
            [
                Some("latency"),
                Some("role"),
                Some("batch"),
                Some("service"),
                None
            ]
        );
        assert!(!v.key(KeyCode::Char('q'), KeyModifiers::NONE));
        assert!(!v.key(KeyCode::Esc, KeyModifiers::NONE));
        assert!(!v.key(KeyCode::Char('c'), KeyModifiers::CONTROL));
    }
}
