//! Offline runners behind `cairn signals` and `cairn loss` (the CLI wrappers live in
//! `hosts/cairn`): library functions returning serde-serialisable reports, no model needed.
//!
//! * [`run_signals`]: runs an [`Algorithm`] on a [`Batch`] with an [`OfflineHost`] and reports
//!   the per-token advantages, auxiliary coefficients and metrics.
//! * [`run_loss`]: evaluates the objective on a batch whose current log-probs are given
//!   ([`LossToolInput`], documented in `docs/algorithms/loss-tool.md`), split into N
//!   micro-batches, and reports the loss components, `∂loss/∂ℓ` per token and the metrics.

use std::ops::Range;

use cairn_plugin_sdk::{Algorithm, Batch, OfflineHost, Signals};
use serde::{Deserialize, Serialize};

use super::config::ObjectiveConfig;
use super::input::{kept_rows, StepInput};
use super::metrics::batch_metrics;
use super::rl_loss::{LossReport, RlLoss};
use crate::error::{Error, Result};
use crate::loss::TokenLoss;

/// `(name, value)` pairs as a JSON object, in order.
fn metric_map(metrics: &[(String, f64)]) -> serde_json::Map<String, serde_json::Value> {
    metrics
        .iter()
        .map(|(n, v)| (n.clone(), serde_json::json!(v)))
        .collect()
}

/// One row of a [`SignalsReport`], for reading at a glance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowSignals {
    /// Index in the batch.
    pub row: usize,
    pub group_id: u64,
    pub trajectory_id: u64,
    pub turn: u32,
    /// Mask-1 tokens.
    pub tokens: usize,
    /// Mean advantage over the mask-1 tokens (0 when there are none).
    pub advantage_mean: f64,
    /// Whether the row's group was dropped by the algorithm.
    pub dropped: bool,
}

/// What [`run_signals`] returns (`cairn signals` prints it as JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SignalsReport {
    /// The algorithm's output unchanged: per-token advantages `[rows][L]`, aux terms
    /// (coefficients `[rows][L]`), dropped groups and the plugin's metrics. It is exactly the
    /// `signals` key of the loss tool's input.
    pub signals: Signals,
    /// Metrics the plugin logged through `Host::log_metric` during the call.
    pub logged_metrics: serde_json::Map<String, serde_json::Value>,
    /// [`batch_metrics`] of the batch and signals.
    pub batch_metrics: serde_json::Map<String, serde_json::Value>,
    pub rows: Vec<RowSignals>,
}

/// Runs `algorithm` on `batch` offline (no model: host scoring and generation fail with a clear
/// error) and checks the result's shapes.
pub fn run_signals(algorithm: &mut dyn Algorithm, batch: &Batch) -> Result<SignalsReport> {
    batch.validate()?;
    let host = OfflineHost::default();
    let signals = algorithm.signals(batch, &host)?;
    signals.validate_against(batch)?;
    let logged = match host.metrics.into_inner() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    };
    let rows = batch
        .rows
        .iter()
        .zip(&signals.advantages)
        .enumerate()
        .map(|(i, (row, adv))| {
            let selected: Vec<f64> = row
                .response_mask
                .iter()
                .zip(adv)
                .filter(|(&m, _)| m == 1)
                .map(|(_, &a)| f64::from(a))
                .collect();
            RowSignals {
                row: i,
                group_id: row.group_id,
                trajectory_id: row.trajectory_id,
                turn: row.turn,
                tokens: selected.len(),
                advantage_mean: cairn_plugin_sdk::stats::mean(&selected),
                dropped: signals.dropped_groups.contains(&row.group_id),
            }
        })
        .collect();
    Ok(SignalsReport {
        batch_metrics: metric_map(&batch_metrics(batch, &signals)),
        logged_metrics: metric_map(&logged),
        signals,
        rows,
    })
}

