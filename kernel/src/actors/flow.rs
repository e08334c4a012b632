//! The messages that carry an RL step through the actors. Plain data only (ids, rows,
//! results), so each stage can be read without the others.
//!
//! ```text
//! trainer ─Produce(s)─▶ producer ─Played(s)─▶ reward ─Arrived(s)─▶ optimizer ─StepDone(s)─▶ trainer
//!    └────────────────────────────Proceed(s)──────────────────────────▲
//! ```
//!
//! - The **producer** (the rollout actor, or [`super::pull::PullSource`] for the gateway) plays
//!   one step per [`Produce`] and forwards the rollouts to the reward actor.
//! - The **reward** actor finalises the rewards and forwards the step to the optimizer.
//! - The **optimizer** buffers arrived steps and trains them in order, reporting each one on
//!   the trainer's channel ([`StepDone`]).
//! - The **trainer** carries no rows: it writes each report (`metrics.jsonl`, evaluations,
//!   checkpoints), then hands out one credit to each side: [`Produce`] for step `s + 1 + lag`
//!   and [`Proceed`] for step `s + 1`.
//!
//! **Bounded.** The trainer gives the producer `lag + 1` credits at the start and one per
//! finished step, so at most `lag + 1` steps are ever between the producer and the optimizer,
//! whatever the mailboxes' sizes.
//!
//! **Deterministic at any lag.** The optimizer prepares step `t` (staleness, exclusions,
//! `ℓ_old`/`ℓ_ref`) as soon as its batch is in and step `t − 1` is trained, but runs its
//! signals and update only once step `t + lag` has arrived (or is past the end). So step `s`
//! is played by exactly the weights after step `s − lag − 1`, policy version
//! `max(0, s − lag) · updates_per_batch`, and the algorithm's hooks run in one fixed order:
//! `plan_group`/`next_context` of step `t + lag`, then `signals` and `observe` of step `t`,
//! then those of step `t + lag + 1` (its [`Produce`] is sent only after `StepDone(t)`). At
//! `lag = 0` this is synchronous training, message for message.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use actix::prelude::*;
use cairn_plugin_sdk::{Batch, TurnRow};
use serde_json::{Map, Value};

use crate::error::Result;
use crate::rollout::{FailedEpisode, Rollouts};

/// Starts the RL phase at the optimizer: steps `first..end`, `lag` steps of lead.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartRl {
    /// The first RL step to train (0-based; later on resume).
    pub first: u64,
    /// One past the last RL step (`run.steps`).
    pub end: u64,
    /// How many RL steps rollouts may run ahead (`max_staleness / updates_per_batch`).
    pub lag: u64,
    /// The `metrics.jsonl` step of the first RL step (the data pool records it).
    pub global_step: u64,
    /// Group ids for resample rounds (shared with the producer).
    pub next_group_id: Arc<AtomicU64>,
    /// Where each step's report goes.
    pub reports: futures::channel::mpsc::UnboundedSender<StepDone>,
}

/// Play RL step `step` and forward it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Produce {
    pub step: u64,
    /// Group ids are drawn from this counter (shared with the optimizer's resample rounds).
    pub next_group_id: Arc<AtomicU64>,
}

/// A step's rollouts, on their way to the reward actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Played {
    pub step: u64,
    pub rollouts: Result<Rollouts>,
    /// Wall time of playing them, seconds.
    pub rollout_secs: f64,
}

/// A step with final rewards, on its way to the optimizer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Arrived {
    pub step: u64,
    pub collected: Result<Collected>,
}

/// The trainer has written every step before `step`: the optimizer may train `step`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Proceed {
    pub step: u64,
}

/// What the optimizer reports for each step, in step order; after an `Err` nothing follows.
#[derive(Debug)]
pub struct StepDone {
    pub step: u64,
    pub outcome: Result<StepOutcome>,
}

/// What a step did: its metrics (one `metrics.jsonl` line) and the policy version after it.
#[derive(Debug, Default)]
pub struct StepOutcome {
    pub values: Map<String, Value>,
    pub policy_version: u64,
}

/// A step's rollouts after the reward actor: what the optimizer trains on.
#[derive(Debug, Default)]
pub struct Collected {
    pub step: u64,
    /// Rows with final rewards.
    pub batch: Batch,
    /// `(trajectory_id, environment seed)` of every episode played (the data pool records
    /// them).
    pub seeds: Vec<(u64, u64)>,
    /// Trajectories cut by an environment fault (error, panic or timeout).
    pub failed: Vec<FailedEpisode>,
    /// Rows of groups left out because an episode of theirs failed
    /// ([`Rollouts::dropped_rows`]); recorded in the data pool, never trained on.
    pub failure_dropped: Vec<TurnRow>,
    /// Trajectories whose reward could not be placed on any policy token.
    pub unplaceable: usize,
    /// Response tokens sampled.
    pub sampled_tokens: usize,
    /// Wall time of playing the episodes, seconds.
    pub rollout_secs: f64,
    /// What the algorithm logged while planning and in the per-turn hook (summed over
    /// resample rounds by name, see [`Collected::extend`]).
    pub metrics: Vec<(String, f64)>,
}

impl Collected {
    /// Appends another round's rows to this step's batch.
    pub fn extend(&mut self, more: Collected) {
        self.batch.rows.extend(more.batch.rows);
        self.failed.extend(more.failed);
        self.failure_dropped.extend(more.failure_dropped);
        self.seeds.extend(more.seeds);
        self.unplaceable += more.unplaceable;
        self.sampled_tokens += more.sampled_tokens;
        self.rollout_secs += more.rollout_secs;
        self.metrics.extend(more.metrics);
    }
}
