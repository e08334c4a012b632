//! The skill-creator actor. It writes skill entries from trajectories with a deterministic
//! template (the successful action sequence of a task kind); LLM-written skills (ReSkill,
//! SEED/OPID) plug in here when those algorithms land.

use std::collections::BTreeMap;

use actix::prelude::*;
use cairn_plugin_sdk::Batch;

/// A skill entry with its provenance.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Skill {
    /// Task id it was distilled from.
    pub source_task: String,
    /// Step that produced it.
    pub step: u64,
    pub text: String,
}

#[derive(Default)]
pub struct SkillCreatorActor {
    pub skills: BTreeMap<String, Skill>,
}

impl Actor for SkillCreatorActor {
    type Context = Context<Self>;
}

/// Propose skills from a batch; returns the number of new skills.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ProposeSkills {
    pub batch: Batch,
}

impl Handler<ProposeSkills> for SkillCreatorActor {
    type Result = usize;
    fn handle(&mut self, msg: ProposeSkills, _: &mut Self::Context) -> usize {
        let mut added = 0;
        let trajectories = cairn_plugin_sdk::stats::group_indices(
            &msg.batch
                .rows
                .iter()
                .map(|r| r.trajectory_id)
                .collect::<Vec<_>>(),
        );
        for t in trajectories {
            let rows: Vec<_> = t.iter().map(|&i| &msg.batch.rows[i]).collect();
            let Some(first) = rows.first() else { continue };
            if !first.success || self.skills.contains_key(&first.task_id) {
                continue;
            }
            let steps: Vec<String> = rows
                .iter()
                .map(|r| {
                    r.info
                        .get("action")
                        .and_then(|a| a.as_str())
                        .unwrap_or("")
                        .to_string()
                })
                .collect();
            self.skills.insert(
                first.task_id.clone(),
                Skill {
                    source_task: first.task_id.clone(),
                    step: msg.batch.step,
                    text: format!("solved in {} turns: {}", rows.len(), steps.join("; ")),
                },
            );
            added += 1;
        }
        added
    }
}
