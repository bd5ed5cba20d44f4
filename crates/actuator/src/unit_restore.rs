//! A unit's CPUWeight and runtime drop-in given back, by the running daemon or, after a
//! crash, from the journal. What the unit has now decides: appease's value goes back, the
//! old value already there (the crash came between the record and the call, or between
//! a put-back's call and its drop-in) needs only the drop-in, and anyone else's value is
//! theirs, logged and left.

use crate::in_place::weight_text;
use crate::journal::Record;
use crate::restore::FromJournal;
use crate::systemd::{self, UnitControl};
use crate::trail::{audit, Change};
use crate::{KernelActuator, RestoreReport};

/// What appease set on a unit, and what it found there before.
pub(crate) struct UnitChange<'a> {
    pub unit: &'a str,
    pub orig: u64,
    /// None in journals written before the value set was recorded: taken as still set.
    pub set: Option<u64>,
    pub transient: bool,
    pub dropin: Option<&'a str>,
}

/// How a put-back ended.
#[derive(Debug, PartialEq)]
pub(crate) enum PutBack {
    /// The old CPUWeight and drop-in are back.
    Restored,
    /// The old CPUWeight was there already (appease's call never happened, or a put-back
    /// was cut short before the drop-in): only the drop-in went back.
    AlreadyBack,
    /// Someone set the CPUWeight since: theirs, left as it is.
    LeftAlone,
    /// The unit is no more (its drop-in put back all the same).
    Gone,
    /// systemd refused: still appease's to put back.
    Failed,
}

/// Gives `c.unit` its CPUWeight and drop-in back unless someone changed it since;
/// `report` counts how it ended.
pub(crate) fn put_back(
    units: &dyn UnitControl,
    c: &UnitChange,
    report: &mut RestoreReport,
) -> PutBack {
    let outcome = match (units.cpu_weight(c.unit).ok(), c.set) {
        // The old value already: only the drop-in may still be appease's.
        (Some(w), _) if w == c.orig => PutBack::AlreadyBack,
        (Some(w), Some(set)) if w != set => {
            tracing::info!(
                unit = c.unit,
                expected = weight_text(set),
                found = weight_text(w),
                "the unit's CPUWeight was changed by someone else since: left as it is"
            );
            PutBack::LeftAlone
        }
        _ => match units.set_cpu_weight(c.unit, c.orig) {
            Ok(()) => PutBack::Restored,
            Err(e) if units.unit_gone(c.unit) => {
                tracing::debug!(unit = c.unit, error = %e, "unit gone");
                PutBack::Gone
            }
            Err(e) => {
                tracing::warn!(unit = c.unit, error = %e, "could not give the unit its CPUWeight back");
                PutBack::Failed
            }
        },
    };
    match outcome {
        PutBack::Restored | PutBack::AlreadyBack => report.restored += 1,
        PutBack::Gone => report.gone += 1,
        PutBack::LeftAlone => report.left_alone += 1,
        PutBack::Failed => report.failed += 1,
    }
    if matches!(
        outcome,
        PutBack::Restored | PutBack::AlreadyBack | PutBack::Gone
    ) {
        crate::crash_point("unit-put-back");
        systemd::put_back_dropin(c.unit, c.transient, c.dropin);
    }
    outcome
}

impl KernelActuator {
    /// Gives a unit back its CPUWeight and runtime drop-in.
    pub(crate) fn unidle_unit(&mut self, unit: &str, why: &str, report: &mut RestoreReport) {
        let Some(u) = self.idle_units.remove(unit) else {
            return;
        };
        if !self.dry_run {
            let change = UnitChange {
                unit,
                orig: u.orig,
                set: Some(u.weight),
                transient: u.transient,
                dropin: u.dropin.as_deref(),
            };
            let units = self.groups.as_ref().and_then(|g| g.units.as_deref());
            match units.map(|c| put_back(c, &change, report)) {
                Some(PutBack::Restored) => {
                    let (from, to) = (weight_text(u.weight), weight_text(u.orig));
                    audit!(self.trail, Change::Unit, tree = u.root, unit, from, to, why);
                }
                Some(PutBack::AlreadyBack | PutBack::LeftAlone | PutBack::Gone) => {}
                Some(PutBack::Failed) => {
                    self.idle_units.insert(unit.to_string(), u);
                    return;
                }
                None => {
                    report.failed += 1;
                    self.idle_units.insert(unit.to_string(), u);
                    return;
                }
            }
        }
        let _logged_by_journal = self.journal(Record::UnitRestored {
            unit: unit.to_string(),
        });
    }
}

