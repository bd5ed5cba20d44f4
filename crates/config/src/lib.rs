//! appease's configuration. The default is `config/default.toml`, embedded in the binary;
//! a file of the user's overrides any subset of its keys. Unknown keys, bad types and
//! impossible values are errors naming the file, line and column.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use appease_policy::batch::{BatchParams, Class};
use appease_policy::{Budget, ElevationParams, Ladder, Sink, Step};
use serde::de::{Deserializer, Error as _};
use serde::Deserialize;

mod matching;
pub use matching::{valid_unit_name, MatchingNeeds, ProcessFacts};

/// The default configuration, as shipped in the repository.
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");
/// The 2010 paper's RBPE script settings (the 2010 customer-appeasement paper's Table 1).
pub const RBPE_CLASSIC_TOML: &str = include_str!("../../../config/rbpe-classic.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {origin}: {message}")]
    Invalid { origin: String, message: String },
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct Config {
    pub probe: ProbeSection,
    pub elevation: ElevationSection,
    pub batch: BatchSection,
    pub hands_off: HandsOffSection,
    #[serde(rename = "rule", deserialize_with = "rules")]
    pub rules: Vec<Rule>,
    #[serde(rename = "service", deserialize_with = "services")]
    pub services: Vec<Service>,
    pub roles: RolesSection,
    #[serde(rename = "role")]
    pub role: Vec<Role>,
    pub metrics: MetricsSection,
    pub control: ControlSection,
    pub users: UsersSection,
}

/// What unprivileged users (not root, not a system account) may have from appease, all
/// their processes and threads together: no more than this, however many they make.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UsersSection {
    /// Uids from this one on are unprivileged users (None: UID_MIN of /etc/login.defs,
    /// 1000 where it says none).
    pub uid_min: Option<u32>,
    /// Share of one CPU a user's threads may use elevated, over time, all together.
    #[serde(deserialize_with = "share")]
    pub elevated_cpu_share: f64,
    /// Request events a second one user may cause (the probe drops the rest in the
    /// kernel), and all users together; 0: no bound.
    pub events_per_s: u32,
    pub all_events_per_s: u32,
    /// Threads of one user, and of all users, watched at once (each watched thread costs a
    /// CPU reading every 100 ms); 0: no bound.
    pub watched_threads: u32,
    pub all_watched_threads: u32,
}

impl Default for UsersSection {
    fn default() -> Self {
        UsersSection {
            uid_min: None,
            elevated_cpu_share: 0.5,
            events_per_s: 200,
            all_events_per_s: 2000,
            watched_threads: 64,
            all_watched_threads: 256,
        }
    }
}

impl UsersSection {
    /// The first unprivileged uid.
    pub fn uid_min(&self) -> u32 {
        self.uid_min.unwrap_or_else(|| {
            std::fs::read_to_string("/etc/login.defs")
                .ok()
                .and_then(|t| login_defs_uid_min(&t))
                .unwrap_or(1000)
        })
    }
}

/// The overflow uid (`nobody`): a system account, which no user becomes.
const NOBODY: u32 = 65534;
/// The uids systemd gives services with `DynamicUser=` (systemd's docs, "Users, Groups,
/// UIDs and GIDs on systemd Systems"): system services.
const DYNAMIC_SERVICE_UIDS: std::ops::RangeInclusive<u32> = 61184..=65519;

/// Whether `uid` is an unprivileged user's, given the first such uid: from `uid_min` on,
/// but for `nobody` and systemd's dynamic service users. Higher uids are users' (a
/// rootless container's processes run as its owner's subordinate uids).
pub fn unprivileged(uid: u32, uid_min: u32) -> bool {
    uid >= uid_min && uid != NOBODY && !DYNAMIC_SERVICE_UIDS.contains(&uid)
}

/// UID_MIN from /etc/login.defs text.
fn login_defs_uid_min(text: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == "UID_MIN").then(|| f.next()?.parse().ok())?
    })
}

/// Prometheus metrics at `http://LISTEN/metrics`; off unless an address is given.
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    #[serde(deserialize_with = "socket_addr")]
    pub listen: Option<std::net::SocketAddr>,
}

/// Who may use the control socket (`appease status`, `top`, `reload`): root, and the
/// members of `group` when one is named.
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlSection {
    #[serde(deserialize_with = "group")]
    pub group: Option<String>,
}

fn socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(|_| {
        D::Error::custom(format!(
            "{text:?} is not an address to listen on: give IP:PORT, e.g. \"127.0.0.1:9559\" or \"[::1]:9559\""
        ))
    })
}

