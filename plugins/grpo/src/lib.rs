//! `grpo`: group-relative advantages for the PPO clipped surrogate (verl
//! `core_algos.py`, Dr.GRPO arXiv 2503.20783; docs/algorithms/grpo.md), with
//! the Dr.GRPO, RLOO and DAPO variants as options. A pure A-type plugin: it emits one advantage
//! per trajectory, broadcast to every trainable token of every turn of that trajectory.
//!
//! For the trajectories `i` of a task group `g` (rows sharing `group_id`; groups may differ in
//! size), with outcome reward `R_i` (the rows' `episode_reward`):
//!
//! * `R'_i = R_i + overlong_i` — DAPO's soft overlong punishment when `overlong` is set
//!   (arXiv 2503.14476, §3.4, Eq. 13): with `n_i` the trajectory's trainable tokens over all its
//!   turns, `L = max_response_length`, `B = buffer_length`, `f = penalty_factor`:
//!   `overlong_i = 0` if `n_i ≤ L − B`, `−f·(n_i − (L − B))/B` if `L − B < n_i ≤ L`, `−f` above.
//! * baseline `group_mean` (GRPO): `Â_i = (R'_i − μ_g)/(s_g + eps)`, or `R'_i − μ_g` with
//!   `norm_adv_by_std = false` (Dr.GRPO, arXiv 2503.20783). `μ_g`, `s_g` are the mean and the
//!   (`std`: unbiased N−1 like verl's `torch.std`, or population) standard deviation over the
//!   group's samples: every row (a T-turn trajectory counts T times) with
//!   `compute_mean_std_cross_steps = true` (verl-agent's default), one per trajectory otherwise.
//!   verl's edge rules: a group with one sample uses `μ = 0, s = 1`; a group whose samples are
//!   all equal up to float error gives exactly 0 (`stats::is_constant`).
//! * baseline `leave_one_out` (RLOO): `Â_i = R'_i − mean(samples of the other trajectories)`
//!   (same sample rule; no other trajectory: baseline 0); no std division.
//! * `batch_whiten = true` (REINFORCE++ / ReSkill `grpo_double_normalize`): afterwards, the
//!   token advantages of all trained rows are whitened over their trainable tokens,
//!   `(A − mean)/sqrt(var + 1e-8)` with the unbiased variance (verl `masked_whiten`).
//! * `dynamic_sampling = true` (DAPO `filter_groups`): groups whose `R'` are all equal (or
//!   that hold a single trajectory) carry no gradient; they are listed in
//!   `Signals::dropped_groups` (advantages 0) and [`Requirements::dynamic_sampling`] asks the
//!   kernel to sample more groups (groups of at least 2 are then required, as with RLOO). DAPO filters on accuracy; this filters on the reward the
//!   advantage is computed from, i.e. exactly the groups whose advantages would be all zero.
//!
//! DAPO's clip-higher is not an advantage setting: set `clip_high = 0.28` (and keep
//! `clip_low = 0.2`) in the pipeline's `[objective]` table. Token-level loss aggregation
//! (DAPO, Dr.GRPO's constant normaliser) is also chosen there.
//!
//! Config keys (JSON object, unknown keys rejected), defaults in parentheses:
//! `norm_adv_by_std` (true), `std` ("unbiased" | "population"), `eps` (1e-6),
//! `compute_mean_std_cross_steps` (true), `baseline` ("group_mean" | "leave_one_out"),
//! `batch_whiten` (false), `dynamic_sampling` (false),
//! `overlong` (absent; `{max_response_length, buffer_length, penalty_factor = 1.0}`; DAPO used
//! 20480 / 4096 / 1.0).
//!
//! Metrics: `grpo/dropped_groups` (count), `grpo/overlong_fraction` (trajectories penalised),
//! `grpo/overlong_penalty_mean` (mean `overlong_i` over trajectories),
//! `grpo/advantage_abs_mean` (mean |A| over trained trainable tokens).

