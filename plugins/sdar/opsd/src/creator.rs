//! Where the teacher's skills come from: reflections of the kernel's skill creator on
//! successful trajectories (docs/skills.md), asked in `observe`.
//!
//! Once per step, with `skills.reflect` on:
//! 1. reflections that failed since the previous step (`StepReport::failed_reflections`, e.g.
//!    an unparseable reply) are counted and forgotten, so their task may ask again;
//! 2. every task with a successful trajectory in the step is a candidate, in batch order,
//!    with its best trajectory (highest episode reward, the first on ties);
//! 3. one bank query lists the skills (active or under test) and counts them per source task
//!    (the entry's `task_id`, or `extra.skill_task` for a general one); a pending reflection
//!    whose entry has arrived (`extra.reflection_ticket`) stops being pending;
//! 4. a candidate task with fewer than `skills.max_per_task` skills and no pending reflection
//!    gets one [`ReflectionRequest`] (kind `Skill`, status `Active`, scope per
//!    `skills.scope`), at most `skills.max_reflections_per_step` per step. A refused call (a
//!    full queue) is counted and training goes on.
//!
//! Pending tickets are not checkpointed: the kernel does not checkpoint its reflection queue
//! either, so after a resume a task simply asks again.

use std::collections::{BTreeMap, HashMap, HashSet};

use cairn_plugin_sdk::stats::trajectories;
use cairn_plugin_sdk::{
    BankQuery, EntryKind, EntryStatus, Host, ReflectionRequest, Result, StepReport,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{Scope, SkillConfig};

/// The entry `extra` key holding the task a skill came from (whatever its scope).
pub const TASK_KEY: &str = "skill_task";
/// The entry `extra` key the skill creator sets to the request's ticket.
pub const TICKET_KEY: &str = "reflection_ticket";

/// The skill creator's side of a plugin: counters (checkpointed) and pending tickets (not).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Creator {
    /// Reflections the skill creator accepted, refused (a full queue) and failed, since the
    /// start of the run.
    pub requested: u64,
    pub refused: u64,
    pub failed: u64,
    /// Accepted and not yet answered: ticket → task.
    #[serde(skip)]
    pub pending: BTreeMap<u64, String>,
}

/// What one step's [`Creator::observe`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CreatorStep {
    pub requested: usize,
    pub refused: usize,
    pub failed: usize,
    /// Skills in the bank (active or under test), when they were counted this step.
    pub skills_in_bank: Option<usize>,
}

impl CreatorStep {
    /// `{prefix}/reflections_requested`, `_refused`, `_failed`, and `{prefix}/skills_in_bank`
    /// when counted.
    pub fn metrics(&self, prefix: &str) -> Vec<(String, f64)> {
        let mut out = vec![
            (
                format!("{prefix}/reflections_requested"),
                self.requested as f64,
            ),
            (format!("{prefix}/reflections_refused"), self.refused as f64),
            (format!("{prefix}/reflections_failed"), self.failed as f64),
        ];
        if let Some(n) = self.skills_in_bank {
            out.push((format!("{prefix}/skills_in_bank"), n as f64));
        }
        out
    }
}

/// The reflection prompt for trajectory `t` (the model-backed reflectors send it; the
/// template reflector writes the trajectory's actions instead).
pub fn prompt(t: u64, max_chars: usize) -> String {
    format!(
        "Trajectory {t} below solved its task. Write one short, reusable skill, at most \
         {max_chars} characters, that would help solve tasks like it: the situation it applies \
         to and what to do there."
    )
}

