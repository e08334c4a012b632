//! `eapo`: Efficient Agentic Policy Optimization, "learning when not to act" (arXiv
//! 2606.02132; docs/algorithms/eapo.md). An A-type plugin with a rollout-time decision: some slots of every group run without
//! tools, and their success tells how easy the query is.
//!
//! **Provenance.** From the paper (arXiv 2606.02132, abstract and front matter only): each
//! rollout group contains tool-free trajectories; difficulty-aware reward shaping penalises
//! redundant tool calls mainly on easy queries; confidence-aware token reweighting. **Every
//! formula and constant below is our proposal** (docs/algorithms/eapo.md), not the paper's.
//!
//! 1. **Tool-free slots** ([`Algorithm::plan_group`]): the first `tool_free_slots` slots of each
//!    group get the variant `{label: "tools-off", tools_enabled: false}` (the kernel removes the
//!    tool schema and blocks tool calls); the others the plain context.
//! 2. **Easiness** of the group's query: `e_q` = success rate of its tool-free trajectories
//!    (rows with `variant.tools_enabled = false`); 0 when the group has none (tools are then
//!    free).
//! 3. **Difficulty-aware shaping**: `r_i = R_i − λ · e_q · min(n_i, n_max) · max(R_i, 0)`, with
//!    `R_i` the episode reward (correctness) and `n_i` the trajectory's tool calls (Σ of its
//!    rows' `tool_calls`). Only rewarded answers are penalised: on an easy query a correct
//!    tool-free answer beats a correct tool-heavy one; on a hard query (`e_q = 0`) tools are
//!    free. `λ·n_max ≤ 1` is required, so a correct answer never scores below zero.
//! 4. **GRPO advantage** `Â_i` of the shaped rewards over the whole group (tool-free slots
//!    included), as the grpo plugin: `(r − μ)/(s + eps)` with the unbiased std (or `r − μ` with
//!    `norm_adv_by_std = false`), statistics over rows or trajectories
//!    (`compute_mean_std_cross_steps`); one sample → `μ = 0, s = 1`; equal samples → 0.
//! 5. **Confidence-aware token weights** from the sampling log-probs `ℓ_old` (the rows'
//!    `response_logprobs`), `p_l = exp(min(ℓ_old,l, 0))`: for `Â > 0`, `u_l = 1 + κ(1 − p_l)`
//!    (uncertain tokens that led to success); for `Â < 0`, `u_l = 1 + κ p_l` (confident
//!    mistakes); for `Â = 0`, `u_l = 1`. Normalised to mean 1 over each row's trainable tokens;
//!    the token advantage is `A_l = u_l · Â_i`.
//!
//! Config keys (JSON object, unknown keys rejected), proposed defaults in parentheses:
//! `tool_free_slots` (2; ≥ 1), `tool_penalty` λ (0.1), `max_penalised_calls` n_max (5),
//! `kappa` κ (0.5), `norm_adv_by_std` (true), `eps` (1e-6), `compute_mean_std_cross_steps`
//! (true). Group size 8 is the proposal's (a pipeline setting; the plugin requires at least
//! `tool_free_slots + 1`).
//!
//! Metrics: `eapo/easiness_mean` (mean `e_q` over groups), `eapo/tool_calls_mean` (per
//! trajectory), `eapo/shaping_penalty_mean` (mean `R_i − r_i` over trajectories),
//! `eapo/groups_without_tool_free` (count).

use cairn_plugin_sdk::stats::{
    group_indices, mean, outcome_advantages, trajectories, Normalise, OutcomeSamples, StdKind,
};
use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, GroupRequest, Host, PluginError, Requirements, Result,
    Signals,
};
use serde::Deserialize;

/// The variant label of a tool-free slot.
pub const TOOLS_OFF: &str = "tools-off";

/// The plugin's config (see the crate docs for the keys).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EapoConfig {
    pub tool_free_slots: u32,
    pub tool_penalty: f64,
    pub max_penalised_calls: u32,
    pub kappa: f64,
    pub norm_adv_by_std: bool,
    pub eps: f64,
    pub compute_mean_std_cross_steps: bool,
}

