//! A config reload: what changes, worked out from the old config and the new one alone
//! (`ReloadPlan::new`, no kernel), then applied to the running daemon.

use std::sync::Arc;
use std::time::Duration;

use appease_config::{Config, Service};

use crate::probe_settings::serving_window;
use crate::{control, notify_systemd, services_available, Daemon};

/// What a reload changes.
#[derive(Debug, PartialEq)]
pub(crate) struct ReloadPlan {
    /// The config to run with: the new one, with the keys only a restart changes kept at
    /// their running value.
    pub config: Config,
    /// Keys that changed but keep their running value until a restart.
    pub needs_restart: Vec<String>,
    pub elevation: bool,
    pub hands_off: bool,
    /// Services gone from the config: their groups are removed.
    pub services_removed: Vec<Service>,
    /// Services new or changed (true: new): their groups are made or set again.
    pub services_set: Vec<(Service, bool)>,
    /// Sections applied by handing the config over (roles, rules, batch).
    pub handed_over: Vec<String>,
}

impl ReloadPlan {
    /// The plan for going from `old` to `new`; `scans` says whether the daemon scans
    /// processes (without a scan, services and roles would never be applied, so they too
    /// wait for a restart).
    pub fn new(old: &Config, mut new: Config, scans: bool) -> Self {
        let mut needs_restart = Vec::new();
        let mut restart_only = |name: &str, changed: bool| {
            if changed {
                needs_restart.push(name.to_string());
            }
        };
        restart_only("[probe]", new.probe != old.probe);
        restart_only("[batch] enabled", new.batch.enabled != old.batch.enabled);
        restart_only("[batch] group", new.batch.group != old.batch.group);
        restart_only("[metrics] listen", new.metrics != old.metrics);
        restart_only("[control] group", new.control != old.control);
        // The probe bounds users' events as it was loaded to.
        let probe_users = |c: &Config| {
            (
                c.users.uid_min,
                c.users.events_per_s,
                c.users.all_events_per_s,
            )
        };
        restart_only(
            "[users] uid_min, events_per_s, all_events_per_s",
            probe_users(&new) != probe_users(old),
        );
        // The probe reports lock waits within the window it was loaded with.
        restart_only(
            "[elevation.sink] lifting (after_cpu_ms, lift_ms)",
            serving_window(&new) != serving_window(old),
        );
        if !scans {
            restart_only("[[service]]", new.services != old.services);
            restart_only("[[role]]", new.role != old.role || new.roles != old.roles);
        }
        new.probe = old.probe.clone();
        new.batch.enabled = old.batch.enabled;
        new.batch.group = old.batch.group.clone();
        new.metrics = old.metrics.clone();
        new.control = old.control.clone();
        new.users = appease_config::UsersSection {
            elevated_cpu_share: new.users.elevated_cpu_share,
            ..old.users.clone()
        };
        if !scans {
            new.services = old.services.clone();
            new.role = old.role.clone();
            new.roles = old.roles.clone();
        }
        let services_removed = old
            .services
            .iter()
            .filter(|svc| !new.services.iter().any(|s| s.name == svc.name))
            .cloned()
            .collect();
        let services_set = new
            .services
            .iter()
            .filter_map(|svc| {
                let before = old.services.iter().find(|s| s.name == svc.name);
                (before != Some(svc)).then(|| (svc.clone(), before.is_none()))
            })
            .collect();
        let mut handed_over = Vec::new();
        if new.role != old.role || new.roles != old.roles {
            handed_over.push("[[role]]".to_string());
        }
        if new.rules != old.rules {
            handed_over.push("[[rule]]".to_string());
        }
        if new.batch != old.batch {
            handed_over.push("[batch]".to_string());
        }
        ReloadPlan {
            elevation: new.elevation != old.elevation || new.users != old.users,
            hands_off: new.hands_off != old.hands_off,
            config: new,
            needs_restart,
            services_removed,
            services_set,
            handed_over,
        }
    }
}

