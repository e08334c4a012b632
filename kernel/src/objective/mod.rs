//! The RL objective: the PPO clipped surrogate with asymmetric and dual clipping, KL to the
//! reference (k1/k2/k3, in the loss or in the reward), an entropy bonus, auxiliary C-type
//! terms, teacher-target terms (sampled and top-k reverse KL, top-k forward KL, live or fixed
//! teachers), an off-policy correction for stale rows (truncated IS or AReaL's decoupled PPO),
//! and five loss aggregations, as a pure-Rust [`TokenLoss`]. The formulas, with their sources,
//! are in `docs/algorithms/objective.md`.
//!
//! Main types: [`ObjectiveConfig`] (the `[objective]` settings), [`RlLoss`] (the [`TokenLoss`]
//! the backend drives micro-batch by micro-batch, built by [`RlLoss::from_rows`]) and
//! [`LossReport`] (loss components and metrics). Around them: [`apply_kl_to_rewards`]
//! (`kl_mode = reward`), [`metrics::batch_metrics`] (reward, group and length statistics of a
//! batch), [`logprob`] (log-probs at a temperature, the reference the backend must match) and
//! [`tools`] (the offline `signals` and `loss` runners behind `cairn signals` / `cairn loss`).
//!
//! How the optimizer uses it, per batch (final rewards, algorithm `alg`):
//!
//! 1. Fill every row's `old_logprobs` (`ℓ_old`, at the sampling temperature, under the row's
//!    training prompt) and, when [`ObjectiveConfig::uses_reference`], `ref_logprobs`. With
//!    `kl_mode = reward`, call [`apply_kl_to_rewards`] now, before the algorithm sees the batch.
//! 2. `signals = alg.signals(&batch, host)?`, checked with `Signals::validate_against`; then
//!    fill `old_logprobs` of `signals.extra_rows` too (an extra row takes no part in the
//!    surrogate, the KL or the entropy term, only in the aux and teacher terms that target it,
//!    so it needs no `ref_logprobs`).
//! 3. `let rows = all_rows(&batch, &signals); let trained = trained_rows(&batch, &signals);`
//!    for each optimizer step (one per mini-batch `mini` of `trained`):
//!    `loss = RlLoss::from_rows(&config, &rows, &signals, &mini)?` and
//!    `sequences = train_sequences(&rows, &mini)?`.
//! 4. `backend.train_step(&sequences, micro_batches, temperature, &mut loss)`; then
//!    `loss.check_complete()?` and `loss.report()` give the metrics.
//!
//! The aggregation normalisers (token counts, row counts, per-rollout totals, the constant,
//! and each teacher term's active tokens) come from the whole step, fixed when the loss is
//! built; so the loss, its gradient and every metric are the same for any micro-batch split.
//! Masked slots never enter any arithmetic. Inputs are `f32`; all accumulation is `f64`.

pub mod config;
pub mod input;
pub mod kl;
pub mod logprob;
pub mod metrics;
pub mod off_policy;
pub mod rl_loss;
pub mod surrogate;
pub mod teacher;
pub mod tools;

pub use config::{Aggregation, KlEstimator, KlMode, ObjectiveConfig, OffPolicy};
pub use input::{all_rows, row_weights, train_sequences, trained_rows, ObjectiveRow};
pub use kl::apply_kl_to_rewards;
pub use rl_loss::{LossReport, NamedValue, OffPolicyReport, RlLoss};
pub use teacher::TeacherReport;

#[cfg(doc)]
use crate::loss::TokenLoss;
