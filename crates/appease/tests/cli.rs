//! The `appease` binary's tests that need no root: `cargo test` runs them as any user.
//! The model and the simulator from the command line; bad arguments refused with the
//! reason; `make install` and `make uninstall`; the DaemonSet in deploy/; the docs naming
//! only links, tests and commands that exist; the house rules on file and function
//! lengths. What needs root (BPF, priorities, cgroups) is in `e2e.rs`.

// What the topic modules use, through `use super::*`.
#[allow(unused_imports)]
use std::process::Command;

mod support;
use support::*;

mod commands;
mod docs;
mod house;
mod model_sim;