impl Creator {
    /// One step of skill creation (see the module docs). `writer` names the plugin in the
    /// requests' `extra.skill_writer`.
    pub fn observe(
        &mut self,
        config: &SkillConfig,
        report: &StepReport,
        host: &dyn Host,
        writer: &str,
    ) -> Result<CreatorStep> {
        let mut step = CreatorStep::default();
        for (ticket, _) in &report.failed_reflections {
            if self.pending.remove(ticket).is_some() {
                step.failed += 1;
            }
        }
        self.failed += step.failed as u64;
        if !config.reflect {
            return Ok(step);
        }
        // Candidates: the best successful trajectory of each task, in batch order.
        let mut order: Vec<&str> = Vec::new();
        let mut best: HashMap<&str, (u64, f64)> = HashMap::new();
        for t in trajectories(&report.batch)? {
            if !t.success {
                continue;
            }
            let task = report.batch.rows[t.rows[0]].task_id.as_str();
            match best.get(task) {
                Some(&(_, r)) if r >= t.episode_reward => {}
                Some(_) => {
                    best.insert(task, (t.id, t.episode_reward));
                }
                None => {
                    order.push(task);
                    best.insert(task, (t.id, t.episode_reward));
                }
            }
        }
        if order.is_empty() {
            return Ok(step);
        }
        let skills = host.bank_query(&BankQuery {
            text: String::new(),
            k: usize::MAX,
            kinds: vec![EntryKind::Skill],
            task_id: None,
            include_general: true,
            statuses: vec![EntryStatus::Active, EntryStatus::UnderTest],
            ..BankQuery::default()
        })?;
        step.skills_in_bank = Some(skills.len());
        let mut per_task: HashMap<String, usize> = HashMap::new();
        let mut answered: HashSet<u64> = HashSet::new();
        for s in &skills {
            let source = s.entry.task_id.clone().or_else(|| {
                s.entry
                    .extra
                    .get(TASK_KEY)
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
            if let Some(task) = source {
                *per_task.entry(task).or_default() += 1;
            }
            if let Some(ticket) = s.entry.extra.get(TICKET_KEY).and_then(Value::as_u64) {
                answered.insert(ticket);
            }
        }
        self.pending.retain(|ticket, _| !answered.contains(ticket));
        let pending_tasks: HashSet<&str> = self.pending.values().map(String::as_str).collect();
        let mut requests = Vec::new();
        let mut tasks = Vec::new();
        for task in order {
            if requests.len() >= config.max_reflections_per_step {
                break;
            }
            if pending_tasks.contains(task)
                || per_task.get(task).copied().unwrap_or(0) >= config.max_per_task
            {
                continue;
            }
            let (t, _) = best[task];
            let mut extra = serde_json::Map::new();
            extra.insert(TASK_KEY.into(), json!(task));
            extra.insert("skill_writer".into(), json!(writer));
            requests.push(ReflectionRequest {
                kind: EntryKind::Skill,
                prompt: prompt(t, config.max_chars),
                trajectories: vec![t],
                task_id: match config.scope {
                    Scope::Task => Some(task.to_string()),
                    Scope::General => None,
                },
                parent: None,
                status: EntryStatus::Active,
                extra,
            });
            tasks.push(task.to_string());
        }
        if requests.is_empty() {
            return Ok(step);
        }
        match host.reflect(&requests) {
            Ok(tickets) => {
                step.requested = tickets.len();
                for (ticket, task) in tickets.into_iter().zip(tasks) {
                    self.pending.insert(ticket, task);
                }
            }
            // A refused call (a full queue) is a counted drop: training goes on.
            Err(_) => step.refused = requests.len(),
        }
        self.requested += step.requested as u64;
        self.refused += step.refused as u64;
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{mock_host, row, skill, Teacher};
    use cairn_plugin_sdk::Batch;

    /// One single-turn trajectory per `(trajectory, task, reward)`; success iff reward > 0.
    fn report(step: u64, played: &[(u64, &str, f32)]) -> StepReport {
        let rows = played
            .iter()
            .map(|&(t, task, r)| {
                let mut row = row(t, t, task, &[5], &[-1.0]);
                row.episode_reward = r;
                row.success = r > 0.0;
                row.last_turn = true;
                row
            })
            .collect();
        StepReport {
            step,
            batch: Batch { step, rows },
            ..StepReport::default()
        }
    }

    #[test]
    fn a_task_with_a_success_and_no_skill_gets_one_reflection_on_its_best_trajectory() {
        let host = mock_host(Teacher::default());
        let config = SkillConfig::default();
        let mut c = Creator::default();
        let r = report(
            0,
            &[(1, "a", 1.0), (2, "a", 2.0), (3, "b", 0.0), (4, "a", 2.0)],
        );
        let s = c.observe(&config, &r, &host, "sdar").unwrap();
        assert_eq!((s.requested, s.refused, s.failed), (1, 0, 0));
        assert_eq!(s.skills_in_bank, Some(0));
        let asked = host.reflections.lock().unwrap().clone();
        assert_eq!(asked.len(), 1);
        let q = &asked[0];
        assert_eq!(q.kind, EntryKind::Skill);
        assert_eq!(q.status, EntryStatus::Active);
        assert_eq!(q.trajectories, [2], "the best, the first on ties");
        assert_eq!(q.task_id.as_deref(), Some("a"));
        assert_eq!(q.extra[TASK_KEY], "a");
        assert_eq!(q.extra["skill_writer"], "sdar");
        assert!(q.prompt.contains("Trajectory 2 below solved its task"));
        assert_eq!(c.pending, BTreeMap::from([(1, "a".to_string())]));

        // Pending: not asked again.
        let s = c.observe(&config, &r, &host, "sdar").unwrap();
        assert_eq!(s.requested, 0);
        // It failed: counted, and the task asks again.
        let mut failed = report(2, &[(1, "a", 1.0)]);
        failed.failed_reflections = vec![(1, "unparseable".into())];
        let s = c.observe(&config, &failed, &host, "sdar").unwrap();
        assert_eq!((s.requested, s.failed), (1, 1));
        assert_eq!(c.pending, BTreeMap::from([(2, "a".to_string())]));
        // Its entry arrives: no longer pending, and the task has its one skill.
        let mut e = skill(7, Some("a"), "solved in 1 turns: act");
        e.extra.insert(TICKET_KEY.into(), json!(2));
        host.put(e);
        let s = c.observe(&config, &r, &host, "sdar").unwrap();
        assert_eq!((s.requested, s.skills_in_bank), (0, Some(1)));
        assert!(c.pending.is_empty());
        assert_eq!((c.requested, c.refused, c.failed), (2, 0, 1));
        let m = s.metrics("sdar");
        assert_eq!(
            m,
            [
                ("sdar/reflections_requested".to_string(), 0.0),
                ("sdar/reflections_refused".to_string(), 0.0),
                ("sdar/reflections_failed".to_string(), 0.0),
                ("sdar/skills_in_bank".to_string(), 1.0),
            ]
        );
    }

    #[test]
    fn reflections_are_capped_per_step_in_batch_order_and_a_refusal_is_counted() {
        let config = SkillConfig {
            max_reflections_per_step: 2,
            scope: Scope::General,
            ..SkillConfig::default()
        };
        let r = report(0, &[(1, "c", 1.0), (2, "a", 1.0), (3, "b", 1.0)]);
        let host = mock_host(Teacher::default());
        let mut c = Creator::default();
        c.observe(&config, &r, &host, "icsd").unwrap();
        let asked = host.reflections.lock().unwrap().clone();
        let tasks: Vec<&str> = asked
            .iter()
            .map(|q| q.extra[TASK_KEY].as_str().unwrap())
            .collect();
        assert_eq!(tasks, ["c", "a"]);
        assert!(asked.iter().all(|q| q.task_id.is_none()), "general scope");
        // A general skill counts for the task in its extra.
        let mut e = skill(1, None, "x");
        e.extra.insert(TASK_KEY.into(), json!("b"));
        let host = mock_host(Teacher::default()).refusing_reflections();
        host.put(e);
        let mut c = Creator::default();
        let s = c.observe(&config, &r, &host, "icsd").unwrap();
        assert_eq!((s.requested, s.refused), (0, 2), "c and a; b has its skill");
        assert_eq!(c.refused, 2);
        assert!(c.pending.is_empty());
    }

    #[test]
    fn with_reflect_off_nothing_is_asked_and_failures_are_still_counted() {
        let config = SkillConfig {
            reflect: false,
            ..SkillConfig::default()
        };
        let host = mock_host(Teacher::default());
        let mut c = Creator::default();
        c.pending.insert(3, "a".into());
        let mut r = report(0, &[(1, "a", 1.0)]);
        r.failed_reflections = vec![(3, "timeout".into()), (9, "another plugin's".into())];
        let s = c.observe(&config, &r, &host, "sdar").unwrap();
        assert_eq!((s.requested, s.failed, s.skills_in_bank), (0, 1, None));
        assert!(host.queries.lock().unwrap().is_empty());
        assert!(host.reflections.lock().unwrap().is_empty());
    }

    #[test]
    fn pending_tickets_are_not_checkpointed() {
        let mut c = Creator {
            requested: 3,
            ..Creator::default()
        };
        c.pending.insert(1, "a".into());
        let back: Creator = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back.requested, 3);
        assert!(back.pending.is_empty());
    }
}
