//! One interface over the two CPU cgroup layouts:
//! - v1: the `cpu` controller mounted on its own (`/sys/fs/cgroup/cpu`), `cpu.shares`
//!   (1024 = default) and `cpu.idle`;
//! - v2: the unified hierarchy with the `cpu` controller enabled (`/sys/fs/cgroup`),
//!   `cpu.weight` (100 = default) and `cpu.idle`.
//!
//! Paths handed in and out are relative to the hierarchy's root and start with `/`,
//! as in /proc/PID/cgroup. appease's own groups sit at the top of the hierarchy:
//! the kernel compares idle-ness between siblings, so an idle group nested under a
//! non-idle parent would not protect what runs beside that parent.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub mod boundary;
pub mod layout;
pub mod names;
pub mod procstat;

pub use boundary::{besteffort_pod_of, container_of, Boundary, Container};
pub use layout::{HostLayout, LayoutKind};
pub use procstat::{
    clock_tick_ns, read_ppid, read_stat, resident_kib, stat_fields, stat_ppid, status_real_uid,
    status_value, ProcStat,
};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable CPU cgroup hierarchy: /proc/self/mounts lists neither a cgroup v1 hierarchy with the cpu controller nor a cgroup2 mount whose cgroup.controllers offers cpu")]
    NoCpuController,
    #[error("the CPU cgroup hierarchy at {root} has no cpu.idle (needs Linux 5.15 or newer)")]
    NoIdleSupport { root: PathBuf },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid group name {0:?}: one path component of letters, digits, '.', '-' or '_'")]
    BadName(String),
}

impl CgroupError {
    /// The system call's error behind it, if one was.
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            CgroupError::Io { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The task or group vanished under us: log and skip, never fatal.
    pub fn is_gone(&self) -> bool {
        const ESRCH: i32 = 3;
        matches!(self, CgroupError::Io { source, .. }
            if source.raw_os_error() == Some(ESRCH) || source.kind() == io::ErrorKind::NotFound)
    }
}

/// The least weight a group can have: cgroup v2's `cpu.weight` 1, v1's `cpu.shares` 2.
pub const LEAST_WEIGHT: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The kernfs ids of a process's cgroups: in the v1 `cpu` hierarchy (0: none mounted) and
/// in the unified one (0: not known). An id names one cgroup for as long as it lives and
/// is not given to another, so a path read for it once stays its path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CgroupIds {
    pub v1_cpu: u64,
    pub v2: u64,
}

