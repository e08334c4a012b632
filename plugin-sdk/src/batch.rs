//! Plain-data batch types: the turn rows a rollout produces and the signals an algorithm
//! returns for them.
//!
//! A [`TurnRow`] is one LLM call of one trajectory (docs/algorithms/kernel-contract.md, P1). Rows carry the
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
    /// Whether tools are offered to this slot. `false` removes the tool schema from the
    /// prompt, and the environment refuses tool calls.
    pub tools_enabled: bool,
    /// Plugin-defined data (e.g. injected entry ids, a skill version), a JSON object. Recorded
    /// on every row of the slot, so new algorithm data never needs an ABI change.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for ContextVariant {
    fn default() -> Self {
        ContextVariant {
            label: "plain".into(),
            inject: String::new(),
            tools_enabled: true,
            extra: Default::default(),
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
    /// Plugin- or kernel-defined row data (JSON object) that is neither environment info nor
    /// a context field; crosses the ABI as JSON.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// `ℓ_old`, `[L]`: log-probs of `response_ids` recomputed by the kernel before the update
    /// (or the sampled ones, when the weights have not changed and reuse is on). Empty until
    /// the optimizer actor fills it in; plugins read it in `signals`.
    pub old_logprobs: Vec<f32>,
    /// `ℓ_ref`, `[L]`: log-probs under the reference policy. Empty when no reference pass runs
    /// (KL off and no plugin asked for it).
    pub ref_logprobs: Vec<f32>,
    /// Train `response_ids` under these prompt ids instead of `prompt_ids` (a
    /// training-context override; `ℓ_old` is then recomputed under them). `prompt_ids` keeps
    /// what the policy really saw.
    pub train_prompt_ids: Option<Vec<u32>>,
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
        for (what, v) in [
            ("old_logprobs", &self.old_logprobs),
            ("ref_logprobs", &self.ref_logprobs),
        ] {
            if !v.is_empty() && v.len() != l {
                return Err(PluginError::input(format!(
                    "row {index}: {what} has {} entries for {l} response tokens; give one per \
                     token or leave it empty",
                    v.len()
                )));
            }
        }
        if let Some(&m) = self.response_mask.iter().find(|&&m| m > 1) {
            return Err(PluginError::input(format!(
                "row {index}: response_mask holds {m}; a mask entry is 0 or 1"
            )));
        }
        Ok(())
    }

    /// The prompt the optimizer trains this row under: [`TurnRow::train_prompt_ids`] when set,
    /// else the prompt the policy saw.
    pub fn train_prompt(&self) -> &[u32] {
        self.train_prompt_ids.as_deref().unwrap_or(&self.prompt_ids)
    }

    /// Per-token weights, `[L]`: `w` on the trainable (mask 1) tokens and 0 elsewhere, the
    /// weights of a teacher target that distills the whole response.
    pub fn mask_weights(&self, w: f32) -> Vec<f32> {
        self.response_mask
            .iter()
            .map(|&m| f32::from(m) * w)
            .collect()
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

/// A named auxiliary C-type term (docs/algorithms/kernel-contract.md): the optimizer adds
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
    /// batch's responses. Entries on mask-0 tokens are ignored. Empty: no advantages (what a
    /// stacked planner or auxiliary plugin returns; the estimator must give them).
    pub advantages: Vec<Vec<f32>>,
    /// Per-token factors on the estimator's advantages, `[rows][L]` (empty: none). A stacked
    /// plugin that re-routes credit (ECHO's source-indexed credit) gives these instead of
    /// advantages. The stack's final advantage is
    /// `A_l = A^est_l · Π_m scale^m_l + Σ_m add^m_l` over its members `m` (mask-1 tokens; the
    /// estimator may give them too); the stack's answer carries the composed advantages and
    /// leaves both arrays empty. Rows: `batch.rows` then this plugin's own extra rows.
    pub advantage_scale: Vec<Vec<f32>>,
    /// Per-token terms added to the estimator's advantages, `[rows][L]` (empty: none), e.g.
    /// OPID's weighted teacher advantages `w · (ℓ^T − ℓ_old)`. See
    /// [`Signals::advantage_scale`] for the composition.
    pub advantage_add: Vec<Vec<f32>>,
    /// Auxiliary log-prob terms (C).
    pub aux: Vec<AuxTerm>,
    /// Teacher-target terms (distillation toward a teacher distribution), with live gradients
    /// through the student.
    pub teacher: Vec<TeacherTerm>,
    /// Rows trained in addition to the batch's (auxiliary rows: a response trained under a
    /// context it was not sampled with, via [`TurnRow::train_prompt_ids`]). Per-token arrays of
    /// this `Signals` cover `batch.rows` followed by these rows. An extra row takes no part in
    /// the clipped surrogate, the KL or the entropy term and does not count in their
    /// normalisers: only the aux and teacher terms that target it train it (its `advantages`
    /// entries are never read; give zeros). The kernel fills its `old_logprobs` under its
    /// training prompt.
    pub extra_rows: Vec<TurnRow>,
    /// Groups the plugin drops from this step (dynamic sampling); their rows are not trained on.
    pub dropped_groups: Vec<u64>,
    /// Scalar metrics to log for this step (name, value).
    pub metrics: Vec<(String, f64)>,
}

impl Signals {
    /// Checks that the per-token arrays match the shapes of the batch's rows followed by
    /// [`Signals::extra_rows`], and that teacher targets name existing rows.
    pub fn validate_against(&self, batch: &Batch) -> Result<()> {
        let rows: Vec<&TurnRow> = batch.rows.iter().chain(&self.extra_rows).collect();
        for (i, row) in self.extra_rows.iter().enumerate() {
            row.validate(batch.rows.len() + i)?;
        }
        for (what, values) in [
            ("advantages", &self.advantages),
            ("advantage_scale", &self.advantage_scale),
            ("advantage_add", &self.advantage_add),
        ] {
            if !values.is_empty() {
                check_shape(what, values, &rows)?;
            }
        }
        for term in &self.aux {
            check_shape(
                &format!("aux term `{}`", term.name),
                &term.coefficients,
                &rows,
            )?;
        }
        for term in &self.teacher {
            term.validate(&rows)?;
        }
        Ok(())
    }
}

fn check_shape(what: &str, values: &[Vec<f32>], rows: &[&TurnRow]) -> Result<()> {
    if values.len() != rows.len() {
        return Err(PluginError::input(format!(
            "{what} has {} rows but the batch has {} (rows then extra rows)",
            values.len(),
            rows.len()
        )));
    }
    for (i, (v, row)) in values.iter().zip(rows).enumerate() {
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

/// How a teacher-target term compares student and teacher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TeacherForm {
    /// Reverse KL on the policy's own sampled tokens (EDGE, arXiv 2608.21946, "distillation
    /// loss"): per token `w · sg(ℓ^S − ℓ^T) · ℓ^S`, whose gradient `w (ℓ^S − ℓ^T) ∇ℓ^S` is
    /// the score-function estimator of `∇ KL(π_θ(·|x) ‖ π_T(·|x'))` on sampled tokens.
    #[default]
    SampledReverseKl,
    /// Reverse KL on the teacher's top-k support: both distributions renormalised over the
    /// teacher's `k` ids, per token `w · Σ_v p^S(v) (log p^S(v) − log p^T(v))`.
    TopKReverseKl { k: u32 },
    /// Forward KL on the teacher's top-k support (UCOB's top-k OPD, github TU2021/UCOB,
    /// `sdar_utils.py`): both renormalised over the teacher's `k` ids, per token
    /// `w · Σ_v p^T(v) (log p^T(v) − log p^S(v))`, whose gradient is `−w Σ_v p^T(v) ∇log p^S(v)`.
    TopKForwardKl { k: u32 },
}

/// Where a row's teacher log-probs come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TeacherSource {
    /// A live teacher: the same weights as the update step, no grad, on the row's response
    /// after `context_ids` (EDGE's teacher). Computed inside each optimizer step, so it never
    /// goes stale across several updates per batch.
    Context { context_ids: Vec<u32> },
    /// Fixed, detached teacher scores (e.g. from [`crate::Host::score`] with rollout-time
    /// weights, as OPID does): `logprobs` `[L]` of the sampled ids, and for the top-k form
    /// `top_ids` / `top_logprobs` `[L, k]` row-major.
    Fixed {
        logprobs: Vec<f32>,
        #[serde(default)]
        top_ids: Vec<u32>,
        #[serde(default)]
        top_logprobs: Vec<f32>,
    },
}

/// One row's teacher target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TeacherTarget {
    /// Index into the batch's rows followed by [`Signals::extra_rows`].
    pub row: usize,
    /// Per-token weight `w_l`, `[L]` (0: not distilled). Mask-0 tokens are never distilled.
    pub weights: Vec<f32>,
    pub source: TeacherSource,
}

