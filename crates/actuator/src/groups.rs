//! Moving process trees into appease's idle group and back, journaled like every other
//! change. Processes born inside the group (children of demoted processes) have no
//! journal entry of their own: they go back to where their nearest moved ancestor came
//! from, or to the hierarchy's root.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use appease_cgroup::{CgroupError, Cgroups};
use serde::{Deserialize, Serialize};

use crate::journal::{JournalState, Record, TaskKey};
use crate::{sys, ActError, KernelActuator, RestoreReport};

/// The idle group and what appease moved into it.
pub struct BatchGroup {
    cg: Cgroups,
    name: String,
    /// The group's path once created.
    path: Option<String>,
    moved: HashMap<u32, Moved>,
}

struct Moved {
    key: TaskKey,
    from: String,
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
}

impl BatchGroup {
    /// `name` is a top-level group name, e.g. "appease.batch".
    pub fn new(cg: Cgroups, name: &str) -> Self {
        BatchGroup {
            cg,
            name: name.to_string(),
            path: None,
            moved: HashMap::new(),
        }
    }

    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn cg_err(e: CgroupError) -> ActError {
    ActError::Cgroup(e)
}

fn ppid_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.get(text.rfind(')')? + 1..)?;
    after.split_whitespace().nth(1)?.parse().ok()
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

impl KernelActuator {
    fn batch_mut(&mut self) -> Result<&mut BatchGroup, ActError> {
        self.batch.as_mut().ok_or(ActError::NoCgroups)
    }

    /// Moves the processes of a tree into the idle group (created on first use).
    /// Returns how many moved; vanished processes are skipped.
    pub fn demote(&mut self, root: u32, members: &[u32], why: &str) -> Result<usize, ActError> {
        let dry = self.dry_run;
        let self_pid = self.self_pid;
        if self.batch_mut()?.path.is_none() {
            let path = self.batch_mut()?.path();
            if !dry {
                self.journal(Record::Group { path: path.clone() })?;
                let b = self.batch_mut()?;
                b.cg.ensure_top_group(&b.name, true, 100).map_err(cg_err)?;
            }
            self.batch_mut()?.path = Some(path);
        }
        let group = self.batch_mut()?.path();
        let mut moved = 0;
        for &pid in members {
            if pid == self_pid {
                continue;
            }
            let Ok(stat) = sys::task_stat(pid, pid) else {
                continue;
            };
            let from = match self.batch_mut()?.cg.group_of(pid) {
                Ok(g) => g,
                Err(_) => continue,
            };
            if from == group {
                continue; // born in the group
            }
            let key = TaskKey {
                pid,
                tid: pid,
                start: stat.start,
            };
            if !dry {
                self.journal(Record::Move {
                    key,
                    from: from.clone(),
                    to: group.clone(),
                })?;
                if let Err(e) = self.batch_mut()?.cg.move_process(pid, &group) {
                    self.journal(Record::Return { key })?;
                    if !e.is_gone() {
                        self.counters.failures += 1;
                        tracing::warn!(pid, error = %e, "could not move process into the idle group");
                    }
                    continue;
                }
            }
            self.batch_mut()?.moved.insert(
                pid,
                Moved {
                    key,
                    from,
                    root,
                    comm: stat.comm,
                    why: why.to_string(),
                    since: now_secs(),
                },
            );
            moved += 1;
        }
        self.counters.demotions += moved as u64;
        tracing::info!(root, moved, why, dry_run = dry, "demoted to the idle group");
        Ok(moved)
    }

    /// Moves a tree's processes back where they came from.
    pub fn promote(&mut self, root: u32, members: &[u32]) -> Result<usize, ActError> {
        let dry = self.dry_run;
        let group = self.batch_mut()?.path();
        let mut targets: Vec<u32> = members.to_vec();
        targets.extend(
            self.batch_mut()?
                .moved
                .iter()
                .filter(|(_, m)| m.root == root)
                .map(|(&p, _)| p),
        );
        targets.sort_unstable();
        targets.dedup();
        let root_from = self.batch_mut()?.moved.get(&root).map(|m| m.from.clone());
        let mut back = 0;
        for pid in targets {
            let b = self.batch_mut()?;
            let rec = b.moved.remove(&pid);
            let same = |m: &Moved| sys::task_stat(pid, pid).is_ok_and(|s| s.start == m.key.start);
            let dest = match &rec {
                Some(m) if same(m) => m.from.clone(),
                Some(_) => {
                    self.journal(Record::Return {
                        key: rec.expect("some").key,
                    })?;
                    continue; // gone, pid reused
                }
                None => root_from.clone().unwrap_or_else(|| "/".into()),
            };
            if !dry {
                // Someone else moved it since: leave it where it is.
                if b.cg.group_of(pid).ok().as_deref() == Some(group.as_str()) {
                    if let Err(e) = b.cg.move_process(pid, &dest) {
                        if !e.is_gone() {
                            self.counters.failures += 1;
                            tracing::warn!(pid, error = %e, "could not move process back");
                        }
                    } else {
                        back += 1;
                    }
                }
                if let Some(m) = rec {
                    self.journal(Record::Return { key: m.key })?;
                }
            } else {
                back += 1;
            }
        }
        self.counters.promotions += back as u64;
        tracing::info!(root, back, "promoted out of the idle group");
        Ok(back)
    }

