//! Closed-form models.

pub mod contention;
