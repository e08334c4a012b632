//! `efca`: Environmental Feedback-based Credit Assignment (docs/algorithms/efca.md). A pure
//! A-type plugin that redistributes a trajectory's outcome credit over its turns using what the
//! environment said about each action.
//!
//! **Provenance.** No paper or code for EFCA was found in the public material we could
//! read. Only the idea is the brief's: a short-term feedback signal,
//! a medium-term state-history signal, and return reweighting. Every formula, default and
//! name below is **our proposal**, to be replaced when the source is available.
//!
//! For turn `t` of trajectory `i` (rows in turn order, `T` turns):
//!
//! * short-term `f_t ∈ {−1, 0, +1}`: the row's `feedback` (the environment's classifier: −1
//!   error / invalid / "nothing happens", +1 informative change, 0 otherwise);
//! * medium-term `h_t ∈ {−1, +1}`: −1 when the state this turn's action led to (the next row's
//!   `anchor`) was already visited earlier in the trajectory (a loop or revisit, anchors of turns
//!   `0..=t`), +1 otherwise; the last turn, whose resulting state is not recorded, gets +1;
//! * raw weight `w_t = clip(1 + a·f_t + b·h_t, weight_min, weight_max)`, normalised within the
//!   trajectory to mean 1: `w_t ← w_t · T / Σ_k w_k` (total credit is preserved).
//!
//! Two ways to use the weights (`target`):
//!
//! * `"advantage"` (default): `A_{i,t} = Â_i · w_t`, with `Â_i` the GRPO outcome advantage of
//!   the trajectory's `episode_reward` in its task group (`mode`, `eps`,
//!   `compute_mean_std_cross_steps` as in the grpo plugin: one sample → `μ = 0, s = 1`, equal
//!   samples → 0).
//! * `"returns"`: reweight the discounted turn returns, `G'_{i,t} = G_{i,t} · w_t`
//!   (`G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k}` from `turn_reward`), then GiGPO-style:
//!   `A_{i,t} = A^E_i + omega · (G'_{i,t} − mean_U G')/F_U` over exact anchor-state step groups
//!   `U` of the task group (`F_U` = unbiased std + eps or 1 per `mode`; singleton or constant
//!   step groups give 0).
//!
//! Config keys (JSON object, unknown keys rejected), proposed defaults in parentheses:
//! `feedback_weight` a (0.2), `history_weight` b (0.2), `weight_min` (0.5), `weight_max` (1.5),
//! `target` ("advantage" | "returns"), `mode` ("mean_std_norm" | "mean_norm"), `eps` (1e-6),
//! `compute_mean_std_cross_steps` (true), `gamma` (0.95) and `omega` (1.0), the last two only
//! with `target = "returns"` (rejected otherwise).
//!
//! Metrics: `efca/negative_feedback_fraction`, `efca/revisit_fraction` (rows with `f = −1`,
//! `h = −1`), `efca/weight_min`, `efca/weight_max` (normalised weights over rows).

use cairn_plugin_sdk::config::{check_range, Range};
use cairn_plugin_sdk::stats::{
    anchor_groups, broadcast_rows, is_constant, mean, outcome_advantages, std, trajectories,
    turn_returns, AnchorMatching, Normalise, OutcomeSamples, StdKind, Trajectory,
};
use cairn_plugin_sdk::{Algorithm, Batch, Host, PluginError, Requirements, Result, Signals};
use serde::Deserialize;

/// Where the turn weights act.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// `A_{i,t} = Â_i · w_t`.
    Advantage,
    /// `G'_{i,t} = G_{i,t} · w_t`, then GiGPO-style step normalisation.
    Returns,
}

/// Normalisation of the outcome (and step) advantages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    MeanNorm,
    MeanStdNorm,
}

/// The plugin's config (see the crate docs for the keys).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EfcaConfig {
    pub feedback_weight: f64,
    pub history_weight: f64,
    pub weight_min: f64,
    pub weight_max: f64,
    pub target: Target,
    pub mode: Mode,
    pub eps: f64,
    pub compute_mean_std_cross_steps: bool,
    /// Only with `target = "returns"`; 0.95 when absent.
    pub gamma: Option<f64>,
    /// Only with `target = "returns"`; 1.0 when absent.
    pub omega: Option<f64>,
}