/// A named teacher-target term: `coef · agg_l(per-token term)` over the active tokens of its
/// targets, aggregated with the objective's mode.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TeacherTerm {
    pub name: String,
    pub coef: f32,
    pub form: TeacherForm,
    pub targets: Vec<TeacherTarget>,
}

impl TeacherTerm {
    /// Checks row indices and per-token shapes against `rows`.
    pub fn validate(&self, rows: &[&TurnRow]) -> Result<()> {
        for t in &self.targets {
            let Some(row) = rows.get(t.row) else {
                return Err(PluginError::input(format!(
                    "teacher term `{}` targets row {} but the batch has {} rows",
                    self.name,
                    t.row,
                    rows.len()
                )));
            };
            let l = row.response_ids.len();
            if t.weights.len() != l {
                return Err(PluginError::input(format!(
                    "teacher term `{}`: row {} has {} weights for {l} response tokens",
                    self.name,
                    t.row,
                    t.weights.len()
                )));
            }
            if let TeacherSource::Fixed {
                logprobs,
                top_ids,
                top_logprobs,
            } = &t.source
            {
                let k = match self.form {
                    TeacherForm::TopKReverseKl { k } | TeacherForm::TopKForwardKl { k } => {
                        k as usize
                    }
                    TeacherForm::SampledReverseKl => 0,
                };
                if (k == 0 && logprobs.len() != l)
                    || top_ids.len() != l * k
                    || top_logprobs.len() != l * k
                {
                    return Err(PluginError::input(format!(
                        "teacher term `{}`: row {} has {} teacher log-probs and {} / {} top-k \
                         entries; expected {} and {} (L = {l}, k = {k})",
                        self.name,
                        t.row,
                        logprobs.len(),
                        top_ids.len(),
                        top_logprobs.len(),
                        if k == 0 { l } else { logprobs.len() },
                        l * k
                    )));
                }
            }
        }
        Ok(())
    }
}
