//! Integration tests of `edge` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, and the distillation term through the kernel's objective.

mod objective;
mod stack;

use std::sync::Mutex;

use cairn_edge::Edge;
use cairn_plugin_sdk::{
    Algorithm, BankEntry, BankQuery, ContextVariant, GroupRequest, Host, RenderRequest, Result,
    Retrieved, TurnRow,
};

/// A host with a fixed bank (every entry matches, in id order) that renders a prompt as the
/// bytes of `inject + "|" + observation`.
pub struct TestHost {
    pub bank: Vec<BankEntry>,
    pub metrics: Mutex<Vec<(String, f64)>>,
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost {
            bank: vec![
                BankEntry {
                    id: 1,
                    text: "open the drawer before searching it".into(),
                    ..BankEntry::default()
                },
                BankEntry {
                    id: 2,
                    text: "mugs are usually in the cabinet".into(),
                    task_id: Some("clean-mug".into()),
                    ..BankEntry::default()
                },
            ],
            metrics: Mutex::new(Vec::new()),
        }
    }
}

impl Host for TestHost {
    fn render_prompt(&self, r: &RenderRequest) -> Result<Vec<u32>> {
        Ok(render(&r.variant.inject, &r.observation.text))
    }

    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        Ok(self
            .bank
            .iter()
            .filter(|e| match &q.task_id {
                None => true,
                Some(t) => {
                    e.task_id.as_ref() == Some(t) || (q.include_general && e.task_id.is_none())
                }
            })
            .take(q.k)
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 1.0,
            })
            .collect())
    }

    fn log_metric(&self, name: &str, value: f64) {
        if let Ok(mut m) = self.metrics.lock() {
            m.push((name.into(), value));
        }
    }
}

pub fn render(inject: &str, observation: &str) -> Vec<u32> {
    format!("{inject}|{observation}")
        .bytes()
        .map(u32::from)
        .collect()
}

/// The slots `edge` plans for group `group` (4 slots, task `clean-mug`) at step 0.
pub fn plan(edge: &mut Edge, host: &TestHost, group: u64) -> Vec<ContextVariant> {
    edge.plan_group(
        &GroupRequest {
            step: 0,
            group_id: group,
            task_id: "clean-mug".into(),
            task_kind: "clean".into(),
            task_description: "clean the mug and put it in the cabinet".into(),
            group_size: 4,
            seed: 7,
        },
        host,
    )
    .expect("the test host has a bank")
}

/// One turn: trajectory `trajectory` of `group`, played with `variant`, at `anchor`, with a
/// turn reward, the trajectory's episode reward and success, three trainable tokens with
/// `ℓ_old = [−0.5, −2.0, −0.1]`.
pub fn row(
    group: u64,
    trajectory: u64,
    turn: u32,
    variant: &ContextVariant,
    anchor: &str,
    turn_reward: f32,
    episode_reward: f32,
) -> TurnRow {
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        turn,
        task_id: "clean-mug".into(),
        variant: variant.clone(),
        prompt_ids: vec![1, 2],
        response_ids: vec![5, 6, 7],
        response_logprobs: vec![-0.5, -2.0, -0.1],
        response_mask: vec![1, 1, 1],
        old_logprobs: vec![-0.5, -2.0, -0.1],
        turn_reward,
        episode_reward,
        success: episode_reward > 0.0,
        last_turn: false,
        anchor: Some(anchor.into()),
        observation: format!("you are at {anchor}"),
        ..TurnRow::default()
    }
}
