//! Hindsight analysis through the skill creator, and the skills it leaves behind.
//!
//! - [`request`]: one [`ReflectionRequest`] per analysed trajectory, with OPID's analysis
//!   prompt ([`prompt`], our wording of github jinyangwu/OPID `opid/analysis.py`) and the JSON
//!   reply format `{"episode_skill": <string>, "step_skills": <object>}` with re-asks
//!   (`extra.reply_format`, docs/skills.md). `extra.opid` records what the answer needs: the
//!   trajectory, its task and outcome, the candidate turns and each turn's key.
//! - [`read`]: turns an answered entry (`extra.reply`) into an [`Analysis`]: the episode skill
//!   and at most `K` step skills of candidate turns, in reply order.
//! - [`Skills`]: the table `signals` reads, kept in the plugin state: per scope key (the task,
//!   or one shared key), the newest episode skill per outcome and the newest step skill per
//!   turn key (`anchor:<anchor>`, or `turn:<t>` for a row without an anchor).

use std::collections::BTreeMap;

use cairn_plugin_sdk::stats::Trajectory;
use cairn_plugin_sdk::{BankEntry, Batch, EntryKind, EntryStatus, ReflectionRequest, TurnRow};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{OpidConfig, Scope};

/// The `extra` key OPID's requests (and so their entries) carry.
pub const EXTRA_KEY: &str = "opid";
/// Step skills kept per scope key at most; the oldest go first.
pub const MAX_STEP_KEYS: usize = 256;
/// Scope keys kept at most; the one whose newest skill is oldest goes first.
pub const MAX_SCOPES: usize = 4096;

/// The key a row's step skills are filed and looked up under: its anchor state, else its turn.
pub fn turn_key(row: &TurnRow) -> String {
    match &row.anchor {
        Some(a) => format!("anchor:{a}"),
        None => format!("turn:{}", row.turn),
    }
}

/// The key of a task's skills under `scope`.
pub fn scope_key(scope: Scope, task_id: &str) -> String {
    match scope {
        Scope::Task => task_id.to_string(),
        Scope::General => String::new(),
    }
}

/// OPID's analysis instructions for one trajectory (the kernel then lists its turns and asks
/// for the JSON object).
pub fn prompt(success: bool, candidates: &[u32], k: usize) -> String {
    let episode = if success {
        "the reusable workflow of this successful trajectory: the decision rule and the order \
         of actions that made it work."
    } else {
        "the avoidance rule this failed trajectory teaches: the core mistake, and the warning \
         signs that show it coming."
    };
    let steps =
        if k == 0 || candidates.is_empty() {
            "an empty object {}.".to_string()
        } else {
            let turns: Vec<String> = candidates.iter().map(u32::to_string).collect();
            format!(
            "advice for at most {} critical turn{}, chosen from turns [{}]: for each, one short \
             imperative sentence the agent can act on at that turn, keyed by the turn number \
             as a string (turns count from 0).",
            k.min(candidates.len()),
            if k.min(candidates.len()) == 1 { "" } else { "s" },
            turns.join(", ")
        )
        };
    format!(
        "Analyse the agent's trajectory below, using the whole episode to judge its progress \
         and mistakes.\n\
         - \"episode_skill\": {episode}\n\
         - \"step_skills\": {steps}\n\
         Write every skill as advice to the agent, not as a story of the trajectory."
    )
}

/// The reflection request for trajectory `t` of `batch`, whose candidate critical turns are
/// `candidates` (all its turns, or the statistical selector's).
pub fn request(
    batch: &Batch,
    t: &Trajectory,
    candidates: &[u32],
    config: &OpidConfig,
    step: u64,
) -> ReflectionRequest {
    let first = &batch.rows[t.rows[0]];
    let turn_keys: BTreeMap<String, String> = t
        .rows
        .iter()
        .map(|&i| (batch.rows[i].turn.to_string(), turn_key(&batch.rows[i])))
        .collect();
    let mut extra = serde_json::Map::new();
    extra.insert(
        EXTRA_KEY.into(),
        json!({
            "trajectory": t.id,
            "group": t.group_id,
            "task": first.task_id,
            "success": t.success,
            "step": step,
            "candidates": candidates,
            "turn_keys": turn_keys,
        }),
    );
    extra.insert(
        "reply_format".into(),
        json!({
            "json_keys": {"episode_skill": "string", "step_skills": "object"},
            "retries": config.retries,
            "text_key": "episode_skill",
        }),
    );
    ReflectionRequest {
        kind: EntryKind::Skill,
        prompt: prompt(t.success, candidates, config.max_step_skills as usize),
        trajectories: vec![t.id],
        task_id: Some(first.task_id.clone()),
        parent: None,
        status: EntryStatus::Active,
        extra,
    }
}

