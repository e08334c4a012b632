//! `icsd`: influence calibration for on-policy self-distillation, a **proposal** (no paper or
//! code of ICSD was found; the mechanism follows its description: per-token influence,
//! batch-adaptive calibration to bounded weights, auxiliary mass preserved per action turn;
//! `docs/algorithms/icsd.md`). A [`Role::Auxiliary`] plugin stacked on an advantage estimator:
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"                 # or "gigpo"
//! [[algorithm.stack]]
//! plugin = "icsd"
//! config = { coef = 0.1, w_min = 0.25, w_max = 2.0 }
//! ```
//!
//! Per step, with the teacher of `sdar` (`cairn_opsd`: the same policy with the top
//! `skills.k` skills of the row's task in its context, `ℓ^T [L]`; the student `ℓ^S = ℓ_old`;
//! no model pass beyond those teacher scores):
//! 1. the gap `Δ_l = ℓ^T_l − ℓ^S_l` on every trainable token of a row with a teacher;
//! 2. the influence `I_l = |Δ_l|` (or `|Δ_l| · |Â_i|`, [`Influence`]);
//! 3. [`calibrate`]: `z = I / (mean over the batch's active tokens + 1e-8)`,
//!    `ŵ = clip(z, w_min, w_max)`, and per action turn (a row's trainable tokens)
//!    `w_l = ŵ_l · n_j / Σ_j ŵ`, so every turn keeps `Σ w = n_j` (`rescale_rounds > 1` clips
//!    and rescales again, pulling weights the rescale pushed out of the range back);
//! 4. the term `λ · agg_l(w_l · base_l)`, `icsd-distill` ([`Base`]): by default the
//!    sampled-token reverse KL (coefficient `Δ_l`, a teacher term with weights `w_l` and the
//!    fixed teacher log-probs), or SDAR's gated forms.
//!
//! Rows without a retrieved skill get no teacher and take no part in the calibration
//! (counted). Skills are written by the skill creator from successful trajectories, as in
//! `sdar` ([`Algorithm::observe`]).
//!
//! Metrics (in the signals): the teacher's counts (`icsd/rows_with_teacher`,
//! `icsd/rows_without_skill`, `icsd/rows_nonfinite`, `icsd/rows_score_failed`,
//! `icsd/context_mismatch_rows`, `icsd/skills_too_long`, `icsd/skills_per_row`) and, over the
//! active tokens, `icsd/influence_mean`, `icsd/clipped_fraction`, `icsd/weight_min`,
//! `icsd/weight_max`, `icsd/gap_loss` (`λ ·` token mean of the weighted coefficient, `w·Δ` by
//! default); from `observe`: `icsd/reflections_requested`, `_refused`, `_failed`, `icsd/skills_in_bank`.

use cairn_opsd::{teacher, Creator, Teachers};
use cairn_plugin_sdk::stats::{
    outcome_advantages, trajectories, Normalise, OutcomeSamples, StdKind,
};
use cairn_plugin_sdk::{
    Algorithm, AuxTerm, Batch, EntryKind, Host, Requirements, Result, Role, Signals, StepReport,
    TeacherForm, TeacherSource, TeacherTarget, TeacherTerm,
};
use serde::{Deserialize, Serialize};

pub mod calibrate;
pub mod config;

pub use calibrate::{calibrate, Calibration};
pub use config::{Base, IcsdConfig, Influence};

/// The name of the distillation term.
pub const TERM: &str = "icsd-distill";

/// What the plugin keeps across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct IcsdState {
    /// Steps observed.
    pub steps: u64,
    /// The skill creator's counters.
    pub creator: Creator,
}

pub struct Icsd {
    config: IcsdConfig,
    state: IcsdState,
}

impl Icsd {
    pub fn from_config_json(json: &str) -> Result<Self> {
        Ok(Icsd {
            config: IcsdConfig::from_json(json)?,
            state: IcsdState::default(),
        })
    }

    pub fn config(&self) -> &IcsdConfig {
        &self.config
    }

    pub fn state(&self) -> &IcsdState {
        &self.state
    }
}

/// `|Â|` of every row's trajectory, `[rows]`: GRPO's outcome advantage (group mean and
/// unbiased std over rows, ε = 1e-6; verl-agent's defaults), from the episode rewards.
pub fn abs_advantages(batch: &Batch) -> Result<Vec<f64>> {
    let trajs = trajectories(batch)?;
    let rewards: Vec<f64> = trajs.iter().map(|t| t.episode_reward).collect();
    let adv = outcome_advantages(
        &trajs,
        &rewards,
        Normalise::MeanStd {
            eps: 1e-6,
            std: StdKind::Unbiased,
        },
        OutcomeSamples::Rows,
    );
    let mut out = vec![0.0; batch.rows.len()];
    for (t, a) in trajs.iter().zip(adv) {
        for &r in &t.rows {
            out[r] = a.abs();
        }
    }
    Ok(out)
}

