//! Moving process trees into appease's groups (the idle group, latency services) and
//! back, journaled like every other change. Processes born inside the group (children of demoted processes) have no
//! journal entry of their own: they go back to where their nearest moved ancestor came
//! from, or to the hierarchy's root.

use std::collections::HashMap;

use appease_cgroup::{CgroupError, Cgroups, LEAST_WEIGHT};
use serde::{Deserialize, Serialize};

use crate::in_place::{Demoting, InPlace};
use crate::journal::{Record, TaskKey};
use crate::restore::FromJournal;
use crate::trail::{audit, Change};
use crate::{now_secs, sys, ActError, KernelActuator, RestoreReport};

mod moves;

/// appease's top-level groups (the idle group, one per latency service) and what it
/// moved into them.
pub struct Groups {
    cg: Cgroups,
    batch_name: String,
    /// Groups created so far, in creation order.
    created: Vec<String>,
    /// How each group was made (idle, weight), to make it again if it vanishes.
    made: HashMap<String, (bool, u32)>,
    /// The batch group was made again: it is idle, whatever mode it had.
    batch_remade: bool,
    /// The batch groups' mode as last set: None idle, else the weight both groups have
    /// (quiet, floor). The feeders' group is made with it.
    mode_weight: Option<u32>,
    moved: HashMap<u32, Moved>,
    /// systemd owns the cgroup tree: appease writes none of it (see `boundary`).
    systemd: bool,
    /// Service processes kept where they are (pid -> start time), logged once.
    stayed: HashMap<u32, u64>,
    /// systemd's D-Bus API, on a host it runs (see `systemd`).
    pub(crate) units: Option<Box<dyn crate::systemd::UnitControl>>,
}

struct Moved {
    key: TaskKey,
    from: String,
    to: String,
    class: &'static str,
    root: u32,
    comm: String,
    why: String,
    since: u64,
}

/// A process appease moved, for `appease status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MovedView {
    pub pid: u32,
    pub comm: String,
    pub class: String,
    pub group: String,
    pub original_group: String,
    /// The pid at the top of its tree.
    pub tree: u32,
    pub why: String,
    pub since: u64,
    /// `moved`, or `in place: REASON` for a tree that stays in its cgroup (SCHED_IDLE per
    /// thread) because a move would escape a limit or a container.
    #[serde(default)]
    pub placement: String,
}

impl Groups {
    /// The groups appease made and still holds.
    pub(crate) fn created_paths(&self) -> &[String] {
        &self.created
    }

    /// `batch_name` is the idle group's top-level name, e.g. "appease.batch".
    pub fn new(cg: Cgroups, batch_name: &str) -> Self {
        Groups {
            cg,
            batch_name: batch_name.to_string(),
            created: Vec::new(),
            made: HashMap::new(),
            batch_remade: false,
            mode_weight: None,
            moved: HashMap::new(),
            systemd: false,
            stayed: HashMap::new(),
            units: None,
        }
    }

    /// Talks to systemd through `units` (on a host where it owns the cgroup tree): a
    /// batch tree that is all a unit holds makes the unit idle in place.
    pub fn with_units(mut self, units: Box<dyn crate::systemd::UnitControl>) -> Self {
        self.units = Some(units);
        self
    }

    /// systemd owns the cgroup tree (cgroup v2 with systemd as PID 1): appease moves no
    /// process and creates no group in it; batch is expressed in place.
    pub fn owned_by_systemd(mut self, systemd: bool) -> Self {
        self.systemd = systemd;
        self
    }

    pub(crate) fn systemd_owned(&self) -> bool {
        self.systemd
    }

    /// Why a process in cgroup `from` must not be moved out of it, if it must not: a
    /// limit that binds its cgroup, a container, or systemd's ownership of the tree.
    pub fn boundary(&self, from: &str) -> Option<String> {
        if self.systemd {
            return Some("systemd owns the cgroup tree, and the unit holds other work too".into());
        }
        self.cg.boundary_of(from).map(|b| b.to_string())
    }

