//! Putting back what appease changed: at exit from what the running actuator knows, after
//! a crash from the journal alone. Each part of the actuator (threads, autogroups, pins,
//! groups, threads idled in place, units, other programs' groups) owns one kind of change
//! and its journal records; both paths loop over the same list of parts, so a part added
//! to the actuator is put back by both or by neither (and a test then fails).

use std::io;
use std::path::Path;

use crate::journal::{self, JournalState, Record};
use crate::sys::{self, Kernel};
use crate::{
    autogroup, group_idle, groups, in_place, spread, threads, unit_restore, Journal,
    KernelActuator, RestoreReport,
};

/// What a part needs to put back a change from the journal alone.
pub(crate) struct FromJournal<'a> {
    pub k: &'a dyn Kernel,
    /// The kernel's default slice, to tell a default slice from a custom one.
    pub base_slice_ns: u64,
    /// What the journal records as not yet undone.
    pub state: &'a JournalState,
}

/// One kind of change the actuator makes, journaled before it is made, and how it is put
/// back on each path.
#[derive(Clone, Copy)]
pub(crate) struct Part {
    /// Its name, for logs.
    pub name: &'static str,
    /// How many of its changes a journal's state records as not yet undone.
    pub pending: fn(&JournalState) -> usize,
    /// Puts back what the running actuator changed (daemon exit).
    pub restore_live: fn(&mut KernelActuator, &mut RestoreReport),
    /// Puts back what a journal's state records (after a crash); returns the records
    /// that say so.
    pub restore_from_journal: fn(&FromJournal, &mut RestoreReport) -> Vec<Record>,
}

/// The parts in the order they are put back: autogroups first (nothing demoted is back in
/// a raised one meanwhile), pins before groups (the pinned threads are still where
/// unpinning looks for their children).
#[rustfmt::skip] // a table: one part a line
pub(crate) static PARTS: &[Part] = &[
    //   name                         changes not yet undone                 at exit                              after a crash, from the journal
    part("autogroups",                |st| st.autogroups.len(),              KernelActuator::restore_autogroups,  autogroup::restore_journaled),
    part("threads",                   |st| st.threads.len(),                 KernelActuator::restore_threads,     threads::restore_journaled),
    part("pins",                      |st| st.pinned.len(),                  |a, _| a.restore_pins(),             spread::restore_journaled),
    part("groups",                    |st| st.moves.len() + st.groups.len(), KernelActuator::restore_groups,      groups::restore_journaled),
    part("threads idled in place",    |st| st.idled.len(),                   KernelActuator::restore_in_place,    in_place::restore_journaled),
    part("systemd units",             |st| st.units.len(),                   KernelActuator::restore_units,       unit_restore::restore_journaled_units),
    part("groups made idle in place", |st| st.idle_groups.len(),             KernelActuator::restore_idle_groups, group_idle::restore_journaled),
];

const fn part(
    name: &'static str,
    pending: fn(&JournalState) -> usize,
    restore_live: fn(&mut KernelActuator, &mut RestoreReport),
    restore_from_journal: fn(&FromJournal, &mut RestoreReport) -> Vec<Record>,
) -> Part {
    Part {
        name,
        pending,
        restore_live,
        restore_from_journal,
    }
}

impl KernelActuator {
    /// Puts back everything this actuator changed (daemon exit); the journal goes with
    /// the last change unless something could not be put back.
    pub fn restore_all(&mut self) -> RestoreReport {
        self.restore_parts(PARTS)
    }

    fn restore_parts(&mut self, parts: &[Part]) -> RestoreReport {
        let mut report = RestoreReport::default();
        for part in parts {
            (part.restore_live)(self, &mut report);
            tracing::debug!(part = part.name, ?report, "put back");
        }
        if report.failed == 0 {
            if let Some(j) = self.journal.take() {
                if let Err(e) = j.remove_if_empty() {
                    tracing::warn!(error = %e, "could not remove the journal");
                }
            }
        }
        report
    }
}

/// Undoes what a journal in `dir` records (after a crash): each change whose object is
/// still the same (thread, process, group, unit) and still as appease left it goes back to
/// what it was; what someone else changed since is left alone.
pub fn restore_journal(dir: &Path) -> io::Result<RestoreReport> {
    restore_journal_on(dir, &sys::Host)
}

/// The same on the kernel `k` (the unit tests' fake).
pub(crate) fn restore_journal_on(dir: &Path, k: &dyn Kernel) -> io::Result<RestoreReport> {
    restore_journal_with(dir, k, PARTS)
}

