//! Who writes the skills: the kernel's skill creator ([`Host::reflect`], `docs/skills.md`),
//! asked once per step in `observe`, so a run that starts from an empty bank builds one.
//!
//! For each task group of the step (in batch order) whose best trajectory succeeded, one
//! reflection is requested about that success and, when there is one, the group's worst
//! failure (a contrast, best first: the `template` reflector writes its entry from the first
//! successful trajectory of a request). A task is skipped when the bank already holds
//! `max_skills_per_task` of its skills, or when it got a request less than
//! `reflection_cooldown` steps ago (the entry arrives at a later step); at most
//! `max_reflections_per_step` requests go out per step. A refused call (the creator's queue
//! is full) is a counted drop; training goes on.
//!
//! UCOB writes task- and state-level skills with its own reflection LLM call and keeps a
//! utility per skill for UCB retrieval; here skills are task-level, written by whichever
//! reflector the run configures, and `observe` only adds the exposures and successes of the
//! `good` trajectories to each shown skill's statistics (visible with `cairn bank`).

use std::collections::{BTreeMap, HashSet};

use cairn_plugin_sdk::stats::{group_indices, trajectories, Trajectory};
use cairn_plugin_sdk::{
    BankQuery, Batch, EntryKind, EntryStatus, Host, ReflectionRequest, Result, StatsUpdate,
};
use serde_json::json;

use crate::config::{Branch, SkillScope, UcobConfig};
use crate::plan::{branch_of, skill_ids};

/// `extra` key of a reflected skill: the task it was written from.
pub const TASK_KEY: &str = "ucob_task";

/// Skills of `task` in the bank (entries this plugin's reflections wrote for it, or the
/// task's own skills).
pub fn skills_of(config: &UcobConfig, task: &str, host: &dyn Host) -> Result<usize> {
    let hits = host.bank_query(&BankQuery {
        text: String::new(),
        k: usize::MAX,
        kinds: vec![EntryKind::Skill],
        task_id: Some(task.to_string()),
        include_general: config.skill_scope == SkillScope::General,
        ..BankQuery::default()
    })?;
    Ok(hits
        .iter()
        .filter(|h| match config.skill_scope {
            SkillScope::Task => h.entry.task_id.as_deref() == Some(task),
            SkillScope::General => {
                h.entry.extra.get(TASK_KEY).and_then(|v| v.as_str()) == Some(task)
            }
        })
        .count())
}

/// The step's reflection requests (see the module docs). `last_request` maps a task to the
/// step of its last request.
pub fn reflection_requests(
    config: &UcobConfig,
    step: u64,
    last_request: &BTreeMap<String, u64>,
    batch: &Batch,
    host: &dyn Host,
) -> Result<Vec<ReflectionRequest>> {
    let trajs = trajectories(batch)?;
    let group_ids: Vec<u64> = trajs.iter().map(|t| t.group_id).collect();
    let mut requests = Vec::new();
    let mut asked: HashSet<&str> = HashSet::new();
    for group in group_indices(&group_ids) {
        if requests.len() >= config.max_reflections_per_step {
            break;
        }
        let members: Vec<&Trajectory> = group.iter().map(|&k| &trajs[k]).collect();
        // The first best success and the first worst failure, in batch order.
        let mut best: Option<&Trajectory> = None;
        for t in members.iter().copied().filter(|t| t.success) {
            if best.is_none_or(|b| t.episode_reward > b.episode_reward) {
                best = Some(t);
            }
        }
        let Some(best) = best else { continue };
        let mut worst: Option<&Trajectory> = None;
        for t in members.iter().copied().filter(|t| !t.success) {
            if worst.is_none_or(|w| t.episode_reward < w.episode_reward) {
                worst = Some(t);
            }
        }
        let task = batch.rows[best.rows[0]].task_id.as_str();
        if asked.contains(task)
            || last_request
                .get(task)
                .is_some_and(|&s| step < s.saturating_add(config.reflection_cooldown))
            || skills_of(config, task, host)? >= config.max_skills_per_task
        {
            continue;
        }
        asked.insert(task);
        let chars = config.max_skill_chars;
        let prompt = match worst {
            Some(w) => format!(
                "Two attempts at the same task follow. Trajectory {b} succeeded; trajectory {f} \
                 failed. Write one short, reusable skill, at most {chars} characters: the \
                 procedure that made trajectory {b} succeed, stated so that it also helps other \
                 tasks of this kind, and that trajectory {f} was missing.",
                b = best.id,
                f = w.id
            ),
            None => format!(
                "Trajectory {b} below succeeded at its task. Write one short, reusable skill, at \
                 most {chars} characters: the procedure that made it succeed, stated so that it \
                 also helps other tasks of this kind.",
                b = best.id
            ),
        };
        let mut extra = serde_json::Map::new();
        extra.insert(TASK_KEY.into(), json!(task));
        extra.insert("ucob_group".into(), json!(best.group_id));
        requests.push(ReflectionRequest {
            kind: EntryKind::Skill,
            prompt,
            trajectories: std::iter::once(best.id)
                .chain(worst.map(|w| w.id))
                .collect(),
            task_id: match config.skill_scope {
                SkillScope::Task => Some(task.to_string()),
                SkillScope::General => None,
            },
            parent: None,
            status: EntryStatus::Active,
            extra,
        });
    }
    Ok(requests)
}

/// Exposure and success counts of the skills the step's `good` trajectories were shown, one
/// update per skill, in id order.
pub fn exposure_updates(batch: &Batch) -> Result<Vec<StatsUpdate>> {
    let mut counts: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for t in trajectories(batch)? {
        let row = &batch.rows[t.rows[0]];
        if branch_of(row) != Branch::Good {
            continue;
        }
        for id in skill_ids(&row.variant) {
            let c = counts.entry(id).or_default();
            c.0 += 1;
            c.1 += u64::from(t.success);
        }
    }
    Ok(counts
        .into_iter()
        .map(|(id, (exposures, successes))| StatsUpdate {
            id,
            add_exposures: exposures,
            add_successes: successes,
            ..StatsUpdate::default()
        })
        .collect())
}

/// What `observe` did, for its metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Created {
    pub requested: usize,
    pub refused: usize,
    /// Tasks whose requests went out.
    pub tasks: Vec<String>,
}

/// Sends the step's reflection requests; a refused call is counted, not an error.
pub fn reflect(
    config: &UcobConfig,
    step: u64,
    last_request: &BTreeMap<String, u64>,
    batch: &Batch,
    host: &dyn Host,
) -> Result<Created> {
    let requests = reflection_requests(config, step, last_request, batch, host)?;
    let mut out = Created::default();
    if requests.is_empty() {
        return Ok(out);
    }
    match host.reflect(&requests) {
        Ok(tickets) => {
            out.requested = tickets.len();
            out.tasks = requests
                .iter()
                .filter_map(|r| r.extra.get(TASK_KEY)?.as_str().map(str::to_string))
                .collect();
        }
        Err(_) => out.refused = requests.len(),
    }
    Ok(out)
}
