//! Append-only journal of every scheduling change, written before the change is made,
//! so a restarted daemon or `appease restore` can undo what a crashed daemon left.
//! One JSON object per line; live entries are rewritten compactly when it grows.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::private::{self, Access};
use crate::sys::Sched;

const FILE: &str = "journal.jsonl";
/// The journal is compacted when it passes this size and twice its live entries' size
/// after the last compaction: however much is live, an append costs one write, and a
/// compaction comes only after as many bytes appended as it rewrites.
const COMPACT_AT_BYTES: u64 = 1 << 20;

/// A thread's identity: a tid is only the same thread while its start time matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskKey {
    pub pid: u32,
    pub tid: u32,
    pub start: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Record {
    /// appease takes charge of a thread; `orig` is what it puts back.
    Manage {
        key: TaskKey,
        comm: String,
        orig: Sched,
    },
    /// appease is about to move the thread from nice `prev` to nice `next`. `orig`
    /// repeats the thread's `Manage` record, so that losing that one line (a corrupt
    /// journal) does not lose the thread.
    Apply {
        key: TaskKey,
        prev: i32,
        next: i32,
        slice_ns: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        orig: Option<Sched>,
    },
    /// The thread is back to `orig`, gone, or handed off: nothing to undo.
    Release { key: TaskKey },
    /// appease is about to create this cgroup (a path in the CPU hierarchy).
    Group { path: String },
    /// The group is removed.
    GroupRemoved { path: String },
    /// appease is about to move a process (key.tid = key.pid) from one cgroup to another.
    Move {
        key: TaskKey,
        from: String,
        to: String,
    },
    /// The process is back in `from`, or gone: nothing to undo.
    Return { key: TaskKey },
    /// appease is about to put this thread in SCHED_IDLE where it is (a batch tree that
    /// must stay in its cgroup); `orig` is what it puts back.
    Idle { key: TaskKey, orig: Sched },
    /// The thread is back to `orig`, gone, or changed by someone else: nothing to undo.
    Unidle { key: TaskKey },
    /// appease is about to make a systemd unit idle (CPUWeight=idle, a runtime property);
    /// `orig` is its CPUWeight before, `dropin` what systemd's runtime drop-in for the
    /// property held before (None: no file).
    UnitIdle {
        unit: String,
        orig: u64,
        transient: bool,
        dropin: Option<String>,
        /// The CPUWeight appease sets: a restore puts `orig` back only while the unit
        /// still has it. None in journals written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<u64>,
    },
    /// The unit has its CPUWeight and drop-in back, or is gone: nothing to undo.
    UnitRestored { unit: String },
    /// appease is about to make a cgroup it did not create idle where it is (a container,
    /// a pod, a limited group that holds only batch); `idle` and `weight` (the raw weight
    /// file) are what it puts back.
    GroupIdle {
        path: String,
        idle: bool,
        weight: String,
    },
    /// The group has its idle flag and weight back, or is gone.
    GroupUnidle { path: String },
    /// appease is about to pin this thread of the idle group to one CPU (see `spread`);
    /// `orig` is the CPU list it puts back.
    Pin { key: TaskKey, orig: Vec<usize> },
    /// The thread has its CPUs back, is gone, or was pinned by someone else since.
    Unpin { key: TaskKey },
    /// appease is about to set autogroup `id` (a session's task group at the top of the
    /// CPU hierarchy) from nice `prev` to nice `next`, through the process `key`; `orig`
    /// is the nice it puts back.
    AutogroupNice {
        id: u64,
        key: TaskKey,
        orig: i32,
        prev: i32,
        next: i32,
    },
    /// The autogroup has its nice back, is gone, or was reniced by someone else since.
    AutogroupRestored { id: u64 },
}

/// An autogroup whose nice must be put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingAutogroup {
    /// The process the nice was set through (a member of the session).
    pub key: TaskKey,
    pub orig: i32,
    /// The last nice applied (the autogroup may still have `prev` if the daemon died
    /// between the record and the write).
    pub prev: i32,
    pub nice: i32,
}

/// A systemd unit whose CPUWeight and runtime drop-in must be put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingUnit {
    /// Its CPUWeight before appease's first change.
    pub orig: u64,
    pub transient: bool,
    /// Its runtime drop-in's text before (None: no file).
    pub dropin: Option<String>,
    /// The CPUWeight appease last set (None: not recorded).
    pub set: Option<u64>,
}

/// A process move that must be undone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingMove {
    pub key: TaskKey,
    pub from: String,
    pub to: String,
}

