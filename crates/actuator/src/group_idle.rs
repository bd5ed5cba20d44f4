//! Other programs' cgroups made idle where they are (cgroup v1, or v2 without systemd):
//! a container's or a pod's cgroup, or a limited group, that holds nothing but batch. Its
//! processes stay, its limits bind as before, and the class applies to it as a whole.
//! The idle flag and the weight file are journaled first; going back sets the flag off,
//! then the weight (the kernel resets a group's weight when its idle flag goes off, and
//! refuses a weight while it is on).

use appease_cgroup::Cgroups;

use crate::groups::MovedView;
use crate::in_place::{take_whole, Demoting, InPlace};
use crate::journal::Record;
use crate::restore::FromJournal;
use crate::trail::{audit, Change};
use crate::{ActError, KernelActuator, RestoreReport};

pub(crate) struct IdleGroup {
    pub idle: bool,
    pub weight: String,
    /// The demoted tree it was made idle for, with its processes then; None for a class
    /// by rule (a pod's tier).
    pub root: Option<u32>,
    pub pids: Vec<u32>,
    pub why: String,
    pub since: u64,
}

/// Why a container engine's parent group is idle.
const ALL_CONTAINERS_BATCH: &str = "every container in it is batch";

/// The group that holds a container engine's containers (`/docker`, `/machine.slice`,
/// `/lxc.payload`...), when a container made idle in place has one below the root. An
/// idle container under a non-idle parent still competes, through that parent, as one
/// normal-weight entity with the host's servers at the root (measured: the server's p99
/// as with no appease at all); an idle parent is a sibling of the latency work. Never a
/// Kubernetes tier or the pods' root: the kubelet writes their weights, which the kernel
/// refuses on an idle group.
fn engine_parent(container_group: &str) -> Option<String> {
    let c = appease_cgroup::container_of(container_group)?;
    if c.group != container_group || c.runtime == "kubernetes" {
        return None;
    }
    let parent = &c.group[..c.group.rfind('/')?];
    (!parent.is_empty()).then(|| parent.to_string())
}

