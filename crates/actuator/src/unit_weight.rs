//! The branch rules on a systemd host: a group where a batch's branch meets a server's is
//! a unit (`user.slice`, `system.slice`, a session's scope), and systemd owns it. So the
//! batch's branch is made idle, and the server's weighted up, the way a unit made idle for
//! a tree is: a runtime `CPUWeight` set through the bus (systemd ≥ 252 writes `idle` as
//! `cpu.idle = 1`), journaled first with the unit's old value and drop-in, given back by
//! the rule that set it, at exit and by `appease restore`. A group no unit of the system
//! manager owns (the root, a user manager's delegated units) is left alone.

use crate::in_place::{weight_text, IdleUnit};
use crate::journal::Record;
use crate::systemd::{self, UnitControl, WEIGHT_IDLE, WEIGHT_UNSET};
use crate::trail::{audit, Change};
use crate::{ActError, KernelActuator, RestoreReport};

/// Why a pod's slice is idle.
pub(crate) const BESTEFFORT_POD: &str = "Kubernetes BestEffort pod";

impl KernelActuator {
    /// Under systemd, each Kubernetes BestEffort pod's slice idle through the bus, as a
    /// pod's group is made idle elsewhere: new pods made idle, a pod the kubelet set again
    /// (its `cpu.idle` back to 0) made idle afresh with the kubelet's value as its own, a
    /// deleted pod forgotten. Returns how many pods changed.
    pub(crate) fn keep_besteffort_units_idle(&mut self, cg: &appease_cgroup::Cgroups) -> usize {
        let pods = cg.besteffort_pods();
        let mut changed = 0;
        for gone in self.branch_units(BESTEFFORT_POD) {
            if !pods.contains(&gone) {
                changed +=
                    usize::from(self.unset_branch_unit(&gone, BESTEFFORT_POD, "the pod is gone"));
            }
        }
        for pod in &pods {
            if let Some(unit) = self.branch_unit_at(pod, BESTEFFORT_POD) {
                if self.group_reads_idle(cg, pod) {
                    continue;
                }
                // Rewritten: the kubelet's value is the pod's own now, nothing of ours to
                // put back.
                tracing::info!(
                    pod,
                    unit,
                    "the pod's slice was set again by someone else: made idle afresh"
                );
                self.idle_units.remove(&unit);
                let _logged_by_journal = self.journal(Record::UnitRestored { unit });
            }
            match self.set_branch_unit(pod, WEIGHT_IDLE, BESTEFFORT_POD) {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(pod, error = %e, "could not make the pod's slice idle"),
            }
        }
        changed
    }

    /// systemd owns the cgroup tree: the branch rules set units through the bus.
    pub(crate) fn via_units(&self) -> bool {
        self.groups.as_ref().is_some_and(|g| g.systemd_owned())
    }

    /// Whether `group` is idle. Under systemd a group without a `cpu.idle` file is one
    /// whose unit has no CPU setting in its subtree (systemd took the controller off): not
    /// idle. Elsewhere an unreadable group counts as idle, so that nothing is done to it.
    pub(crate) fn group_reads_idle(&self, cg: &appease_cgroup::Cgroups, group: &str) -> bool {
        cg.idle(group).unwrap_or(!self.via_units())
    }

    /// The unit set for a branch rule that owns `cgroup`, if any: its name.
    pub(crate) fn branch_unit_at(&self, cgroup: &str, why: &str) -> Option<String> {
        self.idle_units
            .iter()
            .find(|(_, u)| u.root == 0 && u.cgroup == cgroup && u.why == why)
            .map(|(name, _)| name.clone())
    }

    /// The cgroups of the units set for the branch rule `why`.
    pub(crate) fn branch_units(&self, why: &str) -> Vec<String> {
        self.idle_units
            .values()
            .filter(|u| u.root == 0 && u.why == why)
            .map(|u| u.cgroup.clone())
            .collect()
    }

