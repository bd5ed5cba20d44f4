//! What kind of host appease runs on, read once at start: which hierarchy holds the
//! CPU controller, whether systemd owns the cgroup tree, whether appease itself runs in
//! a container, and whether a sched_ext scheduler has replaced the fair class.
//!
//! Every reading takes a root directory so that tests can hand in a fake `/`.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::Version;

/// The host's layout, as `appease status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostLayout {
    /// `cgroup-v1`, `cgroup-v2`, `cgroup-v2-systemd`, or `none` (no CPU controller).
    pub kind: LayoutKind,
    /// Mount point of the hierarchy that holds the CPU controller.
    pub cpu_hierarchy: Option<PathBuf>,
    /// systemd is the service manager (PID 1): it owns the cgroup tree.
    pub systemd: bool,
    /// The container technology appease itself runs in, if any (`docker`, `podman`,
    /// `systemd-nspawn`, `kubernetes`, `lxc`, …).
    pub container: Option<String>,
    /// The sched_ext scheduler loaded in place of the fair class, if any.
    pub sched_ext: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutKind {
    CgroupV1,
    CgroupV2,
    CgroupV2Systemd,
    None,
}

impl LayoutKind {
    pub fn name(self) -> &'static str {
        match self {
            LayoutKind::CgroupV1 => "cgroup-v1",
            LayoutKind::CgroupV2 => "cgroup-v2",
            LayoutKind::CgroupV2Systemd => "cgroup-v2-systemd",
            LayoutKind::None => "none",
        }
    }
}

impl HostLayout {
    pub fn detect() -> Self {
        Self::detect_in(Path::new("/"))
    }

    /// Reads the layout of the tree under `root` (a fake `/` in tests).
    pub fn detect_in(root: &Path) -> Self {
        let cpu = cpu_hierarchy_in(root);
        // sd_booted(3): systemd creates /run/systemd/system when it is PID 1. In a
        // container with the host's PIDs (a DaemonSet), /run is the container's own, but
        // PID 1 is the host's init.
        let systemd = root.join("run/systemd/system").is_dir()
            || fs::read_to_string(root.join("proc/1/comm")).is_ok_and(|c| c.trim() == "systemd");
        let kind = match (&cpu, systemd) {
            (None, _) => LayoutKind::None,
            (Some((Version::V1, _)), _) => LayoutKind::CgroupV1,
            (Some((Version::V2, _)), false) => LayoutKind::CgroupV2,
            (Some((Version::V2, _)), true) => LayoutKind::CgroupV2Systemd,
        };
        HostLayout {
            kind,
            cpu_hierarchy: cpu.map(|(_, p)| p),
            systemd,
            container: container_in(root),
            sched_ext: sched_ext_in(root),
        }
    }

    /// What of appease's work still has an effect on this host, for status and the log.
    pub fn effects(&self) -> String {
        if let Some(ops) = &self.sched_ext {
            return format!(
                "sched_ext scheduler {ops:?} is loaded: it decides who runs, cgroup CPU \
                 controls (the idle group, service weights) are likely ignored, and nice \
                 levels and slices are hints it may ignore"
            );
        }
        match self.kind {
            LayoutKind::None => {
                "no CPU cgroup controller: elevation only, no idle group or service groups".into()
            }
            LayoutKind::CgroupV2Systemd => {
                "systemd owns the cgroup tree: appease writes none of its cgroups; a batch \
                 tree that is all its unit holds makes the unit idle through systemd \
                 (CPUWeight=idle), others are demoted per thread (SCHED_IDLE); service \
                 groups are off"
                    .into()
            }
            LayoutKind::CgroupV1 | LayoutKind::CgroupV2 => {
                "elevation, idle group and service groups; trees under a limit or in a \
                 container are demoted in place"
                    .into()
            }
        }
    }
}

/// The hierarchy that holds the CPU controller, from the mount table: a v1 hierarchy
/// with the `cpu` controller if there is one (on a hybrid host processes are in it),
/// else a cgroup2 mount that offers `cpu`.
pub(crate) fn cpu_hierarchy_in(root: &Path) -> Option<(Version, PathBuf)> {
    let mounts = fs::read_to_string(root.join("proc/self/mounts")).unwrap_or_default();
    let under = |point: &str| root.join(point.trim_start_matches('/'));
    let mut v2 = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, point, fstype, opts, ..] = f[..] else {
            continue;
        };
        match fstype {
            "cgroup"
                if opts.split(',').any(|o| o == "cpu")
                    && under(point).join("cpu.shares").exists() =>
            {
                return Some((Version::V1, under(point)));
            }
            "cgroup2" if v2.is_none() => {
                let controllers =
                    fs::read_to_string(under(point).join("cgroup.controllers")).unwrap_or_default();
                if controllers.split_whitespace().any(|c| c == "cpu") {
                    v2 = Some((Version::V2, under(point)));
                }
            }
            _ => {}
        }
    }
    v2
}

/// The container appease runs in, from the marks each runtime leaves.
fn container_in(root: &Path) -> Option<String> {
    // systemd-nspawn, and runtimes that follow systemd's container interface.
    if let Ok(name) = fs::read_to_string(root.join("run/systemd/container")) {
        let name = name.trim();
        if !name.is_empty() {
            return Some(name.to_string());
        }
    }
    if root.join("var/run/secrets/kubernetes.io").is_dir()
        || root.join("run/secrets/kubernetes.io").is_dir()
    {
        return Some("kubernetes".into());
    }
    if root.join(".dockerenv").exists() {
        return Some("docker".into());
    }
    if root.join("run/.containerenv").exists() {
        return Some("podman".into());
    }
    // Our own cgroup path names the runtime when nothing else does.
    let own = fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
    own.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(crate::boundary::container_of)
        .map(|c| c.runtime.to_string())
}

