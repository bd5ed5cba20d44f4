//! Moving a process tree into one of appease's groups and back: each move journaled
//! before it is made, children born inside going back with their nearest moved ancestor.

use super::*;

impl KernelActuator {
    /// Moves the processes of a tree into the idle group (created on first use).
    /// Returns how many moved; vanished processes are skipped.
    /// Processes whose cgroup must not be left (a limit, a container, systemd's tree)
    /// stay where they are, each of their threads in SCHED_IDLE instead (`in_place`).
    /// Returns how many processes were demoted either way. `members` are (PID, start
    /// time) as the scan saw them: a process that ended since, its PID reused by another,
    /// is not touched.
    /// With `feeders`, the tree (one that feeds on a server's responses) goes to the
    /// feeders' group instead (see `Groups::feeders_path`).
    pub fn demote(
        &mut self,
        root: u32,
        members: &[(u32, u64)],
        why: &str,
        feeders: bool,
    ) -> Result<usize, ActError> {
        let members = &as_the_scan_saw(members)[..];
        let (mut to_move, mut in_place) = (Vec::new(), Vec::new());
        for &pid in members {
            let g = self.groups_mut()?;
            if g.moved.contains_key(&pid) {
                continue;
            }
            let Ok(from) = g.cg.group_of(pid) else {
                continue; // gone
            };
            match g.boundary(&from) {
                Some(reason) => in_place.push(InPlace {
                    pid,
                    group: from,
                    reason,
                }),
                None => to_move.push(pid),
            }
        }
        let mut moved = 0;
        if !to_move.is_empty() {
            let g = self.groups_mut()?;
            let top = match feeders {
                // Made in the batch groups' mode: the least weight while the idle group is
                // idle, the same weight as it when it is not.
                true => {
                    let (name, weight) = (g.feeders_name(), g.mode_weight.unwrap_or(LEAST_WEIGHT));
                    self.ensure_group(&name, false, weight)?
                }
                false => {
                    let name = g.batch_name.clone();
                    self.ensure_group(&name, true, 100)?
                }
            };
            let group = self.ensure_job_group(&top, &format!("job-{root}"))?;
            moved = self.move_into(&group, "batch", root, &to_move, why)?;
            tracing::info!(
                root,
                moved,
                why,
                group = top,
                dry_run = self.dry_run,
                "demoted to a batch group"
            );
        }
        let tree = Demoting { root, members, why };
        let whole = self.idle_whole_units(&tree, &mut in_place);
        let groups = self.idle_whole_groups(&tree, &mut in_place);
        if groups > 0 {
            // The last container of an engine made idle: its parent too, now.
            self.keep_engine_parents_idle();
        }
        let whole = whole + groups;
        let idled = whole + self.idle_in_place(root, &in_place, why);
        self.counters.demotions += (moved + idled) as u64;
        Ok(moved + idled)
    }

    /// Moves processes found in a demoted tree since its demotion into the group its
    /// moved members went to (a process forked before its parent moved was born
    /// outside). Those born inside, and trees that stayed in place, are left as they are.
    /// `members` are (PID, start time) as the scan saw them. Returns how many moved.
    pub fn follow(&mut self, root: u32, members: &[(u32, u64)]) -> Result<usize, ActError> {
        let Some(g) = self.groups.as_mut() else {
            return Ok(0); // no cgroups: nothing was moved
        };
        let Some((group, why)) = g
            .moved
            .values()
            .find(|m| m.root == root && m.class == "batch")
            .map(|m| (m.to.clone(), m.why.clone()))
        else {
            return Ok(0);
        };
        let moved = self.move_into(&group, "batch", root, &as_the_scan_saw(members), &why)?;
        if moved > 0 {
            tracing::info!(root, moved, group, "followed its tree into the batch group");
            self.counters.demotions += moved as u64;
        }
        Ok(moved)
    }

    /// Moves processes of a latency service into its group (see ensure_service_group).
    pub fn place_in_service(
        &mut self,
        group: &str,
        root: u32,
        members: &[u32],
        why: &str,
    ) -> Result<usize, ActError> {
        let moved = self.move_into(group, "latency", root, members, why)?;
        if moved > 0 {
            tracing::info!(root, moved, group, "placed in its service group");
        }
        Ok(moved)
    }