    /// Sets the CPUWeight of the unit that owns `cgroup` to `weight` for the branch rule
    /// `why`. Returns true when it changed something. Nothing is done for a unit set so
    /// already by someone else, or idle (an idle unit is not raised), or, for a raise, at
    /// least as high; a unit appease set otherwise (weighted up, now to be made idle) gets
    /// its own value back first.
    pub(crate) fn set_branch_unit(
        &mut self,
        cgroup: &str,
        weight: u64,
        why: &str,
    ) -> Result<bool, ActError> {
        if self.branch_unit_at(cgroup, why).is_some() {
            return Ok(false);
        }
        let other = self
            .idle_units
            .iter()
            .find(|(_, u)| u.root == 0 && u.cgroup == cgroup)
            .map(|(name, _)| name.clone());
        if let Some(unit) = other {
            self.unidle_unit(
                &unit,
                "another branch rule applies",
                &mut RestoreReport::default(),
            );
            if self.idle_units.contains_key(&unit) {
                return Ok(false); // not given back: its own value stays journaled
            }
        }
        self.with_units(Ok(false), |a, units| {
            a.set_unit_weight(units, cgroup, weight, why)
        })
    }

    /// `f` with systemd's bus lent out of the groups (`none` without it): what it calls
    /// on the actuator may not reach the bus meanwhile.
    pub(crate) fn with_units<R>(
        &mut self,
        none: R,
        f: impl FnOnce(&mut Self, &dyn UnitControl) -> R,
    ) -> R {
        let Some(units) = self.groups.as_mut().and_then(|g| g.units.take()) else {
            return none;
        };
        let result = f(self, &*units);
        if let Some(g) = self.groups.as_mut() {
            g.units = Some(units);
        }
        result
    }

    fn set_unit_weight(
        &mut self,
        units: &dyn UnitControl,
        cgroup: &str,
        weight: u64,
        why: &str,
    ) -> Result<bool, ActError> {
        let unit = match units.unit_at(cgroup) {
            Ok(u) => u,
            Err(e) => {
                // The root, a user manager's units, a group systemd does not know.
                tracing::debug!(cgroup, error = %e, "no unit of the system manager owns it");
                return Ok(false);
            }
        };
        if self.idle_units.contains_key(&unit.id) {
            return Ok(false); // idle for a tree: its own value is journaled already
        }
        let orig = units.cpu_weight(&unit.id)?;
        let raised_already = weight != WEIGHT_IDLE && orig != WEIGHT_UNSET && orig >= weight;
        if orig == WEIGHT_IDLE || raised_already {
            return Ok(false);
        }
        let dropin = systemd::read_dropin(&unit.id, unit.transient);
        if !self.dry_run {
            let was = (orig, unit.transient, dropin.clone());
            self.set_unit_journaled(units, &unit.id, was, weight)?;
        }
        audit!(
            self.trail,
            Change::Unit,
            unit = unit.id,
            cgroup,
            from = weight_text(orig),
            to = weight_text(weight),
            why,
            dry_run = self.dry_run.then_some(true)
        );
        self.idle_units.insert(
            unit.id,
            IdleUnit {
                orig,
                weight,
                transient: unit.transient,
                dropin,
                cgroup: cgroup.to_string(),
                root: 0,
                pids: Vec::new(),
                why: why.to_string(),
                since: crate::now_secs(),
            },
        );
        Ok(true)
    }

