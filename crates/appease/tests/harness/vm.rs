//! Running a script in the project's VM (cgroup v2, with and without systemd).

use crate::*;

pub(crate) fn in_vm(mode: &str, script: &str) {
    in_vm_with(mode, script, &[]);
}

/// With these files of the repository beside the script in the VM's /opt/appease.
pub(crate) fn in_vm_with(mode: &str, script: &str, files: &[&str]) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let vm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
    let out = Command::new(repo.join("scripts/vm/run.sh"))
        .arg(mode)
        .arg(vm.join(script))
        .arg(vm.join("lib.sh"))
        .args(files.iter().map(|f| repo.join(f)))
        .env("APPEASE_BIN", BIN)
        .output()
        .expect("scripts/vm/run.sh runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    // The whole output is above; the failed checks are repeated here, where a clipped
    // log still shows them.
    let mut failed: Vec<&str> = text.lines().filter(|l| l.starts_with("not ok")).collect();
    if failed.is_empty() {
        // The VM stopped before its checks said anything: its last words instead.
        let lines: Vec<&str> = text.lines().collect();
        failed = lines[lines.len().saturating_sub(20)..].to_vec();
    }
    assert!(
        out.status.success(),
        "the VM's checks failed:\n{}",
        failed.join("\n")
    );
    assert!(
        text.lines().any(|l| l.ends_with(" passed, 0 failed")),
        "no closing count from the VM:\n{text}"
    );
}
