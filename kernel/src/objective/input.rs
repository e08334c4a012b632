//! What the objective reads per optimizer step, and the one place it is built from turn
//! rows: [`super::RlLoss::from_rows`] (used by the optimizer and by `cairn loss`) calls
//! [`step_parts`] here.
//!
//! A step trains some of the rows of `batch.rows ++ signals.extra_rows` (the indexing every
//! per-token array of [`Signals`] uses): [`trained_rows`] lists those of non-dropped groups,
//! the optimizer splits them into mini-batches, and [`train_sequences`] gives the backend the
//! (training prompt, response) pair of each, in the order the loss indexes them. Each trained
//! row carries its `ℓ_old` (and `ℓ_ref` when the KL needs it) in `old_logprobs` /
//! `ref_logprobs`; the kernel fills them before the plugin's `signals`.

use std::collections::HashMap;

use cairn_plugin_sdk::{Batch, Signals, TurnRow};

use super::config::{Aggregation, ObjectiveConfig, OffPolicy};
use super::teacher::StepTeacher;
use crate::backend::Sequence;
use crate::error::{Error, Result};

/// One trained sequence, as the loss reads it. Every per-token vector has the response's
/// length `L`; slots with mask 0 are never read, whatever they hold (NaN included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectiveRow {
    /// Loss mask `[L]`: 1 on tokens the policy sampled and is trained on.
    pub mask: Vec<u8>,
    /// Advantage `A` per token `[L]` (from [`Signals::advantages`]).
    pub advantages: Vec<f32>,
    /// `ℓ_old` per token `[L]`, nats: the log-probs the ratio is taken against, recomputed
    /// before the update at the sampling temperature ([`TurnRow::old_logprobs`]).
    pub old_logp: Vec<f32>,
    /// `ℓ_ref` per token `[L]`, nats: the frozen reference policy's log-probs. Required on every
    /// row when `kl_coef > 0` and `kl_mode = loss`; when given at all, given on every row.
    pub ref_logp: Option<Vec<f32>>,
    /// `ℓ_behav` per token `[L]`: the log-probs the response was sampled with
    /// ([`TurnRow::response_logprobs`]); read only with an off-policy correction.
    pub behav_logp: Option<Vec<f32>>,
    /// The rollout (trajectory) the row belongs to; used by `per-rollout` aggregation.
    pub rollout_id: u64,
    /// One `[L]` vector of detached coefficients `c_l` per auxiliary term, in the order of the
    /// step's aux terms.
    pub aux: Vec<Vec<f32>>,
    /// An extra row ([`Signals::extra_rows`]): it takes no part in the clipped surrogate, the
    /// KL penalty or the entropy bonus and does not count in their aggregation normalisers
    /// (nor in the step's token metrics); only the aux and teacher terms that target it train
    /// it. Its `advantages`, `ref_logp` and `behav_logp` are never read.
    pub extra: bool,
}

impl ObjectiveRow {
    /// Number of mask-1 tokens.
    pub fn tokens(&self) -> usize {
        self.mask.iter().filter(|&&m| m == 1).count()
    }
}

/// `batch.rows` followed by `signals.extra_rows`: the rows every per-token array of the
/// signals covers, and the `rows` argument of [`super::RlLoss::from_rows`].
pub fn all_rows<'a>(batch: &'a Batch, signals: &'a Signals) -> Vec<&'a TurnRow> {
    batch.rows.iter().chain(&signals.extra_rows).collect()
}

/// Indices into [`all_rows`] of the rows that are trained on: rows (batch or extra) whose group
/// the algorithm did not drop, in order.
pub fn trained_rows(batch: &Batch, signals: &Signals) -> Vec<usize> {
    all_rows(batch, signals)
        .iter()
        .enumerate()
        .filter(|(_, r)| !signals.dropped_groups.contains(&r.group_id))
        .map(|(i, _)| i)
        .collect()
}

