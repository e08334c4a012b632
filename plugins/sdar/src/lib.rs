//! `sdar`: SDAR, self-distilled agentic RL (arXiv 2605.15155, abstract; the formulas follow
//! the public reimplementation in github TU2021/UCOB, `verl/trainer/ppo/sdar_utils.py`;
//! `docs/algorithms/sdar.md`). A [`Role::Auxiliary`] plugin stacked on an advantage
//! estimator, which keeps computing every advantage:
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"                 # or "gigpo"
//! [[algorithm.stack]]
//! plugin = "sdar"
//! config = { coef = 0.1, beta = 5.0, form = "ucob" }
//! ```
//!
//! RL stays the primary objective; a gated on-policy self-distillation term is added:
//! `L = L_RL + λ · agg_l(g_l · d_l)`, with
//! - the **teacher**: the same policy with a skill-conditioned context (`cairn_opsd`: the top
//!   `skills.k` skills of the bank for the row's task, injected into the row's context and
//!   scored on the row's own sampled tokens with the current weights), `ℓ^T [L]`;
//! - the **student**: the row's `ℓ_old`, `ℓ^S [L]`;
//! - the **gap** `Δ_l = sg(ℓ^T_l − ℓ^S_l)` and the **gate** `g_l = σ(β Δ_l)`, detached
//!   ([`gates`]): a token the teacher endorses (`Δ > 0`) is distilled, one it rejects
//!   (`Δ < 0`, e.g. after a misleading skill) is softly left out; `gate = false` gives
//!   `g = 1` (naive OPSD);
//! - the **form** of `d_l` ([`Form`]): `ucob` (gradient `−λ g_l ∇ℓ^S_l`, an aux term with
//!   coefficients `−g_l`), `reverse_kl` (gradient `−λ g_l Δ_l ∇ℓ^S_l`, a sampled reverse-KL
//!   teacher term with weights `g_l`), or a top-k form with the same gate as weights.
//!
//! Rows without a retrieved skill get no teacher signal (counted). The skills are written by
//! the kernel's skill creator from successful trajectories ([`Algorithm::observe`],
//! `cairn_opsd::Creator`), so a run from an empty bank builds its own.
//!
//! Metrics (in the signals): `sdar/rows_with_teacher`, `sdar/rows_without_skill`,
//! `sdar/rows_nonfinite`, `sdar/rows_score_failed`, `sdar/context_mismatch_rows`,
//! `sdar/skills_too_long`, `sdar/skills_per_row`, and over the teacher rows' trainable tokens
//! `sdar/gate_mean`, `sdar/gate_active_ratio` (share with `g > 0.5`), `sdar/gap_mean` (mean
//! `Δ`) and `sdar/gap_loss` (`λ ·` token mean of `g·Δ`, the reimplementation's loss value at
//! `ℓ_old`);
//! from `observe`: `sdar/reflections_requested`, `_refused`, `_failed`, `sdar/skills_in_bank`.

use cairn_opsd::{teacher, Creator, Teachers};
use cairn_plugin_sdk::{
    Algorithm, AuxTerm, Batch, EntryKind, Host, Requirements, Result, Role, Signals, StepReport,
    TeacherSource, TeacherTarget, TeacherTerm, TurnRow,
};
use serde::{Deserialize, Serialize};

pub mod config;

pub use config::{Form, SdarConfig};

/// The name of the distillation term (an aux term in the `ucob` form, a teacher term in the
/// others).
pub const TERM: &str = "sdar-distill";

/// What the plugin keeps across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SdarState {
    /// Steps observed.
    pub steps: u64,
    /// The skill creator's counters.
    pub creator: Creator,
}

pub struct Sdar {
    config: SdarConfig,
    state: SdarState,
}

impl Sdar {
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Sdar {
            config: SdarConfig::from_json(json)?,
            state: SdarState::default(),
        })
    }

    pub fn config(&self) -> &SdarConfig {
        &self.config
    }

    pub fn state(&self) -> &SdarState {
        &self.state
    }
}

