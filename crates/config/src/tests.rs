use super::*;

#[test]
fn embedded_default_parses_and_matches_the_code_defaults() {
    assert_eq!(Config::embedded(), Config::default());
    assert_eq!(Config::parse("", "empty").unwrap(), Config::default());
}

#[test]
fn rbpe_classic_is_table1() {
    let c = Config::parse(RBPE_CLASSIC_TOML, "rbpe").unwrap();
    assert_eq!(c.elevation.ladder, Ladder::rbpe_table1());
    assert_eq!(c.elevation_params().slice, None);
}

#[test]
fn a_partial_file_overrides_only_its_keys() {
    let c = Config::parse(
        "[elevation]\nslice_us = 0\n[elevation.budget]\ncpu_share = 0.8\n",
        "f",
    )
    .unwrap();
    assert_eq!(c.elevation.slice_us, 0);
    assert_eq!(c.elevation.budget.cpu_share, 0.8);
    assert_eq!(c.elevation.budget.burst_ms, 250);
    assert_eq!(c.elevation.ladder, Config::default().elevation.ladder);
}

/// A process known by its name, cgroup and owner (its exe unread).
fn facts<'a>(comm: &'a str, cgroup: Option<&'a str>, uid: Option<u32>) -> ProcessFacts<'a> {
    ProcessFacts {
        comm,
        exe: None,
        cgroup,
        uid,
    }
}

fn err(text: &str) -> String {
    Config::parse(text, "test.toml").unwrap_err().to_string()
}

#[test]
fn metrics_and_control_take_an_address_and_an_existing_group() {
    let c = Config::parse(
        "[metrics]\nlisten = \"127.0.0.1:9559\"\n[control]\ngroup = \"root\"\n",
        "f",
    )
    .unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9559".parse().unwrap()));
    assert_eq!(c.control.group.as_deref(), Some("root"));
    assert_eq!(gid_of("root"), Some(0));
    let e = err("[metrics]\nlisten = \"localhost\"\n");
    assert!(e.contains("line 2") && e.contains("IP:PORT"), "{e}");
    let e = err("[control]\ngroup = \"no-such-group-here\"\n");
    assert!(e.contains("no group \"no-such-group-here\""), "{e}");
}

#[test]
fn unknown_key_names_key_and_position() {
    let e = err("[elevation]\nenabled = true\nslice_ms = 3\n");
    assert!(
        e.contains("test.toml") && e.contains("line 3, column 1") && e.contains("slice_ms"),
        "{e}"
    );
}

#[test]
fn malformed_values_are_located() {
    let e = err("[probe]\nmin_gap_ms = \"soon\"\n");
    assert!(
        e.contains("line 2, column 14") && e.contains("invalid type"),
        "{e}"
    );
    let e = err("[probe\n");
    assert!(e.contains("line 1"), "{e}");
    let e = err("[elevation.budget]\ncpu_share = 1.5\n");
    assert!(e.contains("line 2") && e.contains("(0, 1]"), "{e}");
    let e = err("[elevation]\nslice_us = 5\n");
    assert!(e.contains("100..=100000"), "{e}");
    let e = err("[elevation.sink]\nlift_ms = 1500\n");
    assert!(e.contains("line 2") && e.contains("0..=1000"), "{e}");
    let e = err("[hands_off]\ncomms = [\"a-very-long-command-name\"]\n");
    assert!(e.contains("15"), "{e}");
}