/// Everything the journal says must be undone.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JournalState {
    pub threads: BTreeMap<TaskKey, Pending>,
    pub moves: BTreeMap<TaskKey, PendingMove>,
    pub groups: BTreeSet<String>,
    /// Threads put in SCHED_IDLE in place, with what they had before.
    pub idled: BTreeMap<TaskKey, Sched>,
    /// systemd units made idle: their CPUWeight before, whether they are transient, and
    /// their runtime drop-in before.
    pub units: BTreeMap<String, PendingUnit>,
    /// Other programs' cgroups made idle in place: their idle flag and weight before.
    pub idle_groups: BTreeMap<String, (bool, String)>,
    /// Threads pinned to one CPU (`spread`), with the CPUs they had before.
    pub pinned: BTreeMap<TaskKey, Vec<usize>>,
    /// Autogroups given a nice, by id.
    pub autogroups: BTreeMap<u64, PendingAutogroup>,
    /// Lines (1-based) that could not be read, other than a torn last one: what they
    /// recorded is lost, so the journal is kept for a look (`read_pending`).
    pub corrupt: Vec<usize>,
}

impl JournalState {
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
            && self.moves.is_empty()
            && self.groups.is_empty()
            && self.idled.is_empty()
            && self.units.is_empty()
            && self.idle_groups.is_empty()
            && self.pinned.is_empty()
            && self.autogroups.is_empty()
    }

    /// How many changes are pending (threads, processes, groups, idled threads).
    pub fn len(&self) -> usize {
        self.threads.len()
            + self.moves.len()
            + self.groups.len()
            + self.idled.len()
            + self.units.len()
            + self.idle_groups.len()
            + self.pinned.len()
            + self.autogroups.len()
    }
}

/// What the journal says must be undone for one thread.
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    pub key: TaskKey,
    pub comm: String,
    pub orig: Sched,
    /// Nice values the thread may have from appease: the last applied one, or the one
    /// before it if the daemon died between journaling and applying.
    pub ours: Vec<i32>,
}

impl Pending {
    fn new(key: TaskKey, comm: String, orig: Sched, ours: Vec<i32>) -> Pending {
        Pending {
            key,
            comm,
            orig,
            ours,
        }
    }
}

pub struct Journal {
    dir: PathBuf,
    file: File,
    bytes: u64,
    /// The size after the last compaction (or at open).
    compacted_bytes: u64,
    live: JournalState,
}

