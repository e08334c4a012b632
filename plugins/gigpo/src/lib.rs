//! `gigpo`: Group-in-Group Policy Optimization (arXiv 2505.10978; docs/algorithms/gigpo.md), following
//! verl-agent's `gigpo/core_gigpo.py`. A pure A-type plugin: one advantage per turn row,
//! broadcast to the row's trainable tokens.
//!
//! Two nested groupings inside a task group `g` (rows sharing `group_id`):
//!
//! 1. **Episode level** (paper Eq. 3): `A^E_i = (R_i − μ_g)/F`, with `R_i` the rows'
//!    `episode_reward`, `F = s_g + eps` (`mode = "mean_std_norm"`, unbiased std) or `F = 1`
//!    (`mode = "mean_norm"`). The statistics are over all rows of the group with
//!    `compute_mean_std_cross_steps = true` (a T-turn trajectory counts T times; verl-agent's
//!    default), over trajectories otherwise. A single sample uses `μ = 0, s = 1`; equal samples
//!    give exactly 0.
//! 2. **Step level** (Eq. 5–7): rows of the same task group whose anchor states match form a
//!    step group `U` (`anchor_matching = "exact"`: equal `anchor` strings; `"similar"`: greedy
//!    clustering in row order, joining the first cluster whose representative has difflib
//!    similarity ratio ≥ `similarity_threshold`, see `stats::similarity_ratio`). With the
//!    discounted turn return `G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k}` from the rows' `turn_reward`:
//!    `A^S_{i,t} = (G_{i,t} − mean_U G)/F_U`, `F_U` = unbiased std of `U` + eps or 1, per
//!    `mode`. A singleton step group, or one whose returns are all equal, gives `A^S = 0`.
//! 3. **Combined** (Eq. 8): `A_{i,t} = A^E_i + omega · A^S_{i,t}`.
//!
//! Config keys (JSON object, unknown keys rejected), defaults in parentheses (verl-agent's):
//! `mode` ("mean_norm" | "mean_std_norm"), `omega` (1.0, `step_advantage_w`; ≥ 0), `gamma`
//! (0.95; in [0, 1]), `eps` (1e-6), `compute_mean_std_cross_steps` (true), `anchor_matching`
//! ("exact" | "similar"), `similarity_threshold` (0.95 when `similar`; in (0, 1); rejected with
//! `exact`).
//!
//! Requirements: anchor keys and per-turn rewards on every row. The invalid-action penalty of
//! the ALFWorld setup is the environment's business (it lowers that turn's `turn_reward`).
//!
//! Metrics: `gigpo/step_group_size_mean` (rows per step group), `gigpo/singleton_step_groups`
//! (fraction of step groups with one row), `gigpo/step_advantage_abs_mean` (mean |A^S| over
//! rows).

use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::stats::{
    anchor_groups, broadcast_rows, is_constant, mean, outcome_advantages, std, trajectories,
    turn_returns, AnchorMatching, Normalise, OutcomeSamples, StdKind,
};
use cairn_plugin_sdk::{Algorithm, Batch, Host, PluginError, Requirements, Result, Signals};
use serde::Deserialize;

/// How both levels are normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Subtract the group mean only (the verl-agent configs' choice).
    MeanNorm,
    /// Subtract the mean, divide by the unbiased std + eps.
    MeanStdNorm,
}

/// How anchor keys are matched into step groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Matching {
    Exact,
    Similar,
}

/// The plugin's config (see the crate docs for the keys).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GigpoConfig {
    pub mode: Mode,
    pub omega: f64,
    pub gamma: f64,
    pub eps: f64,
    pub compute_mean_std_cross_steps: bool,
    pub anchor_matching: Matching,
    pub similarity_threshold: Option<f64>,
}

impl Default for GigpoConfig {
    fn default() -> Self {
        GigpoConfig {
            mode: Mode::MeanNorm,
            omega: 1.0,
            gamma: 0.95,
            eps: 1e-6,
            compute_mean_std_cross_steps: true,
            anchor_matching: Matching::Exact,
            similarity_threshold: None,
        }
    }
}

/// verl-agent's default similarity threshold.
const DEFAULT_THRESHOLD: f64 = 0.95;

