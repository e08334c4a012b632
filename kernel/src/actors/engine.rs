//! An external rollout engine as the pipeline sees it. The engine itself (its HTTP client,
//! the weight sync and the probe) lives in the `cairn-gateway` crate, which depends on the
//! kernel: the host hands [`start`](super::start) a [`StartEngine`] that starts the engine's
//! actor once the policy actor runs, and gets back the two recipients the pipeline needs.

use actix::prelude::*;

use super::policy::{Generate, PolicyActor};

/// Starts the engine's actor beside the policy actor (inside the running actix `System`).
pub type StartEngine = Box<dyn FnOnce(Addr<PolicyActor>) -> EngineLink + Send>;

/// A started engine: the rollout actors generate through `generate` instead of the policy
/// actor, and the optimizer reads `stats` into each step's metrics.
#[derive(Clone)]
pub struct EngineLink {
    pub generate: Recipient<Generate>,
    pub stats: Recipient<ReadEngineStats>,
}

/// The engine's counters: syncs done and the last probe's mismatch.
#[derive(Message)]
#[rtype(result = "EngineStats")]
pub struct ReadEngineStats;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub syncs: u64,
    /// Mean |engine − trainer| log-prob on the probe at the last sync, nats per token.
    pub probe_mismatch: f64,
    pub served_version: Option<u64>,
}
