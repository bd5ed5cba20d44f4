//! The servers' branch weighted up where it meets a batch whose branch cannot be idle.
//!
//! A server and a batch tree meet at the level of the cgroup tree where their branches
//! part: `/system.slice` against `/docker` for a build in a container. When the batch's
//! side there cannot be made idle (the container also runs a server, the session also
//! has someone typing), its threads in `SCHED_IDLE` compete only among their group's
//! tasks, and its branch keeps full weight at the meeting level. So the server's side is
//! given the highest weight cgroup v2 allows there (a hundred times the default) while it
//! serves beside such batch: its share under contention is then a hundred to one, while
//! the batch keeps whatever the server leaves (weight only matters when both want the
//! CPU); a weight does not make its wake-ups preempt the batch's branch as an idle one
//! would (docs/hosts.md). Nothing moves; the weight goes back when no such batch is left,
//! when the servers stop serving, at exit and at restore (journaled first, as for a group
//! made idle: its flag and weight).

use std::collections::BTreeSet;

use appease_cgroup::Cgroups;

use crate::branch::branch_of;
use crate::group_idle::{is_below, IdleGroup};
use crate::trail::{audit, Change};
use crate::{KernelActuator, RestoreReport};

/// Why a group's weight is raised.
pub(crate) const SERVES_BESIDE_BATCH: &str =
    "it serves beside batch whose branch cannot be idle where they meet";

/// The weight given, in cgroup v2 units: v2's highest, a hundred times the default 100
/// (102400 `cpu.shares`). Beside redis in the container shape, ten times the default left
/// its p99 1.20-1.34 times the build's out-of-container idle group; this, 0.95-1.09.
pub(crate) const RAISED_WEIGHT: u32 = 10_000;

/// Whether `group` is as appease left it: not idle, at the raised weight.
pub(crate) fn as_left(cg: &Cgroups, group: &str) -> bool {
    cg.idle(group).is_ok_and(|idle| !idle)
        && cg
            .weight_raw(group)
            .ok()
            .and_then(|w| cg.weight_from_raw(&w))
            == Some(RAISED_WEIGHT)
}

impl KernelActuator {
    /// The group on `server`'s side where it meets `batch`, when the batch's side there is
    /// not idle: the highest group of the server's path that does not hold the batch. None
    /// when they share a group (nothing to weigh apart), the server sits at the root (its
    /// nice acts there), or the batch's side is idle already.
    fn server_side(&self, cg: &Cgroups, server: &str, batch: &str, own: &str) -> Option<String> {
        let servers = BTreeSet::from([server.to_string()]);
        let batch_side = branch_of(batch, &servers, own)?;
        if self.group_reads_idle(cg, &batch_side) {
            return None;
        }
        let batches = BTreeSet::from([batch.to_string()]);
        branch_of(server, &batches, "")
    }

