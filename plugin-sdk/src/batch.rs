//! Plain-data batch types: the turn rows a rollout produces and the signals an algorithm
//! returns for them.
//!
//! A [`TurnRow`] is one LLM call of one trajectory (algorithms.md §0, "row"). Rows carry the
//! exact token ids the policy saw and sampled, never re-tokenised text. [`Batch`] serialises to
//! the documented JSON form read by `cairn signals` and `cairn loss` (see `docs/batch-json.md`).

use serde::{Deserialize, Serialize};

use crate::error::{PluginError, Result};

/// Why generation of a response stopped.
#[repr(u8)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, abi_stable::StableAbi,
)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop id was sampled; it is the last response token and is trained on.
    #[default]
    Stop = 0,
    /// `max_new_tokens` was reached. The response is kept exactly as sampled: no EOS is forced.
    Length = 1,
    /// The episode was cut by the environment or the gateway (timeout, crash) mid-turn.
    Aborted = 2,
}

/// The context a rollout slot was given, decided by the algorithm before generation and
/// recorded on every row the slot produces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextVariant {
    /// A short label: `"plain"`, `"experience:3"`, `"skill:v2"`, `"tools-off"`.
    pub label: String,
    /// Text injected into the prompt for this slot (empty: none).
    pub inject: String,
    /// Whether tools are offered to this slot.
    pub tools_enabled: bool,
}

impl Default for ContextVariant {
    fn default() -> Self {
        ContextVariant {
            label: "plain".into(),
            inject: String::new(),
            tools_enabled: true,
        }
    }
}

/// One turn of one trajectory: a single policy call and what the environment made of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TurnRow {
    /// Task group (verl's `uid`): the G rollouts of one task share it.
    pub group_id: u64,
    /// Trajectory (rollout) id, unique within a batch.
    pub trajectory_id: u64,
    /// Turn index `t` within the trajectory, from 0.
    pub turn: u32,
    /// The task this trajectory plays (environment task id).
    pub task_id: String,
    /// The policy version that sampled `response_ids`.
    pub policy_version: u64,
    /// The context variant of the rollout slot.
    pub variant: ContextVariant,
    /// The exact prompt ids the policy saw, `[P]`.
    pub prompt_ids: Vec<u32>,
    /// Response ids, `[L]`: sampled ids (mask 1) and, for merged multi-call rows, inserted
    /// observation ids (mask 0).
    pub response_ids: Vec<u32>,
    /// Log-probs of `response_ids` under the sampling distribution (temperature applied),
    /// `[L]`, nats. Slots with mask 0 hold 0 (or anything: they are never read).
    pub response_logprobs: Vec<f32>,
    /// Loss mask, `[L]`: 1 on tokens the policy sampled and is trained on, 0 elsewhere.
    pub response_mask: Vec<u8>,
    /// Why this response ended.
    pub finish_reason: FinishReason,
    /// Environment reward of this turn, `r_{i,t}`.
    pub turn_reward: f32,
    /// Episode (outcome) reward `R_i`, the same on every row of the trajectory.
    pub episode_reward: f32,
    /// Whether the trajectory solved its task (same on every row of the trajectory).
    pub success: bool,
    /// Whether this is the last turn of its trajectory.
    pub last_turn: bool,
    /// Anchor-state key: the raw environment state at this turn, without history (GiGPO).
    pub anchor: Option<String>,
    /// The environment's observation the policy acted on at this turn (the environment part
    /// of the prompt; the state `anchor` describes).
    pub observation: String,
    /// Short-term environment feedback on this turn's action: -1 error / invalid,
    /// 0 neutral, +1 informative change (EFCA).
    pub feedback: i8,
    /// Number of tool calls made in this turn.
    pub tool_calls: u32,
    /// Anything else the environment reports, as a JSON object.
    pub info: serde_json::Map<String, serde_json::Value>,
}