use cairn_plugin_sdk::stats::{
    broadcast_rows, group_indices, is_constant, masked_whiten, mean, outcome_advantages,
    trajectories, Normalise, OutcomeSamples, StdKind, Trajectory,
};
use cairn_plugin_sdk::{Algorithm, Batch, Host, PluginError, Requirements, Result, Signals};
use serde::Deserialize;

/// The whitening variance floor, as verl's `masked_whiten`.
const WHITEN_EPS: f64 = 1e-8;

/// Which standard deviation divides the group-centred rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdChoice {
    /// N−1 denominator (verl's `torch.std`).
    Unbiased,
    /// N denominator.
    Population,
}

/// What is subtracted from a trajectory's reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// The group mean (GRPO, Dr.GRPO).
    GroupMean,
    /// The mean of the other trajectories of the group (RLOO).
    LeaveOneOut,
}

/// DAPO's soft overlong punishment (see the crate docs).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlong {
    /// `L`: the length budget of a trajectory's policy tokens (all turns).
    pub max_response_length: u32,
    /// `B`: the punishment ramps from 0 at `L − B` to `−penalty_factor` at `L`.
    pub buffer_length: u32,
    /// `f` (1.0).
    #[serde(default = "one")]
    pub penalty_factor: f64,
}

fn one() -> f64 {
    1.0
}

impl Overlong {
    /// The (non-positive) reward added for `tokens` policy tokens.
    pub fn penalty(&self, tokens: usize) -> f64 {
        let (max, buffer) = (
            f64::from(self.max_response_length),
            f64::from(self.buffer_length),
        );
        let excess = tokens as f64 - (max - buffer);
        if excess <= 0.0 {
            0.0
        } else {
            -self.penalty_factor * (excess / buffer).min(1.0)
        }
    }
}

/// The plugin's config (see the crate docs for the keys).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    pub norm_adv_by_std: bool,
    pub std: StdChoice,
    pub eps: f64,
    pub compute_mean_std_cross_steps: bool,
    pub baseline: Baseline,
    pub batch_whiten: bool,
    pub dynamic_sampling: bool,
    pub overlong: Option<Overlong>,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            norm_adv_by_std: true,
            std: StdChoice::Unbiased,
            eps: 1e-6,
            compute_mean_std_cross_steps: true,
            baseline: Baseline::GroupMean,
            batch_whiten: false,
            dynamic_sampling: false,
            overlong: None,
        }
    }
}

impl GrpoConfig {
    /// Rejects invalid values and contradictory combinations, naming the key.
    pub fn validate(&self) -> Result<()> {
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(PluginError::config(format!(
                "`eps` = {}: must be a finite number ≥ 0 (verl uses 1e-6)",
                self.eps
            )));
        }
        if self.baseline == Baseline::LeaveOneOut && self.norm_adv_by_std {
            return Err(PluginError::config(
                "`norm_adv_by_std` = true cannot be combined with baseline = \"leave_one_out\": RLOO \
                 subtracts the other samples' mean and does not divide by a std; set \
                 norm_adv_by_std = false",
            ));
        }
        if let Some(o) = &self.overlong {
            if o.buffer_length == 0 || o.buffer_length > o.max_response_length {
                return Err(PluginError::config(format!(
                    "`overlong`: buffer_length = {} must be in 1..=max_response_length ({})",
                    o.buffer_length, o.max_response_length
                )));
            }
            if !(o.penalty_factor.is_finite() && o.penalty_factor >= 0.0) {
                return Err(PluginError::config(format!(
                    "`overlong`: penalty_factor = {} must be a finite number ≥ 0",
                    o.penalty_factor
                )));
            }
        }
        Ok(())
    }

    fn samples(&self) -> OutcomeSamples {
        if self.compute_mean_std_cross_steps {
            OutcomeSamples::Rows
        } else {
            OutcomeSamples::Trajectories
        }
    }
}

/// The GRPO algorithm plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct Grpo {
    config: GrpoConfig,
}

impl Grpo {
    /// Builds the plugin from its JSON config (the export macro's constructor).
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: GrpoConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(Grpo { config })
    }

    pub fn config(&self) -> &GrpoConfig {
        &self.config
    }
}

