//! `hint`: the worked example of a scaffold plugin (`plugin-sdk/README.md`, "Writing a
//! scaffold plugin"). It is a [`Role::Planner`], stacked on an advantage estimator:
//!
//! ```toml
//! [algorithm]
//! plugin = "grpo"
//! [[algorithm.stack]]
//! plugin = "hint"
//! config = { hint = "Objects are usually where they were last seen.", coef = 0.5 }
//! ```
//!
//! It uses each hook of the SDK once:
//! 1. **Planner** ([`Algorithm::plan_group`]): the first half of each group's slots get the
//!    hint injected into the prompt (label `hint`, `extra.hinted = true`), the other half
//!    play plain — the A/B split of the experience-distillation family (EDGE, arXiv
//!    2608.21946).
//! 2. **Per-turn context** ([`Algorithm::next_context`]): a hinted slot whose last action the
//!    environment rejected (feedback −1) gets a second, corrective sentence for the next turn.
//! 3. **Teacher target** ([`Signals::teacher`]): in a group where the hinted half did better on
//!    average, every plain row is distilled toward the policy *with* the hint: a live teacher
//!    on the row's own sampled tokens, its context rendered by [`Host::render_prompt`] so the
//!    ids are exactly the ones the policy would see (sampled-token reverse KL).
//! 4. **State and the bank** ([`Algorithm::observe`], `save_state`): counts steps and groups
//!    where the hint helped (checkpointed with the run), and writes an evidence card into the
//!    experience bank for each such group; `plan_group` retrieves the task's cards
//!    ([`Host::bank_query`]) and records how many there are on the hinted variant.
//!
//! The scaffold is training-time only: evaluations and the exported model never see it.

use cairn_plugin_sdk::stats::group_indices;
use cairn_plugin_sdk::{
    Algorithm, BankQuery, Batch, ContextVariant, EntryKind, GroupRequest, Host, NewEntry,
    PluginError, Provenance, RenderRequest, Requirements, Result, Role, Signals, StepReport,
    TeacherForm, TeacherSource, TeacherTarget, TeacherTerm, TurnContext, TurnContextRequest,
};
use serde::{Deserialize, Serialize};

/// The label of hinted slots.
pub const HINT: &str = "hint";

/// `algorithm.stack[i].config` of `hint`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HintConfig {
    /// Injected into hinted prompts.
    pub hint: String,
    /// Added after a rejected action, for the next turn of a hinted slot.
    pub correction: String,
    /// Coefficient of the distillation term.
    pub coef: f32,
}

impl Default for HintConfig {
    fn default() -> Self {
        HintConfig {
            hint: "Hint: pick one of the admissible actions that moves you toward the goal.".into(),
            correction: "The last action was rejected; choose an admissible one.".into(),
            coef: 0.5,
        }
    }
}

/// What the plugin keeps across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HintState {
    pub steps: u64,
    /// Groups in which the hinted half had the higher mean reward.
    pub helped_groups: u64,
    pub groups: u64,
}

pub struct Hint {
    config: HintConfig,
    state: HintState,
}

impl Hint {
    pub fn from_config_json(json: &str) -> Result<Self> {
        let config: HintConfig = cairn_plugin_sdk::config::parse_config(json)?;
        if config.hint.trim().is_empty() {
            return Err(PluginError::config(
                "`hint` is empty: give the text to inject into hinted prompts",
            ));
        }
        if !(config.coef >= 0.0 && config.coef.is_finite()) {
            return Err(PluginError::config(format!(
                "`coef` = {} must be a finite number >= 0",
                config.coef
            )));
        }
        Ok(Hint {
            config,
            state: HintState::default(),
        })
    }

    fn hinted(&self) -> ContextVariant {
        let mut extra = serde_json::Map::new();
        extra.insert("hinted".into(), serde_json::Value::Bool(true));
        ContextVariant {
            label: HINT.into(),
            inject: self.config.hint.clone(),
            extra,
            ..ContextVariant::default()
        }
    }
}

