//! On a systemd host, what appease changes in the cgroup tree goes through systemd's
//! D-Bus API: systemd owns the tree, and its delegation rules ask that nobody else write
//! to it. A batch tree that is all a unit holds makes the unit itself idle, in place, with
//! a runtime property (`CPUWeight=idle`, which systemd ≥ 252 writes as `cpu.idle = 1`):
//! the unit keeps its processes, its limits and its bookkeeping, and `systemctl stop`
//! still reaches everything. systemd persists a runtime property as a drop-in under
//! /run/systemd/system.control; appease puts back what that file held before (or
//! removes it), so that nothing an administrator set is lost.
//!
//! The same property, through the same call, makes a batch's branch idle where it meets a
//! server's (`user.slice`) and weights a server's branch up (`system.slice`), see
//! `unit_weight`.
//!
//! The calls sit behind `UnitControl`, so the actuator's logic can be tested without a bus.

use std::fs;
use std::path::PathBuf;

use zbus::blocking::{Connection, Proxy};
use zbus::zvariant::{OwnedObjectPath, Value};

/// systemd's CPUWeight for the idle class.
pub const WEIGHT_IDLE: u64 = 0;
/// CPUWeight not set (systemd's CGROUP_WEIGHT_INVALID): the default applies.
pub const WEIGHT_UNSET: u64 = u64::MAX;

#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    #[error("systemd over D-Bus: {0}")]
    Bus(#[from] zbus::Error),
    #[error("unit {unit}: {what}")]
    Unit { unit: String, what: String },
}

/// A unit and the cgroup it owns (relative to the hierarchy's root, e.g.
/// `/system.slice/backup.service`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub id: String,
    pub cgroup: String,
    /// Made at run time (systemd-run, a session scope): its drop-ins live elsewhere.
    pub transient: bool,
}

/// What appease asks of systemd.
pub trait UnitControl {
    /// The unit `pid` belongs to.
    fn unit_of(&self, pid: u32) -> Result<Unit, UnitError>;
    /// The unit's CPUWeight property (WEIGHT_UNSET when not set).
    fn cpu_weight(&self, unit: &str) -> Result<u64, UnitError>;
    /// Sets CPUWeight as a runtime property (lost at reboot).
    fn set_cpu_weight(&self, unit: &str, weight: u64) -> Result<(), UnitError>;
    /// Whether the unit is gone (not loaded, or stopped with nothing left of it).
    fn unit_gone(&self, unit: &str) -> bool;
    /// The unit of systemd's manager that owns `cgroup` itself (`/user.slice` is
    /// `user.slice`); an error for a group no unit of this manager owns (the root, a
    /// delegated subtree such as a user manager's units).
    fn unit_at(&self, cgroup: &str) -> Result<Unit, UnitError>;
    /// The system bus's daemon: appease's own calls reach systemd through it, so what it
    /// receives is no sign of a server for the branch rules.
    fn bus_daemon_pid(&self) -> Option<u32> {
        None
    }
}

/// The D-Bus interface that carries the cgroup properties of a unit named `unit`, by its
/// type: None for a type that has no cgroup of its own.
fn cgroup_interface(unit: &str) -> Option<&'static str> {
    Some(match unit.rsplit_once('.')?.1 {
        "service" => "org.freedesktop.systemd1.Service",
        "scope" => "org.freedesktop.systemd1.Scope",
        "slice" => "org.freedesktop.systemd1.Slice",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
    })
}

/// The unit name a cgroup's last component would be, if it is one that owns a cgroup.
pub fn unit_name_of(cgroup: &str) -> Option<&str> {
    let name = cgroup.rsplit('/').next()?;
    cgroup_interface(name).map(|_| name)
}

/// The runtime drop-in systemd writes for a CPUWeight set with SetUnitProperties: under
/// /run/systemd/transient for a transient unit, /run/systemd/system.control otherwise.
pub fn cpu_weight_dropin(unit: &str, transient: bool) -> PathBuf {
    let dir = if transient {
        "/run/systemd/transient"
    } else {
        "/run/systemd/system.control"
    };
    PathBuf::from(format!("{dir}/{unit}.d/50-CPUWeight.conf"))
}

/// The drop-in's text now, if any.
pub fn read_dropin(unit: &str, transient: bool) -> Option<String> {
    fs::read_to_string(cpu_weight_dropin(unit, transient)).ok()
}

/// Puts back the drop-in as it was before appease set the property: its old text, or no
/// file. The live value is already back (set through the bus); this keeps a later
/// `daemon-reload` from bringing appease's value back.
pub fn put_back_dropin(unit: &str, transient: bool, before: Option<&str>) {
    let path = cpu_weight_dropin(unit, transient);
    let result = match before {
        Some(text) => fs::write(&path, text),
        None => match fs::remove_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
    };
    if let Err(e) = result {
        tracing::warn!(unit, path = %path.display(), error = %e, "could not put back the runtime drop-in");
    }
}