impl Default for EfcaConfig {
    fn default() -> Self {
        EfcaConfig {
            feedback_weight: 0.2,
            history_weight: 0.2,
            weight_min: 0.5,
            weight_max: 1.5,
            target: Target::Advantage,
            mode: Mode::MeanStdNorm,
            eps: 1e-6,
            compute_mean_std_cross_steps: true,
            gamma: None,
            omega: None,
        }
    }
}

impl EfcaConfig {
    /// Rejects invalid values and contradictory combinations, naming the key.
    pub fn validate(&self) -> Result<()> {
        let check = PluginError::check_config;
        for (key, v) in [
            ("feedback_weight", self.feedback_weight),
            ("history_weight", self.history_weight),
        ] {
            check(
                v.is_finite() && v >= 0.0,
                format!("`{key}` = {v}: must be a finite number ≥ 0 (proposed 0.2)"),
            )?;
        }
        check(
            self.weight_min.is_finite() && self.weight_min > 0.0,
            format!(
                "`weight_min` = {}: must be > 0 so every turn keeps some credit (proposed 0.5)",
                self.weight_min
            ),
        )?;
        check(
            self.weight_max.is_finite() && self.weight_max >= self.weight_min,
            format!(
                "`weight_max` = {}: must be ≥ weight_min ({}) (proposed 1.5)",
                self.weight_max, self.weight_min
            ),
        )?;
        check(
            self.eps.is_finite() && self.eps >= 0.0,
            format!("`eps` = {}: must be a finite number ≥ 0", self.eps),
        )?;
        if self.target == Target::Advantage {
            for (key, set) in [
                ("gamma", self.gamma.is_some()),
                ("omega", self.omega.is_some()),
            ] {
                check(
                    !set,
                    format!("`{key}` is only used with target = \"returns\"; remove it or set target = \"returns\""),
                )?;
            }
        }
        let gamma = self.gamma();
        check_range("gamma", gamma, Range::Closed(0.0, 1.0), "the discount", "")?;
        let omega = self.omega();
        check(
            omega.is_finite() && omega >= 0.0,
            format!("`omega` = {omega}: the step weight must be ≥ 0"),
        )
    }

    fn gamma(&self) -> f64 {
        self.gamma.unwrap_or(0.95)
    }

    fn omega(&self) -> f64 {
        self.omega.unwrap_or(1.0)
    }

    fn normalise(&self) -> Normalise {
        match self.mode {
            Mode::MeanNorm => Normalise::Mean,
            Mode::MeanStdNorm => Normalise::MeanStd {
                eps: self.eps,
                std: StdKind::Unbiased,
            },
        }
    }
}

/// The EFCA algorithm plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct Efca {
    config: EfcaConfig,
}

/// The per-turn signals of one row (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnWeight {
    pub feedback: i8,
    pub history: i8,
    /// The normalised weight `w_t` (mean 1 over the trajectory).
    pub weight: f64,
}