/// RLOO: `R_i − mean(samples of the other trajectories of the group)`, per trajectory.
fn leave_one_out(trajs: &[Trajectory], rewards: &[f64], samples: OutcomeSamples) -> Vec<f64> {
    let weight = |i: usize| match samples {
        OutcomeSamples::Rows => trajs[i].rows.len() as f64,
        OutcomeSamples::Trajectories => 1.0,
    };
    let mut out = vec![0.0; trajs.len()];
    for group in group_indices(&trajs.iter().map(|t| t.group_id).collect::<Vec<_>>()) {
        let values: Vec<f64> = group.iter().map(|&i| rewards[i]).collect();
        if is_constant(&values) && group.len() > 1 {
            continue; // exactly zero
        }
        let total: f64 = group.iter().map(|&i| weight(i) * rewards[i]).sum();
        let count: f64 = group.iter().map(|&i| weight(i)).sum();
        for &i in &group {
            let others = count - weight(i);
            let baseline = if others > 0.0 {
                (total - weight(i) * rewards[i]) / others
            } else {
                0.0
            };
            out[i] = rewards[i] - baseline;
        }
    }
    out
}

impl Algorithm for Grpo {
    fn requirements(&self) -> Requirements {
        Requirements {
            dynamic_sampling: self.config.dynamic_sampling,
            // A lone sample has no baseline to compare with (RLOO), and dynamic sampling would
            // drop every group of one.
            min_group_size: if self.config.baseline == Baseline::LeaveOneOut
                || self.config.dynamic_sampling
            {
                2
            } else {
                0
            },
            ..Requirements::default()
        }
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let c = &self.config;
        let trajs = trajectories(batch)?;
        let penalties: Vec<f64> = trajs
            .iter()
            .map(|t| {
                let tokens = t
                    .rows
                    .iter()
                    .map(|&r| batch.rows[r].trainable_tokens())
                    .sum();
                c.overlong.as_ref().map_or(0.0, |o| o.penalty(tokens))
            })
            .collect();
        let rewards: Vec<f64> = trajs
            .iter()
            .zip(&penalties)
            .map(|(t, p)| t.episode_reward + p)
            .collect();

        let mut per_traj = match c.baseline {
            Baseline::GroupMean => {
                let mode = if c.norm_adv_by_std {
                    let std = match c.std {
                        StdChoice::Unbiased => StdKind::Unbiased,
                        StdChoice::Population => StdKind::Population,
                    };
                    Normalise::MeanStd { eps: c.eps, std }
                } else {
                    Normalise::Mean
                };
                outcome_advantages(&trajs, &rewards, mode, c.samples())
            }
            Baseline::LeaveOneOut => leave_one_out(&trajs, &rewards, c.samples()),
        };

        let mut dropped_groups = Vec::new();
        if c.dynamic_sampling {
            for group in group_indices(&trajs.iter().map(|t| t.group_id).collect::<Vec<_>>()) {
                let values: Vec<f64> = group.iter().map(|&i| rewards[i]).collect();
                if is_constant(&values) {
                    dropped_groups.push(trajs[group[0]].group_id);
                    for &i in &group {
                        per_traj[i] = 0.0;
                    }
                }
            }
        }

        let mut per_row = vec![0.0; batch.rows.len()];
        for (t, &a) in trajs.iter().zip(&per_traj) {
            for &r in &t.rows {
                per_row[r] = a;
            }
        }
        let trained = |r: usize| !dropped_groups.contains(&batch.rows[r].group_id);
        let advantages = if c.batch_whiten {
            let values: Vec<Vec<f64>> = batch
                .rows
                .iter()
                .zip(&per_row)
                .map(|(row, &a)| vec![a; row.response_mask.len()])
                .collect();
            let masks: Vec<Vec<u8>> = batch
                .rows
                .iter()
                .enumerate()
                .map(|(r, row)| {
                    if trained(r) {
                        row.response_mask.clone()
                    } else {
                        vec![0; row.response_mask.len()]
                    }
                })
                .collect();
            masked_whiten(&values, &masks, StdKind::Unbiased, WHITEN_EPS)
                .into_iter()
                .map(|row| row.into_iter().map(|a| a as f32).collect())
                .collect()
        } else {
            broadcast_rows(batch, &per_row)
        };

        let abs: Vec<f64> = batch
            .rows
            .iter()
            .zip(&advantages)
            .enumerate()
            .filter(|&(r, _)| trained(r))
            .flat_map(|(_, (row, adv))| {
                row.response_mask
                    .iter()
                    .zip(adv)
                    .filter(|(&m, _)| m == 1)
                    .map(|(_, &a)| f64::from(a).abs())
            })
            .collect();
        let penalised = penalties.iter().filter(|&&p| p < 0.0).count();
        let metrics = vec![
            (
                "grpo/dropped_groups".to_string(),
                dropped_groups.len() as f64,
            ),
            (
                "grpo/overlong_fraction".to_string(),
                if trajs.is_empty() {
                    0.0
                } else {
                    penalised as f64 / trajs.len() as f64
                },
            ),
            ("grpo/overlong_penalty_mean".to_string(), mean(&penalties)),
            ("grpo/advantage_abs_mean".to_string(), mean(&abs)),
        ];
        Ok(Signals {
            advantages,
            dropped_groups,
            metrics,
            ..Signals::default()
        })
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "grpo",
    description: "group-relative advantages: GRPO, Dr.GRPO (no std), RLOO, batch whitening, DAPO dynamic sampling and overlong shaping",
    create: Grpo::from_config_json,
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{FinishReason, OfflineHost, TurnRow};

    use super::*;

    /// A test row: group, trajectory, turn, episode reward, number of trainable tokens.
    fn row(group: u64, traj: u64, turn: u32, reward: f32, tokens: usize) -> TurnRow {
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            turn,
            episode_reward: reward,
            success: reward > 0.0,
            response_ids: vec![7; tokens + 1],
            response_logprobs: vec![-0.5; tokens + 1],
            // A trailing mask-0 slot on every row: it must stay 0.
            response_mask: [vec![1; tokens], vec![0]].concat(),
            finish_reason: FinishReason::Stop,
            ..TurnRow::default()
        }
    }