/// Whether `group` is `ancestor` or below it.
pub(crate) fn is_below(group: &str, ancestor: &str) -> bool {
    group == ancestor
        || group
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `group` is still as appease left it: idle, or (`weighted`: a server's branch)
/// at the raised weight. A group found otherwise was changed by someone since (an
/// administrator's `cpu.idle` or weight) and is theirs: a stop or a restore leaves it.
/// After a crash between the journal's record and the write, the group reads as it
/// was, and is rightly left so too.
fn as_left(cg: &Cgroups, group: &str, weighted: bool) -> bool {
    match weighted {
        true => crate::server_weight::as_left(cg, group),
        false => cg.idle(group).unwrap_or(false),
    }
}

fn put_back(
    cg: &Cgroups,
    path: &str,
    idle: bool,
    weight: &str,
) -> Result<(), appease_cgroup::CgroupError> {
    cg.set_idle(path, idle)?;
    if !idle {
        cg.set_weight_raw(path, weight)?;
    }
    Ok(())
}

impl KernelActuator {
    /// The cgroup hierarchy, when appease writes other programs' groups itself: not
    /// without groups, and not on a systemd host (its tree is changed through its bus).
    pub(crate) fn cgroups_written_here(&self) -> Option<Cgroups> {
        let g = self.groups.as_ref()?;
        (!g.systemd_owned()).then(|| g.cgroups().clone())
    }

    /// Makes `group` idle in place. Returns true when it changed something: a first
    /// change, or a change someone undid since (a kubelet rewriting a pod's settings),
    /// applied again.
    pub fn idle_group_in_place(
        &mut self,
        group: &str,
        root: Option<u32>,
        pids: &[u32],
        why: &str,
    ) -> Result<bool, ActError> {
        let cg = self
            .groups
            .as_ref()
            .ok_or(ActError::NoCgroups)?
            .cgroups()
            .clone();
        if self
            .idle_groups
            .get(group)
            .is_some_and(|g| g.why == crate::server_weight::SERVES_BESIDE_BATCH)
        {
            // Weighted up for a server beside batch, and now batch itself: its weight back
            // first, then made idle as a group of batch.
            self.unidle_group(
                group,
                "it is to be made idle",
                &mut RestoreReport::default(),
            );
        }
        if let Some(g) = self.idle_groups.get_mut(group) {
            // A tree that ended or re-rooted handed it over: this tree's promotion gives
            // it back. A pod's class by rule stays the rule's.
            if g.root.is_some() && root.is_some() {
                g.root = root;
                g.pids = pids.to_vec();
            }
            if self.dry_run || cg.idle(group).unwrap_or(true) {
                return Ok(false);
            }
            tracing::warn!(group, why = %g.why, "someone made the group non-idle again: applied again");
            cg.set_idle(group, true)?;
            audit!(
                self.trail,
                Change::Group,
                group,
                tree = g.root,
                from = "cpu.idle=0",
                to = "cpu.idle=1",
                why = g.why.as_str()
            );
            return Ok(true);
        }
        let (idle, weight) = (cg.idle(group)?, cg.weight_raw(group)?);
        if idle {
            return Ok(false); // idle already, by someone else's choice: not ours to undo
        }
        self.change_group(group, (idle, &weight), || cg.set_idle(group, true))?;
        let from = format!("cpu.idle=0, weight {weight}");
        audit!(
            self.trail,
            Change::Group,
            group,
            tree = root,
            from,
            to = "cpu.idle=1",
            why,
            dry_run = self.dry_run.then_some(true)
        );
        self.idle_groups.insert(
            group.to_string(),
            IdleGroup {
                idle,
                weight,
                root,
                pids: pids.to_vec(),
                why: why.to_string(),
                since: crate::now_secs(),
            },
        );
        Ok(true)
    }

    /// Journals what `group` has (`before`: its idle flag and weight), then makes `change`
    /// to it; a change the kernel refuses is closed in the journal at once. Nothing in a dry run.
    pub(crate) fn change_group(
        &mut self,
        group: &str,
        (idle, weight): (bool, &str),
        change: impl FnOnce() -> Result<(), appease_cgroup::CgroupError>,
    ) -> Result<(), ActError> {
        if self.dry_run {
            return Ok(());
        }
        let path = group.to_string();
        let weight = weight.to_string();
        self.journal(Record::GroupIdle { path, idle, weight })?;
        if let Err(e) = change() {
            let path = group.to_string();
            let _logged_by_journal = self.journal(Record::GroupUnidle { path });
            self.counters.fail_errno(e.os_error());
            return Err(e.into());
        }
        Ok(())
    }

    /// On a host without systemd: the in-place processes whose container (or, outside
    /// containers, own cgroup) holds nothing but this tree's processes make that group
    /// idle as a whole. Returns how many processes were demoted so, and the rest (for
    /// `idle_in_place`, per thread).
    pub(crate) fn idle_whole_groups(&mut self, tree: &Demoting, procs: &mut Vec<InPlace>) -> usize {
        let Some(g) = self.groups.as_ref() else {
            return 0;
        };
        if g.systemd_owned() || procs.is_empty() {
            return 0;
        }
        let cg = g.cgroups().clone();
        let members: std::collections::HashSet<u32> = tree.members.iter().copied().collect();
        let container_or_own = |p: &InPlace| {
            appease_cgroup::container_of(&p.group).map_or_else(|| p.group.clone(), |c| c.group)
        };
        take_whole(procs, container_or_own, |group, pids| {
            let whole = group != "/"
                && cg
                    .processes_below(group)
                    .is_ok_and(|all| all.iter().all(|p| members.contains(p)));
            whole
                && match self.idle_group_in_place(group, Some(tree.root), pids, tree.why) {
                    Ok(_) => self.idle_groups.contains_key(group),
                    Err(e) => {
                        tracing::warn!(group, error = %e, "could not make the group idle: per thread");
                        false
                    }
                }
        })
    }

    /// Kubernetes BestEffort pods are the idle class as a whole, at pod level (not the
    /// tier: the kubelet writes tier weights, which the kernel refuses on an idle group).
    /// Called on every scan: new pods are made idle, pods the kubelet rewrote are made
    /// idle again, deleted ones are forgotten. On a systemd host (the kubelet's systemd
    /// driver) the pods are slices of systemd's, set through the bus (`unit_weight`).
    /// Returns how many pods changed.
    pub fn keep_besteffort_pods_idle(&mut self) -> usize {
        let Some(cg) = self.groups.as_ref().map(|g| g.cgroups().clone()) else {
            return 0;
        };
        if self.via_units() {
            return self.keep_besteffort_units_idle(&cg);
        }
        let pods = cg.besteffort_pods();
        self.forget_vanished_idle_groups();
        let mut changed = 0;
        for pod in pods {
            match self.idle_group_in_place(&pod, None, &[], "Kubernetes BestEffort pod") {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(pod, error = %e, "could not make the pod idle"),
            }
        }
        changed
    }

    /// A container engine's parent group is idle while everything in it is in containers
    /// made idle for demoted trees (`engine_parent`); it goes back once something else
    /// runs there. Called on every scan, and on every exec (`on_exec`), so that a new
    /// container is not born idle for longer than the exec takes to arrive. Returns how
    /// many parents changed.
    pub fn keep_engine_parents_idle(&mut self) -> usize {
        let Some(cg) = self.cgroups_written_here() else {
            return 0;
        };
        self.forget_vanished_idle_groups();
        let parents: std::collections::BTreeSet<String> = self
            .idle_groups
            .iter()
            .filter_map(|(path, g)| {
                if g.why == ALL_CONTAINERS_BATCH {
                    Some(path.clone())
                } else {
                    g.root.and_then(|_| engine_parent(path))
                }
            })
            .collect();
        let mut changed = 0;
        for parent in parents {
            let ours = self
                .idle_groups
                .get(&parent)
                .is_some_and(|g| g.why == ALL_CONTAINERS_BATCH);
            let all_batch = self.only_idle_containers_below(&cg, &parent);
            if all_batch {
                match self.idle_group_in_place(&parent, None, &[], ALL_CONTAINERS_BATCH) {
                    Ok(true) => changed += 1,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(parent, error = %e, "could not make the containers' parent idle")
                    }
                }
            } else if ours {
                let why = "something else runs in the containers' parent";
                self.unidle_group(&parent, why, &mut RestoreReport::default());
                changed += 1;
            }
        }
        changed
    }

    /// Whether an exec can change a decision now: an engine's parent is idle, or a
    /// branch is idle (`branch`).
    pub fn wants_exec_events(&self) -> bool {
        self.idle_groups
            .values()
            .any(|g| g.why == ALL_CONTAINERS_BATCH || g.why == crate::branch::ONLY_BATCH_BUSY)
            || !self.branch_units(crate::branch::ONLY_BATCH_BUSY).is_empty()
    }

    /// A process exec'd: below an idle branch of ours and not batch, the branch goes back
    /// now; under a containers' parent made idle and outside every container made idle (a
    /// container just started), the parent goes back now.
    pub fn on_exec(&mut self, pid: u32) {
        self.on_exec_in_branches(pid);
        let parents = crate::keys_where(&self.idle_groups, |g| g.why == ALL_CONTAINERS_BATCH);
        if parents.is_empty() {
            return;
        }
        let Some(group) = self
            .groups
            .as_ref()
            .and_then(|g| g.cgroups().group_of(pid).ok())
        else {
            return;
        };
        if parents.iter().any(|p| is_below(&group, p))
            && !self.in_a_group_made_idle_for_a_tree(&group)
        {
            self.keep_engine_parents_idle();
        }
    }

    /// Whether `group` is at or below a group (a container's, a pod's, a limited one) made
    /// idle for a demoted tree.
    pub(crate) fn in_a_group_made_idle_for_a_tree(&self, group: &str) -> bool {
        self.idle_groups
            .iter()
            .any(|(path, g)| g.root.is_some() && is_below(group, path))
            || self
                .idle_units
                .values()
                .any(|u| u.root != 0 && is_below(group, &u.cgroup))
    }

    /// Whether every process below `parent` is in a container made idle for a demoted
    /// tree (and there is at least one).
    fn only_idle_containers_below(&self, cg: &Cgroups, parent: &str) -> bool {
        let Ok(pids) = cg.processes_below(parent) else {
            return false;
        };
        !pids.is_empty()
            && pids.iter().all(|&p| {
                cg.group_of(p)
                    // Gone since: it no longer runs there.
                    .map_or(true, |g| {
                        g != parent && self.in_a_group_made_idle_for_a_tree(&g)
                    })
            })
    }

    /// Groups made idle for a tree none of whose recorded processes is alive go back.
    pub(crate) fn release_ended_groups(&mut self) {
        let ended: Vec<String> = self
            .idle_groups
            .iter()
            .filter(|(_, g)| {
                g.root.is_some() && !g.pids.iter().any(|&p| crate::in_place::process_alive(p))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut report = RestoreReport::default();
        for group in ended {
            self.unidle_group(&group, "the demoted tree ended", &mut report);
        }
    }

    /// Groups made idle in place that are gone (a pod deleted): forgotten.
    pub fn forget_vanished_idle_groups(&mut self) {
        let Some(cg) = self.groups.as_ref().map(|g| g.cgroups().clone()) else {
            return;
        };
        let gone: Vec<String> = self
            .idle_groups
            .keys()
            .filter(|p| !cg.exists(p))
            .cloned()
            .collect();
        for path in gone {
            self.idle_groups.remove(&path);
            let _logged_by_journal = self.journal(Record::GroupUnidle { path });
        }
    }

    pub(crate) fn unidle_group(&mut self, path: &str, why: &str, report: &mut RestoreReport) {
        let Some(g) = self.idle_groups.remove(path) else {
            return;
        };
        let Some(cg) = self.groups.as_ref().map(|g| g.cgroups().clone()) else {
            return;
        };
        let weighted = g.why == crate::server_weight::SERVES_BESIDE_BATCH;
        if !self.dry_run && cg.exists(path) && !as_left(&cg, path, weighted) {
            // Someone set its weight or idle flag since: theirs now.
            tracing::info!(
                path,
                "the group's idle flag or weight was changed by someone else since: left as it is"
            );
            report.left_alone += 1;
            let _logged_by_journal = self.journal(Record::GroupUnidle {
                path: path.to_string(),
            });
            return;
        }
        if !self.dry_run {
            match put_back(&cg, path, g.idle, &g.weight) {
                Ok(()) => {
                    report.restored += 1;
                    let to = format!("cpu.idle={}, weight {}", u8::from(g.idle), g.weight);
                    let from = if weighted {
                        "weight raised"
                    } else {
                        "cpu.idle=1"
                    };
                    audit!(
                        self.trail,
                        Change::Group,
                        group = path,
                        tree = g.root,
                        from,
                        to,
                        why
                    );
                }
                Err(_) if !cg.exists(path) => report.gone += 1,
                Err(e) => {
                    tracing::warn!(path, error = %e, "could not put the group's idle flag and weight back");
                    report.failed += 1;
                    self.idle_groups.insert(path.to_string(), g);
                    return;
                }
            }
        }
        let _logged_by_journal = self.journal(Record::GroupUnidle {
            path: path.to_string(),
        });
    }

    /// Groups made idle for the demoted tree `root` go back. Returns how many.
    pub(crate) fn unidle_groups_of(&mut self, root: u32) -> usize {
        let paths: Vec<String> = crate::keys_where(&self.idle_groups, |g| g.root == Some(root));
        let mut report = RestoreReport::default();
        for p in &paths {
            self.unidle_group(p, "promoted out of the idle class", &mut report);
        }
        (report.restored + report.gone) as usize
    }

    pub(crate) fn restore_idle_groups(&mut self, report: &mut RestoreReport) {
        let paths: Vec<String> = crate::keys_where(&self.idle_groups, |_| true);
        for p in paths {
            self.unidle_group(&p, "appease stops", report);
        }
    }

    /// Groups made idle in place, one line each, for `appease status`.
    pub(crate) fn idle_group_views(&self) -> Vec<MovedView> {
        self.idle_groups
            .iter()
            .map(|(path, g)| {
                let weighted = g.why == crate::server_weight::SERVES_BESIDE_BATCH;
                MovedView {
                    pid: 0,
                    comm: "(cgroup)".into(),
                    // Not a process of either class: a server's branch weighted up.
                    class: if weighted { "weighted" } else { "batch" }.into(),
                    group: path.clone(),
                    original_group: path.clone(),
                    tree: g.root.unwrap_or(0),
                    why: g.why.clone(),
                    since: g.since,
                    placement: if weighted {
                        format!(
                            "in place: its weight raised to {} (cgroup v2 units)",
                            crate::server_weight::RAISED_WEIGHT
                        )
                    } else {
                        "in place: the group is idle".into()
                    },
                }
            })
            .collect()
    }
}

/// After a crash: every group the journal says was made idle in place gets its idle flag
/// and weight back.
pub(crate) fn restore_journaled(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let state = c.state;
    let mut done = Vec::new();
    if state.idle_groups.is_empty() {
        return done;
    }
    let Ok(cg) = Cgroups::detect() else {
        report.failed += state.idle_groups.len() as u32;
        return done;
    };
    for (path, (idle, weight)) in &state.idle_groups {
        // The journal does not say which of the two it was: either state is appease's.
        if cg.exists(path) && !as_left(&cg, path, false) && !as_left(&cg, path, true) {
            tracing::info!(
                path,
                "the group's idle flag or weight was changed by someone else since: left as it is"
            );
            report.left_alone += 1;
            done.push(Record::GroupUnidle { path: path.clone() });
            continue;
        }
        match put_back(&cg, path, *idle, weight) {
            Ok(()) => report.restored += 1,
            Err(_) if !cg.exists(path) => report.gone += 1,
            Err(e) => {
                tracing::warn!(path, error = %e, "could not put the group's idle flag and weight back");
                report.failed += 1;
                continue;
            }
        }
        done.push(Record::GroupUnidle { path: path.clone() });
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_parent_is_the_group_above_a_container_never_a_pod_tier_or_the_root() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(
            engine_parent(&format!("/docker/{id}")).as_deref(),
            Some("/docker")
        );
        assert_eq!(
            engine_parent(&format!("/system.slice/docker-{id}.scope")).as_deref(),
            Some("/system.slice")
        );
        // Only for the container's own group, not a group inside it.
        assert_eq!(engine_parent(&format!("/docker/{id}/inner")), None);
        assert_eq!(
            engine_parent("/kubepods/besteffort/pod1234-abcd"),
            None,
            "the kubelet owns the tiers"
        );
        assert_eq!(engine_parent("/user.slice"), None, "not a container");
    }

    #[test]
    fn below_means_the_group_itself_or_a_path_under_it_not_a_name_that_starts_alike() {
        assert!(is_below("/docker", "/docker"));
        assert!(is_below("/docker/abc", "/docker"));
        assert!(!is_below("/docker2/abc", "/docker"));
        assert!(!is_below("/", "/docker"));
    }
}