    /// Every process in the idle group back where it came from, and the group removed.
    pub(crate) fn restore_groups(&mut self, report: &mut RestoreReport) {
        let dry = self.dry_run;
        let Some(b) = self.batch.as_mut() else { return };
        let Some(group) = b.path.clone() else { return };
        if dry {
            b.moved.clear();
            b.path = None;
            return;
        }
        for attempt in 0..3 {
            let b = self.batch.as_mut().expect("checked");
            let pids = b.cg.processes(&group).unwrap_or_default();
            for pid in pids {
                let b = self.batch.as_mut().expect("checked");
                let origin = |p: u32| {
                    b.moved
                        .get(&p)
                        .filter(|m| sys::task_stat(p, p).is_ok_and(|s| s.start == m.key.start))
                        .map(|m| m.from.clone())
                };
                let dest = destination(pid, origin);
                match b.cg.move_process(pid, &dest) {
                    Ok(()) => report.restored += 1,
                    Err(e) if e.is_gone() => report.gone += 1,
                    Err(e) => {
                        tracing::warn!(pid, error = %e, "could not move process back");
                        report.failed += 1;
                    }
                }
            }
            let b = self.batch.as_mut().expect("checked");
            match b.cg.remove(&group) {
                Ok(()) => break,
                // A fork raced the moves: go round again.
                Err(e) if attempt < 2 => tracing::debug!(error = %e, "group not empty yet"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not remove the idle group");
                    report.failed += 1;
                }
            }
        }
        let b = self.batch.as_mut().expect("checked");
        let keys: Vec<TaskKey> = b.moved.drain().map(|(_, m)| m.key).collect();
        let removed = !b.cg.exists(&group);
        b.path = None;
        for key in keys {
            let _logged_by_journal = self.journal(Record::Return { key });
        }
        if removed {
            let _logged_by_journal = self.journal(Record::GroupRemoved { path: group });
        }
    }

    /// Processes now in the idle group (none before it exists, or in a dry run).
    pub fn batch_processes(&self) -> Vec<u32> {
        match &self.batch {
            Some(BatchGroup {
                cg, path: Some(p), ..
            }) if !self.dry_run => cg.processes(p).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The starvation floor: `Some(weight)` lifts cpu.idle and sets the weight; `None`
    /// makes the group idle again.
    pub fn set_batch_floor(&mut self, floor: Option<u32>) -> Result<(), ActError> {
        if self.dry_run {
            return Ok(());
        }
        let Some(BatchGroup {
            cg, path: Some(p), ..
        }) = &self.batch
        else {
            return Ok(());
        };
        // The kernel refuses a weight on an idle group: idle flag off first, and the
        // weight back before the flag goes on again.
        match floor {
            Some(weight) => {
                cg.set_idle(p, false)?;
                cg.set_weight(p, weight)?;
            }
            None => {
                cg.set_weight(p, 100)?;
                cg.set_idle(p, true)?;
            }
        }
        Ok(())
    }

    pub fn moved(&self) -> Vec<MovedView> {
        let Some(b) = &self.batch else { return vec![] };
        let group = b.path();
        let mut v: Vec<MovedView> = b
            .moved
            .iter()
            .map(|(&pid, m)| MovedView {
                pid,
                comm: m.comm.clone(),
                class: "batch".into(),
                group: group.clone(),
                original_group: m.from.clone(),
                tree: m.root,
                why: m.why.clone(),
                since: m.since,
            })
            .collect();
        v.sort_by_key(|m| m.pid);
        v
    }
}

/// After a crash: moves what the journal says back, then empties and removes the groups.
pub(crate) fn restore_journal_groups(
    state: &JournalState,
    report: &mut RestoreReport,
) -> Vec<Record> {
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
    for group in &state.groups {
        for _ in 0..3 {
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
        }
        if cg.exists(group) {
            report.failed += 1;
        }
    }
    done
}