#[test]
fn rules_force_classes() {
    let text = r#"
[[rule]]
comm = "ffmpeg"
class = "batch"

[[rule]]
unit = "postgresql.service"
class = "latency"

[[rule]]
user = "root"
cgroup = "/backup"
class = "batch"
"#;
    let c = Config::parse(text, "r.toml").unwrap();
    let pg = Some("/system.slice/postgresql.service");
    assert_eq!(
        c.forced_class(&facts("ffmpeg", None, None)),
        Some(Class::Batch)
    );
    assert_eq!(
        c.forced_class(&facts("postgres", pg, Some(108))),
        Some(Class::Latency)
    );
    assert_eq!(
        c.forced_class(&facts("tar", Some("/backup/nightly"), Some(0))),
        Some(Class::Batch)
    );
    assert_eq!(
        c.forced_class(&facts("tar", Some("/backups"), Some(0))),
        None,
        "a path prefix"
    );
    assert_eq!(
        c.forced_class(&facts("tar", Some("/backup"), Some(1000))),
        None,
        "all fields match"
    );
    assert_eq!(c.forced_class(&facts("nginx", None, None)), None);
}

#[test]
fn services_are_latency_and_bad_services_are_errors() {
    let text = "[[service]]\nname = \"web\"\ncomm = \"nginx\"\ntrust_comm = true\nweight = 200\n";
    let c = Config::parse(text, "s.toml").unwrap();
    assert_eq!(c.services[0].group_name(), "appease.svc.web");
    assert_eq!(
        c.forced_class(&facts("nginx", None, None)),
        Some(Class::Latency)
    );
    assert_eq!(
        c.service_of(&facts("nginx", None, None)).map(|s| s.weight),
        Some(200)
    );
    let e = err("[[service]]\nname = \"a/b\"\ncomm = \"x\"\n");
    assert!(e.contains("line 1") && e.contains("names the group"), "{e}");
    let e = err("[[service]]\nname = \"w\"\n");
    assert!(e.contains("at least one of"), "{e}");
    let e = err(
        "[[service]]\nname = \"w\"\nexe = \"/x\"\nuser = \"root\"\n[[service]]\nname = \"w\"\nexe = \"/y\"\nuser = \"root\"\n",
    );
    assert!(e.contains("used twice"), "{e}");
    let e = err("[[service]]\nname = \"w\"\nexe = \"/x\"\nuser = \"root\"\nweight = 0\n");
    assert!(e.contains("1..=10000"), "{e}");
}

#[test]
fn a_misspelt_key_in_a_service_or_a_role_is_an_error_naming_it() {
    let e = err("[[service]]\nname = \"w\"\ncom = \"x\"\n");
    assert!(
        e.contains("line 3") && e.contains("unknown field `com`") && e.contains("expected one of"),
        "{e}"
    );
    let e = err("[[role]]\napp = \"s\"\nrank = 0\ncomm = \"x\"\nuser_name = \"root\"\n");
    assert!(
        e.contains("line 5") && e.contains("unknown field `user_name`"),
        "{e}"
    );
}

#[test]
fn a_serving_autogroup_nice_is_a_raise_or_nothing() {
    let e = err("[batch]\nserving_autogroup_nice = 5\n");
    assert!(e.contains("nice 5 is outside -20..=0"), "{e}");
    let e = err("[batch]\nserving_autogroup_nice = -21\n");
    assert!(e.contains("nice -21"), "{e}");
    let off = Config::parse("[batch]\nserving_autogroup_nice = 0\n", "f").unwrap();
    assert_eq!(off.batch.serving_autogroup_nice, 0);
}

#[test]
fn feeders_go_to_the_idle_group_unless_the_least_weight_is_asked_for() {
    assert_eq!(Config::parse("", "f").unwrap().batch.feeders, Feeders::Idle);
    let c = Config::parse("[batch]\nfeeders = \"least-weight\"\n", "f").unwrap();
    assert_eq!(c.batch.feeders, Feeders::LeastWeight);
    let e = err("[batch]\nfeeders = \"low\"\n");
    assert!(e.contains("line 2") && e.contains("`least-weight`"), "{e}");
}

