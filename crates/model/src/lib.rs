//! Closed-form models: lock contention (machine repairman) and seeds/004's unhappiness.

pub mod contention;
pub mod unhappiness;