impl CgroupIds {
    /// The id of the group `Cgroups::group_of` names in hierarchy `version` (0: not known).
    pub fn of(&self, version: Version) -> u64 {
        match version {
            Version::V1 => self.v1_cpu,
            Version::V2 => self.v2,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Cgroups {
    version: Version,
    root: PathBuf,
}

/// Every write and mkdir of this crate: a test build's failpoint `cgroup-write` (feature
/// `failpoints`, e.g. FAILPOINTS=cgroup-write=50%return) makes the filesystem refuse it,
/// as a cgroup filesystem refuses what it will not do (EACCES here).
fn write(path: &Path, value: impl AsRef<[u8]>) -> io::Result<()> {
    refused()?;
    fs::write(path, value)
}

fn create_dir(path: &Path) -> io::Result<()> {
    refused()?;
    fs::create_dir(path)
}

fn refused() -> io::Result<()> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("cgroup-write", |_| Err(io::Error::from_raw_os_error(
        libc::EACCES
    )));
    Ok(())
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl Cgroups {
    /// Finds the CPU hierarchy of this host from the mount table: a v1 hierarchy with
    /// the cpu controller if there is one, otherwise a cgroup2 mount that offers cpu
    /// (at /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host).
    pub fn detect() -> Result<Self, CgroupError> {
        match layout::cpu_hierarchy_in(Path::new("/")) {
            Some((version, root)) => Self::at(version, &root),
            None => Err(CgroupError::NoCpuController),
        }
    }

    /// A hierarchy at a given root (tests, unusual mounts).
    pub fn at(version: Version, root: &Path) -> Result<Self, CgroupError> {
        let cg = Cgroups {
            version,
            root: root.to_path_buf(),
        };
        if version == Version::V2 {
            // Children only get cpu.* files when the root delegates the controller.
            let ctl = root.join("cgroup.subtree_control");
            let enabled = fs::read_to_string(&ctl).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "cpu") {
                write(&ctl, "+cpu").map_err(io_err("enabling the cpu controller in", &ctl))?;
            }
        }
        Ok(cg)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The kernfs id of `group` (its directory's inode): what `CgroupIds` holds for it.
    pub fn group_id(&self, group: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        fs::symlink_metadata(self.dir(group)).ok().map(|m| m.ino())
    }

    pub(crate) fn dir(&self, group: &str) -> PathBuf {
        self.root.join(group.trim_start_matches('/'))
    }

    /// The group `pid` is in, in this hierarchy (e.g. "/" or "/system.slice/x.service").
    pub fn group_of(&self, pid: u32) -> Result<String, CgroupError> {
        let path = PathBuf::from(format!("/proc/{pid}/cgroup"));
        let text = fs::read_to_string(&path).map_err(io_err("reading", &path))?;
        parse_proc_cgroup(&text, self.version).ok_or_else(|| CgroupError::Io {
            op: "finding the cpu controller in",
            path,
            source: io::Error::new(io::ErrorKind::InvalidData, "no cpu line"),
        })
    }

    /// Creates a top-level group `/name` (if missing) with the given settings (`weight` as
    /// `set_weight` takes it, for a group that is not idle). One found idle is taken as it
    /// is for an idle group and refused (unchanged) for a weighted one.
    pub fn ensure_top_group(
        &self,
        name: &str,
        idle: bool,
        weight: u32,
    ) -> Result<String, CgroupError> {
        check_name(name)?;
        let group = format!("/{name}");
        let dir = self.dir(&group);
        match create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating", &dir)(e)),
        }
        if !dir.join("cpu.idle").exists() {
            let _best_effort = fs::remove_dir(&dir);
            return Err(CgroupError::NoIdleSupport {
                root: self.root.clone(),
            });
        }
        // The kernel refuses a weight for an idle group (EINVAL). An idle group's weight is
        // the kernel's own, so none is written for one: an idle group found (one an earlier
        // run left) is taken as it is. A weighted group found idle is refused, unchanged.
        if !idle {
            self.set_weight(&group, weight)?;
        }
        self.set_idle(&group, idle)?;
        Ok(group)
    }

    /// Creates `parent/name` (if missing) with a weight; on v2 the parent must delegate
    /// the cpu controller to its children, which this enables.
    pub fn ensure_child_group(
        &self,
        parent: &str,
        name: &str,
        weight: u32,
    ) -> Result<String, CgroupError> {
        check_name(name)?;
        if self.version == Version::V2 {
            let ctl = self.dir(parent).join("cgroup.subtree_control");
            let enabled = fs::read_to_string(&ctl).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "cpu") {
                write(&ctl, "+cpu").map_err(io_err("enabling the cpu controller in", &ctl))?;
            }
        }
        let group = format!("{}/{name}", parent.trim_end_matches('/'));
        let dir = self.dir(&group);
        match create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating", &dir)(e)),
        }
        self.set_weight(&group, weight)?;
        Ok(group)
    }

    /// cpu.idle = 1 makes the group's tasks run only when nothing non-idle beside it wants the CPU.
    pub fn set_idle(&self, group: &str, idle: bool) -> Result<(), CgroupError> {
        let f = self.dir(group).join("cpu.idle");
        write(&f, if idle { "1" } else { "0" }).map_err(io_err("writing", &f))
    }

    /// Weight on v2's scale (1..=10000, default 100); v1 shares are weight × 1024 / 100,
    /// but `LEAST_WEIGHT` is the least either allows (v1's 2 shares).
    pub fn set_weight(&self, group: &str, weight: u32) -> Result<(), CgroupError> {
        let weight = weight.clamp(LEAST_WEIGHT, 10_000);
        let (file, value) = match self.version {
            Version::V1 if weight == LEAST_WEIGHT => ("cpu.shares", 2),
            Version::V1 => ("cpu.shares", weight as u64 * 1024 / 100),
            Version::V2 => ("cpu.weight", weight as u64),
        };
        let f = self.dir(group).join(file);
        write(&f, value.to_string()).map_err(io_err("writing", &f))
    }

    /// The group's weight file as the kernel shows it (`cpu.shares` on v1, `cpu.weight`
    /// on v2), to be written back as it was.
    pub fn weight_raw(&self, group: &str) -> Result<String, CgroupError> {
        let f = self.dir(group).join(self.weight_file());
        Ok(fs::read_to_string(&f)
            .map_err(io_err("reading", &f))?
            .trim()
            .to_string())
    }

    /// A weight file's value (`weight_raw`) in cgroup v2 units, as `set_weight` takes them.
    pub fn weight_from_raw(&self, raw: &str) -> Option<u32> {
        let v: u64 = raw.trim().parse().ok()?;
        let w = match self.version {
            Version::V1 => v * 100 / 1024,
            Version::V2 => v,
        };
        u32::try_from(w).ok()
    }

    pub fn set_weight_raw(&self, group: &str, value: &str) -> Result<(), CgroupError> {
        let f = self.dir(group).join(self.weight_file());
        write(&f, value).map_err(io_err("writing", &f))
    }

    fn weight_file(&self) -> &'static str {
        match self.version {
            Version::V1 => "cpu.shares",
            Version::V2 => "cpu.weight",
        }
    }