#[test]
fn roles_are_staggered_fixed_nice_values_above_normal() {
    let text = "[[role]]\napp = \"search\"\ncomm = \"proc_a\"\ntrust_comm = true\nrank = 0\n\n\
                    [[role]]\napp = \"search\"\ncomm = \"proc_b\"\ntrust_comm = true\nrank = 1\n";
    let c = Config::parse(text, "r.toml").unwrap();
    assert_eq!(
        c.role_of(&facts("proc_a", None, None)).map(|r| r.1),
        Some(-5)
    );
    assert_eq!(
        c.role_of(&facts("proc_b", None, None)).map(|r| r.1),
        Some(-4)
    );
    assert_eq!(
        c.forced_class(&facts("proc_b", None, None)),
        Some(Class::Latency)
    );
    let e = err("[[role]]\napp = \"s\"\nexe = \"/x\"\nuser = \"root\"\nrank = 5\n");
    assert!(e.contains("nice 0") && e.contains("top_nice"), "{e}");
    let e = err("[roles]\ntop_nice = -40\n");
    assert!(e.contains("-20..=19"), "{e}");
}

#[test]
fn bad_rules_are_located_errors() {
    let e = err("[[rule]]\ncomm = \"ffmpeg\"\nclass = \"bulk\"\n");
    assert!(
        e.contains("line 3") && e.contains("unknown variant `bulk`"),
        "{e}"
    );
    let e = err("[[rule]]\nclass = \"batch\"\n");
    assert!(e.contains("at least one of"), "{e}");
    let e = err("[[rule]]\ncgroup = \"system.slice\"\nclass = \"batch\"\n");
    assert!(e.contains("absolute path"), "{e}");
    let e = err("[[rule]]\nuser = \"no-such-user-here\"\nclass = \"batch\"\n");
    assert!(e.contains("unknown user"), "{e}");
    let e = err("[batch]\ngroup = \"a/b\"\n");
    assert!(e.contains("one top-level cgroup name"), "{e}");
}

#[test]
fn impossible_ladders_are_config_errors() {
    let decreasing = "[[elevation.ladder]]\nfrom_runnable_per_cpu = 0.0\nunix_nice = 0\ninet_nice = 0\ndecay_ms = 0\n\
                          [[elevation.ladder]]\nfrom_runnable_per_cpu = 2.0\nunix_nice = -2\ninet_nice = -1\ndecay_ms = 100\n\
                          [[elevation.ladder]]\nfrom_runnable_per_cpu = 1.0\nunix_nice = -4\ninet_nice = -2\ndecay_ms = 100\n";
    let e = err(decreasing);
    assert!(
        e.contains("impossible ladder") && e.contains("step 2") && e.contains("must be greater"),
        "{e}"
    );
    assert!(e.contains("line "), "{e}");
    let out_of_range = "[[elevation.ladder]]\nfrom_runnable_per_cpu = 0.0\nunix_nice = -21\ninet_nice = 0\ndecay_ms = 100\n";
    let e = err(out_of_range);
    assert!(e.contains("-21") && e.contains("-20..=19"), "{e}");
}

#[test]
fn a_rule_by_user_name_looks_the_name_up_once() {
    let cfg = Config::parse(
        "[[rule]]\nuser = \"root\"\nclass = \"batch\"\n\n\
             [[service]]\nname = \"s\"\nuser = \"root\"\n",
        "t",
    )
    .unwrap();
    let rule = &cfg.rules[0];
    assert!(rule.uid.get().is_none(), "not before the first match");
    assert!(rule.matches(&facts("x", None, Some(0))));
    assert_eq!(rule.uid.get(), Some(&Some(0)), "kept for the next matches");
    assert!(!rule.matches(&facts("x", None, Some(1000))));
    let svc = &cfg.services[0];
    assert!(svc.matcher().matches(&facts("x", None, Some(0))));
    assert_eq!(svc.uid.get(), Some(&Some(0)), "a service's too");
}

