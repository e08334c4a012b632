//! The algorithm plugin interface.
//!
//! One step, as the kernel drives a plugin (see `plugin-sdk/README.md`):
//! 1. [`Algorithm::plan_group`] assigns each rollout slot of a task group a context variant;
//! 2. during rollout, [`Algorithm::next_context`] (when [`Requirements::turn_context`]) may
//!    change the context of each next turn;
//! 3. after rewards, the kernel fills in `ℓ_old` (and `ℓ_ref`) on every row and calls
//!    [`Algorithm::signals`], which is **pure** (it takes `&self`): under dynamic sampling it
//!    runs again on the grown batch;
//! 4. after the update, [`Algorithm::observe`] runs exactly once per step with the rows that
//!    were trained: the place for state updates (posteriors, utilities, bank management).
//!
//! Plugins compose into a stack (`[algorithm]` plus `[[algorithm.stack]]` in the pipeline
//! config): one [`Role::Estimator`] gives the advantages, stacked [`Role::Planner`] and
//! [`Role::Auxiliary`] plugins add context plans and extra loss terms.

use serde::{Deserialize, Serialize};

use crate::bank::EntryKind;
use crate::batch::{Batch, ContextVariant, Signals};
use crate::error::Result;
use crate::services::Host;

/// What part of a stack a plugin plays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Computes the advantages (exactly one per pipeline).
    #[default]
    Estimator,
    /// Plans rollout contexts (and may add auxiliary terms); gives no advantages.
    Planner,
    /// Adds auxiliary or teacher terms, extra rows or dropped groups; gives no advantages and
    /// plans nothing.
    Auxiliary,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Estimator => "estimator",
            Role::Planner => "planner",
            Role::Auxiliary => "auxiliary",
        }
    }
}

/// What an algorithm needs from the pipeline. The kernel checks every field against the
/// environment, the backend and the rest of the stack when it loads the pipeline, so an unmet
/// need is a config error before any compute starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Requirements {
    /// The plugin's part in a stack.
    pub role: Role,
    /// Rows must carry anchor-state keys (GiGPO step groups).
    pub anchor_keys: bool,
    /// Rows must carry per-turn environment rewards.
    pub step_rewards: bool,
    /// Rows must carry short-term environment feedback (EFCA).
    pub feedback: bool,
    /// The plugin calls [`Host::score`] (teacher re-scoring).
    pub teacher_scores: bool,
    /// The plugin asks [`Host::score`] for top-k ids, or emits a top-k teacher term.
    pub teacher_topk: bool,
    /// The plugin reads `ref_logprobs` in `signals`: the reference pass runs even with KL off.
    pub ref_logprobs: bool,
    /// The plugin calls [`Host::generate`].
    pub generation: bool,
    /// The plugin keeps bank entries of these kinds (through the host's bank callbacks).
    pub bank: Vec<EntryKind>,
    /// The plugin calls [`Host::reflect`].
    pub reflection: bool,
    /// The plugin disables tools for some rollout slots.
    pub tool_free_slots: bool,
    /// The kernel calls [`Algorithm::next_context`] before every turn after the first.
    pub turn_context: bool,
    /// The smallest group size the plugin works with (0: any).
    pub min_group_size: u32,
    /// The plugin needs an even group size (half/half partitions).
    pub even_group_size: bool,
    /// The plugin may drop groups; the kernel then samples more groups to fill the batch.
    pub dynamic_sampling: bool,
}

/// Facts about the task of a group, for planning.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupRequest {
    pub step: u64,
    pub group_id: u64,
    pub task_id: String,
    /// The task kind (one of the environment's `task_kinds`).
    pub task_kind: String,
    /// The task's description (its goal).
    pub task_description: String,
    pub group_size: u32,
    /// A seed for the plugin's own randomness, derived from the run seed, the step and the
    /// group, so plans are reproducible.
    pub seed: u64,
}

/// One finished turn, as the per-turn context hook sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnSummary {
    pub observation: String,
    pub action: String,
    pub reward: f32,
    pub feedback: i8,
    pub tool_calls: u32,
}