/// One answered analysis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    pub entry: u64,
    pub trajectory: u64,
    pub task: String,
    pub success: bool,
    /// The episode skill; `None` when it was too long.
    pub episode: Option<String>,
    /// `(turn key, skill)` of the kept step skills, in reply order.
    pub steps: Vec<(String, String)>,
    /// Step skills of the reply not kept: not a candidate turn, not a non-empty string, or
    /// beyond the first `K`.
    pub dropped: usize,
    /// Skills (episode or step) over `max_skill_chars`, not kept.
    pub too_long: usize,
}

/// Reads an entry written for one of OPID's requests; `None` when the entry is not OPID's or
/// lacks its reply (another plugin's skill).
pub fn read(entry: &BankEntry, config: &OpidConfig) -> Option<Analysis> {
    let meta = entry.extra.get(EXTRA_KEY)?.as_object()?;
    let reply = entry.extra.get("reply")?.as_object()?;
    let fits = |s: &str| s.chars().count() <= config.max_skill_chars;
    let mut out = Analysis {
        entry: entry.id,
        trajectory: meta.get("trajectory")?.as_u64()?,
        task: meta.get("task")?.as_str()?.to_string(),
        success: meta.get("success")?.as_bool()?,
        ..Analysis::default()
    };
    let episode = reply
        .get("episode_skill")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty());
    match episode {
        Some(s) if fits(s) => out.episode = Some(s.to_string()),
        Some(_) => out.too_long += 1,
        None => {}
    }
    let candidates: Vec<u64> = meta
        .get("candidates")?
        .as_array()?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let keys = meta.get("turn_keys")?.as_object()?;
    let k = config.max_step_skills as usize;
    if let Some(steps) = reply.get("step_skills").and_then(Value::as_object) {
        for (turn, skill) in steps {
            let key = turn
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|t| candidates.contains(t))
                .and_then(|t| keys.get(&t.to_string()))
                .and_then(Value::as_str);
            let text = skill.as_str().map(str::trim).filter(|s| !s.is_empty());
            match (key, text) {
                (Some(key), Some(text)) if out.steps.len() < k => {
                    if fits(text) {
                        out.steps.push((key.to_string(), text.to_string()));
                    } else {
                        out.too_long += 1;
                    }
                }
                _ => out.dropped += 1,
            }
        }
    }
    Some(out)
}

/// One stored skill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Skill {
    pub text: String,
    /// The bank entry it came from.
    pub entry: u64,
}

/// The skills of one scope key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskSkills {
    /// The newest episode skill of a successful trajectory (a workflow).
    pub success: Option<Skill>,
    /// The newest episode skill of a failed trajectory (an avoidance rule).
    pub failure: Option<Skill>,
    /// The newest step skill per turn key.
    pub steps: BTreeMap<String, Skill>,
    /// The newest entry id stored here.
    pub newest: u64,
}

impl TaskSkills {
    /// The episode skill for a row of a trajectory with this outcome: the same outcome's,
    /// else the other's.
    pub fn episode(&self, success: bool) -> Option<&str> {
        let (same, other) = if success {
            (&self.success, &self.failure)
        } else {
            (&self.failure, &self.success)
        };
        same.as_ref().or(other.as_ref()).map(|s| s.text.as_str())
    }
}

/// Every scope key's skills (deterministic order, for checkpoints).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Skills(pub BTreeMap<String, TaskSkills>);