    pub fn batch_path(&self) -> String {
        format!("/{}", self.batch_name)
    }

    /// The group of demoted trees that feed on a server's responses (a dump, a
    /// download, an ETL query), with `[batch] feeders = "least-weight"`: of the least
    /// weight, not idle, while the idle group is idle. An idle client runs only when no
    /// other task wants the CPU, and each hand-off from the server it reads waits for
    /// such a moment; a group that is not idle is not preempted at once by a waking
    /// server either (see docs/daemon.md, "Feeders").
    pub fn feeders_path(&self) -> String {
        format!("/{}", self.feeders_name())
    }

    fn feeders_name(&self) -> String {
        format!("{}-feeders", self.batch_name)
    }

    /// The top of the batch group `group` is in or under (the idle group or the
    /// feeders'), if it is in one.
    fn batch_top_of(&self, group: &str) -> Option<String> {
        [self.batch_path(), self.feeders_path()]
            .into_iter()
            .find(|top| group == top || group.strip_prefix(top).is_some_and(|r| r.starts_with('/')))
    }

    /// Whether `group` is one of the batch groups or one of their jobs' groups.
    pub fn in_batch(&self, group: &str) -> bool {
        self.batch_top_of(group).is_some()
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cg
    }
}

fn cg_err(e: CgroupError) -> ActError {
    ActError::Cgroup(e)
}

fn ppid_of(pid: u32) -> Option<u32> {
    appease_cgroup::read_ppid(pid)
}

/// Where a process found in the group goes back to: its own recorded origin if it
/// was moved, else the origin of its nearest moved ancestor, else the root group.
fn destination(pid: u32, origin_of: impl Fn(u32) -> Option<String>) -> String {
    let mut cur = pid;
    for _ in 0..64 {
        if let Some(from) = origin_of(cur) {
            return from;
        }
        match ppid_of(cur) {
            Some(p) if p > 1 && p != cur => cur = p,
            _ => break,
        }
    }
    "/".to_string()
}

/// The batch groups (idle, feeders') and their jobs' groups, as a handle another thread
/// can read.
#[derive(Clone, Debug)]
pub struct BatchGroup {
    cg: Cgroups,
    paths: Vec<String>,
}

impl BatchGroup {
    /// Every process in the groups and below them now (none of a group that cannot be
    /// read).
    pub fn processes(&self) -> Vec<u32> {
        self.paths
            .iter()
            .flat_map(|p| self.cg.processes_below(p).unwrap_or_default())
            .collect()
    }
}

impl KernelActuator {
    fn groups_mut(&mut self) -> Result<&mut Groups, ActError> {
        self.groups.as_mut().ok_or(ActError::NoCgroups)
    }

    /// Creates the top-level group `name` once (journaled first).
    fn ensure_group(&mut self, name: &str, idle: bool, weight: u32) -> Result<String, ActError> {
        self.make_group(None, name, idle, weight)
    }

    /// The group of one job (a demoted tree) inside the idle group `top`, created once
    /// (journaled first) with a normal weight: the jobs share what the idle group gets
    /// per job, not per thread.
    fn ensure_job_group(&mut self, top: &str, name: &str) -> Result<String, ActError> {
        self.make_group(Some(top), name, false, 100)
    }

    /// Creates group `name` at the top of the hierarchy or inside `parent`, once
    /// (journaled first); a child group is never idle itself.
    fn make_group(
        &mut self,
        parent: Option<&str>,
        name: &str,
        idle: bool,
        weight: u32,
    ) -> Result<String, ActError> {
        let path = format!("{}/{name}", parent.unwrap_or(""));
        if self.groups_mut()?.created.contains(&path) {
            return Ok(path);
        }
        if !self.dry_run {
            self.journal(Record::Group { path: path.clone() })?;
            let cg = &self.groups_mut()?.cg;
            match parent {
                None => cg.ensure_top_group(name, idle, weight),
                Some(parent) => cg.ensure_child_group(parent, name, weight),
            }
            .map_err(cg_err)?;
        }
        let g = self.groups_mut()?;
        g.created.push(path.clone());
        g.made.insert(path.clone(), (idle, weight));
        Ok(path)
    }