fn group<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = String::deserialize(d)?;
    match gid_of(&name) {
        Some(_) => Ok(Some(name)),
        None => Err(D::Error::custom(format!("no group {name:?} on this host"))),
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolesSection {
    /// Nice of rank 0 (an application's critical process); each rank below is one more.
    #[serde(deserialize_with = "nice")]
    pub top_nice: i32,
}

impl Default for RolesSection {
    fn default() -> Self {
        RolesSection { top_nice: -5 }
    }
}

/// Declares a kind of latency work: its own fields, then the keys that pick its processes
/// (`comm`, `exe`, `cgroup`, `user`, `unit`, every one given must match; `trust_comm` as
/// for [`Rule`]), and its matching rule.
/// A macro rather than a shared struct: serde's `flatten` would cost a misspelt key's
/// line and the list of keys expected there.
macro_rules! latency_work {
    ($(#[$attr:meta])* pub struct $name:ident { $($(#[$fattr:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$attr])*
        #[derive(Clone, Debug, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fattr])* pub $field: $ty,)*
            pub comm: Option<String>,
            pub exe: Option<PathBuf>,
            pub cgroup: Option<String>,
            pub user: Option<String>,
            pub unit: Option<String>,
            #[serde(default)]
            pub trust_comm: bool,
            /// `user` as a uid, looked up once.
            #[serde(skip)]
            pub uid: OnceLock<Option<u32>>,
        }

        impl $name {
            /// The rule matching its processes, which are latency work.
            pub fn matcher(&self) -> Rule {
                Rule {
                    comm: self.comm.clone(),
                    exe: self.exe.clone(),
                    cgroup: self.cgroup.clone(),
                    user: self.user.clone(),
                    unit: self.unit.clone(),
                    trust_comm: self.trust_comm,
                    class: Class::Latency,
                    uid: cached_uid(&self.uid, self.user.as_deref()),
                }
            }
        }
    };
}

latency_work! {
    /// A fixed, staggered priority for one process of a multi-process application
    /// (the AIX case study). `appease roles suggest` proposes the ranks.
    pub struct Role {
        /// The application it belongs to (for status and logs).
        pub app: String,
        /// 0 = the critical process; its direct dependencies next; the rest equal below.
        pub rank: u32,
    }
}

/// `user` (a name or a uid) as a uid, looked up in /etc/passwd once per config.
fn cached_uid(cell: &OnceLock<Option<u32>>, user: Option<&str>) -> OnceLock<Option<u32>> {
    if let Some(u) = user {
        cell.get_or_init(|| u.parse::<u32>().ok().or_else(|| uid_of(u)));
    }
    cell.clone()
}

latency_work! {
    /// A latency-sensitive application with a group of its own: isolated from others and
    /// sharing the CPUs by weight. Its processes are never demoted.
    pub struct Service {
        /// Names the group: /appease.svc.NAME.
        pub name: String,
        /// cpu.weight on cgroup v2's scale (100 = a normal group); v1 shares are weight × 1024 / 100.
        #[serde(default = "default_weight")]
        pub weight: u32,
    }
}

fn default_weight() -> u32 {
    100
}

impl Service {
    pub fn group_name(&self) -> String {
        format!("appease.svc.{}", self.name)
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSection {
    pub enabled: bool,
    /// Top-level CPU cgroup the idle class lives in.
    #[serde(deserialize_with = "group_name")]
    pub group: String,
    /// CPUs a process tree must use on average ...
    #[serde(deserialize_with = "cpus")]
    pub min_cpus: f64,
    /// ... for this long, with no request, to be demoted.
    #[serde(deserialize_with = "positive_ms")]
    pub after_ms: u64,
    /// A tree that received a request this recently is never demoted.
    #[serde(deserialize_with = "positive_ms")]
    pub request_memory_ms: u64,
    /// How often the process table is scanned, on average (each period is drawn from
    /// 0.8–1.2 times it, out of step with any periodic load).
    #[serde(deserialize_with = "positive_ms")]
    pub scan_ms: u64,
    /// Starvation floor: batch work that waits for CPU yet gets less than this share of
    /// all CPUs (percent) ...
    #[serde(deserialize_with = "percent")]
    pub floor_pct: f64,
    /// ... for this long gets cpu.idle lifted ...
    #[serde(deserialize_with = "positive_ms")]
    pub floor_after_ms: u64,
    /// ... for this long, with this cpu.weight (v2 scale, 100 = a normal group).
    #[serde(deserialize_with = "positive_ms")]
    pub floor_hold_ms: u64,
    #[serde(deserialize_with = "weight")]
    pub floor_weight: u32,
    /// With no request anywhere for this long, the batch group runs as a normal group
    /// with quiet_weight (fair among batch jobs); 0 keeps it idle always.
    #[serde(deserialize_with = "optional_ms")]
    pub quiet_after_ms: u64,
    #[serde(deserialize_with = "weight")]
    pub quiet_weight: u32,
    /// While the group is idle, its busy threads are pinned one CPU each, evenly, turned
    /// at every scan (the kernel herds an idle group's tasks between CPUs).
    pub spread: bool,
    /// While the idle group holds batch, the autogroup of a serving process's session
    /// (a process outside any CPU cgroup, where the kernel makes autogroups) gets this
    /// nice; 0 never raises one.
    #[serde(deserialize_with = "raise_nice")]
    pub serving_autogroup_nice: i32,
    /// Where a tree that read responses while it soaked (a dump, a download, an ETL query)
    /// goes: the idle group like any batch, or a group of the least weight beside it.
    pub feeders: Feeders,
}

/// The batch group of trees that feed on a server's responses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feeders {
    /// The idle group, with every other batch tree: the server's latency first.
    #[default]
    Idle,
    /// A top-level group of the least weight, not idle: the job's pace first (measured,
    /// an ETL loop keeps all of it; the server's p99 beside a download rises).
    LeastWeight,
}

/// Forces a class on the processes it matches; every given field must match.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Process name as in /proc/PID/comm (the executable's name, at most 15 bytes). Any
    /// user sets it for their own processes (prctl), so it proves nothing.
    pub comm: Option<String>,
    /// The process's executable, as /proc/PID/exe links to it (an absolute path).
    pub exe: Option<PathBuf>,
    /// The process's CPU cgroup path starts with this (e.g. "/system.slice/backup").
    pub cgroup: Option<String>,
    /// User name or numeric uid.
    pub user: Option<String>,
    /// A system's systemd unit, e.g. "postgresql.service": a component of the cgroup path,
    /// never one under a user's manager (user@UID.service), whose units users name.
    pub unit: Option<String>,
    /// Accept a matcher that grants something (latency, a service's group, a role) by
    /// `comm` alone, which any user can take for their own process.
    #[serde(default)]
    pub trust_comm: bool,
    pub class: Class,
    /// `user` as a uid, looked up once (not /etc/passwd on every match).
    #[serde(skip)]
    pub uid: OnceLock<Option<u32>>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeSection {
    #[serde(deserialize_with = "positive_ms")]
    pub min_gap_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ElevationSection {
    pub enabled: bool,
    #[serde(deserialize_with = "positive_ms")]
    pub tick_ms: u64,
    #[serde(deserialize_with = "percent")]
    pub min_psi_pct: f64,
    #[serde(deserialize_with = "slice_us")]
    pub slice_us: u64,
    #[serde(deserialize_with = "positive_ms")]
    pub forget_after_ms: u64,
    pub budget: BudgetSection,
    pub sink: SinkSection,
    #[serde(deserialize_with = "ladder")]
    pub ladder: Ladder,
}

/// Long requests: a thread that computes this long after its last request read sinks
/// below its own nice until its next request.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkSection {
    /// CPU time since the last request read (0: long requests never sink).
    #[serde(deserialize_with = "optional_ms")]
    pub after_cpu_ms: u64,
    /// Nice levels below the thread's own nice.
    #[serde(deserialize_with = "sink_levels")]
    pub levels: u32,
    /// While a thread serving a request of the same application waits on a lock, the
    /// application's sunk threads (one may hold it) are back at their own nice, for at
    /// most this long at a stretch and this long a second over time (0: never lifted).
    #[serde(deserialize_with = "per_second_ms")]
    pub lift_ms: u64,
}

fn sink_levels<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    checked(
        d,
        |v| (1..=39).contains(v),
        |v| format!("{v} nice levels is outside 1..=39"),
    )
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSection {
    #[serde(deserialize_with = "share")]
    pub cpu_share: f64,
    #[serde(deserialize_with = "positive_ms")]
    pub burst_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HandsOffSection {
    #[serde(deserialize_with = "comms")]
    pub comms: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepToml {
    from_runnable_per_cpu: f64,
    unix_nice: i32,
    inet_nice: i32,
    decay_ms: u64,
}

fn ladder<'de, D: Deserializer<'de>>(d: D) -> Result<Ladder, D::Error> {
    let steps = Vec::<StepToml>::deserialize(d)?;
    Ladder::new(
        steps
            .into_iter()
            .map(|s| Step {
                from_runnable_per_cpu: s.from_runnable_per_cpu,
                unix_nice: s.unix_nice,
                inet_nice: s.inet_nice,
                decay: Duration::from_millis(s.decay_ms),
            })
            .collect(),
    )
    .map_err(|e| D::Error::custom(format!("impossible ladder: {e}")))
}

/// Deserializes a value and checks it: a value `ok` refuses becomes the error `why(v)`,
/// at the value's file position. Shared by every TOML schema of the project.
pub fn checked<'de, D, T>(
    d: D,
    ok: impl Fn(&T) -> bool,
    why: impl Fn(&T) -> String,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let v = T::deserialize(d)?;
    if ok(&v) {
        Ok(v)
    } else {
        Err(D::Error::custom(why(&v)))
    }
}

/// Field validators for serde's `deserialize_with`, one line each: a value `ok` refuses is
/// an error `why` (a format string that may name the value). Shared by every TOML schema
/// of the project.
#[macro_export]
macro_rules! validators {
    ($($(#[$doc:meta])* $name:ident: $t:ty, |$v:ident| $ok:expr, $why:literal;)*) => {$(
        $(#[$doc])*
        fn $name<'de, D: ::serde::Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
            $crate::checked(d, |$v: &$t| $ok, |$v: &$t| format!($why))
        }
    )*};
}

validators! {
    positive_ms: u64, |v| (1..=3_600_000).contains(v), "{v} ms is outside 1..=3600000";
    /// 0 (off) or a time in ms.
    optional_ms: u64, |v| (0..=3_600_000).contains(v), "{v} ms is outside 0..=3600000";
    per_second_ms: u64, |v| (0..=1000).contains(v), "{v} ms in a second is outside 0..=1000";
    percent: f64, |v| (0.0..=100.0).contains(v), "{v} is not a percentage in 0..=100";
    share: f64, |v| *v > 0.0 && *v <= 1.0, "{v} is not a share of one CPU in (0, 1]";
    cpus: f64, |v| *v > 0.0 && *v <= 1024.0, "{v} is not a CPU count in (0, 1024]";
    /// The kernel accepts custom slices of 0.1..=100 ms.
    slice_us: u64, |v| *v == 0 || (100..=100_000).contains(v),
        "{v} µs is outside the kernel's slice range 100..=100000 (0 keeps the default slice)";
    weight: u32, |v| (1..=10_000).contains(v), "weight {v} is outside 1..=10000";
    nice: i32, |v| (appease_policy::NICE_MIN..=appease_policy::NICE_MAX).contains(v),
        "nice {v} is outside -20..=19";
    raise_nice: i32, |v| (appease_policy::NICE_MIN..=0).contains(v),
        "nice {v} is outside -20..=0 (0: never raise)";
}

fn comms<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    for c in &v {
        if c.is_empty() || c.len() > 15 {
            return Err(D::Error::custom(format!(
                "comm name {c:?} must be 1 to 15 bytes (the kernel truncates command names to 15)"
            )));
        }
    }
    Ok(v)
}

fn group_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    let ok = !v.is_empty()
        && !v.starts_with('.')
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(D::Error::custom(format!(
            "group {v:?} must be one top-level cgroup name (letters, digits, '.', '-', '_')"
        )));
    }
    Ok(v)
}

fn rules<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Rule>, D::Error> {
    let rules = Vec::<Rule>::deserialize(d)?;
    for (i, r) in rules.iter().enumerate() {
        r.check()
            .map_err(|e| D::Error::custom(format!("rule {i}: {e}")))?;
    }
    Ok(rules)
}

fn services<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Service>, D::Error> {
    let services = Vec::<Service>::deserialize(d)?;
    let mut names = std::collections::HashSet::new();
    for (i, s) in services.iter().enumerate() {
        let ok = !s.name.is_empty()
            && s.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
        if !ok {
            return Err(D::Error::custom(format!(
                "service {i}: name {:?} must be letters, digits, '-' or '_' \
                 (it names the group appease.svc.NAME)",
                s.name
            )));
        }
        if !names.insert(s.name.clone()) {
            return Err(D::Error::custom(format!(
                "service {i}: name {:?} is used twice",
                s.name
            )));
        }
        if !(1..=10_000).contains(&s.weight) {
            return Err(D::Error::custom(format!(
                "service {i}: weight {} is outside 1..=10000",
                s.weight
            )));
        }
        s.matcher()
            .check()
            .map_err(|e| D::Error::custom(format!("service {i} ({}): {e}", s.name)))?;
    }
    Ok(services)
}

/// The uid of a user name, from /etc/passwd.
pub fn uid_of(name: &str) -> Option<u32> {
    id_in("/etc/passwd", name)
}

/// The gid of a group name (or a number), from /etc/group.
pub fn gid_of(name: &str) -> Option<u32> {
    name.parse().ok().or_else(|| id_in("/etc/group", name))
}

/// The third field of `name`'s line in a passwd-format file.
fn id_in(file: &str, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        if f.next()? != name {
            return None;
        }
        f.nth(1)?.parse().ok()
    })
}