#[test]
fn a_unit_matches_the_systems_unit_and_never_a_users_of_that_name() {
    let c = Config::parse(
        "[[role]]\napp = \"db\"\nunit = \"postgresql.service\"\nrank = 0\n",
        "u.toml",
    )
    .unwrap();
    let system = "/system.slice/postgresql.service";
    let user = "/user.slice/user-1000.slice/user@1000.service/app.slice/postgresql.service";
    assert!(c.role_of(&facts("postgres", Some(system), None)).is_some());
    assert!(
        c.role_of(&facts("postgres", Some(&format!("{system}/worker")), None))
            .is_some(),
        "below the unit's group"
    );
    assert_eq!(c.role_of(&facts("postgres", Some(user), None)), None);
    assert_eq!(c.forced_class(&facts("postgres", Some(user), None)), None);
    // A container's own systemd names its units too, below its scope.
    for theirs in [
        "/system.slice/docker-abc.scope/system.slice/postgresql.service",
        "/lxc.payload.c1/system.slice/postgresql.service",
    ] {
        assert_eq!(
            c.role_of(&facts("postgres", Some(theirs), None)),
            None,
            "{theirs}"
        );
    }
    assert_eq!(
        c.role_of(&facts(
            "postgres",
            Some("/system.slice/postgresql.service.d"),
            None
        )),
        None,
        "the whole name"
    );
    assert_eq!(c.role_of(&facts("postgres", None, None)), None);
    assert_eq!(
        c.matching_needs(),
        MatchingNeeds {
            cgroup: true,
            uid: false,
            exe: false
        }
    );
}

#[test]
fn granting_by_a_name_or_an_executable_alone_is_refused_unless_trusted() {
    let entries = [
        (
            "[[service]]\nname = \"web\"\ncomm = \"nginx\"\n",
            "service 0 (web)",
        ),
        (
            "[[role]]\napp = \"search\"\ncomm = \"nginx\"\nrank = 0\n",
            "role 0 (search)",
        ),
        (
            "[[rule]]\ncomm = \"nginx\"\nclass = \"latency\"\n",
            "rule 0",
        ),
    ];
    for (entry, name) in entries {
        let e = err(entry);
        assert!(
            e.contains(name)
                && e.contains("comm \"nginx\" alone")
                && e.contains("add user")
                && e.contains("trust_comm = true"),
            "{e}"
        );
        let trusted = entry.replace(
            "comm = \"nginx\"\n",
            "comm = \"nginx\"\ntrust_comm = true\n",
        );
        let c = Config::parse(&trusted, "t.toml").unwrap();
        assert_eq!(
            c.forced_class(&facts("nginx", None, None)),
            Some(Class::Latency)
        );
        let warnings = c.comm_trust_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(name) && warnings[0].contains("\"nginx\""),
            "{warnings:?}"
        );
        // An executable is no better (any user runs /usr/sbin/nginx with a config of
        // their own); a user, unit or cgroup is.
        let by_exe = entry.replace("comm = \"nginx\"\n", "exe = \"/usr/sbin/nginx\"\n");
        assert!(err(&by_exe).contains("exe \"/usr/sbin/nginx\" alone"));
        // With what a user cannot fake besides the name, neither refused nor warned about.
        for more in ["user = \"root\"\n", "unit = \"nginx.service\"\n"] {
            let named = entry.replace("comm = \"nginx\"\n", &format!("comm = \"nginx\"\n{more}"));
            let c = Config::parse(&named, "n.toml").unwrap();
            assert!(c.comm_trust_warnings().is_empty());
            let with_trust = named.replace(
                "comm = \"nginx\"\n",
                "comm = \"nginx\"\ntrust_comm = true\n",
            );
            let c = Config::parse(&with_trust, "n.toml").unwrap();
            assert!(c.comm_trust_warnings().is_empty(), "not only by trust");
        }
    }
    // Demoting or leaving alone by name gives nobody anything.
    for class in ["batch", "normal"] {
        let c = Config::parse(
            &format!("[[rule]]\ncomm = \"ffmpeg\"\nclass = \"{class}\"\n"),
            "b.toml",
        )
        .unwrap();
        assert!(c.comm_trust_warnings().is_empty());
    }
    assert!(Config::embedded().comm_trust_warnings().is_empty());
}