    fn move_into(
        &mut self,
        group: &str,
        class: &'static str,
        root: u32,
        members: &[u32],
        why: &str,
    ) -> Result<usize, ActError> {
        let (dry, self_pid) = (self.dry_run, self.self_pid);
        let mut moved = 0;
        for &pid in members {
            if pid == self_pid || self.groups_mut()?.moved.contains_key(&pid) {
                continue;
            }
            let Ok(stat) = sys::task_stat(pid, pid) else {
                continue;
            };
            // hands_off: never demoted, never placed in a service group.
            if self.exceptions.contains(&stat.comm) {
                continue;
            }
            let Ok(from) = self.groups_mut()?.cg.group_of(pid) else {
                continue;
            };
            if from == group {
                continue; // born in the group
            }
            if class == "batch" && self.groups_mut()?.in_batch(&from) {
                continue; // demoted already, in another job's group: it stays there
            }
            if let Some(reason) = self.groups_mut()?.boundary(&from) {
                let g = self.groups_mut()?;
                if g.stayed.insert(pid, stat.start) != Some(stat.start) {
                    tracing::info!(pid, group, from, reason, "left in its cgroup");
                }
                continue;
            }
            let key = TaskKey {
                pid,
                tid: pid,
                start: stat.start,
            };
            if !dry && !self.move_journaled(key, &from, group)? {
                continue;
            }
            let change = if class == "batch" {
                Change::Demote
            } else {
                Change::Place
            };
            audit!(
                self.trail,
                change,
                pid,
                comm = stat.comm.as_str(),
                tree = root,
                from,
                to = group,
                why,
                dry_run = dry.then_some(true)
            );
            self.groups_mut()?.moved.insert(
                pid,
                Moved {
                    key,
                    from,
                    to: group.to_string(),
                    class,
                    root,
                    comm: stat.comm,
                    why: why.to_string(),
                    since: now_secs(),
                },
            );
            moved += 1;
        }
        Ok(moved)
    }

    /// Moves process `key` from `from` into `group`, journaled first (a group that
    /// vanished is made again); false when it did not move (gone, refused, or its PID
    /// reused meanwhile: then it is put back at once).
    fn move_journaled(&mut self, key: TaskKey, from: &str, group: &str) -> Result<bool, ActError> {
        let pid = key.pid;
        self.journal(Record::Move {
            key,
            from: from.to_string(),
            to: group.to_string(),
        })?;
        let mut result = self.groups_mut()?.cg.move_process(pid, group);
        if result.is_err() && !self.groups_mut()?.cg.exists(group) {
            self.remake(group)?;
            result = self.groups_mut()?.cg.move_process(pid, group);
        }
        if let Err(e) = result {
            self.journal(Record::Return { key })?;
            if !e.is_gone() {
                self.counters.fail_errno(e.os_error());
                tracing::warn!(pid, group, error = %e, "could not move process");
            }
            return Ok(false);
        }
        // Between one process of the tree and the next.
        crate::crash_point("cgroup-moved");
        // The process ended and its PID was reused between the check above and
        // the write: the newcomer is not ours to move. It goes back at once.
        if sys::task_stat(pid, pid).map_or(true, |s| s.start != key.start) {
            let _gone_too = self.groups_mut()?.cg.move_process(pid, from);
            self.journal(Record::Return { key })?;
            tracing::warn!(pid, group, "the PID was reused while it moved: put back");
            return Ok(false);
        }
        Ok(true)
    }

    /// Moves a demoted tree's processes back where they came from.
    pub fn promote(&mut self, root: u32, members: &[u32]) -> Result<usize, ActError> {
        let mut targets: Vec<u32> = members.to_vec();
        let g = self.groups_mut()?;
        targets.extend(
            g.moved
                .iter()
                .filter(|(_, m)| m.root == root && g.in_batch(&m.to))
                .map(|(&p, _)| p),
        );
        targets.sort_unstable();
        targets.dedup();
        let root_from = g.moved.get(&root).map(|m| m.from.clone());
        let fallback = root_from.unwrap_or_else(|| "/".into());
        let mut back = 0;
        for pid in targets {
            let g = self.groups_mut()?;
            if g.moved.get(&pid).is_some_and(|m| !g.in_batch(&m.to)) {
                continue; // in another of appease's groups
            }
            // Its job's group (born there, or moved), or the idle group itself: where
            // it is, if that is in the idle group.
            let group =
                g.cg.group_of(pid)
                    .ok()
                    .filter(|c| g.in_batch(c))
                    .or_else(|| g.moved.get(&pid).map(|m| m.to.clone()))
                    .unwrap_or_else(|| g.batch_path());
            back +=
                self.move_back(pid, &group, &fallback, "promoted out of the idle class")? as usize;
        }
        let unidled = self.unidle_tree(root, members)
            + self.unidle_units_of(root)
            + self.unidle_groups_of(root);
        self.counters.promotions += (back + unidled) as u64;
        tracing::info!(root, back, unidled, "promoted out of the idle class");
        Ok(back + unidled)
    }

