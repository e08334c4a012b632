//! What the objective reads per optimizer step: [`ObjectiveRow`]s (one per trained sequence),
//! the auxiliary terms' names and coefficients ([`StepInput::aux`]), and the aggregation weights
//! computed from them once per step ([`row_weights`]).
//!
//! [`StepInput::from_batch`] builds them from a [`Batch`], the algorithm's [`Signals`] and the
//! recomputed log-probs; it drops the rows of the groups the algorithm dropped.

use std::collections::HashMap;

use cairn_plugin_sdk::{Batch, Signals};

use super::config::{Aggregation, ObjectiveConfig};
use crate::error::{Error, Result};

/// One trained sequence. Every per-token vector has the response's length `L`; slots with
/// mask 0 are never read, whatever they hold (NaN included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectiveRow {
    /// Loss mask `[L]`: 1 on tokens the policy sampled and is trained on.
    pub mask: Vec<u8>,
    /// Advantage `A` per token `[L]` (from [`Signals::advantages`]).
    pub advantages: Vec<f32>,
    /// `ℓ_old` per token `[L]`, nats: the log-probs of the policy that generated the data,
    /// recomputed before the update at the sampling temperature.
    pub old_logp: Vec<f32>,
    /// `ℓ_ref` per token `[L]`, nats: the frozen reference policy's log-probs. Required on every
    /// row when `kl_coef > 0` and `kl_mode = loss`; when given at all, given on every row.
    pub ref_logp: Option<Vec<f32>>,
    /// The rollout (trajectory) the row belongs to; used by `per-rollout` aggregation.
    pub rollout_id: u64,
    /// One `[L]` vector of detached coefficients `c_l` per auxiliary term, in the order of the
    /// step's aux terms (see [`StepInput::aux`]).
    pub aux: Vec<Vec<f32>>,
}

impl ObjectiveRow {
    /// Number of mask-1 tokens.
    pub fn tokens(&self) -> usize {
        self.mask.iter().filter(|&&m| m == 1).count()
    }
}

/// One optimizer step's data: the arguments of [`super::RlLoss::new`] besides the config.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepInput {
    pub rows: Vec<ObjectiveRow>,
    /// `(name, coef)` of each auxiliary C-type term `coef · agg_l(c_l · ℓ_l)` (algorithms.md
    /// §0: no ratio, no clip; gradient `coef · w · c_l`), as in [`cairn_plugin_sdk::AuxTerm`].
    pub aux: Vec<(String, f32)>,
    /// For each entry of `rows`, its index in the batch it was built from.
    pub batch_rows: Vec<usize>,
}

/// Indices of the batch rows that are trained on: rows whose group the algorithm did not drop.
/// The optimizer recomputes old (and reference) log-probs for exactly these rows, in this order.
pub fn kept_rows(batch: &Batch, signals: &Signals) -> Vec<usize> {
    batch
        .rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !signals.dropped_groups.contains(&r.group_id))
        .map(|(i, _)| i)
        .collect()
}

impl StepInput {
    /// Builds the step's rows from a batch and its signals. `old_logp` (and `ref_logp`, when
    /// given) are `[kept rows][L]`, for the rows [`kept_rows`] returns, in that order. The
    /// rollout id of a row is its `trajectory_id`.
    pub fn from_batch(
        batch: &Batch,
        signals: &Signals,
        old_logp: Vec<Vec<f32>>,
        ref_logp: Option<Vec<Vec<f32>>>,
    ) -> Result<Self> {
        signals.validate_against(batch)?;
        let kept = kept_rows(batch, signals);
        let shape = |what: &str, n: usize| {
            if n == kept.len() {
                Ok(())
            } else {
                Err(Error::Shape {
                    what: "objective input",
                    detail: format!(
                        "{what} has {n} rows but {} batch rows are trained (dropped groups \
                         excluded); give one entry per kept row",
                        kept.len()
                    ),
                })
            }
        };
        shape("old_logp", old_logp.len())?;
        if let Some(r) = &ref_logp {
            shape("ref_logp", r.len())?;
        }
        let mut refs = ref_logp.map(|r| r.into_iter().map(Some).collect::<Vec<_>>());
        let rows = kept
            .iter()
            .zip(old_logp)
            .enumerate()
            .map(|(k, (&i, old))| ObjectiveRow {
                mask: batch.rows[i].response_mask.clone(),
                advantages: signals.advantages[i].clone(),
                old_logp: old,
                ref_logp: refs.as_mut().and_then(|r| r[k].take()),
                rollout_id: batch.rows[i].trajectory_id,
                aux: signals
                    .aux
                    .iter()
                    .map(|t| t.coefficients[i].clone())
                    .collect(),
            })
            .collect();
        let aux = signals
            .aux
            .iter()
            .map(|t| (t.name.clone(), t.coef))
            .collect();
        Ok(StepInput {
            rows,
            aux,
            batch_rows: kept,
        })
    }
}

