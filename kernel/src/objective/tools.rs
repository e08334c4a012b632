//! Offline runners behind `cairn signals` and `cairn loss` (the CLI wrappers live in
//! `hosts/cairn`): library functions returning serde-serialisable reports, no model needed.
//!
//! * [`run_signals`]: runs an [`Algorithm`] on a [`Batch`] with an [`OfflineHost`] and reports
//!   the per-token advantages, auxiliary coefficients and metrics.
//! * [`run_loss`]: evaluates the objective on a batch whose rows carry `ℓ_old` (and `ℓ_ref`)
//!   and whose current log-probs are given ([`LossToolInput`], documented in
//!   `docs/algorithms/loss-tool.md`), through the optimizer's own builder
//!   ([`RlLoss::from_rows`]), split into N micro-batches, and reports the loss components,
//!   `∂loss/∂ℓ` per token and the metrics.

use std::ops::Range;

use cairn_plugin_sdk::{
    Algorithm, Batch, OfflineHost, Signals, TeacherForm, TeacherSource, TurnRow,
};
use serde::{Deserialize, Serialize};

use super::config::{from_json_at, ObjectiveConfig};
use super::input::{all_rows, trained_rows};
use super::metrics::batch_metrics;
use super::rl_loss::{LossReport, RlLoss};
use crate::error::{Error, Result};
use crate::loss::{TokenLoss, TokenScores};

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
    /// Mean advantage over the mask-1 tokens (0 when there are none, or when the plugin gives
    /// no advantages).
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
    // One entry per batch row, also for a plugin that gives no advantages (a stack member that
    // only scales them or adds aux terms).
    let rows = batch
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let adv = signals.advantages.get(i).map_or(&[][..], Vec::as_slice);
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
                tokens: row.response_mask.iter().filter(|&&m| m == 1).count(),
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

/// The loss tool's input (see `docs/algorithms/loss-tool.md`). The rows carry `ℓ_old` and
/// `ℓ_ref` themselves (`old_logprobs`, `ref_logprobs`); the per-token arrays here are the
/// model's outputs, `[rows][L_r]` over the batch's rows followed by the signals' extra rows,
/// one entry per response token (values on mask-0 slots are ignored), dropped rows included.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossToolInput {
    /// The batch, in its usual JSON form. A row without `old_logprobs` takes its
    /// `response_logprobs` (the sampling log-probs) as `ℓ_old`.
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
    /// Per-token entropies `H`, nats; required when `entropy_coef > 0`.
    #[serde(default)]
    pub entropy: Option<Vec<Vec<f32>>>,
}

impl LossToolInput {
    /// Parses the JSON form. Errors name the input as "loss tool input" (the CLI replaces it
    /// with the file path) and the place of the bad value (`batch.rows[1].turn: ...`).
    pub fn from_json(text: &str) -> Result<Self> {
        from_json_at(text, "loss tool input")
    }
}

/// Reads a batch in its JSON form (docs/batch-json.md), as `cairn signals --batch` does;
/// `source` names the input in errors. A value of the wrong type, out of range, or an
/// unknown key is an error naming its place (`rows[2].turn: invalid type: ...`).
pub fn parse_batch(text: &str, source: &str) -> Result<Batch> {
    from_json_at(text, source).map_err(|e| match e {
        Error::Config { file, message } => Error::Config {
            file,
            message: format!("{message} (the batch JSON form is in docs/batch-json.md)"),
        },
        other => other,
    })
}

/// What [`run_loss`] returns (`cairn loss` prints it as JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossToolReport {
    /// The objective settings used.
    pub objective: ObjectiveConfig,
    /// Indices of the trained rows (batch rows then extra rows; rows of dropped groups are
    /// left out).
    pub trained_rows: Vec<usize>,
    /// The micro-batches, as `[start, end)` positions in `trained_rows`.
    pub micro_batches: Vec<[usize; 2]>,
    /// Loss components and metrics.
    pub report: LossReport,
    /// `∂loss/∂ℓ_θ` per token, `[rows][L_r]` (batch rows then extra rows); 0 on mask-0 slots
    /// and untrained rows.
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