/// The sequences the backend trains for `indices` (into `rows`), in that order: each row's
/// training prompt ([`TurnRow::train_prompt`]) and its response ids.
pub fn train_sequences(rows: &[&TurnRow], indices: &[usize]) -> Result<Vec<Sequence>> {
    indices
        .iter()
        .map(|&i| {
            let row = rows.get(i).ok_or_else(|| out_of_range(i, rows.len()))?;
            Ok(Sequence {
                prompt_ids: row.train_prompt().to_vec(),
                response_ids: row.response_ids.clone(),
            })
        })
        .collect()
}

fn out_of_range(i: usize, n: usize) -> Error {
    Error::Shape {
        what: "objective input",
        detail: format!(
            "row index {i} is outside the {n} rows (batch rows then extra rows) the step was \
             given"
        ),
    }
}

fn shape(detail: String) -> Error {
    Error::Shape {
        what: "objective input",
        detail,
    }
}

/// A step's rows, aux terms and teacher terms, checked for shape; what `RlLoss` is built from.
#[derive(Clone, Debug, Default)]
pub(crate) struct StepParts {
    pub rows: Vec<ObjectiveRow>,
    /// `(name, coef)` of each auxiliary C-type term `coef · agg_l(c_l · ℓ_l)` (no ratio, no
    /// clip; gradient `coef · w · c_l`).
    pub aux: Vec<(String, f32)>,
    pub teacher: Vec<StepTeacher>,
    /// For each step row, its index in `rows` (errors name rows by it).
    pub labels: Vec<usize>,
}

/// Builds the step for `indices` (into `rows` = batch rows then extra rows) from the rows'
/// masks, `old_logprobs`, `ref_logprobs` and (with an off-policy correction)
/// `response_logprobs`, and from the signals' advantages, aux and teacher terms.
pub(crate) fn step_parts(
    config: &ObjectiveConfig,
    rows: &[&TurnRow],
    signals: &Signals,
    indices: &[usize],
) -> Result<StepParts> {
    let n = rows.len();
    let check_len = |what: &str, got: usize| {
        if got == n {
            Ok(())
        } else {
            Err(shape(format!(
                "{what} has {got} rows but the step was given {n} (batch rows then extra rows); \
                 give one entry per row"
            )))
        }
    };
    check_len("signals.advantages", signals.advantages.len())?;
    for (what, v) in [
        ("signals.advantage_scale", &signals.advantage_scale),
        ("signals.advantage_add", &signals.advantage_add),
    ] {
        if !v.is_empty() {
            check_len(what, v.len())?;
        }
    }
    // Rows from here on are the signals' extra rows.
    let first_extra = n.saturating_sub(signals.extra_rows.len());
    for t in &signals.aux {
        check_len(&format!("aux term `{}`", t.name), t.coefficients.len())?;
    }
    for t in &signals.teacher {
        t.validate(rows)?;
    }
    let mut position = vec![None; n];
    for (k, &i) in indices.iter().enumerate() {
        match position.get_mut(i) {
            None => return Err(out_of_range(i, n)),
            Some(Some(_)) => {
                return Err(shape(format!(
                    "row {i} is listed twice in the step; each row is trained once per step"
                )))
            }
            Some(p) => *p = Some(k),
        }
    }
    let mut out = Vec::with_capacity(indices.len());
    for &i in indices {
        let row = rows[i];
        row.validate(i)?;
        let l = row.response_ids.len();
        if row.old_logprobs.len() != l {
            return Err(shape(format!(
                "row {i}: old_logprobs has {} entries for {l} response tokens; the optimizer \
                 fills ℓ_old before building the objective (in a batch file, give old_logprobs \
                 per row)",
                row.old_logprobs.len()
            )));
        }
        let per_token = |what: &str, v: &[f32]| {
            if v.len() == l {
                Ok(v.to_vec())
            } else {
                Err(shape(format!(
                    "{what}: row {i} has {} values but {l} response tokens",
                    v.len()
                )))
            }
        };
        let extra = i >= first_extra;
        let mut advantages = per_token("signals.advantages", &signals.advantages[i])?;
        let scale = match signals.advantage_scale.get(i) {
            Some(v) => Some(per_token("signals.advantage_scale", v)?),
            None => None,
        };
        let add = match signals.advantage_add.get(i) {
            Some(v) => Some(per_token("signals.advantage_add", v)?),
            None => None,
        };
        if !extra {
            compose_advantages(
                &row.response_mask,
                &mut advantages,
                scale.as_deref(),
                add.as_deref(),
            );
        }
        out.push(ObjectiveRow {
            mask: row.response_mask.clone(),
            advantages,
            old_logp: row.old_logprobs.clone(),
            ref_logp: (!extra && !row.ref_logprobs.is_empty()).then(|| row.ref_logprobs.clone()),
            behav_logp: (!extra && config.off_policy != OffPolicy::None)
                .then(|| row.response_logprobs.clone()),
            rollout_id: row.trajectory_id,
            extra,
            aux: signals
                .aux
                .iter()
                .map(|t| per_token(&format!("aux term `{}`", t.name), &t.coefficients[i]))
                .collect::<Result<_>>()?,
        });
    }
    Ok(StepParts {
        rows: out,
        aux: signals
            .aux
            .iter()
            .map(|t| (t.name.clone(), t.coef))
            .collect(),
        teacher: signals
            .teacher
            .iter()
            .map(|t| StepTeacher::resolve(t, &position))
            .collect::<Result<_>>()?,
        labels: indices.to_vec(),
    })
}