/// The aggregation weight `w_r` of each row: `agg(X) = Σ_r w_r Σ_l m_{r,l} X_{r,l}` (see
/// [`Aggregation`]). Computed over the whole step; rows without mask-1 tokens get 0.
pub fn row_weights(config: &ObjectiveConfig, rows: &[ObjectiveRow]) -> Vec<f64> {
    let tokens: Vec<usize> = rows.iter().map(ObjectiveRow::tokens).collect();
    let total: usize = tokens.iter().sum();
    let active = tokens.iter().filter(|&&t| t > 0).count() as f64;
    let mut rollout_tokens: HashMap<u64, usize> = HashMap::new();
    if config.aggregation == Aggregation::PerRollout {
        for (row, &t) in rows.iter().zip(&tokens) {
            *rollout_tokens.entry(row.rollout_id).or_default() += t;
        }
    }
    rows.iter()
        .zip(&tokens)
        .map(|(row, &t)| {
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
                Aggregation::PerRollout => 1.0 / (rollout_tokens[&row.rollout_id] as f64 * active),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{AuxTerm, TurnRow};

    use super::*;

    fn objective_row(mask: &[u8], rollout: u64) -> ObjectiveRow {
        ObjectiveRow {
            mask: mask.to_vec(),
            rollout_id: rollout,
            ..Default::default()
        }
    }

    /// `check(mode, norm_constant, expected)` on algorithms.md §1e's aggregation example: row 1
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
            response_ids: vec![0; mask.len()],
            response_logprobs: vec![0.0; mask.len()],
            response_mask: mask.to_vec(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn from_batch_drops_groups_and_checks_shapes() {
        let batch = Batch {
            step: 3,
            rows: vec![
                turn_row(1, 10, &[1, 1]),
                turn_row(2, 20, &[1]),
                turn_row(1, 11, &[0, 1, 1]),
            ],
        };
        let signals = Signals {
            advantages: vec![vec![0.5, 0.5], vec![9.0], vec![0.0, -1.0, -1.0]],
            aux: vec![AuxTerm {
                name: "edge".into(),
                coef: 0.5,
                coefficients: vec![vec![1.0, 2.0], vec![3.0], vec![4.0, 5.0, 6.0]],
            }],
            dropped_groups: vec![2],
            metrics: vec![],
        };
        assert_eq!(kept_rows(&batch, &signals), vec![0, 2]);
        let old = vec![vec![-1.0, -1.0], vec![-2.0, -2.0, -2.0]];
        let input = StepInput::from_batch(&batch, &signals, old.clone(), None).unwrap();
        assert_eq!(input.batch_rows, vec![0, 2]);
        assert_eq!(input.rows[1].advantages, vec![0.0, -1.0, -1.0]);
        assert_eq!(input.rows[1].aux, vec![vec![4.0, 5.0, 6.0]]);
        assert_eq!(
            (input.rows[1].rollout_id, input.rows[1].ref_logp.clone()),
            (11, None)
        );
        assert_eq!(input.aux, vec![("edge".to_string(), 0.5)]);

        let e = StepInput::from_batch(&batch, &signals, vec![vec![0.0; 2]], None).unwrap_err();
        assert!(
            e.to_string()
                .contains("old_logp has 1 rows but 2 batch rows are trained"),
            "{e}"
        );
        let mut short = signals;
        short.advantages[2].pop();
        let e = StepInput::from_batch(&batch, &short, old, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("row 2 has 2 values but 3 response tokens"),
            "{e}"
        );
    }
}