impl GigpoConfig {
    /// Rejects invalid values and contradictory combinations, naming the key.
    pub fn validate(&self) -> Result<()> {
        let bad = PluginError::check_config;
        bad(
            self.omega.is_finite() && self.omega >= 0.0,
            format!(
                "`omega` = {}: the step-advantage weight must be ≥ 0 (verl-agent uses 1.0)",
                self.omega
            ),
        )?;
        check_range(
            "gamma",
            self.gamma,
            Range::Closed(0.0, 1.0),
            "the discount",
            "verl-agent uses 0.95",
        )?;
        bad(
            self.eps.is_finite() && self.eps >= 0.0,
            format!(
                "`eps` = {}: must be a finite number ≥ 0 (verl uses 1e-6)",
                self.eps
            ),
        )?;
        match (self.anchor_matching, self.similarity_threshold) {
            (Matching::Exact, Some(t)) => Err(PluginError::config(format!(
                "`similarity_threshold` = {t} has no effect with anchor_matching = \"exact\"; set \
                 anchor_matching = \"similar\" or remove it"
            ))),
            (Matching::Similar, Some(t)) => bad(
                t > 0.0 && t < 1.0,
                format!("`similarity_threshold` = {t}: must be in (0, 1) (verl-agent uses 0.95; 1 is exact matching)"),
            ),
            _ => Ok(()),
        }
    }

    fn matching(&self) -> AnchorMatching {
        match self.anchor_matching {
            Matching::Exact => AnchorMatching::Exact,
            Matching::Similar => AnchorMatching::Similar {
                threshold: self.similarity_threshold.unwrap_or(DEFAULT_THRESHOLD),
            },
        }
    }
}

/// Per row `A^E` and `A^S`, and the step groups (indices into `batch.rows`).
struct Levels {
    episode: Vec<f64>,
    step: Vec<f64>,
    groups: Vec<Vec<usize>>,
}

/// The GiGPO algorithm plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct Gigpo {
    config: GigpoConfig,
}

impl Gigpo {
    /// Builds the plugin from its JSON config (the export macro's constructor).
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: GigpoConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(Gigpo { config })
    }

    pub fn config(&self) -> &GigpoConfig {
        &self.config
    }

    /// `A^E` and `A^S` of every row (see the crate docs).
    pub fn row_advantages(&self, batch: &Batch) -> Result<(Vec<f64>, Vec<f64>)> {
        let levels = self.levels(batch)?;
        Ok((levels.episode, levels.step))
    }

    fn levels(&self, batch: &Batch) -> Result<Levels> {
        let c = &self.config;
        let trajs = trajectories(batch)?;
        let mode = match c.mode {
            Mode::MeanNorm => Normalise::Mean,
            Mode::MeanStdNorm => Normalise::MeanStd {
                eps: c.eps,
                std: StdKind::Unbiased,
            },
        };
        let samples = if c.compute_mean_std_cross_steps {
            OutcomeSamples::Rows
        } else {
            OutcomeSamples::Trajectories
        };
        let rewards: Vec<f64> = trajs.iter().map(|t| t.episode_reward).collect();
        let mut episode = vec![0.0; batch.rows.len()];
        for (t, a) in trajs
            .iter()
            .zip(outcome_advantages(&trajs, &rewards, mode, samples))
        {
            for &r in &t.rows {
                episode[r] = a;
            }
        }

        let returns = turn_returns(batch, &trajs, c.gamma)?;
        let mut step = vec![0.0; batch.rows.len()];
        let groups = anchor_groups(batch, c.matching())?;
        for group in &groups {
            let g: Vec<f64> = group.iter().map(|&r| returns[r]).collect();
            if g.len() < 2 || is_constant(&g) {
                continue; // a value minus its own mean: exactly 0
            }
            let mu = mean(&g);
            let f = match c.mode {
                Mode::MeanNorm => 1.0,
                Mode::MeanStdNorm => std(&g, StdKind::Unbiased) + c.eps,
            };
            for (&r, x) in group.iter().zip(&g) {
                step[r] = (x - mu) / f;
            }
        }
        Ok(Levels {
            episode,
            step,
            groups,
        })
    }
}

