//! Closed-form models: lock contention (machine repairman), the 2010 customer-appeasement
//! paper's unhappiness, and the Staircase study's scalability formula.

pub mod contention;
pub mod scalability;
pub mod unhappiness;