    /// Single-turn batch: one row per trajectory, `groups[i]` / `rewards[i]`, 2 tokens each.
    fn single_turn(groups: &[u64], rewards: &[f32]) -> Batch {
        let rows = groups
            .iter()
            .zip(rewards)
            .enumerate()
            .map(|(i, (&g, &r))| row(g, i as u64, 0, r, 2))
            .collect();
        Batch { step: 0, rows }
    }

    fn signals(config: &str, batch: &Batch) -> Signals {
        let grpo = Grpo::from_config_json(config).unwrap();
        grpo.signals(batch, &OfflineHost::default()).unwrap()
    }

    /// `check(config, batch, expected advantage per row)`: every trainable token of a row holds
    /// the row's value (to 1e-4, the precision of the worked examples), every mask-0 slot 0.
    fn check(config: &str, batch: &Batch, expected: &[f64]) -> Signals {
        let s = signals(config, batch);
        assert_eq!(s.advantages.len(), expected.len());
        for (r, (adv, want)) in s.advantages.iter().zip(expected).enumerate() {
            for (&a, &m) in adv.iter().zip(&batch.rows[r].response_mask) {
                let want = if m == 1 { *want } else { 0.0 };
                assert!(
                    (f64::from(a) - want).abs() < 1e-4,
                    "{config}: row {r}: {adv:?} vs {want}"
                );
            }
        }
        s
    }

