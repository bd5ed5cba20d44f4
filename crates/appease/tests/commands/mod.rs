//! What the command line, `make install` and the deployment files promise, checked as
//! any user: bad arguments refused with the reason, the files installed and removed
//! again, the DaemonSet asking for no more than the daemon needs.

use super::*;

#[test]
fn bench_rejects_unknown_scenarios_modes_and_loads() {
    for (args, expect) in [
        (vec!["bench", "nosuch"], "unknown scenario \"nosuch\""),
        (
            vec!["bench", "synthetic", "--modes", "fast"],
            "unknown mode \"fast\"",
        ),
        (vec!["bench", "synthetic", "--load=-1"], "--load -1"),
        (
            vec!["bench", "synthetic", "--batch", "backup"],
            "unknown batch load \"backup\"",
        ),
        (
            vec!["bench", "synthetic", "--arrivals", "bursty"],
            "unknown arrivals \"bursty\"",
        ),
    ] {
        fails_saying(Command::new(BIN).args(&args), expect);
    }
}

#[test]
fn make_install_and_uninstall_honour_destdir_and_keep_the_config() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let stage = TempDir::new("install");
    let make = |target: &str| {
        let out = Command::new("make")
            .arg("-C")
            .arg(&repo)
            .arg(target)
            .arg(format!("DESTDIR={}", stage.0.display()))
            .arg("PREFIX=/usr")
            .output()
            .expect("make runs");
        assert!(
            out.status.success(),
            "make {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    make("install");
    let bin = stage.0.join("usr/bin/appease");
    let cfg = stage.0.join("etc/appease/appease.toml");
    let unit = stage.0.join("etc/systemd/system/appease.service");
    assert!(bin.exists() && cfg.exists() && unit.exists());
    let man = stage.0.join("usr/share/man/man8/appease.8");
    let bash = stage
        .0
        .join("usr/share/bash-completion/completions/appease");
    let zsh = stage.0.join("usr/share/zsh/vendor-completions/_appease");
    let fish = stage
        .0
        .join("usr/share/fish/vendor_completions.d/appease.fish");
    let man_text = std::fs::read_to_string(&man).unwrap();
    assert!(
        man_text.contains(".TH appease 8") && man_text.contains("restore"),
        "{man_text}"
    );
    let bash_text = std::fs::read_to_string(&bash).unwrap();
    assert!(
        bash_text.contains("complete") && bash_text.contains("daemon"),
        "{bash_text}"
    );
    assert!(zsh.exists() && fish.exists());
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains("ExecStart=/usr/bin/appease daemon --config /etc/appease/appease.toml"),
        "{text}"
    );
    assert!(
        text.contains("ExecStopPost=/usr/bin/appease restore"),
        "{text}"
    );
    assert!(!text.contains('@'), "every placeholder filled: {text}");
    // The operator's config survives a second install and an uninstall.
    std::fs::write(&cfg, "# mine\n").unwrap();
    make("install");
    make("uninstall");
    assert!(
        [&bin, &unit, &man, &bash, &zsh, &fish]
            .iter()
            .all(|f| !f.exists()),
        "binary, unit, man page and completions removed"
    );
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), "# mine\n");
}

#[test]
fn the_daemonset_in_deploy_runs_appease_on_the_host_with_only_what_it_needs() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/appease-daemonset.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let ds: DaemonSet = serde_yaml_ng::from_str(&text).expect("a valid apps/v1 DaemonSet");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.host_pid,
        Some(true),
        "the probe names processes by host PIDs"
    );
    assert_eq!(
        pod.automount_service_account_token,
        Some(false),
        "no API-server access"
    );
    assert!(pod.host_network.is_none_or(|h| !h), "no host network");
    let [c] = &pod.containers[..] else {
        panic!("one container")
    };
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/appease".to_string(), "daemon".to_string()][..])
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let mut add = caps.add.clone().unwrap();
    add.sort();
    assert_eq!(
        add,
        [
            "BPF",
            "DAC_OVERRIDE",
            "PERFMON",
            "SYS_ADMIN",
            "SYS_NICE",
            "SYS_PTRACE"
        ],
        "the capabilities appease uses (the last two to join the host's cgroup namespace)"
    );
    // Every host path is mounted where appease looks for it, and nothing else of the host.
    let volumes = pod.volumes.unwrap();
    let host_path = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
    };
    let mut mounts: Vec<(String, String, bool)> = c
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| {
            let hp = host_path(&m.name).expect("every mount is a host path");
            (hp, m.mount_path, m.read_only.unwrap_or(false))
        })
        .collect();
    mounts.sort();
    assert_eq!(
        mounts,
        [
            ("/run/appease".into(), "/run/appease".into(), false),
            ("/run/dbus".into(), "/run/dbus".into(), false),
            ("/run/systemd".into(), "/run/systemd".into(), false),
            ("/sys/fs/cgroup".into(), "/sys/fs/cgroup".into(), false),
        ]
    );
    assert_eq!(volumes.len(), 4, "no other volume");
    let run_dir = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "APPEASE_RUN_DIR")
        .and_then(|e| e.value.clone());
    assert_eq!(
        run_dir.as_deref(),
        Some("/run/appease"),
        "the journal lives on the host path a restarted pod finds"
    );
}