/// `A_l ← A_l · scale_l + add_l` on the mask-1 tokens of one row, in f64, rounded once to f32
/// (a missing array counts as 1 or 0): the composition the algorithm stack applies to its
/// members' [`Signals::advantage_scale`] / [`Signals::advantage_add`]
/// ([`crate::stack`]), applied here to signals that still carry them (a batch file given to
/// `cairn loss`). A stack's answer carries them composed already, and empty.
fn compose_advantages(
    mask: &[u8],
    advantages: &mut [f32],
    scale: Option<&[f32]>,
    add: Option<&[f32]>,
) {
    if scale.is_none() && add.is_none() {
        return;
    }
    for (l, a) in advantages.iter_mut().enumerate() {
        if mask.get(l) == Some(&1) {
            let s = scale.map_or(1.0, |s| f64::from(s[l]));
            let d = add.map_or(0.0, |d| f64::from(d[l]));
            *a = (f64::from(*a) * s + d) as f32;
        }
    }
}

/// The aggregation weight `w_r` of each row for the clipped surrogate, the KL and the entropy:
/// `agg(X) = Σ_r w_r Σ_l m_{r,l} X_{r,l}` (see [`Aggregation`]). Computed over the whole
/// step's batch rows; extra rows ([`ObjectiveRow::extra`]) and rows without mask-1 tokens get
/// 0 and do not count in any normaliser.
pub fn row_weights(config: &ObjectiveConfig, rows: &[ObjectiveRow]) -> Vec<f64> {
    let tokens: Vec<usize> = rows
        .iter()
        .map(|r| if r.extra { 0 } else { r.tokens() })
        .collect();
    let rollouts: Vec<u64> = rows.iter().map(|r| r.rollout_id).collect();
    aggregation_weights(config, &tokens, &rollouts)
}

/// The aggregation weight of each row for the auxiliary terms: as [`row_weights`], but over
/// every row of the step, batch and extra rows alike (an aux term's coefficients cover them
/// all, and an extra row is trained by the aux terms that target it). Equal to
/// [`row_weights`] in a step without extra rows.
pub fn aux_row_weights(config: &ObjectiveConfig, rows: &[ObjectiveRow]) -> Vec<f64> {
    let tokens: Vec<usize> = rows.iter().map(ObjectiveRow::tokens).collect();
    let rollouts: Vec<u64> = rows.iter().map(|r| r.rollout_id).collect();
    aggregation_weights(config, &tokens, &rollouts)
}