impl Default for EapoConfig {
    fn default() -> Self {
        EapoConfig {
            tool_free_slots: 2,
            tool_penalty: 0.1,
            max_penalised_calls: 5,
            kappa: 0.5,
            norm_adv_by_std: true,
            eps: 1e-6,
            compute_mean_std_cross_steps: true,
        }
    }
}

impl EapoConfig {
    /// Rejects invalid values, naming the key.
    pub fn validate(&self) -> Result<()> {
        let check = PluginError::check_config;
        check(
            self.tool_free_slots >= 1,
            "`tool_free_slots` = 0: EAPO needs at least one tool-free rollout per group to measure \
             easiness (use the grpo plugin for plain GRPO)"
                .into(),
        )?;
        check(
            self.tool_penalty.is_finite() && self.tool_penalty >= 0.0,
            format!(
                "`tool_penalty` = {}: must be a finite number ≥ 0 (proposed 0.1)",
                self.tool_penalty
            ),
        )?;
        check(
            self.tool_penalty * f64::from(self.max_penalised_calls) <= 1.0,
            format!(
                "`tool_penalty` × max_penalised_calls = {} × {} > 1: a correct answer could score \
                 below a wrong one; lower one of them",
                self.tool_penalty, self.max_penalised_calls
            ),
        )?;
        check(
            self.kappa.is_finite() && self.kappa >= 0.0,
            format!(
                "`kappa` = {}: must be a finite number ≥ 0 (proposed 0.5)",
                self.kappa
            ),
        )?;
        check(
            self.eps.is_finite() && self.eps >= 0.0,
            format!("`eps` = {}: must be a finite number ≥ 0", self.eps),
        )
    }
}

/// The EAPO algorithm plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct Eapo {
    config: EapoConfig,
}

/// Shaping of one trajectory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shaped {
    /// `e_q` of its group.
    pub easiness: f64,
    /// `n_i`, tool calls over all turns.
    pub tool_calls: u32,
    /// `r_i`.
    pub reward: f64,
}

impl Eapo {
    /// Builds the plugin from its JSON config (the export macro's constructor).
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: EapoConfig = cairn_plugin_sdk::config::parse_config(json)?;
        config.validate()?;
        Ok(Eapo { config })
    }

    pub fn config(&self) -> &EapoConfig {
        &self.config
    }

    /// Easiness, tool calls and shaped reward of every trajectory (in [`trajectories`] order).
    pub fn shape(&self, batch: &Batch) -> Result<Vec<Shaped>> {
        let c = &self.config;
        let trajs = trajectories(batch)?;
        let mut tool_free = Vec::with_capacity(trajs.len());
        for t in &trajs {
            let first = &batch.rows[t.rows[0]];
            if let Some(&r) = t
                .rows
                .iter()
                .find(|&&r| batch.rows[r].variant.tools_enabled != first.variant.tools_enabled)
            {
                return Err(PluginError::input(format!(
                    "rows {} and {r} of trajectory {} differ in variant.tools_enabled; a rollout \
                     slot keeps its variant on every turn",
                    t.rows[0], t.id
                )));
            }
            tool_free.push(!first.variant.tools_enabled);
        }
        let mut out = vec![
            Shaped {
                easiness: 0.0,
                tool_calls: 0,
                reward: 0.0
            };
            trajs.len()
        ];
        for group in group_indices(&trajs.iter().map(|t| t.group_id).collect::<Vec<_>>()) {
            let free: Vec<f64> = group
                .iter()
                .filter(|&&i| tool_free[i])
                .map(|&i| if trajs[i].success { 1.0 } else { 0.0 })
                .collect();
            let easiness = mean(&free);
            for &i in &group {
                let t = &trajs[i];
                let calls: u32 = t.rows.iter().map(|&r| batch.rows[r].tool_calls).sum();
                let penalised = f64::from(calls.min(c.max_penalised_calls));
                let reward = t.episode_reward
                    - c.tool_penalty * easiness * penalised * t.episode_reward.max(0.0);
                out[i] = Shaped {
                    easiness,
                    tool_calls: calls,
                    reward,
                };
            }
        }
        Ok(out)
    }

    /// Confidence weights `u_l` of one row, normalised to mean 1 over its trainable tokens
    /// (mask-0 slots: 0). `row` names the row in errors.
    pub fn token_weights(
        &self,
        row: usize,
        logprobs: &[f32],
        mask: &[u8],
        advantage: f64,
    ) -> Result<Vec<f64>> {
        let mut raw = vec![0.0; mask.len()];
        for (l, (&lp, _)) in logprobs
            .iter()
            .zip(mask)
            .enumerate()
            .filter(|(_, (_, &m))| m == 1)
        {
            if !lp.is_finite() {
                return Err(PluginError::input(format!(
                    "row {row}, token {l}: response_logprobs is {lp} on a trainable token"
                )));
            }
            let p = f64::from(lp).min(0.0).exp();
            raw[l] = if advantage > 0.0 {
                1.0 + self.config.kappa * (1.0 - p)
            } else if advantage < 0.0 {
                1.0 + self.config.kappa * p
            } else {
                1.0
            };
        }
        let n = mask.iter().filter(|&&m| m == 1).count() as f64;
        let total: f64 = raw.iter().sum();
        // Every raw weight is ≥ 1, so the total is positive whenever n > 0.
        let scale = if n > 0.0 { n / total } else { 0.0 };
        Ok(raw.into_iter().map(|u| u * scale).collect())
    }
}