    /// A CPU quota of `quota_us` per 100 ms period on the group, or none (`cpu.cfs_quota_us`
    /// on v1, `cpu.max` on v2).
    pub fn set_cpu_quota(&self, group: &str, quota_us: Option<u64>) -> Result<(), CgroupError> {
        let (file, value) = match (self.version, quota_us) {
            (Version::V1, Some(q)) => ("cpu.cfs_quota_us", q.to_string()),
            (Version::V1, None) => ("cpu.cfs_quota_us", "-1".to_string()),
            (Version::V2, Some(q)) => ("cpu.max", format!("{q} 100000")),
            (Version::V2, None) => ("cpu.max", "max 100000".to_string()),
        };
        let f = self.dir(group).join(file);
        write(&f, value).map_err(io_err("writing", &f))
    }

    pub fn idle(&self, group: &str) -> Result<bool, CgroupError> {
        let f = self.dir(group).join("cpu.idle");
        let v = fs::read_to_string(&f).map_err(io_err("reading", &f))?;
        Ok(v.trim() == "1")
    }

    /// Moves a whole process (all its threads) into `group`.
    pub fn move_process(&self, pid: u32, group: &str) -> Result<(), CgroupError> {
        let f = self.dir(group).join("cgroup.procs");
        write(&f, pid.to_string()).map_err(io_err("moving a process into", &f))
    }

    /// Processes in `group` (not in its children).
    pub fn processes(&self, group: &str) -> Result<Vec<u32>, CgroupError> {
        let f = self.dir(group).join("cgroup.procs");
        let text = fs::read_to_string(&f).map_err(io_err("reading", &f))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Processes in `group` and every group below it.
    pub fn processes_below(&self, group: &str) -> Result<Vec<u32>, CgroupError> {
        let mut all = self.processes(group)?;
        let dir = self.dir(group);
        let children = fs::read_dir(&dir).map_err(io_err("reading", &dir))?;
        for e in children.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let child = format!(
                    "{}/{}",
                    group.trim_end_matches('/'),
                    e.file_name().to_string_lossy()
                );
                all.extend(self.processes_below(&child)?);
            }
        }
        Ok(all)
    }

    pub fn exists(&self, group: &str) -> bool {
        self.dir(group).is_dir()
    }

    /// Removes the empty job groups (`job-N`) directly inside `group`: what an earlier run
    /// of appease that lost its journal left in a group of its own. Nothing else is
    /// touched (a group another tool made there is not appease's), never at the root, and
    /// the kernel removes no group that holds a process or a group. Returns how many went.
    pub fn remove_empty_job_groups(&self, group: &str) -> usize {
        if group.trim_matches('/').is_empty() {
            return 0;
        }
        let Ok(entries) = fs::read_dir(self.dir(group)) else {
            return 0;
        };
        let is_job = |name: &str| {
            name.strip_prefix("job-")
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let dir = e.file_type().is_ok_and(|t| t.is_dir());
            if dir && e.file_name().to_str().is_some_and(is_job) && fs::remove_dir(e.path()).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }

    /// Removes an (empty) group; a missing group is fine.
    pub fn remove(&self, group: &str) -> Result<(), CgroupError> {
        let dir = self.dir(group);
        match fs::remove_dir(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing", &dir)(e)),
        }
    }
}

/// A group name is one path component of letters, digits, '.', '-' or '_'.
fn check_name(name: &str) -> Result<(), CgroupError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(CgroupError::BadName(name.to_string()))
    }
}

/// The cpu hierarchy's path from /proc/PID/cgroup text.
pub fn parse_proc_cgroup(text: &str, version: Version) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match version {
            Version::V1 => controllers.split(',').any(|c| c == "cpu"),
            Version::V2 => id == "0" && controllers.is_empty(),
        };
        wanted.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_TEXT: &str = "9:name=systemd:/\n2:cpuacct:/\n1:cpu:/appease.batch\n0::/\n";
    const V1_JOINT: &str = "4:cpu,cpuacct:/user.slice\n0::/user.slice/session-1.scope\n";
    const V2_TEXT: &str = "0::/system.slice/nginx.service\n";

    #[test]
    fn finds_the_cpu_hierarchy_path() {
        assert_eq!(
            parse_proc_cgroup(V1_TEXT, Version::V1).as_deref(),
            Some("/appease.batch")
        );
        assert_eq!(
            parse_proc_cgroup(V1_JOINT, Version::V1).as_deref(),
            Some("/user.slice")
        );
        assert_eq!(
            parse_proc_cgroup(V2_TEXT, Version::V2).as_deref(),
            Some("/system.slice/nginx.service")
        );
        assert_eq!(parse_proc_cgroup("", Version::V2), None);
    }

    #[test]
    fn rejects_names_that_are_not_one_component() {
        let cg = Cgroups {
            version: Version::V1,
            root: std::env::temp_dir(),
        };
        for bad in ["", "../x", "a/b", "a b"] {
            assert!(
                matches!(
                    cg.ensure_top_group(bad, true, 100),
                    Err(CgroupError::BadName(_))
                ),
                "{bad}"
            );
        }
    }
}