    /// Raises or gives back the weight of the servers' branches, given the groups of the
    /// processes that served lately and of the trees demoted in place, after the
    /// batch's branches were made idle where they could be. Returns how many changed.
    pub(crate) fn sync_server_weights(
        &mut self,
        cg: &Cgroups,
        servers: &BTreeSet<String>,
        batch: &BTreeSet<String>,
        own: &str,
    ) -> usize {
        let wanted: BTreeSet<String> = servers
            .iter()
            .flat_map(|s| batch.iter().filter_map(|b| self.server_side(cg, s, b, own)))
            // Appease's own groups (the idle group, services' groups) are set by it; a
            // group that holds other batch would raise that batch too.
            .filter(|g| !self.is_group_of_ours(g) && !batch.iter().any(|b| is_below(b, g)))
            .collect();
        let mut changed = 0;
        for group in &wanted {
            let raised = if self.via_units() {
                // As high already (ours, or someone's): read from the group, so that a
                // scan asks nothing of the bus.
                let high = cg
                    .weight_raw(group)
                    .ok()
                    .and_then(|w| cg.weight_from_raw(&w));
                if high.is_some_and(|w| w >= RAISED_WEIGHT) {
                    Ok(false)
                } else {
                    self.set_branch_unit(group, RAISED_WEIGHT.into(), SERVES_BESIDE_BATCH)
                }
            } else {
                self.raise_group_weight(cg, group)
            };
            match raised {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(group, error = %e, "could not raise the server's branch weight")
                }
            }
        }
        let why = if servers.is_empty() {
            "no server serves beside the batch"
        } else {
            "no batch beside it outside an idle branch"
        };
        for group in crate::keys_where(&self.idle_groups, |g| g.why == SERVES_BESIDE_BATCH) {
            if !wanted.contains(&group) {
                let mut report = RestoreReport::default();
                self.unidle_group(&group, why, &mut report);
                // A put-back that failed stays and is tried again: not a change.
                changed += usize::from(!self.idle_groups.contains_key(&group));
            }
        }
        for group in self.branch_units(SERVES_BESIDE_BATCH) {
            if !wanted.contains(&group) {
                changed += usize::from(self.unset_branch_unit(&group, SERVES_BESIDE_BATCH, why));
            }
        }
        changed
    }

    /// Gives `group` the raised weight, journaled first. False when it has it already
    /// (from us, or at least as much from whoever set it).
    fn raise_group_weight(&mut self, cg: &Cgroups, group: &str) -> Result<bool, crate::ActError> {
        if self.idle_groups.contains_key(group) {
            return Ok(false);
        }
        let weight = cg.weight_raw(group)?;
        let raised = cg
            .weight_from_raw(&weight)
            .is_some_and(|w| w >= RAISED_WEIGHT);
        if raised || cg.idle(group)? {
            return Ok(false);
        }
        self.change_group(group, (false, &weight), || {
            cg.set_weight(group, RAISED_WEIGHT)
        })?;
        let (from, to) = (
            format!("weight {weight}"),
            format!("weight {RAISED_WEIGHT} (cgroup v2 units)"),
        );
        audit!(
            self.trail,
            Change::Group,
            group,
            from,
            to,
            why = SERVES_BESIDE_BATCH,
            dry_run = self.dry_run.then_some(true)
        );
        self.idle_groups.insert(
            group.to_string(),
            IdleGroup {
                idle: false,
                weight,
                root: None,
                pids: Vec::new(),
                why: SERVES_BESIDE_BATCH.to_string(),
                since: crate::now_secs(),
            },
        );
        Ok(true)
    }

    /// A group appease made (the idle group, a service's group), or below one.
    fn is_group_of_ours(&self, group: &str) -> bool {
        self.groups
            .as_ref()
            .is_some_and(|g| g.created_paths().iter().any(|c| is_below(group, c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::Groups;
    use crate::testing::{journaled_actuator, FakeKernel, TempDir};
    use appease_cgroup::Version;

    const SERVER: &str = "/system.slice/server.service";
    const CONTAINER: &str = "/docker/0123456789abcdef";

    /// A v2 tree of plain files: a service beside a container, each group with its
    /// weight and idle flag.
    fn tree(dir: &TempDir) -> Cgroups {
        let root = dir.0.join("cgroup");
        for g in ["/system.slice", SERVER, "/docker", CONTAINER] {
            let d = root.join(&g[1..]);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpu.weight"), "100\n").unwrap();
            std::fs::write(d.join("cpu.idle"), "0\n").unwrap();
        }
        Cgroups::at(Version::V2, &root).unwrap()
    }

    fn set(groups: &[&str]) -> BTreeSet<String> {
        groups.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_servers_side_is_weighted_up_while_the_batchs_side_cannot_be_idle_and_put_back() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("server-weight"));
        let cg = tree(&dir);
        let mut a =
            journaled_actuator(&k, &dir, &[]).with_groups(Groups::new(cg.clone(), "appease"));
        // The container's own server shares the build's group: nothing to weigh apart.
        let servers = set(&[SERVER, CONTAINER]);
        let batch = set(&[CONTAINER]);
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        assert_eq!(cg.weight_raw("/system.slice").unwrap(), "10000");
        assert_eq!(
            cg.weight_raw(SERVER).unwrap(),
            "100",
            "only where they meet"
        );
        assert_eq!(cg.weight_raw("/docker").unwrap(), "100");
        let pending = crate::journal::read_pending(&dir.0).unwrap();
        assert_eq!(
            pending.idle_groups.get("/system.slice"),
            Some(&(false, "100".to_string())),
            "journaled with what goes back"
        );
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 0, "kept");

        // The batch's side made idle (the engine's parent, by the container rule): the
        // weight goes back, and the journal has nothing left.
        cg.set_idle("/docker", true).unwrap();
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        assert_eq!(cg.weight_raw("/system.slice").unwrap(), "100");
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());

        // Raised again, then the daemon stops: back.
        cg.set_idle("/docker", false).unwrap();
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (1, 0));
        assert_eq!(cg.weight_raw("/system.slice").unwrap(), "100");
    }

    #[test]
    fn a_weight_at_least_as_high_and_servers_gone_leave_nothing_to_do() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("server-weight-high"));
        let cg = tree(&dir);
        let mut a =
            journaled_actuator(&k, &dir, &[]).with_groups(Groups::new(cg.clone(), "appease"));
        cg.set_weight_raw("/system.slice", "10000").unwrap();
        let (servers, batch) = (set(&[SERVER]), set(&[CONTAINER]));
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 0);
        assert_eq!(
            cg.weight_raw("/system.slice").unwrap(),
            "10000",
            "not lowered"
        );
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());

        cg.set_weight_raw("/system.slice", "100").unwrap();
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        // No server serves any more: given back.
        assert_eq!(a.sync_server_weights(&cg, &set(&[]), &batch, "/"), 1);
        assert_eq!(cg.weight_raw("/system.slice").unwrap(), "100");
        // A server at the root: its nice acts there, no group to weigh.
        assert_eq!(a.sync_server_weights(&cg, &set(&["/"]), &batch, "/"), 0);
    }

    #[test]
    fn a_weight_someone_changed_since_is_theirs_and_a_group_holding_other_batch_is_not_raised() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("server-weight-theirs"));
        let cg = tree(&dir);
        let mut a =
            journaled_actuator(&k, &dir, &[]).with_groups(Groups::new(cg.clone(), "appease"));
        let (servers, batch) = (set(&[SERVER]), set(&[CONTAINER]));
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        cg.set_weight_raw("/system.slice", "300").unwrap();
        let report = a.restore_all();
        assert_eq!((report.restored, report.left_alone), (0, 1));
        assert_eq!(
            cg.weight_raw("/system.slice").unwrap(),
            "300",
            "the administrator's"
        );
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());

        // Another tree demoted in place in system.slice: raising it would raise that batch.
        let ci = "/system.slice/ci.service";
        std::fs::create_dir_all(dir.0.join("cgroup/system.slice/ci.service")).unwrap();
        let batch = set(&[CONTAINER, ci]);
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 0);
        assert_eq!(cg.weight_raw("/system.slice").unwrap(), "300");
    }

    #[test]
    fn a_group_made_idle_that_someone_made_non_idle_since_is_theirs_at_the_stop() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("group-idle-theirs"));
        let cg = tree(&dir);
        let mut a =
            journaled_actuator(&k, &dir, &[]).with_groups(Groups::new(cg.clone(), "appease"));
        assert!(a
            .idle_group_in_place(CONTAINER, Some(7), &[7], "test")
            .unwrap());
        assert!(cg.idle(CONTAINER).unwrap());
        // An administrator's choice while appease runs: non-idle, another weight.
        cg.set_idle(CONTAINER, false).unwrap();
        cg.set_weight_raw(CONTAINER, "250").unwrap();
        let report = a.restore_all();
        assert_eq!((report.restored, report.left_alone), (0, 1));
        assert_eq!(
            cg.weight_raw(CONTAINER).unwrap(),
            "250",
            "the administrator's"
        );
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());

        // Left idle by appease: put back at the stop.
        assert!(a
            .idle_group_in_place(CONTAINER, Some(7), &[7], "test")
            .unwrap());
        let report = a.restore_all();
        assert_eq!((report.restored, report.left_alone), (1, 0));
        assert!(!cg.idle(CONTAINER).unwrap());
    }

    #[test]
    fn a_weighted_group_made_idle_for_batch_gets_its_weight_back_first() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("server-weight-idle"));
        let cg = tree(&dir);
        let mut a =
            journaled_actuator(&k, &dir, &[]).with_groups(Groups::new(cg.clone(), "appease"));
        let (servers, batch) = (set(&[SERVER]), set(&[CONTAINER]));
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        assert!(a
            .idle_group_in_place("/system.slice", Some(7), &[7], "test")
            .unwrap());
        assert!(cg.idle("/system.slice").unwrap());
        assert_eq!(
            a.idle_groups["/system.slice"].weight, "100",
            "the weight before ours"
        );
        a.restore_all();
        assert!(!cg.idle("/system.slice").unwrap());
        assert_eq!(cg.weight_raw("/system.slice").unwrap(), "100");
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }
}