fn is_hinted(v: &ContextVariant) -> bool {
    v.extra.get("hinted") == Some(&serde_json::Value::Bool(true))
}

/// How the two halves of a group did.
#[derive(Clone, Debug, PartialEq)]
pub struct Contrast {
    pub group_id: u64,
    pub task_id: String,
    /// Mean episode reward of the hinted and of the plain trajectories.
    pub hinted: f64,
    pub plain: f64,
    pub trajectories: Vec<u64>,
}

impl Contrast {
    pub fn helped(&self) -> bool {
        self.hinted > self.plain
    }
}

/// Per group with both halves: the mean episode reward of each half.
pub fn contrasts(batch: &Batch) -> Vec<Contrast> {
    let groups = group_indices(&batch.rows.iter().map(|r| r.group_id).collect::<Vec<_>>());
    let mut out = Vec::new();
    for rows in groups {
        let trajectories = group_indices(
            &rows
                .iter()
                .map(|&i| batch.rows[i].trajectory_id)
                .collect::<Vec<_>>(),
        );
        let (mut hinted, mut plain) = (Vec::new(), Vec::new());
        let mut ids = Vec::new();
        for t in trajectories {
            let row = &batch.rows[rows[t[0]]];
            ids.push(row.trajectory_id);
            if is_hinted(&row.variant) {
                hinted.push(f64::from(row.episode_reward));
            } else {
                plain.push(f64::from(row.episode_reward));
            }
        }
        if hinted.is_empty() || plain.is_empty() {
            continue;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let first = &batch.rows[rows[0]];
        out.push(Contrast {
            group_id: first.group_id,
            task_id: first.task_id.clone(),
            hinted: mean(&hinted),
            plain: mean(&plain),
            trajectories: ids,
        });
    }
    out
}

impl Algorithm for Hint {
    fn requirements(&self) -> Requirements {
        Requirements {
            role: Role::Planner,
            turn_context: true,
            even_group_size: true,
            min_group_size: 2,
            bank: vec![EntryKind::EvidenceCard],
            ..Requirements::default()
        }
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> Result<Vec<ContextVariant>> {
        let cards = host.bank_query(&BankQuery {
            kinds: vec![EntryKind::EvidenceCard],
            task_id: Some(request.task_id.clone()),
            include_general: false,
            k: 16,
            ..BankQuery::default()
        })?;
        let mut hinted = self.hinted();
        hinted
            .extra
            .insert("evidence_cards".into(), serde_json::json!(cards.len()));
        let half = request.group_size / 2;
        Ok((0..request.group_size)
            .map(|k| {
                if k < half {
                    hinted.clone()
                } else {
                    ContextVariant::default()
                }
            })
            .collect())
    }

    fn next_context(
        &mut self,
        request: &TurnContextRequest,
        _host: &dyn Host,
    ) -> Result<TurnContext> {
        let rejected = request.turns.last().is_some_and(|t| t.feedback < 0);
        if !is_hinted(&request.variant) || !rejected {
            return Ok(TurnContext::Keep);
        }
        let mut variant = self.hinted();
        variant.inject = format!("{} {}", self.config.hint, self.config.correction);
        variant.label = format!("{HINT}+correction");
        Ok(TurnContext::Variant { variant })
    }

    fn signals(&self, batch: &Batch, host: &dyn Host) -> Result<Signals> {
        let helped: std::collections::HashSet<u64> = contrasts(batch)
            .into_iter()
            .filter(Contrast::helped)
            .map(|c| c.group_id)
            .collect();
        let mut targets = Vec::new();
        for (i, row) in batch.rows.iter().enumerate() {
            if !helped.contains(&row.group_id) || is_hinted(&row.variant) {
                continue;
            }
            let context_ids = host.render_prompt(&RenderRequest::for_row(self.hinted(), row))?;
            targets.push(TeacherTarget {
                row: i,
                weights: row.mask_weights(1.0),
                source: TeacherSource::Context { context_ids },
            });
        }
        let distilled = targets.len();
        Ok(Signals {
            teacher: vec![TeacherTerm {
                name: "hint-distill".into(),
                coef: self.config.coef,
                form: TeacherForm::SampledReverseKl,
                targets,
            }],
            metrics: vec![
                ("hint/groups_helped".into(), helped.len() as f64),
                ("hint/rows_distilled".into(), distilled as f64),
            ],
            ..Signals::default()
        })
    }

    fn observe(&mut self, report: &StepReport, host: &dyn Host) -> Result<()> {
        let all = contrasts(&report.batch);
        let cards: Vec<NewEntry> = all
            .iter()
            .filter(|c| c.helped())
            .map(|c| NewEntry {
                kind: EntryKind::EvidenceCard,
                text: format!(
                    "On task {}, the hint raised the mean reward from {:.2} to {:.2}.",
                    c.task_id, c.plain, c.hinted
                ),
                task_id: Some(c.task_id.clone()),
                provenance: Provenance {
                    source_trajectories: c.trajectories.clone(),
                    ..Provenance::default()
                },
                ..NewEntry::default()
            })
            .collect();
        if !cards.is_empty() {
            host.bank_put(&cards)?;
        }
        self.state.steps += 1;
        self.state.groups += all.len() as u64;
        self.state.helped_groups += cards.len() as u64;
        Ok(())
    }

    fn save_state(&self) -> Result<String> {
        cairn_plugin_sdk::state::save_state("hint", &self.state)
    }

    fn load_state(&mut self, state: &str) -> Result<()> {
        if let Some(state) = cairn_plugin_sdk::state::load_state("hint", state)? {
            self.state = state;
        }
        Ok(())
    }
}

cairn_plugin_sdk::export_algorithm! {
    name: "hint",
    description: "worked scaffold example: half-group hints, a per-turn correction, distillation of the hinted policy into the plain one",
    create: Hint::from_config_json,
}

#[cfg(test)]
mod tests {
    use super::*;
    // The SDK's mock host renders a prompt as the bytes of `inject + "|" + observation` and
    // keeps the bank entries put into it.
    use cairn_plugin_sdk::testing::MockHost;
    use cairn_plugin_sdk::{OfflineHost, TurnRow, TurnSummary};

    fn row(group: u64, traj: u64, hinted: bool, reward: f32) -> TurnRow {
        let mut variant = ContextVariant::default();
        if hinted {
            variant = Hint::from_config_json("").unwrap().hinted();
        }
        TurnRow {
            group_id: group,
            trajectory_id: traj,
            variant,
            response_ids: vec![5, 6],
            response_logprobs: vec![-1.0; 2],
            response_mask: vec![1, 0],
            episode_reward: reward,
            observation: "room".into(),
            ..Default::default()
        }
    }

    #[test]
    fn half_of_each_group_is_hinted() {
        let mut h = Hint::from_config_json(r#"{"hint": "look left"}"#).unwrap();
        let plan = h
            .plan_group(
                &GroupRequest {
                    group_size: 4,
                    ..Default::default()
                },
                &MockHost::default(),
            )
            .unwrap();
        let labels: Vec<&str> = plan.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(labels, ["hint", "hint", "plain", "plain"]);
        assert_eq!(plan[0].inject, "look left");
        assert_eq!(plan[0].extra["evidence_cards"], 0);
        let r = h.requirements();
        assert!(r.role == Role::Planner && r.turn_context && r.even_group_size);
        assert_eq!(r.bank, [EntryKind::EvidenceCard]);
        // Without a bank the planner says so instead of planning blind.
        assert!(h
            .plan_group(&GroupRequest::default(), &OfflineHost::default())
            .is_err());
    }

    #[test]
    fn a_rejected_action_adds_the_correction_for_hinted_slots_only() {
        let mut h = Hint::from_config_json(r#"{"hint": "H.", "correction": "C."}"#).unwrap();
        let mut request = TurnContextRequest {
            variant: h.hinted(),
            turns: vec![TurnSummary {
                feedback: -1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let host = OfflineHost::default();
        match h.next_context(&request, &host).unwrap() {
            TurnContext::Variant { variant } => {
                assert_eq!(variant.inject, "H. C.");
                assert_eq!(variant.label, "hint+correction");
            }
            other => panic!("expected a new variant, got {other:?}"),
        }
        request.turns[0].feedback = 0;
        assert_eq!(h.next_context(&request, &host).unwrap(), TurnContext::Keep);
        request.turns[0].feedback = -1;
        request.variant = ContextVariant::default();
        assert_eq!(h.next_context(&request, &host).unwrap(), TurnContext::Keep);
    }

    #[test]
    fn plain_rows_of_groups_the_hint_helped_are_distilled_toward_the_hinted_prompt() {
        let h = Hint::from_config_json(r#"{"hint": "H", "coef": 0.25}"#).unwrap();
        let batch = Batch {
            step: 0,
            rows: vec![
                // Group 1: hinted mean 1.0 > plain 0.0 → plain rows 2, 3 distilled.
                row(1, 10, true, 1.0),
                row(1, 11, true, 1.0),
                row(1, 12, false, 0.0),
                row(1, 13, false, 0.0),
                // Group 2: the hint did not help.
                row(2, 20, true, 0.0),
                row(2, 21, false, 1.0),
            ],
        };
        let s = h.signals(&batch, &MockHost::default()).unwrap();
        s.validate_against(&batch).unwrap();
        assert!(s.advantages.is_empty(), "a planner gives no advantages");
        let term = &s.teacher[0];
        assert_eq!(term.coef, 0.25);
        let rows: Vec<usize> = term.targets.iter().map(|t| t.row).collect();
        assert_eq!(rows, [2, 3]);
        assert_eq!(
            term.targets[0].weights,
            [1.0, 0.0],
            "mask-0 tokens are not distilled"
        );
        assert_eq!(
            term.targets[0].source,
            TeacherSource::Context {
                context_ids: "H|room".bytes().map(u32::from).collect()
            }
        );
        let helped: Vec<(u64, bool)> = contrasts(&batch)
            .iter()
            .map(|c| (c.group_id, c.helped()))
            .collect();
        assert_eq!(helped, vec![(1, true), (2, false)]);
    }

    #[test]
    fn observe_writes_an_evidence_card_per_helped_group_and_the_state_round_trips() {
        let mut h = Hint::from_config_json("").unwrap();
        let mut rows = vec![row(1, 10, true, 1.0), row(1, 11, false, 0.0)];
        for r in &mut rows {
            r.task_id = "t7".into();
        }
        let report = StepReport {
            batch: Batch { step: 0, rows },
            ..Default::default()
        };
        let host = MockHost::default();
        h.observe(&report, &host).unwrap();
        let put = host.entries.lock().unwrap().clone();
        assert_eq!(put.len(), 1);
        assert_eq!(put[0].kind, EntryKind::EvidenceCard);
        assert_eq!(put[0].task_id.as_deref(), Some("t7"));
        assert_eq!(
            put[0].text,
            "On task t7, the hint raised the mean reward from 0.00 to 1.00."
        );
        assert_eq!(put[0].provenance.source_trajectories, [10, 11]);
        // The next plan for that task sees the card.
        let plan = h
            .plan_group(
                &GroupRequest {
                    task_id: "t7".into(),
                    group_size: 2,
                    ..Default::default()
                },
                &host,
            )
            .unwrap();
        assert_eq!(plan[0].extra["evidence_cards"], 1);
        let saved = h.save_state().unwrap();
        let mut again = Hint::from_config_json("").unwrap();
        again.load_state(&saved).unwrap();
        assert_eq!(
            again.state,
            HintState {
                steps: 1,
                helped_groups: 1,
                groups: 1
            }
        );
        let e = Hint::from_config_json(r#"{"coef": -1}"#).err().unwrap();
        assert!(e.message.starts_with("`coef` = -1"), "{e}");
        let e = Hint::from_config_json(r#"{"hint": " "}"#).err().unwrap();
        assert!(e.message.starts_with("`hint` is empty"), "{e}");
    }
}
