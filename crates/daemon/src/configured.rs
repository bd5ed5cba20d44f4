//! What the config names outright: services, whose processes go to a group of their own
//! (children forked later are born there), and roles, whose threads get a fixed nice that
//! requests do not move. Applied at each scan from what it found.

use std::collections::HashMap;

use appease_actuator::{ActError, KernelActuator};

use crate::batch::{log_failure, Process};
use crate::scanner::{RoleProcess, ServiceProcess};

/// The role processes as the last scan found them.
#[derive(Default)]
pub(crate) struct Configured {
    /// pid -> its start.
    roles: HashMap<u32, u64>,
}

impl Configured {
    /// Whether the process has a fixed role priority (request elevation leaves it alone).
    pub fn is_role(&self, (pid, start): Process) -> bool {
        self.roles.get(&pid) == Some(&start)
    }

    /// Places the services' processes, gives the roles' threads their nice, and gives
    /// back the threads of processes that no longer have a role.
    pub fn apply(
        &mut self,
        services: Vec<ServiceProcess>,
        roles: HashMap<u32, RoleProcess>,
        actuator: &mut KernelActuator,
    ) {
        place_services(&services, actuator);
        apply_roles(&roles, actuator);
        actuator.release_roles(|pid| roles.contains_key(&pid));
        self.roles = roles.into_iter().map(|(pid, r)| (pid, r.start)).collect();
    }
}

/// Moves each configured service's processes (with their current children) into its
/// group.
fn place_services(services: &[ServiceProcess], actuator: &mut KernelActuator) {
    for ServiceProcess {
        pid,
        group,
        members,
    } in services
    {
        if actuator.is_moved(*pid) {
            continue;
        }
        if let Err(e) = actuator.place_in_service(group, *pid, members, "configured service") {
            log_failure(&e, *pid, "place in its service group");
        }
    }
}

/// Gives every thread of each role process its fixed nice (new threads included).
fn apply_roles(roles: &HashMap<u32, RoleProcess>, actuator: &mut KernelActuator) {
    for (&pid, RoleProcess { nice, label, .. }) in roles {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for tid in tasks
            .flatten()
            .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        {
            match actuator.fix_nice(pid, tid, *nice, label) {
                Ok(()) | Err(ActError::Gone { .. }) | Err(ActError::HandsOff { .. }) => {}
                Err(e) => {
                    tracing::warn!(pid, tid, error = %e, "could not give a role its priority")
                }
            }
        }
    }
}