/// The loss tool's input (see `docs/algorithms/loss-tool.md`). Every per-token array is
/// `[batch rows][L_r]`, one entry per response token of each row (values on mask-0 slots are
/// ignored), covering all rows, dropped or not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossToolInput {
    /// The batch, in its usual JSON form.
    pub batch: Batch,
    /// The algorithm's signals (e.g. the `signals` of a [`SignalsReport`]). Exactly one of
    /// `signals` and `advantages` is given.
    #[serde(default)]
    pub signals: Option<Signals>,
    /// Shorthand for `signals` with only advantages (no aux terms, nothing dropped).
    #[serde(default)]
    pub advantages: Option<Vec<Vec<f32>>>,
    /// `ℓ_θ`: the current policy's log-probs of the response tokens, nats.
    pub current_logp: Vec<Vec<f32>>,
    /// `ℓ_old`; defaults to the rows' `response_logprobs` (the sampling log-probs).
    #[serde(default)]
    pub old_logp: Option<Vec<Vec<f32>>>,
    /// `ℓ_ref`; required when `kl_coef > 0` with `kl_mode = "loss"`.
    #[serde(default)]
    pub ref_logp: Option<Vec<Vec<f32>>>,
    /// Per-token entropies `H`, nats; required when `entropy_coef > 0`.
    #[serde(default)]
    pub entropy: Option<Vec<Vec<f32>>>,
}

impl LossToolInput {
    /// Parses the JSON form. Errors name the input as "loss tool input"; the CLI replaces it
    /// with the file path.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::Config {
            file: "loss tool input".into(),
            message: e.to_string(),
        })
    }
}

/// What [`run_loss`] returns (`cairn loss` prints it as JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossToolReport {
    /// The objective settings used.
    pub objective: ObjectiveConfig,
    /// Batch indices of the trained rows (rows of dropped groups excluded).
    pub trained_rows: Vec<usize>,
    /// The micro-batches, as `[start, end)` positions in `trained_rows`.
    pub micro_batches: Vec<[usize; 2]>,
    /// Loss components and metrics.
    pub report: LossReport,
    /// `∂loss/∂ℓ_θ` per token, `[batch rows][L_r]`; 0 on mask-0 slots and untrained rows.
    pub grad_logp: Vec<Vec<f32>>,
    /// `∂loss/∂H` per token, same shape; present when `entropy_coef > 0`.
    pub grad_entropy: Option<Vec<Vec<f32>>>,
    /// [`batch_metrics`] of the batch and signals.
    pub batch_metrics: serde_json::Map<String, serde_json::Value>,
}

/// Splits `n` rows into `parts` contiguous micro-batches whose sizes differ by at most one
/// (more parts than rows: one row each).
pub fn split_rows(n: usize, parts: usize) -> Result<Vec<Range<usize>>> {
    if parts == 0 {
        return Err(Error::Other("micro-batch count must be at least 1".into()));
    }
    let parts = parts.min(n.max(1));
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    Ok((0..parts)
        .map(|k| {
            let end = start + base + usize::from(k < extra);
            let range = start..end;
            start = end;
            range
        })
        .collect())
}

fn check_tokens(what: &str, values: &[Vec<f32>], batch: &Batch) -> Result<()> {
    if values.len() != batch.rows.len() {
        return Err(Error::Shape {
            what: "loss tool input",
            detail: format!(
                "{what} has {} rows but the batch has {}",
                values.len(),
                batch.rows.len()
            ),
        });
    }
    for (i, (v, row)) in values.iter().zip(&batch.rows).enumerate() {
        if v.len() != row.response_ids.len() {
            return Err(Error::Shape {
                what: "loss tool input",
                detail: format!(
                    "{what}: row {i} has {} values but {} response tokens",
                    v.len(),
                    row.response_ids.len()
                ),
            });
        }
    }
    Ok(())
}

