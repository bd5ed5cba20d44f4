//! The layouts most hosts run, booted in a VM (scripts/vm): Debian 13 with cgroup v2 under
//! systemd, and the same kernel with a minimal PID 1 (cgroup v2, no service manager). The
//! checks run inside the VM (crates/appease/tests/vm/*.sh); each prints ok / not ok. The
//! systemd tests share one boot, each script run in turn, each test reading its part; the VM
//! without systemd boots beside it (harness/vm.rs).

use super::*;

root_test! {
    fn on_cgroup_v2_under_systemd_demoted_soakers_stay_in_their_units_held_to_their_limits() {
        in_systemd_vm("systemd.sh");
    }
}

root_test! {
    fn as_a_systemd_service_it_notifies_ready_pings_the_watchdog_and_restores_after_a_crash() {
        in_systemd_vm("service.sh");
    }
}

root_test! {
    fn on_cgroup_v2_without_systemd_free_soakers_move_and_limited_ones_are_demoted_in_place() {
        in_vm("init", "init.sh");
    }
}