impl Skills {
    /// Files an analysis under its scope key: the newest skill of each slot wins.
    pub fn insert(&mut self, a: &Analysis, scope: Scope) {
        let key = scope_key(scope, &a.task);
        let task = self.0.entry(key).or_default();
        let skill = |text: &str| Skill {
            text: text.to_string(),
            entry: a.entry,
        };
        if let Some(e) = &a.episode {
            let slot = if a.success {
                &mut task.success
            } else {
                &mut task.failure
            };
            *slot = Some(skill(e));
        }
        for (turn, text) in &a.steps {
            task.steps.insert(turn.clone(), skill(text));
        }
        while task.steps.len() > MAX_STEP_KEYS {
            let oldest = task
                .steps
                .iter()
                .min_by_key(|(_, s)| s.entry)
                .map(|(k, _)| k.clone())
                .expect("more than MAX_STEP_KEYS entries");
            task.steps.remove(&oldest);
        }
        task.newest = task.newest.max(a.entry);
        while self.0.len() > MAX_SCOPES {
            let oldest = self
                .0
                .iter()
                .min_by_key(|(_, t)| t.newest)
                .map(|(k, _)| k.clone())
                .expect("more than MAX_SCOPES scopes");
            self.0.remove(&oldest);
        }
    }

    /// The `(episode skill, step skill)` a row may be scored with.
    pub fn lookup(&self, row: &TurnRow, scope: Scope) -> (Option<&str>, Option<&str>) {
        let Some(task) = self.0.get(&scope_key(scope, &row.task_id)) else {
            return (None, None);
        };
        (
            task.episode(row.success),
            task.steps.get(&turn_key(row)).map(|s| s.text.as_str()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_plugin_sdk::stats::trajectories;

    fn rows() -> Batch {
        let row = |turn: u32, anchor: Option<&str>| TurnRow {
            group_id: 4,
            trajectory_id: 40,
            turn,
            task_id: "clean-mug".into(),
            anchor: anchor.map(Into::into),
            response_ids: vec![1],
            response_logprobs: vec![0.0],
            response_mask: vec![1],
            ..TurnRow::default()
        };
        Batch {
            step: 3,
            rows: vec![row(1, None), row(0, Some("s0")), row(2, Some("s1"))],
        }
    }

    #[test]
    fn a_request_carries_the_prompt_the_format_and_the_turn_keys() {
        let b = rows();
        let t = &trajectories(&b).unwrap()[0];
        let config = OpidConfig::default();
        let r = request(&b, t, &[0, 1, 2], &config, 3);
        assert_eq!(r.kind, EntryKind::Skill);
        assert_eq!(r.trajectories, [40]);
        assert_eq!(r.task_id.as_deref(), Some("clean-mug"));
        assert_eq!(
            Value::Object(r.extra.clone()),
            json!({
                "opid": {
                    "trajectory": 40, "group": 4, "task": "clean-mug", "success": false,
                    "step": 3, "candidates": [0, 1, 2],
                    "turn_keys": {"0": "anchor:s0", "1": "turn:1", "2": "anchor:s1"}
                },
                "reply_format": {
                    "json_keys": {"episode_skill": "string", "step_skills": "object"},
                    "retries": 2, "text_key": "episode_skill"
                }
            })
        );
        assert_eq!(
            r.prompt,
            "Analyse the agent's trajectory below, using the whole episode to judge its \
             progress and mistakes.\n\
             - \"episode_skill\": the avoidance rule this failed trajectory teaches: the core \
             mistake, and the warning signs that show it coming.\n\
             - \"step_skills\": advice for at most 3 critical turns, chosen from turns [0, 1, \
             2]: for each, one short imperative sentence the agent can act on at that turn, \
             keyed by the turn number as a string (turns count from 0).\n\
             Write every skill as advice to the agent, not as a story of the trajectory."
        );
        assert!(prompt(true, &[], 5).contains("\"step_skills\": an empty object {}."));
        assert!(prompt(true, &[2], 5).contains("at most 1 critical turn, chosen from turns [2]"));
    }

    fn entry(reply: Value, candidates: Value) -> BankEntry {
        let mut extra = serde_json::Map::new();
        extra.insert(
            EXTRA_KEY.into(),
            json!({"trajectory": 40, "task": "clean-mug", "success": false,
                   "candidates": candidates,
                   "turn_keys": {"0": "anchor:s0", "1": "turn:1", "2": "anchor:s1"}}),
        );
        extra.insert("reply".into(), reply);
        BankEntry {
            id: 7,
            kind: EntryKind::Skill,
            extra,
            ..BankEntry::default()
        }
    }

    #[test]
    fn step_skills_keep_the_first_k_valid_candidates_in_reply_order() {
        let config = OpidConfig {
            max_step_skills: 2,
            max_skill_chars: 20,
            ..OpidConfig::default()
        };
        let e = entry(
            json!({"episode_skill": " check the drawer ", "step_skills": {
                "2": "open it", "x": "bad key", "9": "not a turn", "1": "", "0": "look first",
                "1 ": "a very long skill that does not fit"
            }}),
            json!([0, 1, 2]),
        );
        let a = read(&e, &config).unwrap();
        assert_eq!(a.episode.as_deref(), Some("check the drawer"));
        assert_eq!(
            a.steps,
            [
                ("anchor:s1".to_string(), "open it".to_string()),
                ("anchor:s0".to_string(), "look first".to_string())
            ]
        );
        // "x", "9", the empty "1", and the long "1 " past K = 2.
        assert_eq!((a.dropped, a.too_long), (4, 0));
        // Only candidate turns are kept (the statistical selector's pick).
        let a = read(&e, &OpidConfig::default()).unwrap();
        assert_eq!(a.steps.len(), 3);
        let only = read(&entry(e.extra["reply"].clone(), json!([0])), &config).unwrap();
        assert_eq!(
            only.steps,
            [("anchor:s0".to_string(), "look first".to_string())]
        );
        // Not OPID's entry.
        assert_eq!(read(&BankEntry::default(), &config), None);
        // Too long.
        let long = entry(
            json!({"episode_skill": "x".repeat(21), "step_skills": {}}),
            json!([]),
        );
        let a = read(&long, &config).unwrap();
        assert_eq!((a.episode, a.too_long), (None, 1));
    }

    #[test]
    fn the_table_keeps_the_newest_skill_and_looks_up_by_outcome_then_anchor() {
        let mut skills = Skills::default();
        let analysis =
            |entry: u64, success: bool, episode: &str, steps: &[(&str, &str)]| Analysis {
                entry,
                task: "clean-mug".into(),
                success,
                episode: Some(episode.into()),
                steps: steps
                    .iter()
                    .map(|(k, s)| (k.to_string(), s.to_string()))
                    .collect(),
                ..Analysis::default()
            };
        skills.insert(
            &analysis(1, false, "avoid the sofa", &[("anchor:s0", "go left")]),
            Scope::Task,
        );
        let mut row = rows().rows[1].clone();
        assert_eq!(
            skills.lookup(&row, Scope::Task),
            (Some("avoid the sofa"), Some("go left"))
        );
        // A successful row falls back to the failure's skill until a success's arrives.
        row.success = true;
        assert_eq!(skills.lookup(&row, Scope::Task).0, Some("avoid the sofa"));
        skills.insert(
            &analysis(2, true, "open the drawer", &[("anchor:s0", "go right")]),
            Scope::Task,
        );
        assert_eq!(
            skills.lookup(&row, Scope::Task),
            (Some("open the drawer"), Some("go right"))
        );
        row.success = false;
        assert_eq!(skills.lookup(&row, Scope::Task).0, Some("avoid the sofa"));
        // Another anchor, another task: nothing; the general scope sees across tasks.
        row.anchor = Some("s9".into());
        assert_eq!(skills.lookup(&row, Scope::Task).1, None);
        row.task_id = "other".into();
        assert_eq!(skills.lookup(&row, Scope::Task), (None, None));
        assert_eq!(skills.lookup(&row, Scope::General), (None, None));
        let mut general = Skills::default();
        general.insert(
            &analysis(3, true, "w", &[("anchor:s9", "z")]),
            Scope::General,
        );
        assert_eq!(general.lookup(&row, Scope::General), (Some("w"), Some("z")));
    }
}