    /// Moves `pid` out of appease's `group`, back to the group it came from (`fallback`
    /// for a process appease did not move itself: one born there). True if it moved.
    fn move_back(
        &mut self,
        pid: u32,
        group: &str,
        fallback: &str,
        why: &str,
    ) -> Result<bool, ActError> {
        let dry = self.dry_run;
        let g = self.groups_mut()?;
        let rec = g.moved.remove(&pid);
        let same = |m: &Moved| sys::task_stat(pid, pid).is_ok_and(|s| s.start == m.key.start);
        let dest = match &rec {
            Some(m) if same(m) => m.from.clone(),
            Some(m) => {
                let key = m.key;
                self.journal(Record::Return { key })?;
                return Ok(false); // gone, pid reused
            }
            None => fallback.to_string(),
        };
        if dry {
            return Ok(true);
        }
        let mut back = false;
        // Someone else moved it since: leave it where it is.
        if g.cg.group_of(pid).ok().as_deref() == Some(group) {
            match g.cg.move_process(pid, &dest) {
                Ok(()) => {
                    back = true;
                    audit!(
                        self.trail,
                        Change::MoveBack,
                        pid,
                        from = group,
                        to = dest,
                        why
                    );
                }
                Err(e) if e.is_gone() => {}
                Err(e) => {
                    self.counters.fail_errno(e.os_error());
                    tracing::warn!(pid, error = %e, "could not move process back");
                }
            }
        }
        if let Some(m) = rec {
            self.journal(Record::Return { key: m.key })?;
        }
        Ok(back)
    }

    /// One process of a demoted tree back where it came from, the rest of the tree
    /// staying (the config now exempts it). True if it was demoted.
    pub fn release_process(&mut self, pid: u32) -> Result<bool, ActError> {
        let unidled = self.unidle_process(pid) > 0;
        let Some(g) = self.groups.as_ref() else {
            return Ok(unidled);
        };
        let group = g
            .moved
            .get(&pid)
            .map(|m| m.to.clone())
            .or_else(|| g.cg.group_of(pid).ok().filter(|c| g.in_batch(c)))
            .unwrap_or_else(|| g.batch_path());
        let fallback = destination(pid, |p| g.moved.get(&p).map(|m| m.from.clone()));
        let why = "exempted by the config (hands_off)";
        Ok(self.move_back(pid, &group, &fallback, why)? || unidled)
    }

    /// Processes in appease's groups whose name is now an exception go back where they
    /// came from. Returns how many moved.
    pub fn release_excepted_processes(&mut self) -> usize {
        let Some(g) = self.groups.as_ref() else {
            return 0;
        };
        let excepted: Vec<(u32, String)> = g
            .moved
            .iter()
            .filter(|(_, m)| self.exceptions.contains(&m.comm))
            .map(|(&pid, m)| (pid, m.to.clone()))
            .collect();
        let mut back = 0;
        for (pid, group) in excepted {
            match self.move_back(pid, &group, "/", "now an exception (hands_off)") {
                Ok(moved) => back += moved as usize,
                Err(e) => tracing::warn!(pid, error = %e, "could not release an exception"),
            }
        }
        back
    }

    /// Whether appease moved `pid` into one of its groups.
    /// Whether appease moved `pid` into one of its groups, or decided to leave it in
    /// its own (a boundary: see `Groups::boundary`).
    pub fn is_moved(&self, pid: u32) -> bool {
        self.groups.as_ref().is_some_and(|g| {
            g.moved.contains_key(&pid)
                || g.stayed
                    .get(&pid)
                    .is_some_and(|&start| sys::task_stat(pid, pid).is_ok_and(|s| s.start == start))
        })
    }

    pub fn moved(&self) -> Vec<MovedView> {
        let Some(g) = &self.groups else {
            return self.idled_views();
        };
        let mut v: Vec<MovedView> = g
            .moved
            .iter()
            .map(|(&pid, m)| MovedView {
                pid,
                comm: m.comm.clone(),
                class: m.class.into(),
                group: m.to.clone(),
                original_group: m.from.clone(),
                tree: m.root,
                why: m.why.clone(),
                since: m.since,
                placement: "moved".into(),
            })
            .chain(self.idled_views())
            .chain(self.idle_group_views())
            .chain(self.branch_unit_views())
            .collect();
        v.sort_by_key(|m| m.pid);
        v
    }
}

/// The PIDs of `members` (PID, start time) that are still the processes the scan saw: one
/// that ended since, its PID reused by another, is left out.
fn as_the_scan_saw(members: &[(u32, u64)]) -> Vec<u32> {
    members
        .iter()
        .filter(|&&(pid, start)| {
            let same = sys::task_stat(pid, pid).is_ok_and(|s| s.start == start);
            if !same {
                tracing::debug!(
                    pid,
                    "not the process the scan saw (ended, or its PID reused): skipped"
                );
            }
            same
        })
        .map(|&(pid, _)| pid)
        .collect()
}
