//! The algorithm plugin interface.

use serde::{Deserialize, Serialize};

use crate::batch::{Batch, ContextVariant, Signals};
use crate::error::Result;
use crate::host::Host;

/// What an algorithm needs from the pipeline. The kernel checks these against the environment
/// and backend when it loads the pipeline, so an unmet need is a config error before any
/// compute starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Requirements {
    /// Rows must carry anchor-state keys (GiGPO step groups).
    pub anchor_keys: bool,
    /// Rows must carry per-turn environment rewards.
    pub step_rewards: bool,
    /// Rows must carry short-term environment feedback (EFCA).
    pub feedback: bool,
    /// The plugin calls [`Host::score`] (teacher re-scoring).
    pub teacher_scores: bool,
    /// The plugin calls [`Host::generate`].
    pub generation: bool,
    /// The plugin keeps a bank (experiences, skills) that is checkpointed with the run.
    pub bank: bool,
    /// The plugin disables tools for some rollout slots.
    pub tool_free_slots: bool,
    /// The smallest group size the plugin works with (0: any).
    pub min_group_size: u32,
    /// The plugin may drop groups; the kernel then samples more groups to fill the batch.
    pub dynamic_sampling: bool,
}

/// The pre-rollout planning request for one task group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRequest {
    pub step: u64,
    pub group_id: u64,
    pub task_id: String,
    pub group_size: u32,
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
    fn plan_group(&mut self, request: &GroupRequest) -> Result<Vec<ContextVariant>> {
        Ok(vec![ContextVariant::default(); request.group_size as usize])
    }

    /// Computes the per-token signals for a batch whose rewards are final.
    fn signals(&mut self, batch: &Batch, host: &dyn Host) -> Result<Signals>;

    /// Serialises the plugin's state (banks, posteriors, counters) for a checkpoint.
    fn save_state(&self) -> Result<String> {
        Ok(String::new())
    }

    /// Restores the state written by [`Algorithm::save_state`].
    fn load_state(&mut self, _state: &str) -> Result<()> {
        Ok(())
    }
}
