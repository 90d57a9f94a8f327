//! Integration tests against the local control plane: one binary, one module per area, so the
//! cluster starts once per `cargo test` run (see bouncer-testkit).

mod bounce;
mod breaker;
mod cli;
mod explain;
mod faults;
mod flux;
mod ground;
mod harness;
mod machine;
mod metrics;
mod notify;
mod overrides;
mod owners;
mod pin;
mod policy_modes;
mod prometheus;
mod revert;
mod safety;
mod safety_cases;
mod safety_round3;
mod scope;

mod toolhive;
mod toolhive_owner;