    #[test]
    fn worked_example_section_1e() {
        let batch = single_turn(&[1, 1, 1, 1], &[1.0, 0.0, 0.5, 0.0]);
        check("{}", &batch, &[1.3056, -0.7833, 0.2611, -0.7833]);
        // The population-std counter-example: a different number, so the default is pinned.
        check(
            r#"{"std": "population"}"#,
            &batch,
            &[1.5076, -0.9045, 0.3015, -0.9045],
        );
        check(
            r#"{"norm_adv_by_std": false}"#,
            &batch,
            &[0.625, -0.375, 0.125, -0.375],
        );
        let s = check("{}", &single_turn(&[1; 4], &[1.0; 4]), &[0.0; 4]);
        assert!(s.advantages.iter().flatten().all(|&a| a == 0.0));
    }

    #[test]
    fn uniform_groups_are_exactly_zero_trl_3857() {
        // Case trl-3857-zero-std-groups: rewards [1,1,1,1, 0,0,0,0] in groups of 4, eps 1e-4.
        let batch = single_turn(
            &[5, 5, 5, 5, 9, 9, 9, 9],
            &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        );
        let s = signals(r#"{"eps": 1e-4}"#, &batch);
        assert!(s.advantages.iter().flatten().all(|&a| a == 0.0));
        assert_eq!(s.metrics[3], ("grpo/advantage_abs_mean".to_string(), 0.0));
        // Equal up to float error is still zero.
        let s = signals("{}", &single_turn(&[1, 1, 1], &[0.1 + 0.2, 0.3, 0.3]));
        assert!(s.advantages.iter().flatten().all(|&a| a == 0.0));
    }

    #[test]
    fn two_samples_trl_2995() {
        // Case trl-2995-loss-normalisation: rewards [1, 0], eps 1e-4, ddof 1 → ±0.707007.
        let mut batch = single_turn(&[1, 1], &[1.0, 0.0]);
        batch.rows[1] = row(1, 1, 0, 0.0, 4);
        let s = signals(r#"{"eps": 1e-4}"#, &batch);
        assert!((f64::from(s.advantages[0][0]) - 0.707007).abs() < 1e-6);
        assert!((f64::from(s.advantages[1][3]) + 0.707007).abs() < 1e-6);
    }

    #[test]
    fn empty_response_rows_get_no_tokens_verl_6310() {
        // Case verl-6310: a valid response (reward 1) and an empty one (reward 0, no trainable
        // token). Advantages ±0.707106; the empty row has nothing to carry them.
        let mut batch = single_turn(&[1, 1], &[1.0, 0.0]);
        batch.rows[1] = row(1, 1, 0, 0.0, 0);
        // The case's 0.707106 is 0.5 / (s + eps) with s = 1/√2 and verl's eps = 1e-6.
        let a = 0.5 / (std::f64::consts::FRAC_1_SQRT_2 + 1e-6);
        let s = check("{}", &batch, &[a, -a]);
        assert_eq!(s.advantages[1], vec![0.0]);
    }

    /// The three trajectories of docs/algorithms/gigpo.md's worked example (A: 2 turns, R = 10; B: 3 turns, 10; C: 3, 0).
    fn gigpo_trajectories() -> Batch {
        let spec = [
            (0, 0, 10.0),
            (0, 1, 10.0),
            (1, 0, 10.0),
            (1, 1, 10.0),
            (1, 2, 10.0),
            (2, 0, 0.0),
            (2, 1, 0.0),
            (2, 2, 0.0),
        ];
        Batch {
            step: 0,
            rows: spec
                .iter()
                .map(|&(t, turn, r)| row(1, t, turn, r, 3))
                .collect(),
        }
    }

    #[test]
    fn statistics_over_rows_or_trajectories() {
        let batch = gigpo_trajectories();
        // Over rows: mean 50/8 = 6.25 → 3.75 / −6.25; over trajectories 6.6667.
        let rows = [3.75, 3.75, 3.75, 3.75, 3.75, -6.25, -6.25, -6.25];
        check(r#"{"norm_adv_by_std": false}"#, &batch, &rows);
        let t = 10.0 / 3.0;
        let trajs = [t, t, t, t, t, -2.0 * t, -2.0 * t, -2.0 * t];
        check(
            r#"{"norm_adv_by_std": false, "compute_mean_std_cross_steps": false}"#,
            &batch,
            &trajs,
        );
        // With the std (row std 5.1755): 0.7246 / −1.2076.
        check(
            "{}",
            &batch,
            &[
                0.7246, 0.7246, 0.7246, 0.7246, 0.7246, -1.2076, -1.2076, -1.2076,
            ],
        );
    }

    #[test]
    fn groups_come_from_ids_and_may_differ_in_size() {
        // Interleaved ids; group 4 has 3 members, group 8 has 2.
        let batch = single_turn(&[4, 8, 4, 8, 4], &[1.0, 2.0, 0.0, 0.0, 0.5]);
        check(
            r#"{"norm_adv_by_std": false}"#,
            &batch,
            &[0.5, 1.0, -0.5, -1.0, 0.0],
        );
    }

    #[test]
    fn leave_one_out_baseline() {
        // RLOO on §1e's rewards: R_i − mean(others) = 4/3 · (R_i − μ).
        let batch = single_turn(&[1, 1, 1, 1], &[1.0, 0.0, 0.5, 0.0]);
        let config = r#"{"baseline": "leave_one_out", "norm_adv_by_std": false}"#;
        check(config, &batch, &[5.0 / 6.0, -0.5, 1.0 / 6.0, -0.5]);
        // Over rows: A (2 rows, R=10), B (3 rows, 10), C (3 rows, 0): A's baseline is
        // (3·10 + 3·0)/6 = 5, B's (2·10 + 3·0)/5 = 4, C's 10.
        let rows = [5.0, 5.0, 6.0, 6.0, 6.0, -10.0, -10.0, -10.0];
        check(config, &gigpo_trajectories(), &rows);
        let grpo = Grpo::from_config_json(config).unwrap();
        assert_eq!(grpo.requirements().min_group_size, 2);
    }

    #[test]
    fn batch_whitening_after_group_normalisation() {
        // Dr.GRPO per group: group 1 rewards [1, 0] → ±0.5; group 2 [2, 0] → ±1. Tokens per row
        // 1, 1, 2, 1 → token values [0.5, −0.5, 1, 1, −1]: mean 0.2, unbiased var 0.825.
        let mut batch = single_turn(&[1, 1, 2, 2], &[1.0, 0.0, 2.0, 0.0]);
        for (r, n) in [1usize, 1, 2, 1].into_iter().enumerate() {
            batch.rows[r] = row(
                batch.rows[r].group_id,
                r as u64,
                0,
                batch.rows[r].episode_reward,
                n,
            );
        }
        let s = (0.825f64 + 1e-8).sqrt();
        let want = [
            (0.5 - 0.2) / s,
            (-0.5 - 0.2) / s,
            (1.0 - 0.2) / s,
            (-1.0 - 0.2) / s,
        ];
        check(
            r#"{"norm_adv_by_std": false, "batch_whiten": true}"#,
            &batch,
            &want,
        );
    }

    #[test]
    fn dynamic_sampling_drops_uniform_groups() {
        let batch = single_turn(&[1, 1, 2, 2, 3], &[1.0, 0.0, 1.0, 1.0, 0.4]);
        let s = check(
            r#"{"dynamic_sampling": true, "norm_adv_by_std": false}"#,
            &batch,
            &[0.5, -0.5, 0.0, 0.0, 0.0],
        );
        // Group 2 is uniform; group 3 has a single trajectory (no contrast either).
        assert_eq!(s.dropped_groups, vec![2, 3]);
        assert_eq!(s.metrics[0], ("grpo/dropped_groups".to_string(), 2.0));
        let grpo = Grpo::from_config_json(r#"{"dynamic_sampling": true}"#).unwrap();
        assert!(grpo.requirements().dynamic_sampling && grpo.requirements().min_group_size == 2);
        assert!(
            !Grpo::from_config_json("{}")
                .unwrap()
                .requirements()
                .dynamic_sampling
        );
        // Dropped groups are left out of the whitening statistics and stay 0: the trained
        // tokens are [0.5, 0.5, −0.5, −0.5], unbiased std sqrt(1/3).
        let w = 0.5 / (1.0f64 / 3.0 + 1e-8).sqrt();
        let s = check(
            r#"{"dynamic_sampling": true, "norm_adv_by_std": false, "batch_whiten": true}"#,
            &batch,
            &[w, -w, 0.0, 0.0, 0.0],
        );
        assert_eq!(s.dropped_groups, vec![2, 3]);
    }

    #[test]
    fn overlong_reward_shaping() {
        // L = 10, B = 4: no penalty up to 6 tokens, a ramp to −1 at 10, −1 beyond.
        let o = Overlong {
            max_response_length: 10,
            buffer_length: 4,
            penalty_factor: 1.0,
        };
        let got: Vec<f64> = [0, 6, 7, 8, 10, 12].iter().map(|&n| o.penalty(n)).collect();
        assert_eq!(got, vec![0.0, 0.0, -0.25, -0.5, -1.0, -1.0]);
        // All three trajectories are correct (R = 1) with 5, 8 (2 turns: 3 + 5) and 12 tokens:
        // shaped [1, 0.5, 0] → Dr.GRPO over trajectories [0.5, 0, −0.5].
        let batch = Batch {
            step: 0,
            rows: vec![
                row(1, 0, 0, 1.0, 5),
                row(1, 1, 0, 1.0, 3),
                row(1, 1, 1, 1.0, 5),
                row(1, 2, 0, 1.0, 12),
            ],
        };
        let config = r#"{"norm_adv_by_std": false, "compute_mean_std_cross_steps": false,
                         "overlong": {"max_response_length": 10, "buffer_length": 4}}"#;
        let s = check(config, &batch, &[0.5, 0.0, 0.0, -0.5]);
        assert_eq!(
            s.metrics[1],
            ("grpo/overlong_fraction".to_string(), 2.0 / 3.0)
        );
        assert_eq!(
            s.metrics[2],
            ("grpo/overlong_penalty_mean".to_string(), -0.5)
        );
    }

    #[test]
    fn config_errors_name_the_key() {
        let err = |json: &str| Grpo::from_config_json(json).unwrap_err().message;
        assert!(err(r#"{"epsilon": 1e-6}"#).contains("unknown field `epsilon`"));
        let e = err(r#"{"std": "sample"}"#);
        assert!(e.starts_with("`std`: unknown variant `sample`"), "{e}");
        let e = err(r#"{"eps": "small"}"#);
        assert!(e.starts_with("`eps`: invalid type"), "{e}");
        assert!(err(r#"{"eps": -1}"#).starts_with("`eps` = -1"));
        let e = err(r#"{"baseline": "leave_one_out"}"#);
        assert!(
            e.starts_with("`norm_adv_by_std` = true cannot be combined"),
            "{e}"
        );
        let e = err(r#"{"overlong": {"max_response_length": 10, "buffer_length": 0}}"#);
        assert!(e.starts_with("`overlong`: buffer_length = 0"), "{e}");
        let e = err(r#"{"overlong": {"max_response_length": 10}}"#);
        assert!(
            e.starts_with("`overlong`: missing field `buffer_length`"),
            "{e}"
        );
        assert!(err("[1]").contains("must be a JSON object"));
        // Empty and null configs are the defaults.
        assert_eq!(
            Grpo::from_config_json("").unwrap().config(),
            &GrpoConfig::default()
        );
        assert_eq!(
            Grpo::from_config_json("null").unwrap().config(),
            &GrpoConfig::default()
        );
    }

    #[test]
    fn inconsistent_batches_are_errors() {
        let mut batch = gigpo_trajectories();
        batch.rows[1].episode_reward = 3.0;
        let grpo = Grpo::from_config_json("{}").unwrap();
        let e = grpo.signals(&batch, &OfflineHost::default()).unwrap_err();
        assert!(e.message.contains("differ in episode_reward"), "{e}");
        batch.rows[1].episode_reward = 10.0;
        batch.rows[2].response_mask.pop();
        let e = grpo.signals(&batch, &OfflineHost::default()).unwrap_err();
        assert!(e.message.contains("row 2"), "{e}");
    }
}