impl Efca {
    /// Builds the plugin from its JSON config (the export macro's constructor).
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: EfcaConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(Efca { config })
    }

    pub fn config(&self) -> &EfcaConfig {
        &self.config
    }

    /// `f_t`, `h_t` and the normalised weight `w_t` of every row of `trajs`.
    pub fn turn_weights(&self, batch: &Batch, trajs: &[Trajectory]) -> Result<Vec<TurnWeight>> {
        let c = &self.config;
        let mut out = vec![
            TurnWeight {
                feedback: 0,
                history: 1,
                weight: 1.0
            };
            batch.rows.len()
        ];
        for traj in trajs {
            let mut anchors = Vec::with_capacity(traj.rows.len());
            for &r in &traj.rows {
                let row = &batch.rows[r];
                let Some(a) = row.anchor.as_deref() else {
                    return Err(PluginError::input(format!(
                        "row {r} (trajectory {}, turn {}) has no anchor key; efca needs the \
                         anchor state of every turn to detect revisits",
                        row.trajectory_id, row.turn
                    )));
                };
                if !(-1..=1).contains(&row.feedback) {
                    return Err(PluginError::input(format!(
                        "row {r}: feedback is {}; it must be -1, 0 or +1",
                        row.feedback
                    )));
                }
                anchors.push(a);
            }
            let raw: Vec<f64> = traj
                .rows
                .iter()
                .enumerate()
                .map(|(k, &r)| {
                    let revisit = anchors
                        .get(k + 1)
                        .is_some_and(|next| anchors[..=k].contains(next));
                    let history = if revisit { -1 } else { 1 };
                    let feedback = batch.rows[r].feedback;
                    out[r].feedback = feedback;
                    out[r].history = history;
                    (1.0 + c.feedback_weight * f64::from(feedback)
                        + c.history_weight * f64::from(history))
                    .clamp(c.weight_min, c.weight_max)
                })
                .collect();
            // weight_min > 0, so the sum is positive.
            let scale = raw.len() as f64 / raw.iter().sum::<f64>();
            for (&r, w) in traj.rows.iter().zip(raw) {
                out[r].weight = w * scale;
            }
        }
        Ok(out)
    }

    /// The token advantage of every row, before broadcasting.
    pub fn row_advantages(&self, batch: &Batch) -> Result<Vec<f64>> {
        Ok(self.advantages_and_weights(batch)?.0)
    }

    /// The row advantages and the turn weights they were built from.
    fn advantages_and_weights(&self, batch: &Batch) -> Result<(Vec<f64>, Vec<TurnWeight>)> {
        let c = &self.config;
        let trajs = trajectories(batch)?;
        let weights = self.turn_weights(batch, &trajs)?;
        let rewards: Vec<f64> = trajs.iter().map(|t| t.episode_reward).collect();
        let samples = if c.compute_mean_std_cross_steps {
            OutcomeSamples::Rows
        } else {
            OutcomeSamples::Trajectories
        };
        let outcome = outcome_advantages(&trajs, &rewards, c.normalise(), samples);
        let mut out = vec![0.0; batch.rows.len()];
        match c.target {
            Target::Advantage => {
                for (t, a) in trajs.iter().zip(&outcome) {
                    for &r in &t.rows {
                        out[r] = a * weights[r].weight;
                    }
                }
            }
            Target::Returns => {
                let returns = turn_returns(batch, &trajs, c.gamma())?;
                let reweighted: Vec<f64> = returns
                    .iter()
                    .zip(&weights)
                    .map(|(g, w)| g * w.weight)
                    .collect();
                for (t, a) in trajs.iter().zip(&outcome) {
                    for &r in &t.rows {
                        out[r] = *a;
                    }
                }
                for group in anchor_groups(batch, AnchorMatching::Exact)? {
                    let g: Vec<f64> = group.iter().map(|&r| reweighted[r]).collect();
                    if g.len() < 2 || is_constant(&g) {
                        continue;
                    }
                    let mu = mean(&g);
                    let f = match c.mode {
                        Mode::MeanNorm => 1.0,
                        Mode::MeanStdNorm => std(&g, StdKind::Unbiased) + c.eps,
                    };
                    for (&r, x) in group.iter().zip(&g) {
                        out[r] += c.omega() * (x - mu) / f;
                    }
                }
            }
        }
        Ok((out, weights))
    }
}

impl Algorithm for Efca {
    fn requirements(&self) -> Requirements {
        Requirements {
            feedback: true,
            anchor_keys: true,
            step_rewards: self.config.target == Target::Returns,
            ..Requirements::default()
        }
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let (per_row, weights) = self.advantages_and_weights(batch)?;
        let n = weights.len().max(1) as f64;
        let w: Vec<f64> = weights.iter().map(|t| t.weight).collect();
        let metrics = vec![
            (
                "efca/negative_feedback_fraction".to_string(),
                weights.iter().filter(|t| t.feedback < 0).count() as f64 / n,
            ),
            (
                "efca/revisit_fraction".to_string(),
                weights.iter().filter(|t| t.history < 0).count() as f64 / n,
            ),
            ("efca/weight_min".to_string(), extreme(&w, f64::min)),
            ("efca/weight_max".to_string(), extreme(&w, f64::max)),
        ];
        Ok(Signals {
            advantages: broadcast_rows(batch, &per_row),
            metrics,
            ..Signals::default()
        })
    }
}

