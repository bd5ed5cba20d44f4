//! Append-only journal of every scheduling change, written before the change is made,
//! so a restarted daemon or `appease restore` can undo what a crashed daemon left.
//! One JSON object per line; live entries are rewritten compactly when it grows.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys::Sched;

const FILE: &str = "journal.jsonl";
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
    pub units: BTreeMap<String, (u64, bool, Option<String>)>,
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
    live: JournalState,
}

impl Journal {
    /// Opens (creating) the journal in `dir`, keeping what it already holds.
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let live = read_pending(dir)?;
        let path = dir.join(FILE);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
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
        // Written, and the change it announces not yet made.
        crate::crash_point("journal-written");
        self.bytes += lines.len() as u64;
        for rec in recs {
            apply(&mut self.live, rec.clone());
        }
        if self.bytes > COMPACT_AT_BYTES {
            self.compact()?;
        }
        Ok(())
    }

    pub fn state(&self) -> &JournalState {
        &self.live
    }

    /// Rewrites the journal with only the live entries (atomic rename).
    fn compact(&mut self) -> io::Result<()> {
        let tmp = self.dir.join(format!("{FILE}.tmp"));
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
        for (unit, (orig, transient, dropin)) in &self.live.units {
            line(&Record::UnitIdle {
                unit: unit.clone(),
                orig: *orig,
                transient: *transient,
                dropin: dropin.clone(),
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
        fs::write(&tmp, &out)?;
        fs::rename(&tmp, self.path())?;
        self.file = OpenOptions::new().append(true).open(self.path())?;
        self.bytes = out.len() as u64;
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
    fs::copy(dir.join(FILE), &to)?;
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
        } => keep_first(&mut live.units, unit, (orig, transient, dropin)),
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

/// Reads what a journal in `dir` says must be undone. A torn last line (a crash while
/// writing it: no newline after it) is ignored; it described a change not yet made. Any
/// other line that is not a record (not UTF-8, not JSON: a damaged disk, an edit) is
/// skipped, and its number kept in `corrupt`: the rest is still undone.
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
        match rec {
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
mod tests {
    use super::*;

    fn key(tid: u32) -> TaskKey {
        TaskKey {
            pid: 1,
            tid,
            start: 42,
        }
    }

    fn sched(nice: i32) -> Sched {
        Sched {
            policy: 0,
            nice,
            slice_ns: 0,
            reset_on_fork: false,
        }
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("appease-journal-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn replays_live_entries_across_reopen() {
        let dir = tmpdir("replay");
        let mut j = Journal::open(&dir).unwrap();
        j.append(&Record::Manage {
            key: key(1),
            comm: "a".into(),
            orig: sched(0),
        })
        .unwrap();
        j.append(&Record::Apply {
            key: key(1),
            prev: 0,
            next: -5,
            slice_ns: 500_000,
            orig: None,
        })
        .unwrap();
        j.append(&Record::Manage {
            key: key(2),
            comm: "b".into(),
            orig: sched(3),
        })
        .unwrap();
        j.append(&Record::Apply {
            key: key(2),
            prev: 3,
            next: -2,
            slice_ns: 0,
            orig: None,
        })
        .unwrap();
        j.append(&Record::Apply {
            key: key(2),
            prev: -2,
            next: 0,
            slice_ns: 0,
            orig: None,
        })
        .unwrap();
        j.append(&Record::Release { key: key(1) }).unwrap();
        drop(j);
        // A torn line at the end is skipped.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(FILE))
            .unwrap();
        f.write_all(b"{\"op\":\"apply\",\"key\":{\"pi").unwrap();
        let live = read_pending(&dir).unwrap().threads;
        assert_eq!(live.len(), 1);
        let p = &live[&key(2)];
        assert_eq!((p.orig.nice, p.ours.clone()), (3, vec![-2, 0]));
        let j = Journal::open(&dir).unwrap();
        assert_eq!(j.state().threads.len(), 1);
        j.remove_if_empty().unwrap();
        assert!(dir.join(FILE).exists(), "kept while something is pending");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn compaction_keeps_live_entries_only() {
        let dir = tmpdir("compact");
        let mut j = Journal::open(&dir).unwrap();
        for tid in 0..8000 {
            j.append(&Record::Manage {
                key: key(tid),
                comm: "x".into(),
                orig: sched(0),
            })
            .unwrap();
            j.append(&Record::Apply {
                key: key(tid),
                prev: 0,
                next: -3,
                slice_ns: 0,
                orig: None,
            })
            .unwrap();
            if tid != 7 {
                j.append(&Record::Release { key: key(tid) }).unwrap();
            }
        }
        assert!(fs::metadata(dir.join(FILE)).unwrap().len() < COMPACT_AT_BYTES);
        let live = read_pending(&dir).unwrap().threads;
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), vec![key(7)]);
        assert_eq!(live[&key(7)].ours, vec![0, -3]);
        drop(j);
        let mut j = Journal::open(&dir).unwrap();
        j.append(&Record::Release { key: key(7) }).unwrap();
        j.remove_if_empty().unwrap();
        assert!(!dir.join(FILE).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn moves_and_groups_replay_and_compact() {
        let dir = tmpdir("moves");
        let mut j = Journal::open(&dir).unwrap();
        j.append(&Record::Group {
            path: "/appease.batch".into(),
        })
        .unwrap();
        j.append(&Record::Move {
            key: key(5),
            from: "/".into(),
            to: "/appease.batch".into(),
        })
        .unwrap();
        // Moved again (say promoted then demoted): the first origin is what counts.
        j.append(&Record::Move {
            key: key(5),
            from: "/appease.batch".into(),
            to: "/appease.batch".into(),
        })
        .unwrap();
        j.append(&Record::Move {
            key: key(6),
            from: "/a".into(),
            to: "/appease.batch".into(),
        })
        .unwrap();
        j.append(&Record::Return { key: key(6) }).unwrap();
        drop(j);
        let st = read_pending(&dir).unwrap();
        assert_eq!(
            st.groups.iter().cloned().collect::<Vec<_>>(),
            vec!["/appease.batch".to_string()]
        );
        assert_eq!(st.moves.len(), 1);
        assert_eq!(st.moves[&key(5)].from, "/");
        let mut j = Journal::open(&dir).unwrap();
        j.compact().unwrap();
        assert_eq!(
            read_pending(&dir).unwrap(),
            st,
            "compaction keeps moves and groups"
        );
        j.append(&Record::Return { key: key(5) }).unwrap();
        j.append(&Record::GroupRemoved {
            path: "/appease.batch".into(),
        })
        .unwrap();
        assert!(j.state().is_empty());
        j.remove_if_empty().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn raised_autogroups_replay_and_compact_keeping_the_first_original() {
        let dir = tmpdir("autogroups");
        let mut j = Journal::open(&dir).unwrap();
        let raise = |id, prev, next| Record::AutogroupNice {
            id,
            key: key(5),
            orig: prev,
            prev,
            next,
        };
        j.append(&raise(7, 0, -10)).unwrap();
        // Raised again to a new nice (a reload): 0 is still what goes back.
        j.append(&raise(7, -10, -5)).unwrap();
        j.append(&raise(8, 2, -10)).unwrap();
        j.append(&Record::AutogroupRestored { id: 8 }).unwrap();
        drop(j);
        let st = read_pending(&dir).unwrap();
        assert_eq!(st.autogroups.keys().copied().collect::<Vec<_>>(), vec![7]);
        let a = &st.autogroups[&7];
        assert_eq!((a.orig, a.prev, a.nice, a.key), (0, -10, -5, key(5)));
        let mut j = Journal::open(&dir).unwrap();
        j.compact().unwrap();
        assert_eq!(read_pending(&dir).unwrap(), st, "compaction keeps them");
        j.append(&Record::AutogroupRestored { id: 7 }).unwrap();
        assert!(j.state().is_empty());
        j.remove_if_empty().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn threads_idled_in_place_and_idle_units_replay_and_compact() {
        let dir = tmpdir("in-place");
        let mut j = Journal::open(&dir).unwrap();
        let idle = |nice| Sched {
            policy: crate::sys::SCHED_IDLE,
            ..sched(nice)
        };
        j.append(&Record::Idle {
            key: key(7),
            orig: sched(3),
        })
        .unwrap();
        // Recorded again (a daemon that died between the record and the change, then a
        // new one): the first original is what counts.
        j.append(&Record::Idle {
            key: key(7),
            orig: idle(3),
        })
        .unwrap();
        j.append(&Record::Idle {
            key: key(8),
            orig: sched(0),
        })
        .unwrap();
        j.append(&Record::Unidle { key: key(8) }).unwrap();
        j.append(&Record::UnitIdle {
            unit: "backup.service".into(),
            orig: crate::systemd::WEIGHT_UNSET,
            transient: false,
            dropin: None,
        })
        .unwrap();
        j.append(&Record::UnitIdle {
            unit: "run-r1.scope".into(),
            orig: 50,
            transient: true,
            dropin: Some("[Scope]\nCPUWeight=50\n".into()),
        })
        .unwrap();
        j.append(&Record::UnitRestored {
            unit: "backup.service".into(),
        })
        .unwrap();
        drop(j);
        let st = read_pending(&dir).unwrap();
        assert_eq!(st.idled.len(), 1);
        assert_eq!(st.idled[&key(7)], sched(3));
        assert_eq!(
            st.units.get("run-r1.scope"),
            Some(&(50, true, Some("[Scope]\nCPUWeight=50\n".to_string())))
        );
        assert_eq!(st.len(), 2);
        let mut j = Journal::open(&dir).unwrap();
        j.compact().unwrap();
        assert_eq!(read_pending(&dir).unwrap(), st, "compaction keeps both");
        j.append(&Record::Unidle { key: key(7) }).unwrap();
        j.append(&Record::UnitRestored {
            unit: "run-r1.scope".into(),
        })
        .unwrap();
        assert!(j.state().is_empty());
        j.remove_if_empty().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    fn manage(tid: u32, nice: i32) -> Record {
        Record::Manage {
            key: key(tid),
            comm: "t".into(),
            orig: sched(nice),
        }
    }

    fn apply_rec(tid: u32, orig: i32, next: i32) -> Record {
        Record::Apply {
            key: key(tid),
            prev: orig,
            next,
            slice_ns: 0,
            orig: Some(sched(orig)),
        }
    }

    fn lines_of(recs: &[Record]) -> Vec<Vec<u8>> {
        recs.iter()
            .map(|r| serde_json::to_vec(r).unwrap())
            .collect()
    }

    fn write_lines(dir: &Path, lines: &[Vec<u8>]) {
        fs::create_dir_all(dir).unwrap();
        let mut text = Vec::new();
        for l in lines {
            text.extend_from_slice(l);
            text.push(b'\n');
        }
        fs::write(dir.join(FILE), text).unwrap();
    }

    #[test]
    fn a_line_that_is_not_utf8_costs_that_line_only() {
        let dir = tmpdir("utf8");
        let mut lines = lines_of(&[manage(1, 0), apply_rec(1, 0, -5), manage(2, 3)]);
        lines.insert(1, b"{\"op\":\"release\",\xff}".to_vec());
        write_lines(&dir, &lines);
        let st = read_pending(&dir).expect("read, not aborted");
        assert_eq!(st.threads.len(), 2, "every other line replayed");
        assert_eq!(st.corrupt, vec![2]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_lost_manage_line_is_made_good_by_the_apply_record() {
        let dir = tmpdir("lost-manage");
        let mut lines = lines_of(&[manage(1, 4), apply_rec(1, 4, -5)]);
        lines[0] = b"garbage".to_vec();
        write_lines(&dir, &lines);
        let st = read_pending(&dir).unwrap();
        let p = &st.threads[&key(1)];
        assert_eq!((p.orig, p.ours.clone()), (sched(4), vec![4, -5]));
        assert_eq!(st.corrupt, vec![1]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_last_line_is_ended_before_the_next_record() {
        let dir = tmpdir("torn");
        let mut lines = lines_of(&[manage(1, 0)]);
        lines.push(br#"{"op":"manage","key":{"pi"#.to_vec());
        write_lines(&dir, &lines);
        // Remove the newline after the torn line: a crash mid-write leaves none.
        let mut text = fs::read(dir.join(FILE)).unwrap();
        text.pop();
        fs::write(dir.join(FILE), text).unwrap();
        let mut j = Journal::open(&dir).unwrap();
        assert!(
            j.state().corrupt.is_empty(),
            "a torn tail is not corruption"
        );
        j.append(&manage(2, 0)).unwrap();
        drop(j);
        let st = read_pending(&dir).unwrap();
        assert_eq!(
            st.threads.len(),
            2,
            "the record after the torn line is read"
        );
        assert_eq!(
            st.corrupt,
            vec![2],
            "the torn line, now ended, is one bad line"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn restore_keeps_a_journal_with_unreadable_lines_and_counts_them_failed() {
        let dir = tmpdir("restore-corrupt");
        // A group that does not exist (gone) and one unreadable line.
        let mut lines = lines_of(&[Record::GroupIdle {
            path: "/appease-no-such-group".into(),
            idle: false,
            weight: "1024".into(),
        }]);
        lines.push(b"\x00\x01 not a record".to_vec());
        write_lines(&dir, &lines);
        let report = crate::restore_journal(&dir).unwrap();
        assert_eq!(report.failed, 1, "{report:?}");
        let kept: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(kept.len(), 1, "a copy kept for a look");
        fs::remove_dir_all(&dir).unwrap();
    }
}
