//! Where log lines go. Until the daemon has dropped its capabilities, the calling thread
//! writes them to stderr itself; from then on a lossy background writer does, so that a
//! slow stderr (a full pipe, a stalled journald) never blocks the event loop. Its thread
//! starts only then: capabilities are per thread, and one started earlier would keep them
//! all for the daemon's life.

use std::io::{self, Write};
use std::sync::{Mutex, OnceLock};

use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};
use tracing_subscriber::fmt::MakeWriter;

static BACKGROUND: OnceLock<NonBlocking> = OnceLock::new();
static GUARD: Mutex<Option<WorkerGuard>> = Mutex::new(None);

/// The subscriber's writer (`tracing_subscriber::fmt().with_writer(LogWriter)`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LogWriter;

pub enum Line {
    Background(NonBlocking),
    Stderr(io::Stderr),
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Line::Background(w) => w.write(buf),
            Line::Stderr(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Line::Background(w) => w.flush(),
            Line::Stderr(w) => w.flush(),
        }
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        match BACKGROUND.get() {
            Some(w) => Line::Background(w.clone()),
            None => Line::Stderr(io::stderr()),
        }
    }
}

/// From now on a background thread writes the lines (lossy: a full queue drops lines
/// rather than wait). Call once the calling thread has the capabilities it keeps.
pub fn go_background() {
    let (writer, guard) = tracing_appender::non_blocking(io::stderr());
    if BACKGROUND.set(writer).is_ok() {
        *GUARD.lock().unwrap_or_else(|p| p.into_inner()) = Some(guard);
    }
}

/// Writes what is queued and ends the background writer (at exit; later lines are
/// dropped).
pub fn flush() {
    let guard = GUARD.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(guard);
}