impl TurnRow {
    /// Checks that the per-token arrays have one entry per response token.
    pub fn validate(&self, index: usize) -> Result<()> {
        let l = self.response_ids.len();
        if self.response_logprobs.len() != l || self.response_mask.len() != l {
            return Err(PluginError::input(format!(
                "row {index}: response_ids has {l} tokens but response_logprobs has {} and \
                 response_mask has {}; give one entry per response token",
                self.response_logprobs.len(),
                self.response_mask.len()
            )));
        }
        if let Some(&m) = self.response_mask.iter().find(|&&m| m > 1) {
            return Err(PluginError::input(format!(
                "row {index}: response_mask holds {m}; a mask entry is 0 or 1"
            )));
        }
        Ok(())
    }

    /// Number of trainable (mask 1) tokens.
    pub fn trainable_tokens(&self) -> usize {
        self.response_mask.iter().filter(|&&m| m == 1).count()
    }

    /// Index of the last policy-sampled token (mask 1), where an outcome reward belongs.
    /// `None` for a row without any policy token (an empty response).
    pub fn last_policy_token(&self) -> Option<usize> {
        self.response_mask.iter().rposition(|&m| m == 1)
    }
}

/// A batch of turn rows, the unit passed from rollout to reward to algorithm to optimizer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Batch {
    /// Training step that produced the batch.
    pub step: u64,
    pub rows: Vec<TurnRow>,
}

impl Batch {
    /// Validates every row (see [`TurnRow::validate`]).
    pub fn validate(&self) -> Result<()> {
        self.rows
            .iter()
            .enumerate()
            .try_for_each(|(i, r)| r.validate(i))
    }

    /// Total number of response tokens, masked or not.
    pub fn response_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.response_ids.len()).sum()
    }

    /// An all-zero per-token array shaped like the batch's responses.
    pub fn zeros_like_responses(&self) -> Vec<Vec<f32>> {
        self.rows
            .iter()
            .map(|r| vec![0.0; r.response_ids.len()])
            .collect()
    }
}

/// A named auxiliary C-type term (algorithms.md §0): the optimizer adds
/// `coef · agg_l(c_l · ℓ^S_l)` with `c_l` detached, no ratio and no clip.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuxTerm {
    pub name: String,
    pub coef: f32,
    /// Per row, per response token coefficient `c_l`; same shape as the batch's responses.
    pub coefficients: Vec<Vec<f32>>,
}

/// What an algorithm plugin returns for a batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Signals {
    /// Per row, per response token advantage for the clipped surrogate (A); same shape as the
    /// batch's responses. Entries on mask-0 tokens are ignored.
    pub advantages: Vec<Vec<f32>>,
    /// Auxiliary log-prob terms (C).
    pub aux: Vec<AuxTerm>,
    /// Groups the plugin drops from this step (dynamic sampling); their rows are not trained on.
    pub dropped_groups: Vec<u64>,
    /// Scalar metrics to log for this step (name, value).
    pub metrics: Vec<(String, f64)>,
}

impl Signals {
    /// Checks that the per-token arrays match the batch's response shapes.
    pub fn validate_against(&self, batch: &Batch) -> Result<()> {
        check_shape("advantages", &self.advantages, batch)?;
        for term in &self.aux {
            check_shape(
                &format!("aux term `{}`", term.name),
                &term.coefficients,
                batch,
            )?;
        }
        Ok(())
    }
}

fn check_shape(what: &str, values: &[Vec<f32>], batch: &Batch) -> Result<()> {
    if values.len() != batch.rows.len() {
        return Err(PluginError::input(format!(
            "{what} has {} rows but the batch has {}",
            values.len(),
            batch.rows.len()
        )));
    }
    for (i, (v, row)) in values.iter().zip(&batch.rows).enumerate() {
        if v.len() != row.response_ids.len() {
            return Err(PluginError::input(format!(
                "{what}: row {i} has {} values but {} response tokens",
                v.len(),
                row.response_ids.len()
            )));
        }
    }
    Ok(())
}
