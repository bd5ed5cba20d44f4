//! Closed-form models: lock contention (machine repairman) and the 2010 customer-appeasement paper's unhappiness.

pub mod contention;
pub mod unhappiness;
