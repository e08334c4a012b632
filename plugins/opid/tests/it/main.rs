//! Integration tests of `opid` with the rest of Cairn, in process (rlib types): the stack over
//! `grpo` and `gigpo` (`cairn_kernel::stack::Stack`), with the final advantages after the
//! stack's credit composition checked against the worked example; and the built `cdylib`
//! through the loader.

mod ffi;
mod stack;

use std::sync::Mutex;

use cairn_plugin_sdk::{
    BankEntry, BankQuery, EntryKind, Host, ReflectionRequest, RenderRequest, Result, Retrieved,
    ScoreRequest, Scored, TurnRow,
};
use serde_json::{json, Value};

/// `ℓ_old`, `ℓ^ep`, `ℓ^st` of the worked example.
pub const OLD: [f32; 3] = [-0.7, -1.5, -0.2];
pub const EP: [f32; 3] = [-0.5, -1.6, -0.2];
pub const ST: [f32; 3] = [-0.3, -0.9, -0.1];

/// A host that renders `inject|observation` as bytes, scores a context with opid's step
/// header as [`ST`], with its episode header as [`EP`], anything else as [`OLD`], keeps a
/// bank, and queues reflections (answered by the test with [`TestHost::answer`]).
#[derive(Default)]
pub struct TestHost {
    pub scored: Mutex<Vec<ScoreRequest>>,
    pub bank: Mutex<Vec<BankEntry>>,
    pub reflected: Mutex<Vec<ReflectionRequest>>,
}

pub fn render(inject: &str, observation: &str) -> Vec<u32> {
    format!("{inject}|{observation}")
        .bytes()
        .map(u32::from)
        .collect()
}

impl Host for TestHost {
    fn render_prompt(&self, r: &RenderRequest) -> Result<Vec<u32>> {
        Ok(render(&r.variant.inject, &r.observation.text))
    }

    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        self.scored.lock().unwrap().extend_from_slice(requests);
        Ok(requests
            .iter()
            .map(|r| {
                let context: String = r.context_ids.iter().map(|&b| b as u8 as char).collect();
                let lp = if context.contains("Step skill") {
                    ST
                } else if context.contains("Episode skill") {
                    EP
                } else {
                    OLD
                };
                Scored {
                    logprobs: lp.to_vec(),
                    ..Scored::default()
                }
            })
            .collect())
    }

    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        let mut out: Vec<Retrieved> = self
            .bank
            .lock()
            .unwrap()
            .iter()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 0.0,
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.entry.id));
        out.truncate(q.k);
        Ok(out)
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
        let mut r = self.reflected.lock().unwrap();
        let first = r.len() as u64 + 1;
        r.extend_from_slice(requests);
        Ok((first..first + requests.len() as u64).collect())
    }
}

impl TestHost {
    /// Answers ticket `ticket` as the skill creator does for a JSON reply format: a Skill
    /// entry with the request's extra plus `reflection_ticket` and `reply`.
    pub fn answer(&self, ticket: u64, reply: Value) -> u64 {
        let request = self.reflected.lock().unwrap()[ticket as usize - 1].clone();
        let mut extra = request.extra;
        extra.insert("reflection_ticket".into(), json!(ticket));
        extra.insert("reply".into(), reply.clone());
        let mut bank = self.bank.lock().unwrap();
        let id = 100 + bank.len() as u64;
        bank.push(BankEntry {
            id,
            kind: EntryKind::Skill,
            text: reply["episode_skill"].as_str().unwrap_or("").into(),
            task_id: request.task_id,
            extra,
            ..BankEntry::default()
        });
        id
    }
}

/// One turn of task `clean-mug` with the worked example's tokens and `ℓ_old`; its prompt is
/// exactly what the host renders for it.
pub fn row(group: u64, traj: u64, turn: u32, anchor: &str, success: bool) -> TurnRow {
    let observation = format!("you are at {anchor}");
    TurnRow {
        group_id: group,
        trajectory_id: traj,
        turn,
        task_id: "clean-mug".into(),
        policy_version: 2,
        prompt_ids: render("", &observation),
        response_ids: vec![5, 6, 7],
        response_logprobs: OLD.to_vec(),
        response_mask: vec![1, 1, 1],
        old_logprobs: OLD.to_vec(),
        episode_reward: f32::from(u8::from(success)),
        success,
        anchor: Some(anchor.into()),
        observation,
        ..TurnRow::default()
    }
}