/// The loaded sched_ext scheduler's name, or "unknown" while one is enabled without a name.
fn sched_ext_in(root: &Path) -> Option<String> {
    let dir = root.join("sys/kernel/sched_ext");
    let state = fs::read_to_string(dir.join("state")).ok()?;
    if state.trim() != "enabled" {
        return None;
    }
    let ops = fs::read_to_string(dir.join("root/ops")).unwrap_or_default();
    Some(match ops.trim() {
        "" => "unknown".to_string(),
        name => name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/` in a fresh temporary directory.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("appease-layout-{name}-{}", std::process::id()));
            let _fresh = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            FakeRoot(dir)
        }

        fn file(&self, path: &str, text: &str) -> &Self {
            let p = self.0.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
            self
        }

        fn dir(&self, path: &str) -> &Self {
            fs::create_dir_all(self.0.join(path)).unwrap();
            self
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _best_effort = fs::remove_dir_all(&self.0);
        }
    }

    const HYBRID: &str = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
        cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
        cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";

    #[test]
    fn a_v1_cpu_controller_wins_on_a_hybrid_host() {
        let r = FakeRoot::new("v1");
        r.file("proc/self/mounts", HYBRID)
            .file("sys/fs/cgroup/cpu/cpu.shares", "1024")
            .file("sys/fs/cgroup/unified/cgroup.controllers", "");
        let l = HostLayout::detect_in(&r.0);
        assert_eq!(l.kind, LayoutKind::CgroupV1);
        assert_eq!(l.cpu_hierarchy, Some(r.0.join("sys/fs/cgroup/cpu")));
        assert!(!l.systemd);
        assert_eq!(l.sched_ext, None);
    }

    #[test]
    fn the_cpu_controller_moved_to_the_unified_hierarchy_is_found_where_it_is_mounted() {
        let r = FakeRoot::new("v2-hybrid");
        let mounts = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
            cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        r.file("proc/self/mounts", mounts)
            .file("sys/fs/cgroup/unified/cgroup.controllers", "cpu pids");
        let l = HostLayout::detect_in(&r.0);
        assert_eq!(l.kind, LayoutKind::CgroupV2);
        assert_eq!(l.cpu_hierarchy, Some(r.0.join("sys/fs/cgroup/unified")));
    }

    #[test]
    fn systemd_and_the_container_it_runs_in_are_reported() {
        let r = FakeRoot::new("nspawn");
        r.file(
            "proc/self/mounts",
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n",
        )
        .file(
            "sys/fs/cgroup/cgroup.controllers",
            "cpuset cpu io memory pids",
        )
        .dir("run/systemd/system")
        .file("run/systemd/container", "systemd-nspawn\n");
        let l = HostLayout::detect_in(&r.0);
        assert_eq!(l.kind, LayoutKind::CgroupV2Systemd);
        assert!(l.systemd);
        assert_eq!(l.container.as_deref(), Some("systemd-nspawn"));
        assert!(l.effects().contains("systemd owns"), "{}", l.effects());
    }

    #[test]
    fn systemd_as_the_hosts_pid_1_is_seen_from_a_container_with_the_hosts_pids() {
        let r = FakeRoot::new("hostpid");
        r.file(".dockerenv", "").file("proc/1/comm", "systemd\n");
        let l = HostLayout::detect_in(&r.0);
        assert!(l.systemd);
        assert_eq!(l.container.as_deref(), Some("docker"));
        r.file("proc/1/comm", "bash\n");
        assert!(!HostLayout::detect_in(&r.0).systemd);
    }

    #[test]
    fn containers_are_known_by_their_marks_or_by_our_own_cgroup() {
        let r = FakeRoot::new("docker");
        r.file(".dockerenv", "");
        assert_eq!(
            HostLayout::detect_in(&r.0).container.as_deref(),
            Some("docker")
        );
        let r = FakeRoot::new("pod");
        r.file(
            "proc/self/cgroup",
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/cri-containerd-0123.scope\n",
        );
        let l = HostLayout::detect_in(&r.0);
        assert_eq!(l.container.as_deref(), Some("kubernetes"));
        assert_eq!(l.kind, LayoutKind::None, "no mounts in this fake root");
        let r = FakeRoot::new("bare");
        r.file(
            "proc/self/cgroup",
            "1:cpu:/\n0::/user.slice/session-3.scope\n",
        );
        assert_eq!(HostLayout::detect_in(&r.0).container, None);
    }

    #[test]
    fn a_loaded_sched_ext_scheduler_is_named_and_said_to_ignore_cgroup_controls() {
        let r = FakeRoot::new("scx");
        r.file("sys/kernel/sched_ext/state", "enabled\n")
            .file("sys/kernel/sched_ext/root/ops", "rusty\n");
        let l = HostLayout::detect_in(&r.0);
        assert_eq!(l.sched_ext.as_deref(), Some("rusty"));
        assert!(l.effects().contains("rusty"));
        assert!(l.effects().contains("ignored"));
        r.file("sys/kernel/sched_ext/state", "disabled\n");
        assert_eq!(HostLayout::detect_in(&r.0).sched_ext, None);
    }
}
