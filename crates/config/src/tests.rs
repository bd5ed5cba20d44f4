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
    assert_eq!(c.forced_class("ffmpeg", None, None), Some(Class::Batch));
    assert_eq!(
        c.forced_class("postgres", pg, Some(108)),
        Some(Class::Latency)
    );
    assert_eq!(
        c.forced_class("tar", Some("/backup/nightly"), Some(0)),
        Some(Class::Batch)
    );
    assert_eq!(
        c.forced_class("tar", Some("/backups"), Some(0)),
        None,
        "a path prefix"
    );
    assert_eq!(
        c.forced_class("tar", Some("/backup"), Some(1000)),
        None,
        "all fields match"
    );
    assert_eq!(c.forced_class("nginx", None, None), None);
}

#[test]
fn services_are_latency_and_bad_services_are_errors() {
    let text = "[[service]]\nname = \"web\"\ncomm = \"nginx\"\nweight = 200\n";
    let c = Config::parse(text, "s.toml").unwrap();
    assert_eq!(c.services[0].group_name(), "appease.svc.web");
    assert_eq!(c.forced_class("nginx", None, None), Some(Class::Latency));
    assert_eq!(
        c.service_of("nginx", None, None).map(|s| s.weight),
        Some(200)
    );
    let e = err("[[service]]\nname = \"a/b\"\ncomm = \"x\"\n");
    assert!(e.contains("line 1") && e.contains("names the group"), "{e}");
    let e = err("[[service]]\nname = \"w\"\n");
    assert!(e.contains("at least one of"), "{e}");
    let e =
        err("[[service]]\nname = \"w\"\ncomm = \"x\"\n[[service]]\nname = \"w\"\ncomm = \"y\"\n");
    assert!(e.contains("used twice"), "{e}");
    let e = err("[[service]]\nname = \"w\"\ncomm = \"x\"\nweight = 0\n");
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
    let text = "[[role]]\napp = \"search\"\ncomm = \"proc_a\"\nrank = 0\n\n\
                    [[role]]\napp = \"search\"\ncomm = \"proc_b\"\nrank = 1\n";
    let c = Config::parse(text, "r.toml").unwrap();
    assert_eq!(c.role_of("proc_a", None, None).map(|r| r.1), Some(-5));
    assert_eq!(c.role_of("proc_b", None, None).map(|r| r.1), Some(-4));
    assert_eq!(c.forced_class("proc_b", None, None), Some(Class::Latency));
    let e = err("[[role]]\napp = \"s\"\ncomm = \"x\"\nrank = 5\n");
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
    assert!(rule.matches("x", None, Some(0)));
    assert_eq!(rule.uid.get(), Some(&Some(0)), "kept for the next matches");
    assert!(!rule.matches("x", None, Some(1000)));
    let svc = &cfg.services[0];
    assert!(svc.matcher().matches("x", None, Some(0)));
    assert_eq!(svc.uid.get(), Some(&Some(0)), "a service's too");
}

#[test]
fn the_config_parser_never_panics_on_damaged_configs() {
    let seed = include_bytes!("../../../config/default.toml");
    appease_fuzz::fuzz("config", seed, |b| {
        let _clear_error_or_config = Config::parse(&appease_fuzz::text(b), "fuzz.toml");
    });
}