/// [`row_weights`] from each row's count of counted tokens and its rollout id (teacher terms
/// count their active tokens).
pub(crate) fn aggregation_weights(
    config: &ObjectiveConfig,
    tokens: &[usize],
    rollouts: &[u64],
) -> Vec<f64> {
    let total: usize = tokens.iter().sum();
    let active = tokens.iter().filter(|&&t| t > 0).count() as f64;
    let mut rollout_tokens: HashMap<u64, usize> = HashMap::new();
    if config.aggregation == Aggregation::PerRollout {
        for (&id, &t) in rollouts.iter().zip(tokens) {
            *rollout_tokens.entry(id).or_default() += t;
        }
    }
    rollouts
        .iter()
        .zip(tokens)
        .map(|(id, &t)| {
            if t == 0 {
                return 0.0;
            }
            match config.aggregation {
                Aggregation::TokenMean => 1.0 / total as f64,
                Aggregation::SeqMeanTokenSum => 1.0 / active,
                Aggregation::SeqMeanTokenMean => 1.0 / (active * t as f64),
                // `validate` guarantees a positive constant; an unvalidated config without one
                // falls back to a plain sum.
                Aggregation::SeqMeanTokenSumNorm => 1.0 / config.norm_constant.unwrap_or(1.0),
                Aggregation::PerRollout => 1.0 / (rollout_tokens[id] as f64 * active),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::AuxTerm;

    use super::*;

    fn objective_row(mask: &[u8], rollout: u64) -> ObjectiveRow {
        ObjectiveRow {
            mask: mask.to_vec(),
            rollout_id: rollout,
            ..Default::default()
        }
    }

    /// `check(mode, norm_constant, expected)` on docs/algorithms/objective.md's aggregation example: row 1
    /// losses [0.2, 0.4, 0.6] (a fourth, padded slot holds NaN), row 2 [1.0].
    fn check(aggregation: Aggregation, norm_constant: Option<f64>, want: f64) {
        let config = ObjectiveConfig {
            aggregation,
            norm_constant,
            ..Default::default()
        };
        let rows = [
            objective_row(&[1, 1, 1, 0], 1),
            objective_row(&[1, 0, 0, 0], 2),
        ];
        let values = [
            [0.2, 0.4, 0.6, f64::NAN],
            [1.0, f64::NAN, f64::NAN, f64::NAN],
        ];
        let w = row_weights(&config, &rows);
        let got: f64 = rows
            .iter()
            .zip(&values)
            .zip(&w)
            .map(|((r, v), w)| {
                r.mask
                    .iter()
                    .zip(v)
                    .filter(|(&m, _)| m == 1)
                    .map(|(_, x)| w * x)
                    .sum::<f64>()
            })
            .sum();
        assert!(
            (got - want).abs() < 1e-12,
            "{aggregation:?}: {got} want {want}"
        );
    }

    #[test]
    fn aggregation_worked_example_section_1e() {
        check(Aggregation::TokenMean, None, 0.55);
        check(Aggregation::SeqMeanTokenSum, None, 1.1);
        check(Aggregation::SeqMeanTokenMean, None, 0.7);
        check(Aggregation::SeqMeanTokenSumNorm, Some(4.0), 0.55);
        // One row per rollout: per-rollout equals seq-mean-token-mean.
        check(Aggregation::PerRollout, None, 0.7);
    }

    #[test]
    fn empty_rows_are_not_counted() {
        let config = ObjectiveConfig {
            aggregation: Aggregation::SeqMeanTokenSum,
            ..Default::default()
        };
        let rows = [
            objective_row(&[1, 1], 1),
            objective_row(&[0, 0], 2),
            objective_row(&[], 3),
        ];
        assert_eq!(row_weights(&config, &rows), vec![1.0, 0.0, 0.0]);
    }

    fn turn_row(group: u64, traj: u64, mask: &[u8]) -> TurnRow {
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            prompt_ids: vec![7],
            response_ids: vec![0; mask.len()],
            response_logprobs: vec![-0.5; mask.len()],
            response_mask: mask.to_vec(),
            old_logprobs: vec![-1.0; mask.len()],
            ..TurnRow::default()
        }
    }

    #[test]
    fn step_parts_reads_rows_and_checks_shapes() {
        let mut extra = turn_row(1, 12, &[1]);
        extra.train_prompt_ids = Some(vec![8, 9]);
        let batch = Batch {
            step: 3,
            rows: vec![
                turn_row(1, 10, &[1, 1]),
                turn_row(2, 20, &[1]),
                turn_row(1, 11, &[0, 1, 1]),
            ],
        };
        let signals = Signals {
            advantages: vec![vec![0.5, 0.5], vec![9.0], vec![0.0, -1.0, -1.0], vec![2.0]],
            aux: vec![AuxTerm {
                name: "edge".into(),
                coef: 0.5,
                coefficients: vec![vec![1.0, 2.0], vec![3.0], vec![4.0, 5.0, 6.0], vec![7.0]],
            }],
            extra_rows: vec![extra],
            dropped_groups: vec![2],
            ..Signals::default()
        };
        assert_eq!(trained_rows(&batch, &signals), vec![0, 2, 3]);
        let rows = all_rows(&batch, &signals);
        let seqs = train_sequences(&rows, &[3, 0]).unwrap();
        assert_eq!(
            (seqs[0].prompt_ids.clone(), seqs[1].prompt_ids.clone()),
            (vec![8, 9], vec![7])
        );
        let config = ObjectiveConfig::default();
        let parts = step_parts(&config, &rows, &signals, &[2, 3]).unwrap();
        assert_eq!(parts.labels, vec![2, 3]);
        assert_eq!(parts.rows[0].advantages, vec![0.0, -1.0, -1.0]);
        assert_eq!(parts.rows[0].aux, vec![vec![4.0, 5.0, 6.0]]);
        assert_eq!(parts.rows[1].aux, vec![vec![7.0]]);
        assert_eq!(parts.rows[0].old_logp, vec![-1.0; 3]);
        assert_eq!(
            (
                parts.rows[0].rollout_id,
                parts.rows[0].ref_logp.clone(),
                parts.rows[0].behav_logp.clone()
            ),
            (11, None, None)
        );
        assert_eq!(parts.aux, vec![("edge".to_string(), 0.5)]);
        // With an off-policy correction ℓ_behav is the sampled log-probs.
        let tis = ObjectiveConfig {
            off_policy: OffPolicy::Tis,
            ..Default::default()
        };
        let parts = step_parts(&tis, &rows, &signals, &[0]).unwrap();
        assert_eq!(parts.rows[0].behav_logp, Some(vec![-0.5; 2]));

        let check = |indices: &[usize], signals: &Signals, rows: &[&TurnRow], want: &str| {
            let e = step_parts(&config, rows, signals, indices)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        };
        check(
            &[0, 9],
            &signals,
            &rows,
            "row index 9 is outside the 4 rows",
        );
        check(&[0, 0], &signals, &rows, "row 0 is listed twice");
        let mut short = signals.clone();
        short.advantages[2].pop();
        check(
            &[2],
            &short,
            &rows,
            "row 2 has 2 values but 3 response tokens",
        );
        let mut fewer = signals.clone();
        fewer.advantages.pop();
        check(
            &[0],
            &fewer,
            &rows,
            "signals.advantages has 3 rows but the step was given 4",
        );
        let mut no_old = batch.clone();
        no_old.rows[2].old_logprobs.clear();
        let rows2 = all_rows(&no_old, &signals);
        check(
            &[2],
            &signals,
            &rows2,
            "row 2: old_logprobs has 0 entries for 3 response tokens",
        );
    }
}