/// The per-turn context request: the trajectory so far and the observation of the next turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnContextRequest {
    pub step: u64,
    pub group_id: u64,
    pub trajectory_id: u64,
    pub task_id: String,
    /// The index of the turn about to be played.
    pub turn: u32,
    /// The slot's current context.
    pub variant: ContextVariant,
    pub turns: Vec<TurnSummary>,
    pub observation: crate::env::Observation,
}

/// What the next turn's prompt is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TurnContext {
    /// The slot's context, unchanged.
    #[default]
    Keep,
    /// A new context for this and later turns (e.g. a trigger-fired skill injected).
    Variant { variant: ContextVariant },
    /// The whole prompt, as ids (e.g. ECHO's reconstructed context, from
    /// [`Host::render_prompt`]). Used for this turn only; the row records it as its prompt.
    Prompt {
        prompt_ids: Vec<u32>,
        /// Recorded on the turn's row as `extra` entries (e.g. ECHO's selected record ids), so
        /// `signals` can read what this prompt was built from. A JSON object; may be absent.
        #[serde(default)]
        extra: serde_json::Map<String, serde_json::Value>,
    },
}

/// What happened in a step, given to [`Algorithm::observe`] once the update is done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepReport {
    pub step: u64,
    /// Policy version after the update.
    pub policy_version: u64,
    /// The rows of the step (every resample round), with final rewards and `ℓ_old`.
    pub batch: Batch,
    /// Groups no row of which was trained on (dropped by a plugin, or stale).
    pub dropped_groups: Vec<u64>,
    /// Bank entries the skill creator wrote since the previous step (answers to
    /// [`Host::reflect`]).
    pub new_entries: Vec<u64>,
    /// Reflections that failed since the previous step: (ticket, reason).
    pub failed_reflections: Vec<(u64, String)>,
}

/// An RL algorithm: turns a batch of turn rows into per-token training signals.
///
/// Implement this in a plugin crate and export it with [`crate::export_algorithm!`]. Every
/// method runs inside `catch_unwind` at the boundary: a panic becomes an error, never an abort.
pub trait Algorithm: Send + 'static {
    /// What the pipeline must provide. Called once, at load.
    fn requirements(&self) -> Requirements {
        Requirements::default()
    }

    /// Assigns a context variant to each of the `group_size` slots of a group, before
    /// generation. The default gives every slot the plain context.
    fn plan_group(
        &mut self,
        request: &GroupRequest,
        _host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        Ok(vec![ContextVariant::default(); request.group_size as usize])
    }

    /// The context of the next turn of a trajectory (only called with
    /// [`Requirements::turn_context`]).
    fn next_context(
        &mut self,
        _request: &TurnContextRequest,
        _host: &dyn Host,
    ) -> Result<TurnContext> {
        Ok(TurnContext::Keep)
    }

    /// Computes the per-token signals for a batch whose rewards are final and whose rows carry
    /// `old_logprobs` (and `ref_logprobs` when a reference pass ran). It takes `&self`
    /// because it must not change the plugin's state: it may run more than once per step
    /// (dynamic sampling re-runs it on the grown batch). State updates belong in
    /// [`Algorithm::observe`].
    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals>;

    /// Updates the plugin's state after the step's update, exactly once per step.
    fn observe(&mut self, _report: &StepReport, _host: &dyn Host) -> Result<()> {
        Ok(())
    }

    /// Serialises the plugin's state (posteriors, counters) for a checkpoint. Bank entries are
    /// checkpointed by the kernel.
    fn save_state(&self) -> Result<String> {
        Ok(String::new())
    }

    /// Restores the state written by [`Algorithm::save_state`].
    fn load_state(&mut self, _state: &str) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `signals` is pure and its type says so: it runs through a shared reference (ABI 4).
    #[test]
    fn signals_runs_through_a_shared_reference() {
        struct Zero;
        impl Algorithm for Zero {
            fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
                Ok(Signals {
                    advantages: batch.zeros_like_responses(),
                    ..Default::default()
                })
            }
        }
        let plugin: &dyn Algorithm = &Zero;
        let batch = Batch {
            step: 0,
            rows: vec![crate::TurnRow {
                response_ids: vec![1, 2],
                ..Default::default()
            }],
        };
        let s = plugin
            .signals(&batch, &crate::OfflineHost::default())
            .unwrap();
        assert_eq!(s.advantages, vec![vec![0.0, 0.0]]);
    }
}