impl Default for BatchSection {
    fn default() -> Self {
        BatchSection {
            enabled: true,
            group: "appease.batch".into(),
            min_cpus: 0.8,
            after_ms: 5000,
            request_memory_ms: 60_000,
            scan_ms: 1000,
            floor_pct: 5.0,
            floor_after_ms: 10_000,
            floor_hold_ms: 3000,
            floor_weight: 10,
            quiet_after_ms: 10_000,
            quiet_weight: 100,
            spread: true,
            serving_autogroup_nice: -10,
            feeders: Feeders::Idle,
        }
    }
}

impl Default for ProbeSection {
    fn default() -> Self {
        ProbeSection { min_gap_ms: 20 }
    }
}

impl Default for BudgetSection {
    fn default() -> Self {
        BudgetSection {
            cpu_share: 0.5,
            burst_ms: 250,
        }
    }
}

impl Default for SinkSection {
    fn default() -> Self {
        SinkSection {
            after_cpu_ms: 50,
            levels: 10,
            lift_ms: 200,
        }
    }
}

impl Default for ElevationSection {
    fn default() -> Self {
        let step = |from, unix_nice, inet_nice, ms| Step {
            from_runnable_per_cpu: from,
            unix_nice,
            inet_nice,
            decay: Duration::from_millis(ms),
        };
        ElevationSection {
            enabled: true,
            tick_ms: 20,
            min_psi_pct: 1.0,
            slice_us: 500,
            forget_after_ms: 10_000,
            budget: BudgetSection::default(),
            sink: SinkSection::default(),
            ladder: Ladder::new(vec![
                step(0.0, 0, 0, 0),
                step(1.0, -3, -2, 100),
                step(1.5, -5, -3, 150),
                step(2.0, -8, -5, 200),
                step(3.0, -12, -8, 250),
                step(4.0, -15, -10, 300),
            ])
            .expect("the default ladder is valid"),
        }
    }
}

