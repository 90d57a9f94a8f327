//! The pure core: everything bouncer decides, from plain data. No Kubernetes client or API
//! types, no async runtime, no clock, no environment: the cluster edge converts API objects into
//! these types, and `now` is an argument. `tests/layout.rs` keeps it that way.

pub mod action;
pub mod bounce;
pub mod breaker;
pub mod disruption;
pub mod explain;
pub mod gates;
pub mod gitops;
pub mod group;
pub mod history;
pub mod in_flight;
pub mod literals;
pub mod mark;
pub mod memory;
pub mod model;
pub mod notice;
pub mod outcome;
pub mod overrides;
pub mod pin;
pub mod plan;
pub mod policy;
pub mod quantity;
pub mod queue;
pub mod reasons;
pub mod recheck;
pub mod rollout;
pub mod schedule;
pub mod selector;
pub mod toolhive;
pub mod trend;
pub mod verify;

// Tests of the safety gates across modules; they build workloads with the planner's test kit.
#[cfg(test)]
mod invariant_tests;
#[cfg(test)]
mod pin_rule_tests;
#[cfg(test)]
mod safety_tests;