/// The gates of one row, `[L]`: `σ(β Δ_l)` (or 1 with `gate = false`) on trainable tokens,
/// 0 on mask-0 tokens. `deltas` are the row's gaps `Δ_l` (`RowTeacher::gaps`).
pub fn gates(config: &SdarConfig, row: &TurnRow, deltas: &[f64]) -> Vec<f64> {
    row.response_mask
        .iter()
        .zip(deltas)
        .map(|(&m, &d)| match (m, config.gate) {
            (1, true) => cairn_opsd::gate(config.beta, d),
            (1, false) => 1.0,
            _ => 0.0,
        })
        .collect()
}

/// The `sdar-distill` term and the gate metrics of a batch, given its teachers (pure: the
/// part of [`Algorithm::signals`] after scoring).
pub fn distill(config: &SdarConfig, batch: &Batch, teachers: &Teachers) -> Signals {
    let mut coefficients = batch.zeros_like_responses();
    let mut targets = Vec::new();
    let (mut tokens, mut gate_sum, mut active, mut gap_sum, mut value) = (0usize, 0.0, 0, 0.0, 0.0);
    for t in &teachers.rows {
        let row = &batch.rows[t.row];
        let deltas = t.gaps(row);
        let g = gates(config, row, &deltas);
        for l in (0..row.response_mask.len()).filter(|&l| row.response_mask[l] == 1) {
            tokens += 1;
            gate_sum += g[l];
            active += usize::from(g[l] > 0.5);
            gap_sum += deltas[l];
            value += g[l] * deltas[l];
        }
        match config.teacher_form() {
            None => {
                for (c, g) in coefficients[t.row].iter_mut().zip(&g) {
                    *c = -(*g as f32);
                }
            }
            Some(_) => targets.push(TeacherTarget {
                row: t.row,
                weights: g.iter().map(|&g| g as f32).collect(),
                source: TeacherSource::Fixed {
                    logprobs: t.logprobs.clone(),
                    top_ids: t.top_ids.clone(),
                    top_logprobs: t.top_logprobs.clone(),
                },
            }),
        }
    }
    let mut metrics = teachers.counts.metrics("sdar");
    if tokens > 0 {
        let n = tokens as f64;
        metrics.extend([
            ("sdar/gate_mean".to_string(), gate_sum / n),
            ("sdar/gate_active_ratio".to_string(), active as f64 / n),
            ("sdar/gap_mean".to_string(), gap_sum / n),
            (
                "sdar/gap_loss".to_string(),
                f64::from(config.coef) * value / n,
            ),
        ]);
    }
    let mut signals = Signals {
        metrics,
        ..Signals::default()
    };
    match config.teacher_form() {
        None => signals.aux.push(AuxTerm {
            name: TERM.into(),
            coef: config.coef,
            coefficients,
        }),
        Some(form) => signals.teacher.push(TeacherTerm {
            name: TERM.into(),
            coef: config.coef,
            form,
            targets,
        }),
    }
    signals
}

impl Algorithm for Sdar {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Auxiliary,
            teacher_scores: true,
            teacher_topk: self.config.form.is_top_k(),
            bank: vec![EntryKind::Skill],
            reflection: self.config.skills.reflect,
            ..Requirements::default()
        }
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        let teachers =
            teacher::score(&self.config.skills, batch, host, self.config.scored_top_k())?;
        Ok(distill(&self.config, batch, &teachers))
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let step = self
            .state
            .creator
            .observe(&self.config.skills, report, host, "sdar")?;
        for (name, value) in step.metrics("sdar") {
            host.log_metric(&name, value);
        }
        self.state.steps += 1;
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("sdar", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        if let Some(state) = cairn_plugin_sdk::state::load_state("sdar", state)? {
            self.state = state;
        }
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "sdar",
    description: "SDAR: sigmoid-gated on-policy self-distillation from a skill-conditioned teacher (the policy with retrieved skills), stacked on an estimator; skills written by the skill creator",
    create: Sdar::from_config_json,
}

#[cfg(test)]
mod tests;