impl Config {
    /// Parses TOML text; `origin` names it in errors (a path, or "(embedded default)").
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            origin: origin.to_string(),
            message: describe(&e, text),
        })?;
        cfg.validate().map_err(|message| ConfigError::Invalid {
            origin: origin.to_string(),
            message,
        })
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The embedded default configuration.
    pub fn embedded() -> Self {
        Self::parse(DEFAULT_TOML, "(embedded default)")
            .expect("the embedded default config is valid")
    }

    /// The classifier's parameters.
    pub fn batch_params(&self) -> BatchParams {
        BatchParams {
            min_cpus: self.batch.min_cpus,
            after: Duration::from_millis(self.batch.after_ms),
            request_memory: Duration::from_millis(self.batch.request_memory_ms),
        }
    }

    /// How long without requests before the batch group turns quiet (None: never).
    pub fn quiet_after(&self) -> Option<Duration> {
        (self.batch.quiet_after_ms > 0).then(|| Duration::from_millis(self.batch.quiet_after_ms))
    }

    pub fn floor_params(&self) -> appease_policy::floor::FloorParams {
        appease_policy::floor::FloorParams {
            floor_pct: self.batch.floor_pct,
            after: Duration::from_millis(self.batch.floor_after_ms),
            hold: Duration::from_millis(self.batch.floor_hold_ms),
        }
    }

    /// The class the first matching rule forces, if any; a service's processes are latency.
    pub fn forced_class(&self, p: &ProcessFacts) -> Option<Class> {
        if self.service_of(p).is_some() || self.role_of(p).is_some() {
            return Some(Class::Latency);
        }
        self.rules.iter().find(|r| r.matches(p)).map(|r| r.class)
    }

    /// The role (and its fixed nice) a process has, if any.
    pub fn role_of(&self, p: &ProcessFacts) -> Option<(&Role, i32)> {
        self.role
            .iter()
            .find(|r| r.matcher().matches(p))
            .map(|r| (r, self.roles.top_nice + r.rank as i32))
    }

    /// Checks what serde cannot: roles stay above normal processes.
    fn validate(self) -> Result<Self, String> {
        for (i, r) in self.role.iter().enumerate() {
            r.matcher()
                .check()
                .map_err(|e| format!("role {i} ({}): {e}", r.app))?;
            let nice = self.roles.top_nice + r.rank as i32;
            if nice >= 0 {
                return Err(format!(
                    "role {i} ({}): rank {} gives nice {nice}; roles must stay above normal processes \
                     (nice < 0): lower roles.top_nice ({}) or use fewer ranks",
                    r.app, r.rank, self.roles.top_nice
                ));
            }
        }
        Ok(self)
    }

    /// The configured service a process belongs to, if any.
    pub fn service_of(&self, p: &ProcessFacts) -> Option<&Service> {
        self.services.iter().find(|s| s.matcher().matches(p))
    }

    /// What matching processes against rules, services and roles needs besides their name.
    pub fn matching_needs(&self) -> MatchingNeeds {
        let services = self.services.iter().map(|s| s.matcher());
        let roles = self.role.iter().map(|r| r.matcher());
        let rules = self.rules.iter().cloned().chain(services).chain(roles);
        rules.fold(MatchingNeeds::default(), |n, r| MatchingNeeds {
            cgroup: n.cgroup || r.needs_cgroup(),
            uid: n.uid || r.needs_uid(),
            exe: n.exe || r.needs_exe(),
        })
    }

    /// One line for each entry accepted only because of `trust_comm = true`: it grants
    /// something to any process of that name, whoever runs it.
    pub fn comm_trust_warnings(&self) -> Vec<String> {
        let line = |entry: String, r: &Rule, what: &str| {
            format!(
                "{entry} matches {} alone (trust_comm = true): any user's process of that name or executable gets {what}; name its user (and/or unit, cgroup) instead",
                r.names()
            )
        };
        let rules = self
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.trusted_by_comm())
            .map(|(i, r)| line(format!("rule {i}"), r, "the latency class"));
        let services = self.services.iter().enumerate().filter_map(|(i, s)| {
            let r = s.matcher();
            r.trusted_by_comm().then(|| {
                line(
                    format!("service {i} ({})", s.name),
                    &r,
                    &format!("the group {}", s.group_name()),
                )
            })
        });
        let roles = self.role.iter().enumerate().filter_map(|(i, role)| {
            let r = role.matcher();
            r.trusted_by_comm().then(|| {
                let nice = self.roles.top_nice + role.rank as i32;
                line(
                    format!("role {i} ({})", role.app),
                    &r,
                    &format!("nice {nice}"),
                )
            })
        });
        rules.chain(services).chain(roles).collect()
    }

    pub fn elevation_params(&self) -> ElevationParams {
        let e = &self.elevation;
        ElevationParams {
            ladder: e.ladder.clone(),
            min_psi_pct: e.min_psi_pct,
            budget: Budget {
                cpu_share: e.budget.cpu_share,
                burst: Duration::from_millis(e.budget.burst_ms),
            },
            slice: (e.slice_us > 0).then(|| Duration::from_micros(e.slice_us)),
            forget_after: Duration::from_millis(e.forget_after_ms),
            sink: (e.sink.after_cpu_ms > 0).then(|| Sink {
                after_cpu: Duration::from_millis(e.sink.after_cpu_ms),
                levels: e.sink.levels,
                lift: (e.sink.lift_ms > 0).then(|| Duration::from_millis(e.sink.lift_ms)),
            }),
            user_budget: Some(Budget {
                cpu_share: self.users.elevated_cpu_share,
                burst: Duration::from_millis(e.budget.burst_ms),
            }),
            user_threads_max: self.users.watched_threads,
            users_threads_max: self.users.all_watched_threads,
        }
    }
}

/// "line L, column C: message" from toml's error and the source text.
fn describe(e: &toml::de::Error, text: &str) -> String {
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {col}: {}", e.message().trim_end())
        }
        None => e.message().trim_end().to_string(),
    }
}

#[cfg(test)]
mod tests;