    /// Forgets what appease moved into `groups` (they are gone or being removed, and
    /// what was in them has left): each move is closed in the journal.
    fn close_moves_into(&mut self, groups: &[String]) {
        let Some(g) = self.groups.as_mut() else {
            return;
        };
        let keys: Vec<TaskKey> = g
            .moved
            .values()
            .filter(|m| groups.contains(&m.to))
            .map(|m| m.key)
            .collect();
        g.moved.retain(|_, m| !groups.contains(&m.to));
        for key in keys {
            let _logged_by_journal = self.journal(Record::Return { key });
        }
    }

    /// Someone removed one of appease's groups (only possible once it is empty): forget
    /// it, so that the next use makes it again. Never fatal.
    fn forget_vanished(&mut self, group: &str) -> Result<(), ActError> {
        let g = self.groups_mut()?;
        if g.cg.exists(group) || !g.created.iter().any(|c| c == group) {
            return Ok(());
        }
        g.created.retain(|c| c != group);
        let mut gone = vec![group.to_string()];
        if g.batch_top_of(group).as_deref() == Some(group) {
            g.batch_remade |= group == g.batch_path();
            // Its jobs' groups went with it (only empty groups can go).
            let jobs: Vec<String> = g
                .created
                .iter()
                .filter(|c| g.batch_top_of(c).as_deref() == Some(group))
                .cloned()
                .collect();
            for c in &jobs {
                g.made.remove(c);
            }
            g.created.retain(|c| !jobs.contains(c));
            gone.extend(jobs);
        }
        tracing::warn!(
            group,
            "one of appease's groups vanished; it is made again on next use"
        );
        // What was moved into a vanished group has left it: nothing to undo.
        self.close_moves_into(&gone);
        for path in gone {
            self.journal(Record::GroupRemoved { path })?;
        }
        Ok(())
    }

    /// Makes a vanished group again as it was first made (a job's group inside its
    /// parent, made again first if it vanished too).
    fn remake(&mut self, group: &str) -> Result<(), ActError> {
        self.forget_vanished(group)?;
        let g = self.groups_mut()?;
        let (idle, weight) = g.made.get(group).copied().unwrap_or((false, 100));
        let (parent, name) = group.rsplit_once('/').unwrap_or(("", group));
        let parent = (!parent.is_empty()).then_some(parent);
        if let Some(top) = parent {
            if !self.groups_mut()?.cg.exists(top) {
                self.remake(top)?;
            }
        }
        self.make_group(parent, name, idle, weight)?;
        Ok(())
    }

    /// Removes the groups of jobs that have ended: `alive(root)` says whether the demoted
    /// tree of that root is still there; only the groups of those that are not are read
    /// (not every job's group on every scan), and removed once empty. Returns how many
    /// went.
    pub fn remove_ended_job_groups(&mut self, alive: impl Fn(u32) -> bool) -> usize {
        let Some(g) = self.groups.as_mut() else {
            return 0;
        };
        if self.dry_run {
            return 0;
        }
        let ended: Vec<String> = g
            .created
            .iter()
            .filter(|p| {
                // A job's group is `TOP/job-ROOT` under one of the batch groups.
                let Some(top) = g.batch_top_of(p) else {
                    return false;
                };
                p[top.len()..]
                    .strip_prefix("/job-")
                    .and_then(|root| root.parse().ok())
                    .is_some_and(|root| !alive(root))
            })
            .filter(|p| g.cg.processes(p).is_ok_and(|v| v.is_empty()))
            .cloned()
            .collect();
        let mut removed = 0;
        for path in ended {
            let g = self.groups.as_mut().expect("checked");
            // A fork may have raced the check: the kernel refuses, and it is tried again.
            if g.cg.remove(&path).is_ok() || !g.cg.exists(&path) {
                g.created.retain(|c| c != &path);
                g.made.remove(&path);
                // Its processes have ended: nothing of theirs is left to undo.
                self.close_moves_into(std::slice::from_ref(&path));
                let _logged_by_journal = self.journal(Record::GroupRemoved { path });
                removed += 1;
            }
        }
        removed
    }

