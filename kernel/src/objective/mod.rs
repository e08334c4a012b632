//! The RL objective (algorithms.md §0–§1, §13): the PPO clipped surrogate with asymmetric and
//! dual clipping, KL to the reference (k1/k2/k3, in the loss or in the reward), an entropy
//! bonus, auxiliary C-type terms, and five loss aggregations, as a pure-Rust [`TokenLoss`].
//!
//! Main types: [`ObjectiveConfig`] (the `[objective]` settings), [`ObjectiveRow`] (one trained
//! sequence's mask, advantages, old/reference log-probs, rollout id and aux coefficients),
//! [`RlLoss`] (the [`TokenLoss`] the backend drives micro-batch by micro-batch) and
//! [`LossReport`] (loss components and metrics). Around them: [`apply_kl_to_rewards`]
//! (`kl_mode = reward`), [`metrics::batch_metrics`] (reward, group and length statistics of a
//! batch), [`logprob`] (log-probs at a temperature, the reference the backend must match) and
//! [`tools`] (the offline `signals` and `loss` runners behind `cairn signals` / `cairn loss`).
//!
//! How the optimizer uses it, per step (batch with final rewards, algorithm `alg`):
//!
//! 1. Recompute `ℓ_old` for every row at the sampling temperature (and `ℓ_ref` when
//!    [`ObjectiveConfig::uses_reference`]). With `kl_mode = reward`, call
//!    [`apply_kl_to_rewards`] on the batch now, before the algorithm sees it.
//! 2. `signals = alg.signals(&batch, host)?`, checked with `Signals::validate_against`.
//! 3. For each optimizer step (one per mini-batch; one per batch on-policy), build one
//!    [`ObjectiveRow`] per trained row, skipping rows of `signals.dropped_groups`
//!    ([`kept_rows`]; [`StepInput::from_batch`] does all of this for a whole batch), and
//!    `loss = RlLoss::new(&config, rows, aux)?` with `aux = (name, coef)` of each
//!    `signals.aux` term.
//! 4. `backend.train_step(sequences of those rows, micro_batches, temperature, &mut loss)`;
//!    then `loss.check_complete()?` and `loss.report()` give the metrics.
//!
//! The aggregation normalisers (token counts, row counts, per-rollout totals, the constant)
//! come from the whole step, fixed in [`RlLoss::new`]; so the loss, its gradient and every
//! metric are the same for any micro-batch split. Masked slots never enter any arithmetic.
//! Inputs are `f32`; all accumulation is `f64`.

pub mod config;
pub mod input;
pub mod kl;
pub mod logprob;
pub mod metrics;
pub mod rl_loss;
pub mod surrogate;
pub mod tools;

pub use config::{Aggregation, KlEstimator, KlMode, ObjectiveConfig};
pub use input::{kept_rows, row_weights, ObjectiveRow, StepInput};
pub use kl::apply_kl_to_rewards;
pub use rl_loss::{LossReport, NamedValue, RlLoss};

#[cfg(doc)]
use crate::loss::TokenLoss;