impl Journal {
    /// Opens (creating) the journal in `dir`, keeping what it already holds. `dir` must
    /// be appease's own (see `private`).
    pub fn open(dir: &Path) -> io::Result<Self> {
        let dir = &private::private_dir(dir)?;
        let live = read_pending(dir)?;
        let path = dir.join(FILE);
        let mut file = private::open_private(&path, Access::Append)?;
        let mut bytes = file.metadata()?.len();
        // A torn last line (a crash mid-write) is ended, so that the next record starts
        // a line of its own instead of merging into it.
        if bytes > 0 && !fs::read(&path)?.ends_with(b"\n") {
            file.write_all(b"\n")?;
            bytes += 1;
        }
        Ok(Journal {
            dir: dir.to_path_buf(),
            file,
            bytes,
            compacted_bytes: bytes,
            live,
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Appends one record in a single write (O_APPEND keeps lines whole).
    pub fn append(&mut self, rec: &Record) -> io::Result<()> {
        self.append_all(std::slice::from_ref(rec))
    }

    /// Appends records, one line each, in a single write.
    pub fn append_all(&mut self, recs: &[Record]) -> io::Result<()> {
        let mut lines = String::new();
        for rec in recs {
            lines.push_str(&serde_json::to_string(rec).map_err(io::Error::other)?);
            lines.push('\n');
        }
        self.file.write_all(lines.as_bytes())?;
        // Written, and the change it announces not yet made: after any record, and after
        // a record of one kind (`written-pin`, `written-group-idle`...).
        crate::crash_point("journal-written");
        #[cfg(feature = "failpoints")]
        for op in lines.lines().filter_map(|l| l.strip_prefix("{\"op\":\"")) {
            crate::crash_point(&format!("written-{}", op.split('"').next().unwrap_or("")));
        }
        self.bytes += lines.len() as u64;
        for rec in recs {
            apply(&mut self.live, rec.clone());
        }
        if self.bytes > COMPACT_AT_BYTES.max(2 * self.compacted_bytes) {
            self.compact()?;
        }
        Ok(())
    }

    pub fn state(&self) -> &JournalState {
        &self.live
    }

    /// Rewrites the journal with only the live entries (atomic rename).
    fn compact(&mut self) -> io::Result<()> {
        let mut out = String::new();
        let mut line = |rec: &Record| -> io::Result<()> {
            out.push_str(&serde_json::to_string(rec).map_err(io::Error::other)?);
            out.push('\n');
            Ok(())
        };
        for path in &self.live.groups {
            line(&Record::Group { path: path.clone() })?;
        }
        for m in self.live.moves.values() {
            line(&Record::Move {
                key: m.key,
                from: m.from.clone(),
                to: m.to.clone(),
            })?;
        }
        for (&key, &orig) in &self.live.idled {
            line(&Record::Idle { key, orig })?;
        }
        for (unit, u) in &self.live.units {
            line(&Record::UnitIdle {
                unit: unit.clone(),
                orig: u.orig,
                transient: u.transient,
                dropin: u.dropin.clone(),
                set: u.set,
            })?;
        }
        for (path, (idle, weight)) in &self.live.idle_groups {
            line(&Record::GroupIdle {
                path: path.clone(),
                idle: *idle,
                weight: weight.clone(),
            })?;
        }
        for (&key, orig) in &self.live.pinned {
            line(&Record::Pin {
                key,
                orig: orig.clone(),
            })?;
        }
        for (&id, a) in &self.live.autogroups {
            line(&Record::AutogroupNice {
                id,
                key: a.key,
                orig: a.orig,
                prev: a.prev,
                next: a.nice,
            })?;
        }
        for p in self.live.threads.values() {
            for rec in [
                Record::Manage {
                    key: p.key,
                    comm: p.comm.clone(),
                    orig: p.orig,
                },
                Record::Apply {
                    key: p.key,
                    prev: p.ours.first().copied().unwrap_or(p.orig.nice),
                    next: p.ours.last().copied().unwrap_or(p.orig.nice),
                    slice_ns: 0,
                    orig: Some(p.orig),
                },
            ] {
                line(&rec)?;
            }
        }
        private::replace_private(&self.path(), out.as_bytes())?;
        self.file = private::open_private(&self.path(), Access::Append)?;
        self.bytes = out.len() as u64;
        self.compacted_bytes = self.bytes;
        Ok(())
    }

    /// Removes the journal once nothing is left to undo.
    pub fn remove_if_empty(self) -> io::Result<()> {
        if self.live.is_empty() {
            match fs::remove_file(self.dir.join(FILE)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Copies the journal to `journal.jsonl.corrupt-SECONDS` beside it; returns the copy.
pub fn keep_a_copy(dir: &Path) -> io::Result<PathBuf> {
    let secs = crate::now_secs();
    let to = dir.join(format!("{FILE}.corrupt-{secs}"));
    private::replace_private(&to, &fs::read(dir.join(FILE))?)?;
    Ok(to)
}

fn apply(live: &mut JournalState, rec: Record) {
    // A later record of a thread, unit or group already changed keeps the first original.
    fn keep_first<K: Ord, V>(map: &mut BTreeMap<K, V>, key: K, orig: V) {
        map.entry(key).or_insert(orig);
    }
    fn forget<K: Ord, V>(map: &mut BTreeMap<K, V>, key: &K) {
        map.remove(key);
    }
    match rec {
        Record::Manage { key, comm, orig } => {
            live.threads
                .insert(key, Pending::new(key, comm, orig, vec![orig.nice]));
        }
        Record::Apply {
            key,
            prev,
            next,
            orig,
            ..
        } => applied(live, key, [prev, next], orig),
        Record::Release { key } => forget(&mut live.threads, &key),
        Record::Group { path } => {
            live.groups.insert(path);
        }
        Record::GroupRemoved { path } => {
            live.groups.remove(&path);
        }
        Record::Move { key, from, to } => {
            // A second move of the same process keeps the first origin.
            let from = live.moves.get(&key).map_or(from, |m| m.from.clone());
            live.moves.insert(key, PendingMove { key, from, to });
        }
        Record::Return { key } => forget(&mut live.moves, &key),
        Record::Idle { key, orig } => keep_first(&mut live.idled, key, orig),
        Record::Unidle { key } => forget(&mut live.idled, &key),
        Record::UnitIdle {
            unit,
            orig,
            transient,
            dropin,
            set,
        } => {
            // What it had first, what appease set last.
            let u = live.units.entry(unit).or_insert(PendingUnit {
                orig,
                transient,
                dropin,
                set,
            });
            u.set = set;
        }
        Record::UnitRestored { unit } => forget(&mut live.units, &unit),
        Record::GroupIdle { path, idle, weight } => {
            keep_first(&mut live.idle_groups, path, (idle, weight))
        }
        Record::GroupUnidle { path } => forget(&mut live.idle_groups, &path),
        Record::Pin { key, orig } => keep_first(&mut live.pinned, key, orig),
        Record::Unpin { key } => forget(&mut live.pinned, &key),
        Record::AutogroupNice {
            id,
            key,
            orig,
            prev,
            next,
        } => {
            let orig = live.autogroups.get(&id).map_or(orig, |a| a.orig);
            let pending = PendingAutogroup {
                key,
                orig,
                prev,
                nice: next,
            };
            live.autogroups.insert(id, pending);
        }
        Record::AutogroupRestored { id } => forget(&mut live.autogroups, &id),
    }
}

/// A thread moved from nice `ours[0]` to `ours[1]`.
fn applied(live: &mut JournalState, key: TaskKey, ours: [i32; 2], orig: Option<Sched>) {
    match (live.threads.get_mut(&key), orig) {
        (Some(p), _) => p.ours = ours.to_vec(),
        // Its Manage line was lost: this record says enough to put it back.
        (None, Some(orig)) => {
            let pending = Pending::new(key, String::new(), orig, ours.to_vec());
            live.threads.insert(key, pending);
        }
        (None, None) => {}
    }
}

/// A record whose cgroup paths, unit names and weights are ones appease could have
/// written: a forged or damaged one (`..` in a path, a unit that is no unit name) is
/// refused, never acted on.
fn well_formed(rec: &Record) -> Result<(), String> {
    use appease_cgroup::names::{valid_cgroup_path, valid_unit_name};
    let unit_name = |u: &str| match valid_unit_name(u) {
        true => Ok(()),
        false => Err(format!("not a unit name: {u:?}")),
    };
    let paths: &[&str] = match rec {
        Record::Group { path } | Record::GroupRemoved { path } | Record::GroupUnidle { path } => {
            &[path]
        }
        Record::GroupIdle { path, weight, .. } => {
            if weight.is_empty() || weight.len() > 10 || !weight.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(format!("not a weight: {weight:?}"));
            }
            &[path]
        }
        Record::Move { from, to, .. } => &[from, to],
        Record::UnitIdle { unit, dropin, .. } => {
            // The drop-in's old text goes back into systemd's runtime directory: only what
            // a CPUWeight drop-in holds (comments, a section, the property).
            let property_only = |l: &str| {
                l.is_empty()
                    || l.starts_with('#')
                    || (l.starts_with('[') && l.ends_with(']'))
                    || l.starts_with("CPUWeight=")
            };
            if dropin
                .as_deref()
                .is_some_and(|d| !d.lines().all(property_only))
            {
                return Err(format!("not a CPUWeight drop-in for {unit:?}"));
            }
            return unit_name(unit);
        }
        Record::UnitRestored { unit } => return unit_name(unit),
        _ => &[],
    };
    match paths.iter().find(|p| !valid_cgroup_path(p)) {
        Some(p) => Err(format!("not a cgroup path: {p:?}")),
        None => Ok(()),
    }
}

/// Reads what a journal in `dir` says must be undone. A torn last line (a crash while
/// writing it: no newline after it) is ignored; it described a change not yet made. Any
/// other line that is not a record (not UTF-8, not JSON: a damaged disk, an edit) is
/// skipped, and its number kept in `corrupt`: the rest is still undone. So is a record
/// that names a cgroup path or unit appease could not have written.
pub fn read_pending(dir: &Path) -> io::Result<JournalState> {
    let bytes = match fs::read(dir.join(FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut live = JournalState::default();
    let torn_tail = !bytes.is_empty() && !bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    for (n, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let rec = std::str::from_utf8(line)
            .map_err(|e| e.to_string())
            .and_then(|l| serde_json::from_str::<Record>(l).map_err(|e| e.to_string()));
        match rec.and_then(|r| well_formed(&r).map(|()| r)) {
            Ok(rec) => apply(&mut live, rec),
            Err(_) if torn_tail && n + 1 == lines.len() => {
                tracing::debug!(
                    line = n + 1,
                    "a torn last journal line: its change was not made"
                );
            }
            Err(e) => {
                tracing::warn!(line = n + 1, error = %e, "skipping an unreadable journal line");
                live.corrupt.push(n + 1);
            }
        }
    }
    Ok(live)
}

#[cfg(test)]
mod tests;
