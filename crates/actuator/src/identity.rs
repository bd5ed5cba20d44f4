//! Which thread an id names: as a request's event saw it, and as the kernel has it when
//! the actuator first takes charge of it.

/// A thread as the probe's event describes it. A first contact checks its start against
/// the thread that has the id at the change, and keeps the event's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub tid: u32,
    /// Start in clock ticks after boot, as /proc counts it.
    pub start: u64,
    pub comm: String,
    /// Its process's name.
    pub proc_comm: String,
}

/// What a thread id names now, as a source faster than /proc tells it (the daemon's
/// probe reads the task in the kernel, one system call, where a stat file costs an open,
/// the file's formatting and a close).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadNow {
    /// Its thread group.
    pub pid: u32,
    /// Its start in clock ticks after boot, as /proc counts it.
    pub start: u64,
    pub kernel_thread: bool,
}

/// Answers, for a first contact once the actuator holds the thread's pidfd, which thread
/// the id names: `Some(None)` when none has it, `None` when it cannot tell (the actuator
/// then reads the thread's stat file).
pub trait ThreadLookup {
    fn thread_now(&mut self, tid: u32) -> Option<Option<ThreadNow>>;
}

/// A thread as an event saw it, and where to check it is still that one.
pub struct Seen<'a> {
    pub identity: Identity,
    pub lookup: Option<&'a mut dyn ThreadLookup>,
}

impl Seen<'_> {
    /// Checked against the thread's stat file.
    pub fn new(identity: Identity) -> Self {
        Seen {
            identity,
            lookup: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fair, journaled_actuator as actuator, FakeKernel, TempDir};
    use crate::ActError;

    /// A request's elevation of thread 101 of process 100, as the daemon makes it.
    fn elevate(a: &mut crate::KernelActuator, seen: Option<Seen<'_>>) -> Result<(), ActError> {
        a.elevate(100, 101, 5, None, "unix-request", seen)
    }

    fn seen(start: u64) -> Identity {
        Identity {
            tid: 101,
            start,
            comm: "worker".into(),
            proc_comm: "srv".into(),
        }
    }

    #[test]
    fn a_request_of_a_thread_that_has_exited_never_changes_the_one_that_took_its_id() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("event-recycled"));
        let first = k.spawn(100, 101, "worker", fair(0));
        // The request's event describes the first thread; it exits and a new thread of
        // another name takes its id before the daemon reads the event.
        let seen = seen(first);
        k.exit(101);
        let second = k.spawn(100, 101, "other", fair(3));
        assert_ne!(first, second);
        let mut a = actuator(&k, &dir, &[]);
        let before = k.changes();
        let err = elevate(&mut a, Some(Seen::new(seen.clone()))).unwrap_err();
        assert!(matches!(err, ActError::Gone { tid: 101 }), "{err:?}");
        assert_eq!(k.changes(), before);
        assert_eq!(k.sched(101), fair(3));
        assert!(a.managed().is_empty());
        // The event of the thread that has the id now is acted on.
        let now = Identity {
            start: second,
            ..seen
        };
        elevate(&mut a, Some(Seen::new(now))).unwrap();
        assert_eq!(k.sched(101).nice, -2, "five levels above its own 3");
        // The first thread's exit, read after that request, leaves the second managed.
        assert!(!a.forget_exited(101, first));
        assert_eq!(a.managed().len(), 1);
        a.restore_all();
        assert_eq!(k.sched(101), fair(3));
        assert!(a.forget_exited(101, second));
    }

    #[test]
    fn a_first_contact_checked_through_a_lookup_reads_no_stat_file_and_still_tells_a_recycled_id() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("event-lookup"));
        let first = k.spawn(100, 101, "worker", fair(0));
        let seen = seen(first);
        let mut a = actuator(&k, &dir, &[]);
        let mut lookup = k.clone();
        fn with(identity: Identity, lookup: &mut FakeKernel) -> Option<Seen<'_>> {
            Some(Seen {
                identity,
                lookup: Some(lookup),
            })
        }
        elevate(&mut a, with(seen.clone(), &mut lookup)).unwrap();
        assert_eq!(k.sched(101).nice, -5);
        assert_eq!(
            k.stat_reads(),
            0,
            "the lookup told the thread, not its stat file"
        );
        a.restore_all();
        let reads = k.stat_reads();
        // The thread exits and another takes its id before the next event is read.
        k.exit(101);
        let second = k.spawn(100, 101, "other", fair(3));
        let before = k.changes();
        let err = elevate(&mut a, with(seen.clone(), &mut lookup)).unwrap_err();
        assert!(matches!(err, ActError::Gone { tid: 101 }), "{err:?}");
        assert_eq!((k.changes(), k.sched(101)), (before, fair(3)));
        // Nor is a thread of another process under the id, or no thread at all.
        k.exit(101);
        k.spawn(200, 101, "other", fair(3));
        let now = Identity {
            start: second,
            ..seen.clone()
        };
        assert!(elevate(&mut a, with(now, &mut lookup)).is_err());
        k.exit(101);
        assert!(elevate(&mut a, with(seen, &mut lookup)).is_err());
        assert_eq!(k.stat_reads(), reads);
        assert!(a.managed().is_empty());
    }
}