impl Daemon<'_> {
    pub(crate) fn reload(&mut self) {
        // Under systemd (Type=notify-reload): reloading now, ready again after.
        if let Ok(now) = sd_notify::NotifyState::monotonic_usec_now() {
            notify_systemd(&[sd_notify::NotifyState::Reloading, now]);
        }
        let report = self.load_config_again();
        self.shared.reloaded(&report);
        notify_systemd(&[sd_notify::NotifyState::Ready]);
    }

    /// Reads the config file again and applies all of it but the keys only a restart
    /// changes; an invalid file leaves the running config as it is.
    fn load_config_again(&mut self) -> control::ReloadReport {
        let mut report = control::ReloadReport {
            config: self.config_origin(),
            ..Default::default()
        };
        let Some(path) = self.opts.config_path.clone() else {
            tracing::info!("reload requested; the embedded default config is unchanged");
            report.applied = true;
            return report;
        };
        let cfg = match Config::load(&path)
            .map_err(|e| e.to_string())
            .and_then(|c| services_available(&c, &self.layout).map(|()| c))
        {
            Ok(cfg) => cfg,
            Err(e) => {
                tracing::error!(error = %e, "config reload failed; keeping the last good config");
                report.error = Some(e);
                return report;
            }
        };
        let plan = ReloadPlan::new(&self.opts.config, cfg, self.scanner.is_some());
        self.apply_reload(plan, &mut report);
        tracing::info!(
            config = %path.display(),
            changed = ?report.changed,
            "config reloaded"
        );
        if !report.needs_restart.is_empty() {
            tracing::warn!(keys = ?report.needs_restart, "changed keys keep their running value until a restart");
        }
        for f in &report.failed {
            tracing::warn!(failed = %f, "part of the reloaded config could not be applied");
        }
        report
    }

    fn apply_reload(&mut self, plan: ReloadPlan, report: &mut control::ReloadReport) {
        let cfg = plan.config;
        report.needs_restart = plan.needs_restart;
        let changed = &mut report.changed;
        if plan.elevation {
            self.policy.set_params(cfg.elevation_params());
            self.tick = Duration::from_millis(cfg.elevation.tick_ms);
            self.thread_times.config_changed();
            changed.push("[elevation]".into());
        }
        if plan.hands_off {
            self.actuator.set_exceptions(cfg.hands_off.comms.clone());
            for tid in self.actuator.release_excepted_threads() {
                self.policy.forget(tid);
            }
            let moved = self.actuator.release_excepted_processes();
            changed.push(format!("[hands_off] (processes moved back: {moved})"));
        }
        for svc in &plan.services_removed {
            let r = self.actuator.remove_service_group(&svc.group_name());
            changed.push(format!(
                "[[service]] {} removed ({} moved back)",
                svc.name, r.restored
            ));
        }
        for (svc, added) in &plan.services_set {
            match self
                .actuator
                .ensure_service_group(&svc.group_name(), svc.weight)
            {
                Ok(_) if *added => changed.push(format!("[[service]] {} added", svc.name)),
                Ok(_) => changed.push(format!("[[service]] {} changed", svc.name)),
                Err(e) => report.failed.push(format!(
                    "[[service]] {}: cannot set up its group: {e}",
                    svc.name
                )),
            }
        }
        changed.extend(plan.handed_over);
        if let Some(b) = self.batch.as_mut() {
            b.set_config(&cfg);
        }
        self.shared_config = Arc::new(cfg.clone());
        self.opts.config = cfg;
        report.applied = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, "test").expect("valid config")
    }

    #[test]
    fn keys_only_a_restart_changes_keep_their_running_value_and_are_named() {
        let old = config("");
        let new = config(
            "[probe]\nmin_gap_ms = 7\n[batch]\ngroup = \"other.batch\"\n[elevation]\ntick_ms = 3\n",
        );
        let plan = ReloadPlan::new(&old, new, true);
        assert_eq!(plan.needs_restart, ["[probe]", "[batch] group"]);
        assert_eq!(plan.config.probe, old.probe);
        assert_eq!(plan.config.batch.group, old.batch.group);
        assert!(plan.elevation, "the rest applies");
        assert_eq!(plan.config.elevation.tick_ms, 3);
        assert!(!plan.hands_off);
        assert!(plan.handed_over.is_empty(), "{:?}", plan.handed_over);
        // A decay step shorter than the held gap applies too: the next tick gives the
        // probe the gap for it.
        let fast = config(
            "[elevation]\nladder = [\n  { from_runnable_per_cpu = 0.0, unix_nice = 0, inet_nice = 0, decay_ms = 0 },\n  { from_runnable_per_cpu = 1.0, unix_nice = -5, inet_nice = -3, decay_ms = 50 },\n]\n",
        );
        let plan = ReloadPlan::new(&old, fast, true);
        assert!(plan.needs_restart.is_empty(), "{:?}", plan.needs_restart);
        assert!(plan.elevation);
    }

    #[test]
    fn services_are_added_changed_and_removed_by_name() {
        let old = config(
            "[[service]]\nname = \"db\"\nunit = \"postgresql.service\"\n\
             [[service]]\nname = \"web\"\nunit = \"nginx.service\"\n",
        );
        let new = config(
            "[[service]]\nname = \"db\"\nunit = \"postgresql.service\"\nweight = 300\n\
             [[service]]\nname = \"cache\"\nunit = \"redis-server.service\"\n",
        );
        let plan = ReloadPlan::new(&old, new, true);
        let removed: Vec<_> = plan.services_removed.iter().map(|s| &s.name).collect();
        let set: Vec<_> = plan
            .services_set
            .iter()
            .map(|(s, added)| (s.name.as_str(), *added))
            .collect();
        assert_eq!(removed, ["web"]);
        assert_eq!(set, [("db", false), ("cache", true)]);
        assert!(plan.needs_restart.is_empty(), "{:?}", plan.needs_restart);
    }

    #[test]
    fn without_a_process_scan_services_and_roles_wait_for_a_restart() {
        let old = config("");
        let new = config("[[service]]\nname = \"db\"\nunit = \"postgresql.service\"\n");
        let plan = ReloadPlan::new(&old, new, false);
        assert_eq!(plan.needs_restart, ["[[service]]"]);
        assert!(plan.config.services.is_empty());
        assert!(plan.services_set.is_empty());
    }

    #[test]
    fn an_unchanged_config_changes_nothing() {
        let old = config("[[service]]\nname = \"db\"\nunit = \"postgresql.service\"\n");
        let plan = ReloadPlan::new(&old, old.clone(), true);
        assert_eq!(
            plan,
            ReloadPlan {
                config: old,
                needs_restart: vec![],
                elevation: false,
                hands_off: false,
                services_removed: vec![],
                services_set: vec![],
                handed_over: vec![],
            }
        );
    }
}
