//! Running a script in the project's VM (cgroup v2, with and without systemd).

use crate::*;

pub(crate) fn in_vm(mode: &str, script: &str) {
    if (mode, script) == INIT_VM {
        if let Some((ok, text)) = INIT_RUN.get() {
            return check_vm_output(*ok, text, text);
        }
    }
    in_vm_with(mode, script, &[]);
}

/// The VM without systemd, which boots beside the systemd one (below).
const INIT_VM: (&str, &str) = ("init", "init.sh");
/// What it printed, once it ran beside the systemd VM.
static INIT_RUN: std::sync::OnceLock<(bool, String)> = std::sync::OnceLock::new();

/// The scripts that share one boot of the systemd VM (a boot and power-off on emulated
/// CPUs take about a minute), with the files they need.
const SYSTEMD_PARTS: [&str; 3] = ["systemd.sh", "service.sh", "chaos.sh"];
const SYSTEMD_FILES: [&str; 1] = ["deploy/appease.service"];

/// Runs `script`, one of `SYSTEMD_PARTS`, in the systemd VM: the first test to ask boots it
/// once for every part (each a script of its own, run in turn), and each test checks its
/// own part of what the VM printed.
pub(crate) fn in_systemd_vm(script: &str) {
    static RUN: std::sync::OnceLock<(bool, String)> = std::sync::OnceLock::new();
    assert!(
        SYSTEMD_PARTS.contains(&script),
        "{script} is not a part of the shared boot"
    );
    let (_, text) = RUN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("appease-vm-parts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let driver = dir.join("parts.sh");
        // `make chaos`'s unit rounds (chaos.sh); `make test` runs its short form.
        let mut lines = unit_rounds()
            .map_or(String::new(), |n| format!("export CHAOS_UNIT_ROUNDS={n}\n"));
        for part in SYSTEMD_PARTS {
            lines += &format!(
                "echo '=== PART {part}'; sh /opt/appease/{part}; echo \"=== PART END {part} rc=$?\"\n"
            );
        }
        std::fs::write(&driver, lines).unwrap();
        let vm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
        let mut files: Vec<String> = SYSTEMD_PARTS
            .iter()
            .map(|p| vm.join(p).display().to_string())
            .collect();
        files.extend(SYSTEMD_FILES.iter().map(|f| f.to_string()));
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        // QEMU runs each VM's emulated CPUs on one host thread: the VM without systemd
        // runs on the other CPU meanwhile (a minute against six), and is done first, so
        // nothing is left running when the tests end. The tests run one at a time, so
        // nothing else runs beside them.
        let vm_dir = vm.clone();
        let init = std::thread::spawn(move || run_vm(INIT_VM.0, &vm_dir.join(INIT_VM.1), &[]));
        let run = run_vm("systemd", &driver, &files);
        let _best_effort = std::fs::remove_dir_all(&dir);
        if let Ok(init) = init.join() {
            let _first = INIT_RUN.set(init);
        }
        run
    });
    let part: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != format!("=== PART {script}"))
        .take_while(|l| !l.starts_with(&format!("=== PART END {script} ")))
        .collect();
    let ended = text
        .lines()
        .find(|l| l.starts_with(&format!("=== PART END {script} ")));
    check_vm_output(
        ended == Some(format!("=== PART END {script} rc=0").as_str()),
        &part.join("\n"),
        text,
    );
}

/// The chaos harness's unit rounds `make chaos` asks for (CHAOS_UNIT_ROUNDS), if any.
fn unit_rounds() -> Option<u32> {
    let n = std::env::var("CHAOS_UNIT_ROUNDS").ok()?;
    Some(n.parse().expect("CHAOS_UNIT_ROUNDS is a number of rounds"))
}

/// With these files of the repository beside the script in the VM's /opt/appease.
pub(crate) fn in_vm_with(mode: &str, script: &str, files: &[&str]) {
    let vm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
    let (ok, text) = run_vm(mode, &vm.join(script), files);
    check_vm_output(ok, &text, &text);
}

/// Boots the VM in `mode` once to run `script` with lib.sh and `files` (paths from the
/// repository's root, or absolute) beside it; whether it passed, and what it printed.
fn run_vm(mode: &str, script: &std::path::Path, files: &[&str]) -> (bool, String) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let vm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
    let mut cmd = Command::new(repo.join("scripts/vm/run.sh"));
    // `make chaos`'s unit rounds take about 20 s each on the emulated CPUs.
    if let Some(rounds) = unit_rounds() {
        cmd.env("APPEASE_VM_TIMEOUT", (900 + 40 * rounds).to_string());
    }
    let out = cmd
        .arg(mode)
        .arg(script)
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
    (out.status.success(), text)
}

/// Asserts that checks printed `text` (all the VM printed: `whole`) and passed.
fn check_vm_output(ok: bool, text: &str, whole: &str) {
    eprintln!("{whole}");
    // The whole output is above; the failed checks are repeated here, where a clipped
    // log still shows them.
    let mut failed: Vec<&str> = text.lines().filter(|l| l.starts_with("not ok")).collect();
    if failed.is_empty() {
        // The VM stopped before its checks said anything: its last words instead.
        let lines: Vec<&str> = whole.lines().collect();
        failed = lines[lines.len().saturating_sub(20)..].to_vec();
    }
    assert!(ok, "the VM's checks failed:\n{}", failed.join("\n"));
    assert!(
        text.lines().any(|l| l.ends_with(" passed, 0 failed")),
        "no closing count from the VM:\n{whole}"
    );
}
