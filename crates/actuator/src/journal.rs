//! Append-only journal of every scheduling change, written before the change is made,
//! so a restarted daemon or `appease restore` can undo what a crashed daemon left.
//! One JSON object per line; live entries are rewritten compactly when it grows.

use std::collections::BTreeMap;
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
    /// appease is about to move the thread from nice `prev` to nice `next`.
    Apply {
        key: TaskKey,
        prev: i32,
        next: i32,
        slice_ns: u64,
    },
    /// The thread is back to `orig`, gone, or handed off: nothing to undo.
    Release { key: TaskKey },
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

pub struct Journal {
    dir: PathBuf,
    file: File,
    bytes: u64,
    live: BTreeMap<TaskKey, Pending>,
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
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        let bytes = file.metadata()?.len();
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
        let mut line = serde_json::to_string(rec).map_err(io::Error::other)?;
        line.push('\n');
        self.file.write_all(line.as_bytes())?;
        self.bytes += line.len() as u64;
        apply(&mut self.live, rec.clone());
        if self.bytes > COMPACT_AT_BYTES {
            self.compact()?;
        }
        Ok(())
    }

    pub fn pending(&self) -> impl Iterator<Item = &Pending> {
        self.live.values()
    }

    /// Rewrites the journal with only the live entries (atomic rename).
    fn compact(&mut self) -> io::Result<()> {
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let mut out = String::new();
        for p in self.live.values() {
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
                },
            ] {
                out.push_str(&serde_json::to_string(&rec).map_err(io::Error::other)?);
                out.push('\n');
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

fn apply(live: &mut BTreeMap<TaskKey, Pending>, rec: Record) {
    match rec {
        Record::Manage { key, comm, orig } => {
            live.insert(
                key,
                Pending {
                    key,
                    comm,
                    orig,
                    ours: vec![orig.nice],
                },
            );
        }
        Record::Apply {
            key, prev, next, ..
        } => {
            if let Some(p) = live.get_mut(&key) {
                p.ours = vec![prev, next];
            }
        }
        Record::Release { key } => {
            live.remove(&key);
        }
    }
}

/// Reads what a journal in `dir` says must be undone. A torn last line (crash while
/// writing) is ignored; it described a change that was not yet made.
pub fn read_pending(dir: &Path) -> io::Result<BTreeMap<TaskKey, Pending>> {
    let text = match fs::read_to_string(dir.join(FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let mut live = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(rec) => apply(&mut live, rec),
            Err(e) => tracing::warn!(line = n + 1, error = %e, "skipping unreadable journal line"),
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
        })
        .unwrap();
        j.append(&Record::Apply {
            key: key(2),
            prev: -2,
            next: 0,
            slice_ns: 0,
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
        let live = read_pending(&dir).unwrap();
        assert_eq!(live.len(), 1);
        let p = &live[&key(2)];
        assert_eq!((p.orig.nice, p.ours.clone()), (3, vec![-2, 0]));
        let j = Journal::open(&dir).unwrap();
        assert_eq!(j.pending().count(), 1);
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
            })
            .unwrap();
            if tid != 7 {
                j.append(&Record::Release { key: key(tid) }).unwrap();
            }
        }
        assert!(fs::metadata(dir.join(FILE)).unwrap().len() < COMPACT_AT_BYTES);
        let live = read_pending(&dir).unwrap();
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), vec![key(7)]);
        assert_eq!(live[&key(7)].ours, vec![0, -3]);
        drop(j);
        let mut j = Journal::open(&dir).unwrap();
        j.append(&Record::Release { key: key(7) }).unwrap();
        j.remove_if_empty().unwrap();
        assert!(!dir.join(FILE).exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