impl Algorithm for Gigpo {
    fn requirements(&self) -> Requirements {
        Requirements {
            anchor_keys: true,
            step_rewards: true,
            ..Requirements::default()
        }
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let Levels {
            episode,
            step,
            groups,
        } = self.levels(batch)?;
        let combined: Vec<f64> = episode
            .iter()
            .zip(&step)
            .map(|(e, s)| e + self.config.omega * s)
            .collect();
        let sizes: Vec<f64> = groups.iter().map(|g| g.len() as f64).collect();
        let singletons = groups.iter().filter(|g| g.len() == 1).count();
        let metrics = vec![
            ("gigpo/step_group_size_mean".to_string(), mean(&sizes)),
            (
                "gigpo/singleton_step_groups".to_string(),
                if groups.is_empty() {
                    0.0
                } else {
                    singletons as f64 / groups.len() as f64
                },
            ),
            (
                "gigpo/step_advantage_abs_mean".to_string(),
                mean(&step.iter().map(|s| s.abs()).collect::<Vec<_>>()),
            ),
        ];
        Ok(Signals {
            advantages: broadcast_rows(batch, &combined),
            metrics,
            ..Signals::default()
        })
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "gigpo",
    description: "GiGPO: episode-level group advantages plus anchor-state step-level advantages",
    create: Gigpo::from_config_json,
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{OfflineHost, TurnRow};

    use super::*;

    /// docs/algorithms/gigpo.md, worked example: γ = 0.95, one group, three trajectories, success reward 10 on the last
    /// turn. A: s0 → s1, rewards [0, 10]; B: s0 → s2 → s1, [0, 0, 10]; C: s0 → s2 → s2,
    /// [0, 0, 0]. Rows in the order of the table: A t0, A t1, B t0, B t1, B t2, C t0, C t1, C t2.
    fn example(anchors: [&str; 3]) -> Batch {
        let spec = [
            (0, 0, 0, 0.0),
            (0, 1, 1, 10.0),
            (1, 0, 0, 0.0),
            (1, 1, 2, 0.0),
            (1, 2, 1, 10.0),
            (2, 0, 0, 0.0),
            (2, 1, 2, 0.0),
            (2, 2, 2, 0.0),
        ];
        let rows = spec
            .iter()
            .map(|&(traj, turn, anchor, reward)| TurnRow {
                group_id: 3,
                trajectory_id: traj,
                turn,
                anchor: Some(anchors[anchor].to_string()),
                turn_reward: reward,
                episode_reward: if traj == 2 { 0.0 } else { 10.0 },
                response_ids: vec![1, 2, 3],
                response_logprobs: vec![-1.0, -1.0, f32::NAN],
                response_mask: vec![1, 1, 0],
                ..TurnRow::default()
            })
            .collect();
        Batch { step: 0, rows }
    }

    fn signals(config: &str, batch: &Batch) -> Signals {
        Gigpo::from_config_json(config)
            .unwrap()
            .signals(batch, &OfflineHost::default())
            .unwrap()
    }

    /// `check(config, batch, expected A per row)`, to the 1e-4 of the worked example; the
    /// mask-0 slot must stay 0.
    fn check(config: &str, batch: &Batch, expected: &[f64]) {
        let s = signals(config, batch);
        for (r, (adv, want)) in s.advantages.iter().zip(expected).enumerate() {
            assert!(
                (f64::from(adv[0]) - want).abs() < 1e-4 && adv[0] == adv[1],
                "{config}: row {r}: {adv:?} vs {want}"
            );
            assert_eq!(adv[2], 0.0);
        }
    }

    const S: [&str; 3] = ["s0", "s1", "s2"];

    #[test]
    fn worked_example_mean_norm() {
        let g = Gigpo::from_config_json("{}").unwrap();
        let (episode, step) = g.row_advantages(&example(S)).unwrap();
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4);
        assert!(
            close(
                &episode,
                &[3.75, 3.75, 3.75, 3.75, 3.75, -6.25, -6.25, -6.25]
            ),
            "{episode:?}"
        );
        assert!(
            close(
                &step,
                &[3.325, 0.0, 2.85, 6.3333, 0.0, -6.175, -3.1667, -3.1667]
            ),
            "{step:?}"
        );
        check(
            "{}",
            &example(S),
            &[7.075, 3.75, 6.6, 10.0833, 3.75, -12.425, -9.4167, -9.4167],
        );
        // ω scales only the step term.
        check(
            r#"{"omega": 0}"#,
            &example(S),
            &[3.75, 3.75, 3.75, 3.75, 3.75, -6.25, -6.25, -6.25],
        );
    }