#[test]
fn an_exe_matches_exactly_that_path() {
    let c = Config::parse(
        "[[service]]\nname = \"web\"\nexe = \"/usr/sbin/nginx\"\nuser = \"1000\"\n",
        "e.toml",
    )
    .unwrap();
    assert_eq!(
        c.matching_needs(),
        MatchingNeeds {
            cgroup: false,
            uid: true,
            exe: true
        }
    );
    let with_exe = |comm, exe: Option<&'static str>| ProcessFacts {
        comm,
        exe: exe.map(Path::new),
        cgroup: None,
        uid: Some(1000),
    };
    assert!(c
        .service_of(&with_exe("nginx", Some("/usr/sbin/nginx")))
        .is_some());
    assert!(
        c.service_of(&with_exe("anything", Some("/usr/sbin/nginx")))
            .is_some(),
        "whatever its name"
    );
    for other in [
        "/home/u/usr/sbin/nginx",
        "/usr/sbin/nginx2",
        "/usr/sbin/ngin",
        "/usr/local/sbin/nginx",
    ] {
        assert!(
            c.service_of(&with_exe("nginx", Some(other))).is_none(),
            "{other}"
        );
    }
    assert!(
        c.service_of(&with_exe("nginx", None)).is_none(),
        "an exe unread matches nothing"
    );
    assert!(
        c.service_of(&with_exe("nginx", Some("/usr/sbin/nginx (deleted)")))
            .is_some(),
        "a binary an upgrade replaced since the process started"
    );
}

#[test]
fn bad_exe_and_unit_values_are_refused() {
    for exe in [
        "nginx",
        "usr/sbin/nginx",
        "/usr/sbin/../bin/sh",
        "/usr/sbin/nginx (deleted)",
        "/usr/sbin//nginx",
        "/usr/./sbin/nginx",
        "/usr/sbin/nginx/",
        "",
    ] {
        let e = err(&format!("[[rule]]\nexe = \"{exe}\"\nclass = \"batch\"\n"));
        assert!(
            e.contains("rule 0") && e.contains("absolute path"),
            "{exe}: {e}"
        );
    }
    for unit in [
        "postgresql",
        "../postgresql.service",
        "system.slice/postgresql.service",
        ".service",
        "pg sql.service",
        "postgresql.servic",
        "",
    ] {
        let e = err(&format!("[[rule]]\nunit = \"{unit}\"\nclass = \"batch\"\n"));
        assert!(
            e.contains("rule 0") && e.contains("unit's full name"),
            "{unit}: {e}"
        );
    }
    let e = err("[[service]]\nname = \"db\"\nunit = \"postgresql\"\n");
    assert!(e.contains("service 0 (db)") && e.contains("unit"), "{e}");
}

#[test]
fn unit_names_are_systemds() {
    for ok in [
        "postgresql.service",
        "user@1000.service",
        "getty@tty1.service",
        "system-getty.slice",
        "session-3.scope",
        "dev-disk-by\\x2duuid-1234.mount",
        "a:b_c.timer",
        "sshd.socket",
        "-.slice",
        "multi-user.target",
    ] {
        assert!(valid_unit_name(ok), "{ok}");
    }
    let long = format!("{}.service", "a".repeat(248));
    assert_eq!(long.len(), 256);
    for bad in [
        "",
        "postgresql",
        ".service",
        "a/b.service",
        "a b.service",
        "é.service",
        "postgresql.service ",
        "postgresql.unknown",
        long.as_str(),
    ] {
        assert!(!valid_unit_name(bad), "{bad}");
    }
    assert!(valid_unit_name(&long[1..]), "255 bytes");
}

#[test]
fn the_config_parser_never_panics_on_damaged_configs() {
    let seed = include_bytes!("../../../config/default.toml");
    appease_fuzz::fuzz("config", seed, |b| {
        let _clear_error_or_config = Config::parse(&appease_fuzz::text(b), "fuzz.toml");
    });
}