/// Evaluates the objective on `input` with `config`, split into `micro_batches` micro-batches
/// exactly as the optimizer would (one [`RlLoss`], each trained row passed once).
pub fn run_loss(
    input: &LossToolInput,
    config: &ObjectiveConfig,
    micro_batches: usize,
) -> Result<LossToolReport> {
    config.validate()?;
    let batch = &input.batch;
    batch.validate()?;
    let signals = match (&input.signals, &input.advantages) {
        (Some(s), None) => s.clone(),
        (None, Some(a)) => Signals {
            advantages: a.clone(),
            ..Signals::default()
        },
        (Some(_), Some(_)) => {
            return Err(Error::Other(
                "loss tool input: give either \"signals\" or \"advantages\", not both".into(),
            ))
        }
        (None, None) => {
            return Err(Error::Other(
                "loss tool input: missing \"signals\" (or the \"advantages\" shorthand)".into(),
            ))
        }
    };
    signals.validate_against(batch)?;
    check_tokens("current_logp", &input.current_logp, batch)?;
    let sampled: Vec<Vec<f32>> = batch
        .rows
        .iter()
        .map(|r| r.response_logprobs.clone())
        .collect();
    let old_logp = input.old_logp.as_ref().unwrap_or(&sampled);
    check_tokens("old_logp", old_logp, batch)?;
    if let Some(r) = &input.ref_logp {
        check_tokens("ref_logp", r, batch)?;
    }
    match &input.entropy {
        Some(h) => check_tokens("entropy", h, batch)?,
        None if config.needs_entropy() => {
            return Err(Error::Other(format!(
                "loss tool input: entropy_coef = {} needs per-token \"entropy\"",
                config.entropy_coef
            )))
        }
        None => {}
    }

    let kept = kept_rows(batch, &signals);
    let pick = |v: &[Vec<f32>]| kept.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
    let step = StepInput::from_batch(
        batch,
        &signals,
        pick(old_logp),
        input.ref_logp.as_deref().map(pick),
    )?;
    let mut loss = RlLoss::new(config, step.rows, step.aux)?;
    let logp = pick(&input.current_logp);
    let entropy = input.entropy.as_deref().map(pick).unwrap_or_default();

    let splits = split_rows(kept.len(), micro_batches)?;
    let mut grad_logp = batch.zeros_like_responses();
    let mut grad_entropy = config.needs_entropy().then(|| batch.zeros_like_responses());
    for mb in &splits {
        let ent = if entropy.is_empty() {
            &[][..]
        } else {
            &entropy[mb.clone()]
        };
        let grads = loss.grads(mb.clone(), &logp[mb.clone()], ent)?;
        for (k, g) in mb.clone().zip(grads.logp) {
            grad_logp[kept[k]] = g;
        }
        if let Some(out) = grad_entropy.as_mut() {
            for (k, h) in mb.clone().zip(grads.entropy) {
                out[kept[k]] = h;
            }
        }
    }
    Ok(LossToolReport {
        objective: config.clone(),
        micro_batches: splits.iter().map(|r| [r.start, r.end]).collect(),
        trained_rows: kept,
        report: {
            loss.check_complete()?;
            loss.report()
        },
        grad_logp,
        grad_entropy,
        batch_metrics: metric_map(&batch_metrics(batch, &signals)),
    })
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{Host, PluginError};

    use super::*;

    /// The documented example (docs/algorithms/example-batch.json), compiled in so the docs
    /// cannot drift from the format.
    const EXAMPLE: &str = include_str!("../../../docs/algorithms/example-batch.json");

    fn example() -> LossToolInput {
        LossToolInput::from_json(EXAMPLE).unwrap()
    }

    fn kl_config() -> ObjectiveConfig {
        ObjectiveConfig {
            kl_coef: 0.01,
            ..Default::default()
        }
    }

    fn close(got: f64, want: f64, what: &str) {
        assert!((got - want).abs() < 1e-7, "{what}: got {got}, want {want}");
    }

    #[test]
    fn example_values_token_mean() {
        // Expected values from an independent python evaluation of the formulas in
        // docs/algorithms/objective.md on the example file.
        let out = run_loss(&example(), &kl_config(), 1).unwrap();
        assert_eq!(out.trained_rows, vec![0, 1, 2]);
        assert_eq!(out.micro_batches, vec![[0, 3]]);
        let r = &out.report;
        close(r.loss, 0.049392221, "loss");
        close(r.pg_loss, 0.049323571, "pg_loss");
        close(r.kl_loss, 6.865e-05, "kl_loss");
        close(r.kl.unwrap(), 0.006864969, "kl");
        close(r.clip_fraction, 0.125, "clip_fraction");
        close(r.approx_kl_old_k3, 0.011528896, "approx_kl_old_k3");
        close(r.ratio_mean, 0.980278896, "ratio_mean");
        close(r.ratio_max, 1.221402758, "ratio_max");
        assert_eq!((r.tokens, r.rows, r.dual_clip_fraction), (8, 3, 0.0));
        let want = [
            vec![-0.069012219, -0.046577892, -0.062439037, 0.0],
            vec![0.000118953, -0.056683802],
            vec![0.10220988, 0.131583002, 0.124868536],
            vec![0.0, 0.0],
        ];
        for (r, (got, want)) in out.grad_logp.iter().zip(&want).enumerate() {
            for (l, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() < 1e-6,
                    "grad row {r} token {l}: {g} vs {w}"
                );
            }
        }
        assert_eq!(out.grad_entropy, None);
        assert_eq!(
            out.batch_metrics["groups/dropped_fraction"],
            serde_json::json!(0.5)
        );
        assert_eq!(
            out.batch_metrics["truncation_rate"],
            serde_json::json!(0.25)
        );
    }

    #[test]
    fn example_values_seq_mean_token_mean() {
        let config = ObjectiveConfig {
            aggregation: super::super::Aggregation::SeqMeanTokenMean,
            ..kl_config()
        };
        let out = run_loss(&example(), &config, 2).unwrap();
        close(out.report.loss, -0.014557949, "loss");
        close(out.report.pg_loss, -0.014624531, "pg_loss");
        assert!((f64::from(out.grad_logp[1][1]) - -0.075578403).abs() < 1e-6);
    }

    #[test]
    fn micro_batch_count_does_not_change_anything() {
        let input = example();
        let one = run_loss(&input, &kl_config(), 1).unwrap();
        for n in [2, 3, 10] {
            let split = run_loss(&input, &kl_config(), n).unwrap();
            assert_eq!(split.micro_batches.len(), n.min(3));
            for ((name, a), (_, b)) in one.report.metrics().iter().zip(split.report.metrics()) {
                assert!(
                    (a - b).abs() <= 1e-6 * a.abs().max(1e-12),
                    "N={n} {name}: {a} vs {b}"
                );
            }
            for (a, b) in one
                .grad_logp
                .iter()
                .flatten()
                .zip(split.grad_logp.iter().flatten())
            {
                assert!(
                    (a - b).abs() <= 1e-6 * a.abs().max(1e-12),
                    "N={n}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn split_rows_is_balanced() {
        assert_eq!(split_rows(7, 3).unwrap(), vec![0..3, 3..5, 5..7]);
        assert_eq!(split_rows(2, 5).unwrap(), vec![0..1, 1..2]);
        assert_eq!(split_rows(0, 4).unwrap(), vec![0..0]);
        assert!(split_rows(3, 0)
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
    }

    #[test]
    fn input_errors_are_named() {
        let mut both = example();
        both.advantages = Some(vec![]);
        assert!(run_loss(&both, &kl_config(), 1)
            .unwrap_err()
            .to_string()
            .contains("not both"));
        let mut neither = example();
        neither.signals = None;
        assert!(run_loss(&neither, &kl_config(), 1)
            .unwrap_err()
            .to_string()
            .contains("missing \"signals\""));
        let mut short = example();
        short.current_logp[2].pop();
        let e = run_loss(&short, &kl_config(), 1).unwrap_err().to_string();
        assert!(
            e.contains("current_logp: row 2 has 2 values but 3 response tokens"),
            "{e}"
        );
        let mut no_ref = example();
        no_ref.ref_logp = None;
        assert!(run_loss(&no_ref, &kl_config(), 1)
            .unwrap_err()
            .to_string()
            .contains("needs reference log-probs"));
        let entropy = ObjectiveConfig {
            entropy_coef: 0.1,
            ..kl_config()
        };
        assert!(run_loss(&example(), &entropy, 1)
            .unwrap_err()
            .to_string()
            .contains("needs per-token \"entropy\""));
        let e = LossToolInput::from_json(r#"{"batch": {}, "current_logp": [], "logits": []}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("loss tool input") && e.contains("unknown field `logits`"),
            "{e}"
        );
    }

    #[test]
    fn advantages_shorthand_and_default_old_logp() {
        // With the shorthand nothing is dropped; old_logp defaults to response_logprobs, so
        // passing those explicitly changes nothing.
        let mut input = example();
        let signals = input.signals.take().unwrap();
        input.advantages = Some(signals.advantages);
        let a = run_loss(&input, &kl_config(), 1).unwrap();
        assert_eq!(a.trained_rows, vec![0, 1, 2, 3]);
        input.old_logp = Some(
            input
                .batch
                .rows
                .iter()
                .map(|r| r.response_logprobs.clone())
                .collect(),
        );
        let b = run_loss(&input, &kl_config(), 2).unwrap();
        assert!((a.report.loss - b.report.loss).abs() < 1e-12);
        // Row 3 now trains: 10 tokens, its advantages are 0, ρ = 1, ℓ = ℓ_ref.
        assert_eq!(a.report.tokens, 10);
        assert_eq!(a.grad_logp[3], vec![0.0, 0.0]);
    }

    /// A toy algorithm: advantage = episode reward − 0.5 on every trainable token; logs one
    /// metric through the host; fails on an empty batch.
    struct Centre;

    impl Algorithm for Centre {
        fn signals(&mut self, batch: &Batch, host: &dyn Host) -> cairn_plugin_sdk::Result<Signals> {
            if batch.rows.is_empty() {
                return Err(PluginError::input("empty batch"));
            }
            host.log_metric("centre/rows", batch.rows.len() as f64);
            let per_row: Vec<f64> = batch
                .rows
                .iter()
                .map(|r| f64::from(r.episode_reward) - 0.5)
                .collect();
            Ok(Signals {
                advantages: cairn_plugin_sdk::stats::broadcast_rows(batch, &per_row),
                dropped_groups: vec![2],
                metrics: vec![("centre/calls".into(), 1.0)],
                ..Signals::default()
            })
        }
    }

    #[test]
    fn signals_runner_reports_advantages_and_metrics() {
        let batch = example().batch;
        let out = run_signals(&mut Centre, &batch).unwrap();
        assert_eq!(out.signals.advantages[0], vec![0.5, 0.5, 0.5, 0.0]);
        assert_eq!(out.signals.advantages[2], vec![-0.5; 3]);
        assert_eq!(out.logged_metrics["centre/rows"], serde_json::json!(4.0));
        assert_eq!(
            out.batch_metrics["groups/dropped_fraction"],
            serde_json::json!(0.5)
        );
        assert_eq!(out.signals.metrics, vec![("centre/calls".to_string(), 1.0)]);
        let row2 = &out.rows[2];
        assert_eq!(
            (
                row2.trajectory_id,
                row2.tokens,
                row2.advantage_mean,
                row2.dropped
            ),
            (11, 3, -0.5, false)
        );
        assert!(out.rows[3].dropped);
        // The report serialises, and its `signals` feed the loss tool unchanged.
        let json = serde_json::to_value(&out).unwrap();
        let mut input = example();
        input.signals = Some(serde_json::from_value(json["signals"].clone()).unwrap());
        assert!(run_loss(&input, &kl_config(), 2).is_ok());
        // Plugin errors come back as errors.
        let e = run_signals(&mut Centre, &Batch::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty batch"), "{e}");
        let mut bad = batch;
        bad.rows[0].response_mask.pop();
        assert!(run_signals(&mut Centre, &bad)
            .unwrap_err()
            .to_string()
            .contains("row 0"));
    }
}