/// After a crash: every unit the journal says appease set gets its CPUWeight and runtime
/// drop-in back, through systemd.
pub(crate) fn restore_journaled_units(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let (k, state) = (c.k, c.state);
    if state.units.is_empty() {
        return Vec::new();
    }
    let bus = match k.system_bus() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "the journal lists systemd units made idle, but the system bus is not reachable");
            report.failed += state.units.len() as u32;
            return Vec::new();
        }
    };
    let mut done = Vec::new();
    for (unit, u) in &state.units {
        let change = UnitChange {
            unit,
            orig: u.orig,
            set: u.set,
            transient: u.transient,
            dropin: u.dropin.as_deref(),
        };
        if put_back(bus.as_ref(), &change, report) != PutBack::Failed {
            done.push(Record::UnitRestored { unit: unit.clone() });
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::systemd::{WEIGHT_IDLE, WEIGHT_UNSET};
    use crate::testing::{Bus, FakeSystemd, UNIT};

    /// Puts back a unit appease set idle over no CPUWeight (no drop-in before), the unit
    /// having `now`; what it ended as, the unit's weight after, and the calls made.
    fn put_back_with(now: u64, set: Option<u64>) -> (PutBack, u64, Vec<String>, RestoreReport) {
        put_back_on(
            FakeSystemd {
                weight: now,
                ..FakeSystemd::default()
            },
            set,
        )
    }

    fn put_back_on(
        systemd: FakeSystemd,
        set: Option<u64>,
    ) -> (PutBack, u64, Vec<String>, RestoreReport) {
        let fake = Arc::new(Mutex::new(systemd));
        let change = UnitChange {
            unit: UNIT,
            orig: WEIGHT_UNSET,
            set,
            transient: true,
            dropin: None,
        };
        let mut report = RestoreReport::default();
        let outcome = put_back(&Bus(fake.clone()), &change, &mut report);
        let s = fake.lock().unwrap();
        (outcome, s.weight, s.calls.clone(), report)
    }

    #[test]
    fn a_unit_still_as_appease_set_it_gets_its_old_weight() {
        let (outcome, weight, calls, report) = put_back_with(WEIGHT_IDLE, Some(WEIGHT_IDLE));
        assert_eq!(outcome, PutBack::Restored);
        assert_eq!(weight, WEIGHT_UNSET);
        assert_eq!(calls, [format!("set {WEIGHT_UNSET}")]);
        assert_eq!(report.restored, 1);
    }

    #[test]
    fn a_unit_with_its_old_weight_already_needs_no_call_and_is_closed() {
        // The crash came between the record and the call, or between a put-back's call and
        // its drop-in: nobody else's change, and only the drop-in may be left to put back.
        let (outcome, weight, calls, report) = put_back_with(WEIGHT_UNSET, Some(WEIGHT_IDLE));
        assert_eq!(outcome, PutBack::AlreadyBack);
        assert_eq!(weight, WEIGHT_UNSET);
        assert!(calls.is_empty(), "{calls:?}");
        assert_eq!((report.restored, report.left_alone), (1, 0));
    }

    #[test]
    fn a_weight_someone_else_set_since_is_left_as_it_is() {
        let (outcome, weight, calls, report) = put_back_with(77, Some(WEIGHT_IDLE));
        assert_eq!(outcome, PutBack::LeftAlone);
        assert_eq!(weight, 77);
        assert!(calls.is_empty(), "{calls:?}");
        assert_eq!((report.restored, report.left_alone), (0, 1));
    }

    #[test]
    fn an_old_journal_without_the_value_set_puts_the_old_weight_back() {
        let (outcome, weight, _, _) = put_back_with(77, None);
        assert_eq!(outcome, PutBack::Restored);
        assert_eq!(weight, WEIGHT_UNSET);
    }

    #[test]
    fn a_refused_put_back_stays_appeases_and_a_gone_unit_is_closed() {
        let refusing = FakeSystemd {
            weight: WEIGHT_IDLE,
            refuse_set: true,
            ..FakeSystemd::default()
        };
        let (outcome, weight, _, report) = put_back_on(refusing, Some(WEIGHT_IDLE));
        assert_eq!((outcome, weight), (PutBack::Failed, WEIGHT_IDLE));
        assert_eq!((report.failed, report.restored), (1, 0));
        let gone = FakeSystemd {
            gone: true,
            ..FakeSystemd::default()
        };
        let (outcome, _, _, report) = put_back_on(gone, Some(WEIGHT_IDLE));
        assert_eq!(outcome, PutBack::Gone);
        assert_eq!((report.gone, report.failed), (1, 0));
    }
}
