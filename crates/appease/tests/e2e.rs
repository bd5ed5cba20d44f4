//! End to end on the real kernel: the `appease` binary, real BPF, real sockets, real
//! priorities. Root-only tests (`root_test!`) are ignored with their reason unless run
//! with `--include-ignored` (make test, as root), and fail saying so without root.
//! Tests run one at a time (they share the machine's CPUs and the daemon's lock).
//! They are laid out by topic in the modules below, over the harness in `harness/`
//! (and `support/`, which the daemon's benchmarks and `cli.rs` share). The tests that
//! need no root are in `cli.rs`.

// What the topic modules use, through `use super::*`.
#[allow(unused_imports)]
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::net::UnixStream,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    sync::{mpsc, Arc, Mutex, MutexGuard},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

/// A test that needs root: ignored with the reason unless run with `--include-ignored`
/// (make test does), one test at a time, failing clearly when run without root.
macro_rules! root_test {
    ($(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        #[test]
        #[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
        fn $name() {
            let _one_at_a_time = $crate::serial();
            let _timed = $crate::harness::Timed::new(concat!(module_path!(), "::", stringify!($name)));
            $body
        }
    };
}

mod harness;
mod support;
use harness::*;
use support::*;

mod batch;
mod bench;
mod chaos;
mod containers;
mod elevation;
mod in_place;
mod lifecycle;
mod locks;
mod nested;
mod operating;
mod pods;
mod responses;
mod security;
mod services;
mod vm;
