//! The shapes made of systemd's own units, where the bench runs under systemd with the
//! `cpu` controller on cgroup v1 (a legacy-mode host, or `scripts/systemd-container.sh`,
//! which gives a real systemd this machine's real CPUs): every group is a transient scope
//! that systemd makes (`systemd-run --scope`), a quota is a unit property systemd writes,
//! and systemd removes it all when the round's processes are gone.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appease_cgroup::Cgroups;

use super::{Groups, Layout, Shape, LIMIT_QUOTA_US};
use crate::Run;

/// Whether the shapes are to be systemd's units here: systemd is the service manager and
/// the `cpu` controller is on cgroup v1, where systemd keeps its own `name=systemd`
/// hierarchy beside it (on cgroup v2 the bench refuses the scenario).
pub(super) fn wanted() -> bool {
    let layout = appease_cgroup::HostLayout::detect();
    layout.systemd && layout.kind == appease_cgroup::LayoutKind::CgroupV1
}

/// systemd's own hierarchy, which a unit's processes must join too (it tracks units there).
const SYSTEMD_HIERARCHY: &str = "/sys/fs/cgroup/systemd";

/// A scope of `slice` named `name`, held by a sleeping process until the run ends; its
/// group in the `cpu` hierarchy (a CPU setting makes systemd create it there).
fn scope(run: &mut Run, cg: &Cgroups, name: &str, slice: &str, path: &str) -> Result<String> {
    let mut cmd = Command::new("systemd-run");
    cmd.args(["--scope", "--quiet", "--collect"])
        .arg(format!("--unit={name}"))
        .arg(format!("--slice={slice}"))
        .args(["-p", "CPUWeight=100", "--", "sleep", "100000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    run.children.push(
        cmd.spawn()
            .context("starting systemd-run (is systemd the service manager?)")?,
    );
    let group = format!("{path}/{name}");
    let t = Instant::now();
    while !cg.exists(&group) {
        if t.elapsed() > Duration::from_secs(5) {
            bail!("systemd did not make {group} in the cpu hierarchy within 5 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(group)
}

/// Sets `property` of `unit` for this boot, or resets it with an empty value.
fn set_property(unit: &str, property: &str) -> Result<()> {
    let status = Command::new("systemctl")
        .args(["set-property", "--runtime", unit, property])
        .status()
        .context("running systemctl")?;
    if !status.success() {
        bail!("systemctl set-property {unit} {property} failed ({status})");
    }
    Ok(())
}

/// Puts a unit's quota back (no quota) when the run ends.
pub(crate) struct QuotaReset(String);

impl Drop for QuotaReset {
    fn drop(&mut self) {
        if let Err(e) = set_property(&self.0, "CPUQuota=") {
            eprintln!("warning: {} left with its CPU quota: {e:#}", self.0);
        }
    }
}

/// The shape's units: the server's and the client's scopes in `system.slice`, the batch's
/// in `user.slice/user-0.slice` (a user's session) or `system.slice` (a cron job's).
pub(super) fn build(run: &mut Run, shape: Shape) -> Result<Groups> {
    let cg = Cgroups::detect()?;
    let p = format!("appease-bench-{}", std::process::id());
    let server = scope(
        run,
        &cg,
        &format!("{p}-server.scope"),
        "system.slice",
        "/system.slice",
    )?;
    let client = scope(
        run,
        &cg,
        &format!("{p}-client.scope"),
        "system.slice",
        "/system.slice",
    )?;
    let (batch, branch, limited_unit) = match shape.layout {
        Layout::Systemd | Layout::Session => {
            let name = format!("{p}-session.scope");
            let path = "/user.slice/user-0.slice";
            let batch = scope(run, &cg, &name, "user-0.slice", path)?;
            (batch, "/user.slice".to_string(), "user.slice".to_string())
        }
        Layout::Cron => {
            let name = format!("{p}-cron.scope");
            let batch = scope(run, &cg, &name, "system.slice", "/system.slice")?;
            (batch.clone(), batch, name)
        }
        Layout::Container => {
            bail!("the container shape is not built from systemd's units (run it on a host without systemd)")
        }
    };
    if shape.limited {
        // An administrator's quota is not the bench's to change (nor to reset after).
        let had = Command::new("systemctl")
            .args(["show", "-P", "CPUQuotaPerSecUSec", &limited_unit])
            .output()
            .context("running systemctl")?;
        let had = String::from_utf8_lossy(&had.stdout).trim().to_string();
        if had != "infinity" {
            bail!("{limited_unit} has a CPU quota of its own ({had} per second): the limited shapes set their own");
        }
        let percent = LIMIT_QUOTA_US / 1000;
        set_property(&limited_unit, &format!("CPUQuota={percent}%"))?;
        run.quota_resets.push(QuotaReset(limited_unit));
    }
    let names = [server, client, batch, branch];
    Ok(Groups::new(
        cg,
        names,
        vec![PathBuf::from(SYSTEMD_HIERARCHY)],
    ))
}