    /// Journals that appease sets `unit` to `weight` over `was` (its CPUWeight, whether it
    /// is transient, its drop-in's text), then sets it through systemd; a refusal closes
    /// the record again. Every path that sets a unit goes through here, so each journals
    /// first and the chaos harness's crash point follows every call.
    pub(crate) fn set_unit_journaled(
        &mut self,
        units: &dyn UnitControl,
        unit: &str,
        (orig, transient, dropin): (u64, bool, Option<String>),
        weight: u64,
    ) -> Result<(), ActError> {
        self.journal(Record::UnitIdle {
            unit: unit.to_string(),
            orig,
            transient,
            dropin,
            set: Some(weight),
        })?;
        if let Err(e) = units.set_cpu_weight(unit, weight) {
            self.counters.fail("systemd");
            let _logged_by_journal = self.journal(Record::UnitRestored {
                unit: unit.to_string(),
            });
            return Err(e.into());
        }
        crate::crash_point("unit-set");
        Ok(())
    }

    /// Gives back the unit set for the branch rule `why` at `cgroup`, if any.
    pub(crate) fn unset_branch_unit(&mut self, cgroup: &str, why: &str, because: &str) -> bool {
        let Some(unit) = self.branch_unit_at(cgroup, why) else {
            return false;
        };
        self.unidle_unit(&unit, because, &mut RestoreReport::default());
        // A put-back that failed stays and is tried again: not a change.
        !self.idle_units.contains_key(&unit)
    }