    /// Whether a batch group (the idle group, the feeders'), once made, has been removed
    /// by someone since (it is then forgotten, to be made again on next use). A removed
    /// group was empty: nothing that was demoted is in it any more.
    pub fn batch_group_vanished(&mut self) -> bool {
        let Some(g) = self.groups.as_ref().filter(|_| !self.dry_run) else {
            return false;
        };
        let vanished: Vec<String> = [g.batch_path(), g.feeders_path()]
            .into_iter()
            .filter(|p| g.created.contains(p) && !g.cg.exists(p))
            .collect();
        let mut any = false;
        for path in vanished {
            any |= self.forget_vanished(&path).is_ok();
        }
        any
    }

    /// True once after the batch group vanished (it is made again idle): its mode must
    /// be applied again.
    pub fn take_batch_remade(&mut self) -> bool {
        self.groups
            .as_mut()
            .is_some_and(|g| std::mem::take(&mut g.batch_remade))
    }

    /// Creates a latency service's group with its weight (at daemon start, so that an
    /// unusable path is an error before anything else changes), or gives an existing one
    /// a new weight (a reload changed it).
    pub fn ensure_service_group(&mut self, name: &str, weight: u32) -> Result<String, ActError> {
        let path = self.ensure_group(name, false, weight)?;
        let dry = self.dry_run;
        let g = self.groups_mut()?;
        if g.made.get(&path) != Some(&(false, weight)) {
            if !dry {
                g.cg.set_weight(&path, weight).map_err(cg_err)?;
            }
            g.made.insert(path.clone(), (false, weight));
        }
        Ok(path)
    }

    /// A service removed from the config: its processes go back where they came from and
    /// its group is removed.
    pub fn remove_service_group(&mut self, name: &str) -> RestoreReport {
        let path = format!("/{name}");
        let mut report = RestoreReport::default();
        if self
            .groups
            .as_ref()
            .is_none_or(|g| !g.created.contains(&path))
        {
            return report;
        }
        self.dissolve(
            &path,
            "its service was removed from the config",
            &mut report,
        );
        report
    }

    /// Every process in appease's groups back where it came from, and the groups removed.
    pub(crate) fn restore_groups(&mut self, report: &mut RestoreReport) {
        let Some(g) = self.groups.as_mut() else {
            return;
        };
        if self.dry_run {
            g.created.clear();
            g.moved.clear();
            return;
        }
        let created: Vec<String> = g.created.iter().rev().cloned().collect();
        for group in created {
            self.dissolve_trying(&group, "appease stops", report, 10);
        }
        let g = self.groups.as_mut().expect("checked");
        let keys: Vec<TaskKey> = g.moved.drain().map(|(_, m)| m.key).collect();
        for key in keys {
            let _logged_by_journal = self.journal(Record::Return { key });
        }
    }

    /// Moves every process in `group` (one of appease's) back where it came from, and
    /// removes the group, trying 3 times (a fork may race the moves).
    fn dissolve(&mut self, group: &str, why: &str, report: &mut RestoreReport) {
        self.dissolve_trying(group, why, report, 3)
    }

