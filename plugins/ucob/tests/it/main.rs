//! Integration tests of `ucob` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo`, and the `ucob-cbsd` term through the kernel's objective.

mod objective;
mod stack;

use std::sync::Mutex;

use cairn_plugin_sdk::{
    Algorithm, BankEntry, BankQuery, ContextVariant, EntryKind, GroupRequest, Host, RenderRequest,
    Result, Retrieved, ScoreRequest, Scored, TurnRow,
};
use cairn_ucob::Ucob;

/// Fixed answers for the toy: the teacher's scores after `context`, the student's after any
/// other context.
pub struct Toy {
    pub context: Vec<u32>,
    pub teacher: Scored,
    pub student: Scored,
}

/// A host with a fixed bank of skills (every entry matches, in id order), prompts rendered as
/// the bytes of `inject + "|" + observation`, and a deterministic scorer with top-k (or the
/// toy's answers).
pub struct TestHost {
    pub bank: Vec<BankEntry>,
    pub toy: Option<Toy>,
    pub scores: Mutex<Vec<ScoreRequest>>,
    pub metrics: Mutex<Vec<(String, f64)>>,
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost {
            bank: vec![
                BankEntry {
                    id: 1,
                    kind: EntryKind::Skill,
                    text: "open every closed container before searching it".into(),
                    ..BankEntry::default()
                },
                BankEntry {
                    id: 2,
                    kind: EntryKind::Skill,
                    text: "mugs are usually in the cabinet".into(),
                    task_id: Some("clean-mug".into()),
                    ..BankEntry::default()
                },
            ],
            toy: None,
            scores: Mutex::new(Vec::new()),
            metrics: Mutex::new(Vec::new()),
        }
    }
}

impl Host for TestHost {
    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        self.scores.lock().unwrap().extend_from_slice(requests);
        Ok(requests
            .iter()
            .map(|r| {
                if let Some(toy) = &self.toy {
                    return if r.context_ids == toy.context {
                        toy.teacher.clone()
                    } else {
                        toy.student.clone()
                    };
                }
                let c: u32 = r.context_ids.iter().sum();
                let n = r.response_ids.len();
                let k = r.top_k as usize;
                Scored {
                    logprobs: (0..n)
                        .map(|l| -0.2 - 0.05 * ((c as usize + l) % 9) as f32)
                        .collect(),
                    top_ids: (0..n * k).map(|x| (x % k) as u32).collect(),
                    top_logprobs: (0..n * k).map(|x| -0.3 * (1 + x % k) as f32).collect(),
                }
            })
            .collect())
    }

    fn render_prompt(&self, r: &RenderRequest) -> Result<Vec<u32>> {
        Ok(render(&r.variant.inject, &r.observation.text))
    }

    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        Ok(self
            .bank
            .iter()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
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

/// The slots `ucob` plans for group `group` (4 slots, task `clean-mug`).
pub fn plan(ucob: &mut dyn Algorithm, host: &TestHost, group: u64) -> Vec<ContextVariant> {
    ucob.plan_group(
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

/// One turn of trajectory `trajectory` of `group` played with `variant` at `anchor`: the
/// prompt the host renders for its observation, three sampled tokens (the last a stop id).
pub fn row(
    group: u64,
    trajectory: u64,
    turn: u32,
    variant: &ContextVariant,
    anchor: &str,
    turn_reward: f32,
    episode_reward: f32,
) -> TurnRow {
    let observation = format!("you are at {anchor}; trajectory {trajectory}");
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        turn,
        task_id: "clean-mug".into(),
        variant: variant.clone(),
        prompt_ids: render(&variant.inject, &observation),
        response_ids: vec![50 + trajectory as u32, 60 + turn, 2],
        response_logprobs: vec![-0.5, -2.0, -0.1],
        response_mask: vec![1, 1, 1],
        old_logprobs: vec![-0.5, -2.0, -0.1],
        turn_reward,
        episode_reward,
        success: episode_reward > 0.0,
        anchor: Some(anchor.into()),
        observation,
        ..TurnRow::default()
    }
}

/// A fresh `ucob` with the default config.
pub fn ucob() -> Ucob {
    Ucob::from_config_json("").unwrap()
}