/// systemd's manager on the system bus.
pub struct SystemBus {
    conn: Connection,
    daemon_pid: Option<u32>,
}

const DEST: &str = "org.freedesktop.systemd1";

impl SystemBus {
    pub fn connect() -> Result<Self, UnitError> {
        let conn = Connection::system()?;
        let daemon_pid = Proxy::new(
            &conn,
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
        )
        .and_then(|p| p.call("GetConnectionUnixProcessID", &("org.freedesktop.DBus",)))
        .ok();
        Ok(SystemBus { conn, daemon_pid })
    }

    fn manager(&self) -> Result<Proxy<'_>, UnitError> {
        Ok(Proxy::new(
            &self.conn,
            DEST,
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
        )?)
    }

    /// The interface that carries a unit's cgroup properties, by its type.
    fn typed<'a>(&'a self, unit: &str) -> Result<Proxy<'a>, UnitError> {
        let path: OwnedObjectPath = self.manager()?.call("GetUnit", &(unit,))?;
        self.typed_at(unit, path)
    }

    fn typed_at<'a>(&'a self, unit: &str, path: OwnedObjectPath) -> Result<Proxy<'a>, UnitError> {
        let iface = cgroup_interface(unit).ok_or_else(|| UnitError::Unit {
            unit: unit.into(),
            what: "has no cgroup of its own".into(),
        })?;
        Ok(Proxy::new(&self.conn, DEST, path, iface)?)
    }

    /// The unit at object `path`: its name, its cgroup and whether it is transient, all
    /// read at that path (one lookup, whether it was found by pid or by name).
    fn unit_from(&self, path: OwnedObjectPath) -> Result<Unit, UnitError> {
        let unit = Proxy::new(
            &self.conn,
            DEST,
            path.clone(),
            "org.freedesktop.systemd1.Unit",
        )?;
        let id: String = unit.get_property("Id")?;
        let transient: bool = unit.get_property("Transient")?;
        let cgroup: String = self.typed_at(&id, path)?.get_property("ControlGroup")?;
        Ok(Unit {
            id,
            cgroup,
            transient,
        })
    }
}

impl UnitControl for SystemBus {
    fn bus_daemon_pid(&self) -> Option<u32> {
        self.daemon_pid
    }

    fn unit_of(&self, pid: u32) -> Result<Unit, UnitError> {
        self.unit_from(self.manager()?.call("GetUnitByPID", &(pid,))?)
    }

    fn cpu_weight(&self, unit: &str) -> Result<u64, UnitError> {
        Ok(self.typed(unit)?.get_property("CPUWeight")?)
    }

    fn unit_gone(&self, unit: &str) -> bool {
        let loaded: Result<OwnedObjectPath, _> = self
            .manager()
            .and_then(|m| Ok(m.call("GetUnit", &(unit,))?));
        loaded.is_err()
    }

    fn unit_at(&self, cgroup: &str) -> Result<Unit, UnitError> {
        let not_a_unit = |what: String| UnitError::Unit {
            unit: cgroup.into(),
            what,
        };
        let id = unit_name_of(cgroup).ok_or_else(|| not_a_unit("is no unit's cgroup".into()))?;
        let unit = self.unit_from(self.manager()?.call("GetUnit", &(id,))?)?;
        if unit.cgroup != cgroup {
            let owns = format!("{id} of systemd owns {}, not this group", unit.cgroup);
            return Err(not_a_unit(owns));
        }
        Ok(unit)
    }

    fn set_cpu_weight(&self, unit: &str, weight: u64) -> Result<(), UnitError> {
        let props: Vec<(&str, Value<'_>)> = vec![("CPUWeight", Value::U64(weight))];
        self.manager()?
            .call::<_, _, ()>("SetUnitProperties", &(unit, true, props))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroups_unit_name_is_its_last_component_when_that_names_a_unit_with_a_cgroup() {
        assert_eq!(unit_name_of("/user.slice"), Some("user.slice"));
        assert_eq!(
            unit_name_of("/user.slice/user-0.slice/session-1.scope"),
            Some("session-1.scope")
        );
        assert_eq!(
            unit_name_of("/system.slice/redis.service"),
            Some("redis.service")
        );
        assert_eq!(unit_name_of("/"), None);
        assert_eq!(unit_name_of("/docker/0123abcd"), None);
        assert_eq!(unit_name_of("/system.slice/foo.service/payload"), None);
        assert_eq!(unit_name_of("/system.slice/home.mount"), Some("home.mount"));
        assert_eq!(
            unit_name_of("/a/sda.device"),
            None,
            "a device unit has no cgroup"
        );
    }
}