    /// As `dissolve`, `attempts` times, 50 ms apart after the first misses: at exit,
    /// a process that was exiting as it was moved (one a killed job left, its parent gone)
    /// keeps the group busy until it is reaped.
    fn dissolve_trying(
        &mut self,
        group: &str,
        why: &str,
        report: &mut RestoreReport,
        attempts: u32,
    ) {
        let Some(g) = self.groups.as_mut() else {
            return;
        };
        if self.dry_run {
            g.created.retain(|c| c != group);
            g.moved.retain(|_, m| m.to != group);
            return;
        }
        for attempt in 0..attempts {
            if attempt >= 2 {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            remove_stray_groups(&g.cg, group);
            for pid in g.cg.processes(group).unwrap_or_default() {
                let origin = |p: u32| {
                    g.moved
                        .get(&p)
                        .filter(|m| sys::task_stat(p, p).is_ok_and(|s| s.start == m.key.start))
                        .map(|m| m.from.clone())
                };
                let to = destination(pid, origin);
                match g.cg.move_process(pid, &to) {
                    Ok(()) => {
                        report.restored += 1;
                        audit!(self.trail, Change::MoveBack, pid, from = group, to, why);
                    }
                    Err(e) if e.is_gone() => report.gone += 1,
                    Err(e) => {
                        tracing::warn!(pid, error = %e, "could not move process back");
                        report.failed += 1;
                    }
                }
            }
            match g.cg.remove(group) {
                Ok(()) => break,
                // A fork raced the moves: go round again.
                Err(e) if attempt + 1 < attempts => {
                    tracing::debug!(error = %e, "group not empty yet")
                }
                Err(e) => {
                    tracing::warn!(group, error = %e, "could not remove group");
                    report.failed += 1;
                }
            }
        }
        let removed = !g.cg.exists(group);
        if removed {
            g.created.retain(|c| c != group);
        }
        self.close_moves_into(&[group.to_string()]);
        if removed {
            let _logged_by_journal = self.journal(Record::GroupRemoved {
                path: group.to_string(),
            });
        }
    }

    /// The batch groups (with their jobs' groups), for reading their members off the
    /// event loop: reading a cgroup.procs per job costs about 15 µs, 0.8 ms a scan with
    /// 48 jobs, which a real-time loop would take from the server it shares a CPU with.
    /// None before one exists, or in a dry run.
    pub fn batch_group(&self) -> Option<BatchGroup> {
        let g = self.groups.as_ref().filter(|_| !self.dry_run)?;
        let paths: Vec<String> = [g.batch_path(), g.feeders_path()]
            .into_iter()
            .filter(|p| g.created.contains(p))
            .collect();
        (!paths.is_empty()).then(|| BatchGroup {
            cg: g.cg.clone(),
            paths,
        })
    }

    /// `Some(weight)` lifts the batch group's cpu.idle and sets the weight (quiet mode,
    /// starvation floor), the feeders' group's too; `None` makes the batch group idle
    /// again and the feeders' of the least weight. Returns false when there is no batch
    /// group yet (each is made in the mode last set) or in a dry run.
    pub fn set_batch_weight(&mut self, weight: Option<u32>, why: &str) -> Result<bool, ActError> {
        let Some(g) = self.groups.as_mut() else {
            return Ok(false);
        };
        g.mode_weight = weight;
        let (batch, feeders) = (g.batch_path(), g.feeders_path());
        let mut set = false;
        if g.created.contains(&feeders) && !self.dry_run {
            let w = weight.unwrap_or(LEAST_WEIGHT);
            set |= self.set_group_mode(&feeders, false, w, why)?;
            self.groups_mut()?.made.insert(feeders, (false, w));
        }
        if self.groups_mut()?.created.contains(&batch) && !self.dry_run {
            set |= self.set_group_mode(&batch, weight.is_none(), weight.unwrap_or(100), why)?;
        }
        Ok(set)
    }

    /// Gives group `p` its weight and makes it idle or not; false when the group is gone
    /// (forgotten, made again on next use).
    fn set_group_mode(
        &mut self,
        p: &str,
        idle: bool,
        weight: u32,
        why: &str,
    ) -> Result<bool, ActError> {
        let g = self.groups_mut()?;
        // As the kernel has it (cpu.shares on v1, cpu.weight on v2).
        let mode_now = || match (g.cg.idle(p), g.cg.weight_raw(p)) {
            (Ok(true), _) => "cpu.idle=1".to_string(),
            (Ok(false), Ok(w)) => format!("cpu.idle=0, weight {w}"),
            _ => "unknown".to_string(),
        };
        let from = mode_now();
        // The kernel refuses a weight on an idle group: idle flag off first, and the
        // weight back before the flag goes on again.
        let set = match idle {
            false => {
                g.cg.set_idle(p, false)
                    .and_then(|()| g.cg.set_weight(p, weight))
            }
            true => {
                g.cg.set_weight(p, weight)
                    .and_then(|()| g.cg.set_idle(p, true))
            }
        };
        match set {
            Ok(()) => {
                let to = mode_now();
                audit!(self.trail, Change::BatchMode, group = p, from, to, why);
                Ok(true)
            }
            Err(e) if !g.cg.exists(p) => {
                tracing::debug!(error = %e, "batch group gone");
                self.forget_vanished(p)?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// After a crash: moves what the journal says back, then empties and removes the groups.
pub(crate) fn restore_journaled(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let state = c.state;
    let mut done = Vec::new();
    if state.moves.is_empty() && state.groups.is_empty() {
        return done;
    }
    let cg = match Cgroups::detect() {
        Ok(cg) => cg,
        Err(e) => {
            tracing::warn!(error = %e, "journal lists cgroup changes but no CPU hierarchy is available");
            report.failed += (state.moves.len() + state.groups.len()) as u32;
            return done;
        }
    };
    let alive =
        |key: &TaskKey| sys::task_stat(key.pid, key.pid).is_ok_and(|s| s.start == key.start);
    for m in state.moves.values() {
        if !alive(&m.key) {
            report.gone += 1;
        } else if cg.group_of(m.key.pid).ok().as_deref() != Some(m.to.as_str()) {
            report.left_alone += 1; // moved by someone else since
        } else {
            match cg.move_process(m.key.pid, &m.from) {
                Ok(()) => report.restored += 1,
                Err(e) if e.is_gone() => report.gone += 1,
                Err(e) => {
                    tracing::warn!(pid = m.key.pid, error = %e, "could not move process back");
                    report.failed += 1;
                    continue;
                }
            }
        }
        done.push(Record::Return { key: m.key });
    }
    let origin = |pid: u32| {
        state
            .moves
            .values()
            .find(|m| m.key.pid == pid && alive(&m.key))
            .map(|m| m.from.clone())
    };
    // A job's group before the idle group it is in (paths sort parent first).
    for group in state.groups.iter().rev() {
        // A process that is exiting stays listed, and keeps the group busy, until it is
        // reaped: tried again for up to 2 s.
        let t = std::time::Instant::now();
        loop {
            remove_stray_groups(&cg, group);
            for pid in cg.processes(group).unwrap_or_default() {
                match cg.move_process(pid, &destination(pid, origin)) {
                    Ok(()) => report.restored += 1,
                    Err(e) if e.is_gone() => {}
                    Err(e) => tracing::warn!(pid, error = %e, "could not move process back"),
                }
            }
            if cg.remove(group).is_ok() {
                done.push(Record::GroupRemoved {
                    path: group.clone(),
                });
                break;
            }
            if t.elapsed() > std::time::Duration::from_secs(2) {
                tracing::warn!(group, "could not remove the group: still busy after 2 s");
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if cg.exists(group) {
            report.failed += 1;
        }
    }
    done
}

/// Empty job groups inside one of ours that no journal names (left by a run killed with
/// its run directory) would keep it from being removed: they go first.
fn remove_stray_groups(cg: &Cgroups, group: &str) {
    let stray = cg.remove_empty_job_groups(group);
    if stray > 0 {
        tracing::info!(
            group,
            stray,
            "removed empty job groups left inside the group"
        );
    }
}

#[cfg(test)]
mod tests;