impl Algorithm for Eapo {
    fn requirements(&self) -> Requirements {
        Requirements {
            tool_free_slots: true,
            min_group_size: self.config.tool_free_slots + 1,
            ..Requirements::default()
        }
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        _host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let free = self.config.tool_free_slots;
        if request.group_size <= free {
            return Err(PluginError::config(format!(
                "`tool_free_slots` = {free} leaves no tool-enabled slot in group {} of size {}; \
                 raise the group size or lower tool_free_slots",
                request.group_id, request.group_size
            )));
        }
        let off = ContextVariant {
            label: TOOLS_OFF.into(),
            tools_enabled: false,
            ..ContextVariant::default()
        };
        Ok((0..request.group_size)
            .map(|k| {
                if k < free {
                    off.clone()
                } else {
                    ContextVariant::default()
                }
            })
            .collect())
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> Result<Signals> {
        batch.validate()?;
        let c = &self.config;
        let trajs = trajectories(batch)?;
        let shaped = self.shape(batch)?;
        let rewards: Vec<f64> = shaped.iter().map(|s| s.reward).collect();
        let mode = if c.norm_adv_by_std {
            Normalise::MeanStd {
                eps: c.eps,
                std: StdKind::Unbiased,
            }
        } else {
            Normalise::Mean
        };
        let samples = if c.compute_mean_std_cross_steps {
            OutcomeSamples::Rows
        } else {
            OutcomeSamples::Trajectories
        };
        let per_traj = outcome_advantages(&trajs, &rewards, mode, samples);

        let mut advantages = batch.zeros_like_responses();
        for (t, &a) in trajs.iter().zip(&per_traj) {
            for &r in &t.rows {
                let row = &batch.rows[r];
                let u = self.token_weights(r, &row.response_logprobs, &row.response_mask, a)?;
                advantages[r] = u.iter().map(|w| (w * a) as f32).collect();
            }
        }

        let groups = group_indices(&trajs.iter().map(|t| t.group_id).collect::<Vec<_>>());
        let easiness: Vec<f64> = groups.iter().map(|g| shaped[g[0]].easiness).collect();
        let without_free = groups
            .iter()
            .filter(|g| {
                g.iter()
                    .all(|&i| batch.rows[trajs[i].rows[0]].variant.tools_enabled)
            })
            .count();
        let calls: Vec<f64> = shaped.iter().map(|s| f64::from(s.tool_calls)).collect();
        let penalty: Vec<f64> = trajs
            .iter()
            .zip(&shaped)
            .map(|(t, s)| t.episode_reward - s.reward)
            .collect();
        let metrics = vec![
            ("eapo/easiness_mean".to_string(), mean(&easiness)),
            ("eapo/tool_calls_mean".to_string(), mean(&calls)),
            ("eapo/shaping_penalty_mean".to_string(), mean(&penalty)),
            (
                "eapo/groups_without_tool_free".to_string(),
                without_free as f64,
            ),
        ];
        Ok(Signals {
            advantages,
            metrics,
            ..Signals::default()
        })
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "eapo",
    description: "EAPO (proposal): tool-free slots, difficulty-aware tool-call shaping, confidence-aware token weights",
    create: Eapo::from_config_json,
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::{OfflineHost, TurnRow};

    use super::*;

    /// One single-turn trajectory: tool-free?, correct?, tool calls, sampled log-probs.
    fn traj(id: u64, tool_free: bool, correct: bool, calls: u32, logprobs: &[f32]) -> TurnRow {
        TurnRow {
            group_id: 1,
            trajectory_id: id,
            variant: if tool_free {
                ContextVariant {
                    label: TOOLS_OFF.into(),
                    tools_enabled: false,
                    ..ContextVariant::default()
                }
            } else {
                ContextVariant::default()
            },
            episode_reward: if correct { 1.0 } else { 0.0 },
            success: correct,
            tool_calls: calls,
            response_ids: vec![3; logprobs.len() + 1],
            response_logprobs: [logprobs, &[f32::NAN]].concat(),
            response_mask: [vec![1; logprobs.len()], vec![0]].concat(),
            ..TurnRow::default()
        }
    }

    /// docs/algorithms/eapo.md, worked example: group of 6, two tool-free: (tf, 1, 0) ×2, (tool, 1, 2), (tool, 1, 1),
    /// (tool, 0, 3), (tool, 1, 0). Uniform log-probs so the token weights are all 1.
    fn example(free_correct: bool) -> Batch {
        let lp = [-0.5f32, -0.5];
        let rows = vec![
            traj(0, true, free_correct, 0, &lp),
            traj(1, true, free_correct, 0, &lp),
            traj(2, false, true, 2, &lp),
            traj(3, false, true, 1, &lp),
            traj(4, false, false, 3, &lp),
            traj(5, false, true, 0, &lp),
        ];
        Batch { step: 0, rows }
    }

    fn close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < tol, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn shaping_worked_example_section_11e() {
        let eapo = Eapo::from_config_json("{}").unwrap();
        let shaped = eapo.shape(&example(true)).unwrap();
        assert_eq!(shaped[0].easiness, 1.0);
        close(
            &shaped.iter().map(|s| s.reward).collect::<Vec<_>>(),
            &[1.0, 1.0, 0.8, 0.9, 0.0, 1.0],
            1e-12,
        );
        let s = Eapo::from_config_json("{}")
            .unwrap()
            .signals(&example(true), &OfflineHost::default())
            .unwrap();
        let a: Vec<f64> = s.advantages.iter().map(|a| f64::from(a[0])).collect();
        close(&a, &[0.5527, 0.5527, 0.0425, 0.2976, -1.9983, 0.5527], 1e-4);
        assert!(s.advantages.iter().all(|a| a[0] == a[1] && a[2] == 0.0));
        // Both tool-free rollouts fail: e_q = 0, the shaped rewards are the correctness.
        let shaped = eapo.shape(&example(false)).unwrap();
        assert_eq!(shaped[0].easiness, 0.0);
        close(
            &shaped.iter().map(|s| s.reward).collect::<Vec<_>>(),
            &[0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
            1e-12,
        );
    }

    #[test]
    fn token_weights_worked_example_section_11e() {
        // p = [0.95, 0.40, 0.70], κ = 0.5.
        let eapo = Eapo::from_config_json("{}").unwrap();
        let lp: Vec<f32> = [0.95f64, 0.40, 0.70]
            .iter()
            .map(|p| p.ln() as f32)
            .collect();
        let mask = [1, 1, 1];
        close(
            &eapo.token_weights(0, &lp, &mask, 0.7).unwrap(),
            &[0.8849, 1.1223, 0.9928],
            1e-4,
        );
        close(
            &eapo.token_weights(0, &lp, &mask, -0.7).unwrap(),
            &[1.0994, 0.8944, 1.0062],
            1e-4,
        );
        close(
            &eapo.token_weights(0, &lp, &mask, 0.0).unwrap(),
            &[1.0, 1.0, 1.0],
            1e-12,
        );
        // Masked slots are skipped even when NaN, and excluded from the mean.
        let w = eapo
            .token_weights(0, &[lp[0], f32::NAN, lp[1], lp[2]], &[1, 0, 1, 1], 0.7)
            .unwrap();
        close(&w, &[0.8849, 0.0, 1.1223, 0.9928], 1e-4);
        let e = eapo.token_weights(3, &[f32::NAN], &[1], 1.0).unwrap_err();
        assert!(e.message.contains("row 3, token 0"), "{e}");
    }

    #[test]
    fn weights_reach_the_advantages() {
        // The correct tool-heavy trajectory (row 2, Â = 0.0425 > 0) with log-probs of
        // p = [0.95, 0.40]: u ∝ [1.025, 1.3] → mean 1.
        let mut batch = example(true);
        let lp: Vec<f32> = [0.95f64, 0.40].iter().map(|p| p.ln() as f32).collect();
        batch.rows[2] = traj(2, false, true, 2, &lp);
        let s = Eapo::from_config_json("{}")
            .unwrap()
            .signals(&batch, &OfflineHost::default())
            .unwrap();
        let (u0, u1) = (1.025 / 1.1625, 1.3 / 1.1625);
        close(
            &[f64::from(s.advantages[2][0]), f64::from(s.advantages[2][1])],
            &[0.0425 * u0, 0.0425 * u1],
            1e-4,
        );
        assert_eq!(s.metrics[0], ("eapo/easiness_mean".to_string(), 1.0));
        assert_eq!(s.metrics[1], ("eapo/tool_calls_mean".to_string(), 1.0));
    }

    #[test]
    fn plan_puts_tool_free_slots_first() {
        let mut eapo = Eapo::from_config_json("{}").unwrap();
        let request = GroupRequest {
            step: 0,
            group_id: 9,
            task_id: "t".into(),
            group_size: 8,
            ..GroupRequest::default()
        };
        let plan = eapo.plan_group(&request, &OfflineHost::default()).unwrap();
        assert_eq!(plan.len(), 8);
        assert!(plan[..2]
            .iter()
            .all(|v| v.label == TOOLS_OFF && !v.tools_enabled));
        assert!(plan[2..].iter().all(|v| *v == ContextVariant::default()));
        let req = eapo.requirements();
        assert!(req.tool_free_slots && req.min_group_size == 3);
        let e = eapo
            .plan_group(
                &GroupRequest {
                    group_size: 2,
                    ..request
                },
                &OfflineHost::default(),
            )
            .unwrap_err();
        assert!(
            e.message
                .starts_with("`tool_free_slots` = 2 leaves no tool-enabled slot"),
            "{e}"
        );
    }

    #[test]
    fn config_and_input_errors() {
        let err = |json: &str| Eapo::from_config_json(json).unwrap_err().message;
        assert!(err(r#"{"tool_free_slots": 0}"#).starts_with("`tool_free_slots` = 0"));
        assert!(err(r#"{"tool_penalty": 0.3}"#)
            .starts_with("`tool_penalty` × max_penalised_calls = 0.3 × 5 > 1"));
        assert!(err(r#"{"kappa": -0.1}"#).starts_with("`kappa` = -0.1"));
        assert!(err(r#"{"lambda": 0.1}"#).contains("unknown field `lambda`"));
        assert!(err(r#"{"tool_free_slots": -1}"#).starts_with("`tool_free_slots`: invalid value"));
        let mut batch = example(true);
        batch.rows.push(TurnRow {
            turn: 1,
            ..traj(2, true, true, 0, &[-0.1])
        });
        let e = Eapo::from_config_json("{}")
            .unwrap()
            .signals(&batch, &OfflineHost::default())
            .unwrap_err();
        assert!(e.message.contains("differ in variant.tools_enabled"), "{e}");
    }

    #[test]
    fn groups_without_tool_free_rollouts_have_free_tools() {
        let mut batch = example(true);
        batch.rows.truncate(2);
        for r in &mut batch.rows {
            r.group_id = 7;
        }
        batch.rows.extend(example(true).rows[2..].iter().cloned());
        // Group 7: only tool-free; group 1: only tool rollouts → e_q = 0, rewards unshaped.
        let shaped = Eapo::from_config_json("{}").unwrap().shape(&batch).unwrap();
        assert_eq!(
            shaped.iter().map(|s| s.reward).collect::<Vec<_>>(),
            vec![1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
        );
        let s = Eapo::from_config_json("{}")
            .unwrap()
            .signals(&batch, &OfflineHost::default())
            .unwrap();
        assert_eq!(
            s.metrics[3],
            ("eapo/groups_without_tool_free".to_string(), 1.0)
        );
    }
}