    /// Units set for a branch rule, one line each, for `appease status`.
    pub(crate) fn branch_unit_views(&self) -> Vec<crate::MovedView> {
        self.idle_units
            .iter()
            .filter(|(_, u)| u.root == 0)
            .map(|(name, u)| crate::MovedView {
                pid: 0,
                comm: "(unit)".into(),
                class: if u.weight == WEIGHT_IDLE {
                    "batch"
                } else {
                    "weighted"
                }
                .into(),
                group: u.cgroup.clone(),
                original_group: u.cgroup.clone(),
                tree: 0,
                why: u.why.clone(),
                since: u.since,
                placement: format!(
                    "in place: unit {name} {} through systemd",
                    weight_text(u.weight)
                ),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};

    use appease_cgroup::{Cgroups, Version};

    use crate::branch::ONLY_BATCH_BUSY;
    use crate::groups::Groups;
    use crate::server_weight::{RAISED_WEIGHT, SERVES_BESIDE_BATCH};
    use crate::systemd::{Unit, UnitControl, UnitError, WEIGHT_IDLE, WEIGHT_UNSET};
    use crate::testing::{journaled_actuator, FakeKernel, TempDir};

    const SERVER: &str = "/system.slice/web.service";
    const SCOPE: &str = "/user.slice/user-0.slice/session-1.scope";
    const POD: &str =
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice";
    const POD_UNIT: &str = "kubepods-besteffort-pod12_34.slice";

    /// systemd as the branch rules see it: the units of the tree's groups, their
    /// CPUWeight written to the fake tree as systemd writes it (idle as `cpu.idle`).
    #[derive(Clone)]
    struct Manager {
        root: std::path::PathBuf,
        weights: Arc<Mutex<BTreeMap<String, u64>>>,
        refuse: Arc<Mutex<bool>>,
    }

    impl UnitControl for Manager {
        fn unit_of(&self, pid: u32) -> Result<Unit, UnitError> {
            // Every process of the fake host runs in the server's unit.
            let _ = pid;
            self.unit_at(SERVER)
        }
        fn cpu_weight(&self, unit: &str) -> Result<u64, UnitError> {
            self.weights
                .lock()
                .unwrap()
                .get(unit)
                .copied()
                .ok_or_else(|| refused(unit))
        }
        fn set_cpu_weight(&self, unit: &str, weight: u64) -> Result<(), UnitError> {
            if *self.refuse.lock().unwrap() {
                return Err(refused("access denied"));
            }
            self.cpu_weight(unit)?; // not loaded
            let cgroup = ["/system.slice", SERVER, "/user.slice", SCOPE, POD]
                .into_iter()
                .find(|g| crate::systemd::unit_name_of(g) == Some(unit))
                .ok_or_else(|| refused(unit))?;
            let dir = self.root.join(&cgroup[1..]);
            let (idle, w) = match weight {
                WEIGHT_IDLE => (1, 100),
                WEIGHT_UNSET => (0, 100),
                w => (0, w),
            };
            std::fs::write(dir.join("cpu.idle"), format!("{idle}\n")).unwrap();
            std::fs::write(dir.join("cpu.weight"), format!("{w}\n")).unwrap();
            self.weights.lock().unwrap().insert(unit.into(), weight);
            Ok(())
        }
        fn unit_gone(&self, unit: &str) -> bool {
            !self.weights.lock().unwrap().contains_key(unit)
        }
        fn unit_at(&self, cgroup: &str) -> Result<Unit, UnitError> {
            let id = crate::systemd::unit_name_of(cgroup).ok_or_else(|| refused(cgroup))?;
            self.cpu_weight(id)?;
            Ok(Unit {
                id: id.into(),
                cgroup: cgroup.into(),
                transient: false,
            })
        }
    }

    fn refused(what: &str) -> UnitError {
        UnitError::Unit {
            unit: what.into(),
            what: "not loaded".into(),
        }
    }

    /// A systemd-owned v2 tree whose cpu controller is on only where a unit has a CPU
    /// setting (`/user.slice/user-0.slice` has no `cpu.idle`), and its manager.
    fn systemd_host(dir: &TempDir) -> (Cgroups, Manager) {
        let root = dir.0.join("cgroup");
        for g in [
            "/system.slice",
            SERVER,
            "/user.slice",
            "/user.slice/user-0.slice",
            SCOPE,
        ] {
            let d = root.join(&g[1..]);
            std::fs::create_dir_all(&d).unwrap();
            if g != "/user.slice/user-0.slice" {
                std::fs::write(d.join("cpu.weight"), "100\n").unwrap();
                std::fs::write(d.join("cpu.idle"), "0\n").unwrap();
            }
        }
        let weights = [
            "system.slice",
            "web.service",
            "user.slice",
            "session-1.scope",
        ]
        .into_iter()
        .map(|u| (u.to_string(), WEIGHT_UNSET))
        .collect();
        let manager = Manager {
            root: root.clone(),
            weights: Arc::new(Mutex::new(weights)),
            refuse: Arc::default(),
        };
        (Cgroups::at(Version::V2, &root).unwrap(), manager)
    }

    fn actuator(k: &FakeKernel, dir: &TempDir, cg: &Cgroups, m: &Manager) -> crate::KernelActuator {
        let groups = Groups::new(cg.clone(), "appease")
            .owned_by_systemd(true)
            .with_units(Box::new(m.clone()));
        journaled_actuator(k, dir, &[]).with_groups(groups)
    }

    fn set(groups: &[&str]) -> BTreeSet<String> {
        groups.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn under_systemd_the_servers_slice_is_weighted_up_through_the_bus_and_given_back() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("unit-weight"));
        let (cg, m) = systemd_host(&dir);
        let mut a = actuator(&k, &dir, &cg, &m);
        let (servers, batch) = (set(&[SERVER]), set(&[SCOPE]));
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        assert_eq!(
            m.cpu_weight("system.slice").unwrap(),
            u64::from(RAISED_WEIGHT)
        );
        assert_eq!(
            m.cpu_weight("web.service").unwrap(),
            WEIGHT_UNSET,
            "only where they meet"
        );
        let pending = crate::journal::read_pending(&dir.0).unwrap();
        assert_eq!(
            pending.units.get("system.slice").map(|u| u.orig),
            Some(WEIGHT_UNSET),
            "journaled with what goes back"
        );
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 0, "kept");
        let views = a.moved();
        assert!(
            views.iter().any(|v| v.group == "/system.slice"
                && v.class == "weighted"
                && v.placement
                    .contains("unit system.slice CPUWeight=10000 through systemd")),
            "{views:?}"
        );

        // The batch's side made idle (as the branch rule does): the weight goes back.
        assert!(a
            .set_branch_unit("/user.slice", WEIGHT_IDLE, ONLY_BATCH_BUSY)
            .unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.0.join("cgroup/user.slice/cpu.idle")).unwrap(),
            "1\n"
        );
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        assert_eq!(m.cpu_weight("system.slice").unwrap(), WEIGHT_UNSET);
        assert!(
            !a.set_branch_unit("/user.slice", WEIGHT_IDLE, ONLY_BATCH_BUSY)
                .unwrap(),
            "kept"
        );