/// The min or max of `values`; 0 when empty.
fn extreme(values: &[f64], pick: fn(f64, f64) -> f64) -> f64 {
    values.iter().copied().reduce(pick).unwrap_or(0.0)
}

cairn_plugin_sdk::export_algorithm! {
    name: "efca",
    description: "EFCA (proposal): outcome credit reweighted per turn by environment feedback and state revisits",
    create: Efca::from_config_json,
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{OfflineHost, TurnRow};

    use super::*;

    /// docs/algorithms/efca.md, worked example: a successful 4-turn trajectory (R = 1, reward 1 on the last turn) with
    /// f = [+1, −1, +1, +1] and anchors s0, s1, s2, s1 (turn 2's action returns to s1, so
    /// h = [+1, +1, −1, +1]); and a failed one (R = −0.6) with f = 0 and no revisit. With
    /// mean_norm over rows the group mean is 0.2, so the success has Â = 0.8.
    fn example() -> Batch {
        let traj =
            |id: u64, reward: f32, anchors: [&'static str; 4], feedback: [i8; 4], last: f32| {
                (0..4).map(move |t| TurnRow {
                    group_id: 1,
                    trajectory_id: id,
                    turn: t as u32,
                    episode_reward: reward,
                    turn_reward: if t == 3 { last } else { 0.0 },
                    anchor: Some(anchors[t].to_string()),
                    feedback: feedback[t],
                    response_ids: vec![5, 6],
                    response_logprobs: vec![-0.1, -0.2],
                    response_mask: vec![1, 1],
                    ..TurnRow::default()
                })
            };
        let rows = traj(1, 1.0, ["s0", "s1", "s2", "s1"], [1, -1, 1, 1], 1.0)
            .chain(traj(2, -0.6, ["s0", "s3", "s4", "s5"], [0; 4], 0.0))
            .collect();
        Batch { step: 0, rows }
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn weights_worked_example_section_9e() {
        let efca = Efca::from_config_json("{}").unwrap();
        let batch = example();
        let w = efca
            .turn_weights(&batch, &trajectories(&batch).unwrap())
            .unwrap();
        let h: Vec<i8> = w[..4].iter().map(|t| t.history).collect();
        assert_eq!(h, vec![1, 1, -1, 1]);
        // raw [1.4, 1.0, 1.0, 1.4] → [1.1667, 0.8333, 0.8333, 1.1667]; the failure: all 1.2 → 1.
        close(
            &w.iter().map(|t| t.weight).collect::<Vec<_>>(),
            &[1.1667, 0.8333, 0.8333, 1.1667, 1.0, 1.0, 1.0, 1.0],
        );
    }

    #[test]
    fn advantage_target_section_9e() {
        let efca = Efca::from_config_json(r#"{"mode": "mean_norm"}"#).unwrap();
        close(
            &efca.row_advantages(&example()).unwrap(),
            &[0.9333, 0.6667, 0.6667, 0.9333, -0.8, -0.8, -0.8, -0.8],
        );
        // Credit is preserved: the turn advantages average to Â (0.8 up to the f32 reward −0.6).
        let a = efca.row_advantages(&example()).unwrap();
        assert!((mean(&a[..4]) - 0.8).abs() < 1e-7, "{}", mean(&a[..4]));
        let s = Efca::from_config_json(r#"{"mode": "mean_norm"}"#)
            .unwrap()
            .signals(&example(), &OfflineHost::default())
            .unwrap();
        assert!((f64::from(s.advantages[1][1]) - 0.6667).abs() < 1e-4);
        assert_eq!(
            s.metrics[0],
            ("efca/negative_feedback_fraction".to_string(), 1.0 / 8.0)
        );
        assert_eq!(
            s.metrics[1],
            ("efca/revisit_fraction".to_string(), 1.0 / 8.0)
        );
    }

    #[test]
    fn returns_target_section_9e() {
        // Returns [0.8574, 0.9025, 0.95, 1.0] → reweighted [1.0003, 0.7521, 0.7917, 1.1667].
        let batch = example();
        let trajs = trajectories(&batch).unwrap();
        let efca = Efca::from_config_json(r#"{"target": "returns", "mode": "mean_norm"}"#).unwrap();
        let w = efca.turn_weights(&batch, &trajs).unwrap();
        let g = turn_returns(&batch, &trajs, 0.95).unwrap();
        let reweighted: Vec<f64> = g
            .iter()
            .zip(&w)
            .map(|(g, w)| g * w.weight)
            .take(4)
            .collect();
        close(&reweighted, &[1.0003, 0.7521, 0.7917, 1.1667]);
        // Step groups: s0 = {1.0003, 0} (mean 0.50014), s1 = {0.7521, 1.1667} (mean 0.9594),
        // everything else a singleton; plus A^E = ±0.8.
        close(
            &efca.row_advantages(&batch).unwrap(),
            &[
                1.3001354, 0.5927083, 0.8, 1.0072917, -1.3001354, -0.8, -0.8, -0.8,
            ],
        );
        assert!(efca.requirements().step_rewards && efca.requirements().feedback);
    }

    #[test]
    fn default_mode_divides_by_the_group_std() {
        // mean_std_norm over the 8 rows: rewards four 1.0, four −0.6 → s = 0.8552, Â = ±0.9354.
        let a = Efca::from_config_json("{}")
            .unwrap()
            .row_advantages(&example())
            .unwrap();
        let s = (8.0f64 * 0.64 / 7.0).sqrt();
        close(
            &a[..2],
            &[0.8 / (s + 1e-6) * 7.0 / 6.0, 0.8 / (s + 1e-6) * 5.0 / 6.0],
        );
    }

    #[test]
    fn clipping_bounds_raw_weights() {
        // a = b = 0.4: f = +1, h = +1 → 1.8 clipped to 1.5; f = −1, h = −1 → 0.2 clipped to 0.5.
        let mut batch = example();
        let efca =
            Efca::from_config_json(r#"{"feedback_weight": 0.4, "history_weight": 0.4}"#).unwrap();
        let w = efca
            .turn_weights(&batch, &trajectories(&batch).unwrap())
            .unwrap();
        // raw [1.5, 1.0 − 0.4 + 0.4 = 1.0, clip(1 + 0.4 − 0.4) = 1.0, 1.5] → sum 5.
        close(
            &w[..4].iter().map(|t| t.weight).collect::<Vec<_>>(),
            &[1.2, 0.8, 0.8, 1.2],
        );
        batch.rows[2].feedback = -1;
        let w = efca
            .turn_weights(&batch, &trajectories(&batch).unwrap())
            .unwrap();
        // raw [1.5, 1.0, clip(0.2) = 0.5, 1.5] → sum 4.5.
        close(
            &w[..4].iter().map(|t| t.weight).collect::<Vec<_>>(),
            &[4.0 / 3.0, 8.0 / 9.0, 4.0 / 9.0, 4.0 / 3.0],
        );
    }

    #[test]
    fn config_and_input_errors() {
        let err = |json: &str| Efca::from_config_json(json).unwrap_err().message;
        assert!(err(r#"{"weight_min": 0}"#).starts_with("`weight_min` = 0"));
        assert!(err(r#"{"weight_max": 0.4}"#).starts_with("`weight_max` = 0.4"));
        assert!(err(r#"{"history_weight": -1}"#).starts_with("`history_weight` = -1"));
        assert!(
            err(r#"{"gamma": 0.9}"#).starts_with("`gamma` is only used with target = \"returns\"")
        );
        assert!(err(r#"{"target": "returns", "gamma": 2}"#).starts_with("`gamma` = 2"));
        assert!(err(r#"{"target": "tokens"}"#).starts_with("`target`: unknown variant `tokens`"));
        let efca = Efca::from_config_json("{}").unwrap();
        let mut batch = example();
        batch.rows[6].feedback = 2;
        let e = efca.signals(&batch, &OfflineHost::default()).unwrap_err();
        assert!(e.message.contains("row 6: feedback is 2"), "{e}");
        batch.rows[6].feedback = 0;
        batch.rows[2].anchor = None;
        let e = efca.signals(&batch, &OfflineHost::default()).unwrap_err();
        assert!(
            e.message
                .contains("row 2 (trajectory 1, turn 2) has no anchor key"),
            "{e}"
        );
    }
}