pub(crate) fn restore_journal_with(
    dir: &Path,
    k: &dyn Kernel,
    parts: &[Part],
) -> io::Result<RestoreReport> {
    // Whose directory it is first: a journal anyone else could have written is not read.
    let dir = &crate::private::private_dir(dir)?;
    let corrupt = journal::read_pending(dir)?.corrupt;
    if !corrupt.is_empty() {
        // What those lines recorded is lost: the journal is kept as it was for a look,
        // and each counts as a failure. Everything else is still undone.
        let kept = journal::keep_a_copy(dir)?;
        tracing::error!(lines = ?corrupt, kept = %kept.display(), "journal lines could not be read: what they recorded cannot be undone; the journal is kept");
    }
    let mut journal = Journal::open(dir)?;
    let state = journal.state().clone();
    let ctx = FromJournal {
        k,
        base_slice_ns: k.sched_getattr(0)?.slice_ns,
        state: &state,
    };
    let mut report = RestoreReport::default();
    for part in parts {
        tracing::debug!(
            part = part.name,
            pending = (part.pending)(&state),
            "restoring"
        );
        for rec in (part.restore_from_journal)(&ctx, &mut report) {
            journal.append(&rec)?;
        }
    }
    journal.remove_if_empty()?;
    report.failed += corrupt.len() as u32;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::TaskKey;
    use crate::testing::{fair, FakeKernel, TempDir};

    /// A journal that records one change of every kind, none undone, about threads,
    /// processes, groups and units that are gone since.
    fn one_of_each(dir: &Path) -> JournalState {
        let key = |tid| TaskKey {
            pid: tid,
            tid,
            start: 1,
        };
        let mut j = Journal::open(dir).unwrap();
        let gone_group = dir.join("gone-group").display().to_string();
        for rec in [
            Record::Manage {
                key: key(7001),
                comm: "gone".into(),
                orig: fair(0),
            },
            Record::Apply {
                key: key(7001),
                prev: 0,
                next: -3,
                slice_ns: 0,
                orig: None,
            },
            Record::Group {
                path: gone_group.clone(),
            },
            Record::Move {
                key: key(7002),
                from: "/".into(),
                to: gone_group.clone(),
            },
            Record::Idle {
                key: key(7003),
                orig: fair(0),
            },
            Record::UnitIdle {
                unit: "appease-test-gone.service".into(),
                orig: 100,
                transient: true,
                dropin: None,
                set: Some(0),
            },
            Record::GroupIdle {
                path: dir.join("gone-idle-group").display().to_string(),
                idle: false,
                weight: "1024".into(),
            },
            Record::Pin {
                key: key(7004),
                orig: vec![0, 1],
            },
            Record::AutogroupNice {
                id: 7005,
                key: key(7005),
                orig: 0,
                prev: 0,
                next: -2,
            },
        ] {
            j.append(&rec).unwrap();
        }
        j.state().clone()
    }

    #[test]
    fn every_kind_of_journaled_change_belongs_to_one_part_of_the_restore_loop() {
        let dir = TempDir::new("parts");
        let state = one_of_each(&dir.0);
        for part in PARTS {
            assert!(
                (part.pending)(&state) > 0,
                "{} has nothing in the journal",
                part.name
            );
        }
        let owned: usize = PARTS.iter().map(|p| (p.pending)(&state)).sum();
        assert_eq!(
            owned,
            state.len(),
            "a kind of change no part of the loop owns"
        );
    }

    #[test]
    fn restore_from_the_journal_closes_every_part_and_fails_when_one_is_left_out() {
        for left_out in 0..=PARTS.len() {
            let (k, dir) = (FakeKernel::new(), TempDir::new("left-out"));
            one_of_each(&dir.0);
            let parts: Vec<Part> = PARTS
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != left_out)
                .map(|(_, p)| *p)
                .collect();
            restore_journal_with(&dir.0, &k, &parts).unwrap();
            let after = journal::read_pending(&dir.0).unwrap();
            match PARTS.get(left_out) {
                None => assert!(after.is_empty(), "every part in: nothing left, {after:?}"),
                Some(p) => assert_eq!(
                    (p.pending)(&after),
                    after.len(),
                    "with {} left out, only its change is left: {after:?}",
                    p.name
                ),
            }
            if let Some(p) = PARTS.get(left_out) {
                assert!((p.pending)(&after) > 0, "{} left out, yet closed", p.name);
            }
        }
    }
}