fn check_tokens(what: &str, values: &[Vec<f32>], rows: &[&TurnRow]) -> Result<()> {
    if values.len() != rows.len() {
        return Err(Error::Shape {
            what: "loss tool input",
            detail: format!(
                "{what} has {} rows but the batch has {} (rows then extra rows)",
                values.len(),
                rows.len()
            ),
        });
    }
    for (i, (v, row)) in values.iter().zip(rows).enumerate() {
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

/// `ℓ_old` defaults to the sampled log-probs in a batch file.
fn default_old_logprobs(row: &mut TurnRow) {
    if row.old_logprobs.is_empty() {
        row.old_logprobs = row.response_logprobs.clone();
    }
}

/// Evaluates the objective on `input` with `config`, split into `micro_batches` micro-batches
/// exactly as the optimizer does: one [`RlLoss::from_rows`] over the trained rows, each passed
/// once. Teacher terms need fixed teacher log-probs and the sampled-token form here: a live
/// teacher or the top-k form needs a model's forward, which this tool does not have.
pub fn run_loss(
    input: &LossToolInput,
    config: &ObjectiveConfig,
    micro_batches: usize,
) -> Result<LossToolReport> {
    config.validate()?;
    let mut batch = input.batch.clone();
    batch.validate()?;
    let mut signals = match (&input.signals, &input.advantages) {
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
    signals.validate_against(&batch)?;
    for term in &signals.teacher {
        let live = term
            .targets
            .iter()
            .any(|t| matches!(t.source, TeacherSource::Context { .. }));
        if live || term.form != TeacherForm::SampledReverseKl {
            return Err(Error::Other(format!(
                "loss tool input: teacher term `{}` has {}; that needs a model's forward pass, \
                 which the offline loss tool does not run. Give fixed teacher log-probs \
                 (source kind \"fixed\") with the sampled_reverse_kl form, or train it",
                term.name,
                if live {
                    "a live teacher (source kind \"context\")"
                } else {
                    "the top-k form"
                }
            )));
        }
    }
    batch.rows.iter_mut().for_each(default_old_logprobs);
    signals.extra_rows.iter_mut().for_each(default_old_logprobs);
    let rows = all_rows(&batch, &signals);
    check_tokens("current_logp", &input.current_logp, &rows)?;
    match &input.entropy {
        Some(h) => check_tokens("entropy", h, &rows)?,
        None if config.needs_entropy() => {
            return Err(Error::Other(format!(
                "loss tool input: entropy_coef = {} needs per-token \"entropy\"",
                config.entropy_coef
            )))
        }
        None => {}
    }

    let trained = trained_rows(&batch, &signals);
    let mut loss = RlLoss::from_rows(config, &rows, &signals, &trained)?;
    let pick = |v: &[Vec<f32>]| trained.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
    let logp = pick(&input.current_logp);
    let entropy = input.entropy.as_deref().map(pick).unwrap_or_default();

    let splits = split_rows(trained.len(), micro_batches)?;
    let zeros = || -> Vec<Vec<f32>> {
        rows.iter()
            .map(|r| vec![0.0; r.response_ids.len()])
            .collect()
    };
    let mut grad_logp = zeros();
    let mut grad_entropy = config.needs_entropy().then(zeros);
    for mb in &splits {
        let scores = TokenScores {
            logp: &logp[mb.clone()],
            entropy: if entropy.is_empty() {
                &[][..]
            } else {
                &entropy[mb.clone()]
            },
            teacher: &[],
        };
        let grads = loss.grads(mb.clone(), &scores)?;
        for (k, g) in mb.clone().zip(grads.logp) {
            grad_logp[trained[k]] = g;
        }
        if let Some(out) = grad_entropy.as_mut() {
            for (k, h) in mb.clone().zip(grads.entropy) {
                out[trained[k]] = h;
            }
        }
    }
    loss.check_complete()?;
    Ok(LossToolReport {
        objective: config.clone(),
        micro_batches: splits.iter().map(|r| [r.start, r.end]).collect(),
        trained_rows: trained,
        report: loss.report(),
        grad_logp,
        grad_entropy,
        batch_metrics: metric_map(&batch_metrics(&batch, &signals)),
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
        no_ref
            .batch
            .rows
            .iter_mut()
            .for_each(|r| r.ref_logprobs.clear());
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
        // With the shorthand nothing is dropped; old_logprobs defaults to response_logprobs, so
        // passing those explicitly changes nothing.
        let mut input = example();
        let signals = input.signals.take().unwrap();
        input.advantages = Some(signals.advantages);
        let a = run_loss(&input, &kl_config(), 1).unwrap();
        assert_eq!(a.trained_rows, vec![0, 1, 2, 3]);
        for row in &mut input.batch.rows {
            row.old_logprobs = row.response_logprobs.clone();
        }
        let b = run_loss(&input, &kl_config(), 2).unwrap();
        assert!((a.report.loss - b.report.loss).abs() < 1e-12);
        // Row 3 now trains: 10 tokens, its advantages are 0, ρ = 1, ℓ = ℓ_ref.
        assert_eq!(a.report.tokens, 10);
        assert_eq!(a.grad_logp[3], vec![0.0, 0.0]);
    }

    #[test]
    fn rows_carry_old_and_ref_logprobs() {
        // ℓ_old from the rows: with ℓ_old = ℓ_θ everywhere, ρ = 1 and the token-mean surrogate
        // is −mean(A) over the 8 trained tokens: −(0.5·5 − 1·3) / 8 = 0.0625.
        let mut input = example();
        let current = input.current_logp.clone();
        for (row, lp) in input.batch.rows.iter_mut().zip(&current) {
            row.old_logprobs = lp.clone();
        }
        let out = run_loss(&input, &ObjectiveConfig::default(), 2).unwrap();
        close(out.report.pg_loss, 0.0625, "pg_loss with ℓ_old = ℓ_θ");
        assert_eq!(out.report.ratio_mean, 1.0);
        // ℓ_ref from the rows: the KL metric of the documented example.
        close(out.report.kl.unwrap(), 0.006864969, "kl");
        // A wrong length is an error naming the row.
        input.batch.rows[1].old_logprobs.pop();
        let e = run_loss(&input, &ObjectiveConfig::default(), 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 1: old_logprobs has 1 entries for 2 response tokens"),
            "{e}"
        );
    }

    #[test]
    fn fixed_teacher_terms_and_extra_rows_run_offline() {
        use cairn_plugin_sdk::{TeacherTarget, TeacherTerm};

        // The EDGE example as an extra row of the example batch: ℓ_θ = ℓ_old (ρ = 1, A = 0 on
        // it), teacher [−0.3, −0.8, −0.1]: teacher loss 2.5 / 3 with coef 1.
        let mut input = example();
        let mut signals = input.signals.take().unwrap();
        let extra = TurnRow {
            group_id: 1,
            trajectory_id: 12,
            prompt_ids: vec![101],
            response_ids: vec![11, 12, 13],
            response_logprobs: vec![-0.5, -2.0, -0.1],
            response_mask: vec![1, 1, 1],
            ref_logprobs: vec![-0.5, -2.0, -0.1],
            ..TurnRow::default()
        };
        signals.extra_rows.push(extra);
        signals.advantages.push(vec![0.0; 3]);
        signals.teacher.push(TeacherTerm {
            name: "edge".into(),
            coef: 1.0,
            form: TeacherForm::SampledReverseKl,
            targets: vec![TeacherTarget {
                row: 4,
                weights: vec![1.0; 3],
                source: TeacherSource::Fixed {
                    logprobs: vec![-0.3, -0.8, -0.1],
                    top_ids: vec![],
                    top_logprobs: vec![],
                },
            }],
        });
        let without = run_loss(&example(), &kl_config(), 1).unwrap();
        input.signals = Some(signals.clone());
        input.current_logp.push(vec![-0.5, -2.0, -0.1]);
        let out = run_loss(&input, &kl_config(), 3).unwrap();
        assert_eq!(out.trained_rows, vec![0, 1, 2, 4]);
        let t = &out.report.teacher[0];
        close(t.loss, 2.5 / 3.0, "teacher loss");
        assert_eq!(t.active_tokens, 3);
        // The extra row is not in the PPO/KL terms or their token-mean over the batch's 8
        // tokens: those are the step's without it. Its ∂L/∂ℓ is EDGE's alone, over its 3
        // active tokens: [−0.2, −1.2, 0]/3.
        assert_eq!(
            (out.report.pg_loss, out.report.kl_loss, out.report.tokens),
            (without.report.pg_loss, without.report.kl_loss, 8)
        );
        assert_eq!(out.grad_logp[..4], without.grad_logp[..]);
        for (l, want) in [-0.2, -1.2, 0.0].iter().enumerate() {
            assert!((f64::from(out.grad_logp[4][l]) - want / 3.0).abs() < 1e-6);
        }
        // A live teacher or the top-k form is refused, naming the term.
        let mut live = signals.clone();
        live.teacher[0].targets[0].source = TeacherSource::Context {
            context_ids: vec![1],
        };
        input.signals = Some(live);
        let e = run_loss(&input, &kl_config(), 1).unwrap_err().to_string();
        assert!(
            e.contains("teacher term `edge` has a live teacher") && e.contains("needs a model"),
            "{e}"
        );
        let mut top = signals;
        top.teacher[0].form = TeacherForm::TopKReverseKl { k: 2 };
        top.teacher[0].targets[0].source = TeacherSource::Fixed {
            logprobs: vec![],
            top_ids: vec![0; 6],
            top_logprobs: vec![-1.0; 6],
        };
        input.signals = Some(top);
        let e = run_loss(&input, &kl_config(), 1).unwrap_err().to_string();
        assert!(e.contains("teacher term `edge` has the top-k form"), "{e}");
    }

    /// A toy algorithm: advantage = episode reward − 0.5 on every trainable token; logs one
    /// metric through the host; fails on an empty batch.
    struct Centre;

    impl Algorithm for Centre {
        fn signals(&self, batch: &Batch, host: &dyn Host) -> cairn_plugin_sdk::Result<Signals> {
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
    fn json_errors_name_the_place_of_the_bad_value() {
        // serde_json alone gave only a line and column ("invalid type: string \"x\", expected
        // u32 at line 1 column 23"); the fuzzer asks for the field.
        let e = parse_batch(r#"{"rows": [{"turn": "x"}]}"#, "b.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b.json: rows[0].turn: invalid type: string")
                && e.contains("batch-json.md"),
            "{e}"
        );
        let e = parse_batch(r#"{"rows": [{"turnn": 1}]}"#, "b.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rows[0].turnn: unknown field `turnn`"), "{e}");
        let e = parse_batch(r#"{"step": 1} x"#, "b.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("trailing characters"), "{e}");
        let mut input: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap();
        input["current_logp"][1][0] = serde_json::json!({});
        let e = LossToolInput::from_json(&input.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("loss tool input: current_logp[1][0]: invalid type: map"),
            "{e}"
        );
    }

    /// A stack member that returns no advantages (only aux terms, or scales).
    struct NoAdvantages;

    impl Algorithm for NoAdvantages {
        fn signals(&self, _: &Batch, _: &dyn Host) -> cairn_plugin_sdk::Result<Signals> {
            Ok(Signals::default())
        }
    }

    #[test]
    fn signals_report_has_a_row_per_batch_row_without_advantages() {
        // The fuzzer found `rows: []` for such plugins (edge, pats, ucob...): the rows were
        // zipped with the empty advantages.
        let batch = example().batch;
        let out = run_signals(&mut NoAdvantages, &batch).unwrap();
        assert_eq!(out.rows.len(), 4);
        let row0 = &out.rows[0];
        assert_eq!(
            (row0.tokens, row0.advantage_mean, row0.dropped),
            (3, 0.0, false)
        );
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