/// The `icsd-distill` term and its metrics for a batch, given its teachers (pure: the part
/// of [`Algorithm::signals`] after scoring). Errors only when the advantage-weighted
/// influence cannot group the rows into trajectories (an input error naming the row).
pub fn distill(config: &IcsdConfig, batch: &Batch, teachers: &Teachers) -> Result<Signals> {
    let advantages = match config.influence {
        Influence::Gap => None,
        Influence::GapTimesAdvantage => Some(abs_advantages(batch)?),
    };
    // Per teacher row: its trainable positions, gaps and gates there, and influences.
    let mut positions: Vec<Vec<usize>> = Vec::with_capacity(teachers.rows.len());
    let mut gaps: Vec<Vec<f64>> = Vec::with_capacity(teachers.rows.len());
    let mut influence: Vec<Vec<f64>> = Vec::with_capacity(teachers.rows.len());
    for t in &teachers.rows {
        let row = &batch.rows[t.row];
        let deltas = t.gaps(row);
        let at: Vec<usize> = (0..row.response_mask.len())
            .filter(|&l| row.response_mask[l] == 1)
            .collect();
        let scale = advantages.as_ref().map_or(1.0, |a| a[t.row]);
        influence.push(at.iter().map(|&l| deltas[l].abs() * scale).collect());
        gaps.push(at.iter().map(|&l| deltas[l]).collect());
        positions.push(at);
    }
    let c = calibrate(
        &influence,
        config.w_min,
        config.w_max,
        config.rescale_rounds,
    );

    let mut coefficients = batch.zeros_like_responses();
    let mut targets = Vec::new();
    let (mut value, mut w_lo, mut w_hi) = (0.0, f64::INFINITY, f64::NEG_INFINITY);
    for (k, t) in teachers.rows.iter().enumerate() {
        let row = &batch.rows[t.row];
        let mut weights = vec![0.0f32; row.response_ids.len()];
        for ((&l, &w), &d) in positions[k].iter().zip(&c.weights[k]).zip(&gaps[k]) {
            w_lo = w_lo.min(w);
            w_hi = w_hi.max(w);
            let g = if config.base.gated() {
                cairn_opsd::gate(config.beta, d)
            } else {
                1.0
            };
            value += w * g * d;
            match config.base {
                Base::GatedUcob => coefficients[t.row][l] = -(w * g) as f32,
                Base::ReverseKl | Base::GatedReverseKl => weights[l] = (w * g) as f32,
            }
        }
        if config.base != Base::GatedUcob {
            targets.push(TeacherTarget {
                row: t.row,
                weights,
                source: TeacherSource::Fixed {
                    logprobs: t.logprobs.clone(),
                    top_ids: Vec::new(),
                    top_logprobs: Vec::new(),
                },
            });
        }
    }
    let mut metrics = teachers.counts.metrics("icsd");
    if c.tokens > 0 {
        let n = c.tokens as f64;
        metrics.extend([
            ("icsd/influence_mean".to_string(), c.mean),
            ("icsd/clipped_fraction".to_string(), c.clipped as f64 / n),
            ("icsd/weight_min".to_string(), w_lo),
            ("icsd/weight_max".to_string(), w_hi),
            (
                "icsd/gap_loss".to_string(),
                f64::from(config.coef) * value / n,
            ),
        ]);
    }
    let mut signals = Signals {
        metrics,
        ..Signals::default()
    };
    match config.base {
        Base::GatedUcob => signals.aux.push(AuxTerm {
            name: TERM.into(),
            coef: config.coef,
            coefficients,
        }),
        Base::ReverseKl | Base::GatedReverseKl => signals.teacher.push(TeacherTerm {
            name: TERM.into(),
            coef: config.coef,
            form: TeacherForm::SampledReverseKl,
            targets,
        }),
    }
    Ok(signals)
}

impl Algorithm for Icsd {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Auxiliary,
            teacher_scores: true,
            bank: vec![EntryKind::Skill],
            reflection: self.config.skills.reflect,
            ..Requirements::default()
        }
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        let teachers = teacher::score(&self.config.skills, batch, host, 0)?;
        distill(&self.config, batch, &teachers)
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let step = self
            .state
            .creator
            .observe(&self.config.skills, report, host, "icsd")?;
        for (name, value) in step.metrics("icsd") {
            host.log_metric(&name, value);
        }
        self.state.steps += 1;
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("icsd", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        if let Some(state) = cairn_plugin_sdk::state::load_state("icsd", state)? {
            self.state = state;
        }
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "icsd",
    description: "ICSD (proposal): on-policy self-distillation from a skill-conditioned teacher, with per-token influence weights calibrated per batch and the auxiliary mass of every turn preserved",
    create: Icsd::from_config_json,
}

#[cfg(test)]
mod tests;
