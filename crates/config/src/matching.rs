//! Matching a process against the config's rules, services and roles. What grants
//! something names its processes by what a user cannot fake (a uid, a system unit, a
//! cgroup); a `comm` or an executable alone (any user names their process, or runs
//! /usr/sbin/nginx with a config of their own) only where the config says so.

use super::*;

/// What a process is known by, for matching it against rules, services and roles: its
/// name, its executable (/proc/PID/exe), its CPU cgroup and its owner, the last three
/// when read (see [`Config::matching_needs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessFacts<'a> {
    pub comm: &'a str,
    pub exe: Option<&'a Path>,
    pub cgroup: Option<&'a str>,
    pub uid: Option<u32>,
}

/// What matching needs to know of each process besides its name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchingNeeds {
    pub cgroup: bool,
    pub uid: bool,
    pub exe: bool,
}

/// Whether `name` is a systemd unit's full name (shared with the journal's check).
pub use appease_cgroup::names::valid_unit_name;

/// Whether a cgroup path component is a user's service manager (`user@UID.service`), under
/// which the units are the user's to name.
fn is_user_manager(part: &str) -> bool {
    part.starts_with("user@") && part.ends_with(".service")
}

/// Whether the CPU cgroup `path` is in the system's unit `unit` (or below it): where
/// systemd puts it, every component above it a slice (not a user's manager, not a
/// container's own `system.slice` below its scope).
fn in_system_unit(path: &str, unit: &str) -> bool {
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if part == unit {
            return true;
        }
        if is_user_manager(part) || !part.ends_with(".slice") {
            return false;
        }
    }
    false
}

impl Rule {
    /// The checks every matcher (rule, service, role) must pass.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.comm.is_none()
            && self.exe.is_none()
            && self.cgroup.is_none()
            && self.user.is_none()
            && self.unit.is_none()
        {
            return Err("give at least one of comm, exe, cgroup, user, unit to match".into());
        }
        if let Some(c) = &self.comm {
            if c.is_empty() || c.len() > 15 {
                return Err(format!("comm {c:?} must be 1 to 15 bytes"));
            }
        }
        if let Some(e) = &self.exe {
            let normal: PathBuf = e.components().collect();
            let ok = e.is_absolute()
                && normal.as_os_str() == e.as_os_str()
                && !e.components().any(|c| c == std::path::Component::ParentDir)
                && !e.as_os_str().as_encoded_bytes().ends_with(b" (deleted)");
            if !ok {
                return Err(format!(
                    "exe {e:?} must be an executable's absolute path as /proc/PID/exe gives it, \
                     like /usr/sbin/nginx (no '..', '.', '//', trailing '/' or \" (deleted)\")"
                ));
            }
        }
        if let Some(c) = &self.cgroup {
            if !c.starts_with('/') || c.contains("..") {
                return Err(format!(
                    "cgroup {c:?} must be an absolute path in the CPU hierarchy, \
                     like /system.slice/backup.service"
                ));
            }
        }
        if let Some(u) = &self.unit {
            if !valid_unit_name(u) {
                return Err(format!(
                    "unit {u:?} must be a systemd unit's full name, like postgresql.service \
                     (letters, digits, ':', '_', '.', '\\', '@', '-', a suffix such as \
                     .service, .scope or .slice, at most 255 bytes)"
                ));
            }
        }
        if let Some(u) = &self.user {
            if u.parse::<u32>().is_err() && uid_of(u).is_none() {
                return Err(format!("unknown user {u:?}"));
            }
        }
        if self.grants() && self.by_name_alone() && !self.trust_comm {
            return Err(format!(
                "matches by {} alone, which any user can give their own process (a name) or \
                 run (an executable) to be granted it: add user (and/or unit, cgroup), or set \
                 trust_comm = true on this entry",
                self.names()
            ));
        }
        Ok(())
    }

    /// Whether the processes it matches get more than a user could give themselves
    /// (latency: never demoted; a service's group and a role's nice are latency too).
    fn grants(&self) -> bool {
        self.class == Class::Latency
    }

    /// Whether it picks its processes by their name or executable only.
    fn by_name_alone(&self) -> bool {
        self.cgroup.is_none() && self.user.is_none() && self.unit.is_none()
    }

    /// The name and executable it matches, for messages.
    pub(crate) fn names(&self) -> String {
        let comm = self.comm.as_ref().map(|c| format!("comm {c:?}"));
        let exe = self.exe.as_ref().map(|e| format!("exe {e:?}"));
        [comm, exe]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and ")
    }

    /// Whether it is accepted only because `trust_comm` is set.
    pub(crate) fn trusted_by_comm(&self) -> bool {
        self.trust_comm && self.grants() && self.by_name_alone()
    }

    /// Whether a process with these facts matches every field the rule gives.
    pub fn matches(&self, p: &ProcessFacts) -> bool {
        let user_ok = self.user.as_ref().is_none_or(|u| {
            let want = *self
                .uid
                .get_or_init(|| u.parse::<u32>().ok().or_else(|| uid_of(u)));
            want.is_some() && want == p.uid
        });
        let cgroup_ok = self.cgroup.as_ref().is_none_or(|c| {
            let c = c.trim_end_matches('/');
            p.cgroup
                .is_some_and(|g| g == c || g.starts_with(&format!("{c}/")))
        });
        let unit_ok = self
            .unit
            .as_ref()
            .is_none_or(|u| p.cgroup.is_some_and(|g| in_system_unit(g, u)));
        // A binary replaced by an upgrade since the process started shows " (deleted)".
        let exe_ok = self.exe.as_ref().is_none_or(|e| {
            p.exe.is_some_and(|x| {
                let x = x.as_os_str().as_encoded_bytes();
                x.strip_suffix(b" (deleted)").unwrap_or(x) == e.as_os_str().as_encoded_bytes()
            })
        });
        self.comm.as_ref().is_none_or(|c| c == p.comm) && exe_ok && user_ok && cgroup_ok && unit_ok
    }

    /// True when matching needs the process's cgroup.
    pub fn needs_cgroup(&self) -> bool {
        self.cgroup.is_some() || self.unit.is_some()
    }

    /// True when matching needs the process's owner.
    pub fn needs_uid(&self) -> bool {
        self.user.is_some()
    }

    /// True when matching needs the process's executable.
    pub fn needs_exe(&self) -> bool {
        self.exe.is_some()
    }
}