    #[test]
    fn worked_example_mean_std_norm() {
        // Row std 5.1755: A t0 → 0.7246 + 0.6211; B t1 → 0.7246 + 1.1547; C t0 → −1.2076 − 1.1536.
        let s = signals(r#"{"mode": "mean_std_norm"}"#, &example(S));
        for (row, want) in [(0, 1.3457), (3, 1.8793), (5, -2.3612)] {
            assert!(
                (f64::from(s.advantages[row][0]) - want).abs() < 1e-4,
                "row {row}: {:?}",
                s.advantages[row]
            );
        }
        // s1 = {10, 10} is constant: its rows carry the episode term only.
        assert!((f64::from(s.advantages[1][0]) - 0.7246).abs() < 1e-4);
    }

    #[test]
    fn episode_statistics_over_trajectories() {
        // Mean over trajectories 6.6667 instead of 6.25.
        let (episode, _) = Gigpo::from_config_json(r#"{"compute_mean_std_cross_steps": false}"#)
            .unwrap()
            .row_advantages(&example(S))
            .unwrap();
        assert!((episode[0] - 10.0 / 3.0).abs() < 1e-12 && (episode[7] + 20.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn fuzzy_anchor_matching() {
        // s0 is written two ways (difflib ratio 0.982); exact matching splits it, "similar"
        // merges it back into the §2e groups.
        let kitchen = "You are in the kitchen. You see a fridge 1 and a table 1.";
        let kitchen2 = "You are in the kitchen. You see a fridge 1 and a table 2.";
        let mut batch = example([
            kitchen,
            "You are in the hallway. You see a door 1.",
            "You are at the fridge 1. It is closed.",
        ]);
        batch.rows[2].anchor = Some(kitchen2.to_string());
        check(
            r#"{"anchor_matching": "similar"}"#,
            &batch,
            &[7.075, 3.75, 6.6, 10.0833, 3.75, -12.425, -9.4167, -9.4167],
        );
        // Exact: s0 = {A t0, C t0} only (B t0 is alone): mean (9.5 + 0)/2.
        check(
            "{}",
            &batch,
            &[
                3.75 + 4.75,
                3.75,
                3.75,
                10.0833,
                3.75,
                -6.25 - 4.75,
                -9.4167,
                -9.4167,
            ],
        );
        // A threshold above the ratio splits it too.
        check(
            r#"{"anchor_matching": "similar", "similarity_threshold": 0.99}"#,
            &batch,
            &[8.5, 3.75, 3.75, 10.0833, 3.75, -11.0, -9.4167, -9.4167],
        );
    }

    #[test]
    fn step_groups_stay_inside_task_groups() {
        // Move trajectory C into another task group: s0 and s2 no longer include its rows, and
        // C's episode term is its own (single trajectory of 3 equal rows → 0).
        let mut batch = example(S);
        for r in &mut batch.rows[5..] {
            r.group_id = 4;
        }
        let (episode, step) = Gigpo::from_config_json("{}")
            .unwrap()
            .row_advantages(&batch)
            .unwrap();
        assert_eq!(&episode[5..], &[0.0, 0.0, 0.0]);
        // Group 3: s0 = {9.5, 9.025}, mean 9.2625; C's s2 = {0, 0}: constant → 0.
        assert!((step[0] - 0.2375).abs() < 1e-12 && (step[2] + 0.2375).abs() < 1e-12);
        assert_eq!(&step[5..], &[0.0, 0.0, 0.0]);
        // B t1 (s2) is now alone in group 3: a singleton gives 0.
        assert_eq!(step[3], 0.0);
    }

    #[test]
    fn requirements_and_errors() {
        let g = Gigpo::from_config_json("{}").unwrap();
        assert!(g.requirements().anchor_keys && g.requirements().step_rewards);
        let err = |json: &str| Gigpo::from_config_json(json).unwrap_err().message;
        assert!(err(r#"{"omega": -0.5}"#).starts_with("`omega` = -0.5"));
        assert!(err(r#"{"gamma": 1.5}"#).starts_with("`gamma` = 1.5"));
        assert!(err(r#"{"similarity_threshold": 0.9}"#)
            .starts_with("`similarity_threshold` = 0.9 has no effect"));
        assert!(
            err(r#"{"anchor_matching": "similar", "similarity_threshold": 1.0}"#)
                .contains("must be in (0, 1)")
        );
        assert!(err(r#"{"mode": "std"}"#).starts_with("`mode`: unknown variant `std`"));
        assert!(err(r#"{"step_advantage_w": 1}"#).contains("unknown field `step_advantage_w`"));
        let mut batch = example(S);
        batch.rows[4].anchor = None;
        let e = Gigpo::from_config_json("{}")
            .unwrap()
            .signals(&batch, &OfflineHost::default())
            .unwrap_err();
        assert!(
            e.message
                .contains("row 4 (trajectory 1, turn 2) has no anchor key"),
            "{e}"
        );
        batch.rows[4].anchor = Some("s1".into());
        batch.rows[4].turn_reward = f32::INFINITY;
        let e = Gigpo::from_config_json("{}")
            .unwrap()
            .signals(&batch, &OfflineHost::default())
            .unwrap_err();
        assert!(e.message.contains("row 4: turn_reward is inf"), "{e}");
    }
}