        // At exit every unit gets its own value back, and nothing is left to undo.
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (1, 0));
        assert_eq!(m.cpu_weight("user.slice").unwrap(), WEIGHT_UNSET);
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_unit_whose_weight_someone_set_since_keeps_it_at_the_stop_and_the_restore() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("unit-weight-theirs"));
        let (cg, m) = systemd_host(&dir);
        let mut a = actuator(&k, &dir, &cg, &m);
        let (servers, batch) = (set(&[SERVER]), set(&[SCOPE]));
        assert_eq!(a.sync_server_weights(&cg, &servers, &batch, "/"), 1);
        assert_eq!(
            crate::journal::read_pending(&dir.0).unwrap().units["system.slice"].set,
            Some(u64::from(RAISED_WEIGHT)),
            "the journal says what appease set"
        );
        // An administrator's `systemctl set-property system.slice CPUWeight=300`.
        m.set_cpu_weight("system.slice", 300).unwrap();
        let report = a.restore_all();
        assert_eq!((report.restored, report.left_alone), (0, 1));
        assert_eq!(m.cpu_weight("system.slice").unwrap(), 300, "theirs");
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_group_without_a_cpu_controller_is_not_idle_and_one_no_unit_owns_is_left_alone() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("unit-weight-none"));
        let (cg, m) = systemd_host(&dir);
        let mut a = actuator(&k, &dir, &cg, &m);
        // user-0.slice has no cpu.idle under systemd: not idle, so system.slice is raised.
        assert!(!a.group_reads_idle(&cg, "/user.slice/user-0.slice"));
        assert!(
            !a.set_branch_unit("/docker", WEIGHT_IDLE, ONLY_BATCH_BUSY)
                .unwrap(),
            "no unit owns it"
        );
        assert!(!a
            .set_branch_unit("/", WEIGHT_IDLE, ONLY_BATCH_BUSY)
            .unwrap());
        assert!(a.moved().is_empty());
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_refused_call_or_a_weight_as_high_changes_nothing_and_an_idle_unit_is_not_raised() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("unit-weight-refused"));
        let (cg, m) = systemd_host(&dir);
        let mut a = actuator(&k, &dir, &cg, &m);
        *m.refuse.lock().unwrap() = true;
        let raise = u64::from(RAISED_WEIGHT);
        assert!(a
            .set_branch_unit("/system.slice", raise, SERVES_BESIDE_BATCH)
            .is_err());
        assert!(
            crate::journal::read_pending(&dir.0).unwrap().is_empty(),
            "closed"
        );
        assert!(a.moved().is_empty());
        *m.refuse.lock().unwrap() = false;

        m.weights
            .lock()
            .unwrap()
            .insert("system.slice".into(), 10_000);
        assert!(!a
            .set_branch_unit("/system.slice", raise, SERVES_BESIDE_BATCH)
            .unwrap());
        m.weights
            .lock()
            .unwrap()
            .insert("system.slice".into(), WEIGHT_IDLE);
        assert!(!a
            .set_branch_unit("/system.slice", raise, SERVES_BESIDE_BATCH)
            .unwrap());
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());

        // Weighted up, then wanted idle: its own value back first, then idle.
        m.weights.lock().unwrap().insert("user.slice".into(), 100);
        assert!(a
            .set_branch_unit("/user.slice", raise, SERVES_BESIDE_BATCH)
            .unwrap());
        assert!(a
            .set_branch_unit("/user.slice", WEIGHT_IDLE, ONLY_BATCH_BUSY)
            .unwrap());
        assert_eq!(m.cpu_weight("user.slice").unwrap(), WEIGHT_IDLE);
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (1, 0));
        assert_eq!(
            m.cpu_weight("user.slice").unwrap(),
            100,
            "its own, not the raised one"
        );
    }

    #[test]
    fn a_unit_weighted_up_for_a_branch_is_not_taken_over_by_a_tree_made_idle_in_it() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("unit-weight-tree"));
        let (cg, m) = systemd_host(&dir);
        let mut a = actuator(&k, &dir, &cg, &m);
        let raise = u64::from(RAISED_WEIGHT);
        assert!(a
            .set_branch_unit(SERVER, raise, SERVES_BESIDE_BATCH)
            .unwrap());
        // A tree that is all the unit holds: it stays per thread, the unit keeps the
        // weight its branch rule set, and its own value stays the one journaled.
        let pid = std::process::id();
        let procs = dir.0.join("cgroup").join(&SERVER[1..]).join("cgroup.procs");
        std::fs::write(procs, format!("{pid}\n")).unwrap();
        let mut rest = vec![crate::in_place::InPlace::new(pid, SERVER, "soak")];
        let tree = crate::in_place::Demoting {
            root: pid,
            members: &[pid],
            why: "test",
        };
        let whole = a.idle_whole_units(&tree, &mut rest);
        assert_eq!((whole, rest.len()), (0, 1));
        assert_eq!(m.cpu_weight("web.service").unwrap(), raise);
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (1, 0));
        assert_eq!(m.cpu_weight("web.service").unwrap(), WEIGHT_UNSET);
    }

    #[test]
    fn under_systemd_a_besteffort_pods_slice_is_made_idle_again_after_a_rewrite_and_forgotten_when_gone(
    ) {
        let (k, dir) = (FakeKernel::new(), TempDir::new("unit-weight-pod"));
        let (cg, m) = systemd_host(&dir);
        // The pod's slice as the kubelet's systemd driver leaves it: CPUWeight 1.
        let pod_dir = dir.0.join("cgroup").join(&POD[1..]);
        std::fs::create_dir_all(pod_dir.join("cri-containerd-ab.scope")).unwrap();
        std::fs::write(pod_dir.join("cpu.idle"), "0\n").unwrap();
        m.weights.lock().unwrap().insert(POD_UNIT.into(), 1);
        let mut a = actuator(&k, &dir, &cg, &m);
        assert_eq!(a.keep_besteffort_pods_idle(), 1);
        assert_eq!(m.cpu_weight(POD_UNIT).unwrap(), WEIGHT_IDLE);
        assert_eq!(a.keep_besteffort_pods_idle(), 0, "kept");
        let views = a.moved();
        assert!(
            views
                .iter()
                .any(|v| v.group == POD && v.why == "Kubernetes BestEffort pod"),
            "{views:?}"
        );

        // The kubelet sets its weight again: idle afresh, the kubelet's value its own.
        m.set_cpu_weight(POD_UNIT, 1).unwrap();
        assert_eq!(a.keep_besteffort_pods_idle(), 1);
        assert_eq!(m.cpu_weight(POD_UNIT).unwrap(), WEIGHT_IDLE);
        let pending = crate::journal::read_pending(&dir.0).unwrap();
        assert_eq!(pending.units.get(POD_UNIT).map(|u| u.orig), Some(1));

        // The pod deleted: its unit is gone with it, nothing left to undo.
        std::fs::remove_dir_all(&pod_dir).unwrap();
        m.weights.lock().unwrap().remove(POD_UNIT);
        assert_eq!(a.keep_besteffort_pods_idle(), 1);
        assert!(a.moved().is_empty());
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }
}
