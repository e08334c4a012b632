//! The skill-conditioned teacher of a batch: retrieval, teacher contexts and teacher scores.
//!
//! For each row with trainable tokens (see the crate docs for the whole recipe):
//! - **retrieval** ([`retrieve`]): one BM25 query of the row's observation against the active
//!   skills of the row's task and the general ones, top `skills.k`; when that matches nothing,
//!   the task's own newest skills (an empty query), so a task's skill is found even when it
//!   shares no word with the observation. A skill over `skills.max_chars` is skipped and
//!   counted, never truncated, so a row may get fewer than `k`;
//! - **context** ([`teacher_variant`]): the row's own context variant with the skills
//!   appended to its injected text, rendered by the kernel for the row's observation
//!   ([`RenderRequest::for_row`]: observation text and anchor, no history, no tool schemas);
//! - **scores**: one [`Host::score`] call for the whole batch, with
//!   [`ScoreWeights::Current`] at the rollout temperature. Inside `signals` the current
//!   weights are the weights that recomputed the rows' `ℓ_old`, so `Δ = ℓ^T − ℓ_old` compares
//!   one policy under two contexts (the rollout-time weights, `Version(row.policy_version)`,
//!   would add the drift of a stale row's weights to the gap, and are refused once no longer
//!   kept).
//!
//! Counted, never fatal: rows without a retrieved skill, rows whose teacher or student
//! log-prob is not finite on a trainable token (dropped from the teacher), rows whose scoring
//! failed while other rows' succeeded (the batched call failed, then row-by-row calls tell
//! which; e.g. a teacher context over the model's window), over-long skills,
//! and rows whose own prompt is not what the kernel renders for their observation under
//! their own variant (`context_mismatch`: a prompt with history, tool schemas or a per-turn
//! reconstructed context; their gap then also measures that difference, not only the skills).

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use cairn_plugin_sdk::bank::injection;
use cairn_plugin_sdk::{
    BankEntry, BankQuery, Batch, ContextVariant, EntryKind, EntryStatus, Host, PluginError,
    RenderRequest, Result, ScoreRequest, ScoreWeights, Scored, TurnRow,
};
use serde_json::json;

use crate::config::SkillConfig;

/// `variant.extra` key of a teacher context: the injected skill ids, in prompt order.
pub const SKILL_IDS_KEY: &str = "skill_ids";

/// The skills retrieved for one row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retrieval {
    /// In rank order, at most `skills.k`.
    pub skills: Vec<BankEntry>,
    /// Skills that ranked within the top `k` but were longer than `skills.max_chars`.
    pub too_long: usize,
}

fn skill_query(row: &TurnRow, text: &str, k: usize, include_general: bool) -> BankQuery {
    BankQuery {
        text: text.to_string(),
        k,
        kinds: vec![EntryKind::Skill],
        task_id: Some(row.task_id.clone()),
        include_general,
        statuses: vec![EntryStatus::Active],
        ..BankQuery::default()
    }
}

/// The skills of `row`'s teacher (see the module docs).
pub fn retrieve(config: &SkillConfig, row: &TurnRow, host: &dyn Host) -> Result<Retrieval> {
    let mut hits = host.bank_query(&skill_query(row, &row.observation, config.k, true))?;
    if hits.is_empty() {
        hits = host.bank_query(&skill_query(row, "", config.k, false))?;
    }
    let mut out = Retrieval::default();
    for hit in hits.into_iter().take(config.k) {
        let entry = hit.entry;
        // Another task's skill: the bank's filter should not have returned it.
        if entry.task_id.as_ref().is_some_and(|t| *t != row.task_id) {
            continue;
        }
        if entry.text.chars().count() > config.max_chars {
            out.too_long += 1;
            continue;
        }
        out.skills.push(entry);
    }
    Ok(out)
}

/// The teacher's context variant: `base` (the row's own) with the skills' block appended to
/// its injected text (after a newline), label `{base}+skills:{n}`, the skill ids in
/// `extra.skill_ids`, tools as `base` has them.
pub fn teacher_variant(
    base: &ContextVariant,
    header: &str,
    skills: &[BankEntry],
) -> ContextVariant {
    let block = injection(header, skills);
    let inject = if base.inject.is_empty() {
        block
    } else {
        format!("{}\n{block}", base.inject)
    };
    let mut extra = base.extra.clone();
    let ids: Vec<u64> = skills.iter().map(|e| e.id).collect();
    extra.insert(SKILL_IDS_KEY.into(), json!(ids));
    ContextVariant {
        label: format!("{}+skills:{}", base.label, skills.len()),
        inject,
        tools_enabled: base.tools_enabled,
        extra,
    }
}

/// One row's teacher.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowTeacher {
    /// Index into `batch.rows`.
    pub row: usize,
    /// The injected skills, in prompt order.
    pub skill_ids: Vec<u64>,
    /// `ℓ^T`, `[L]`, nats: the row's response ids scored after the teacher context.
    pub logprobs: Vec<f32>,
    /// With `top_k = k > 0`: the teacher's top-k ids and log-probs, `[L, k]` row-major.
    pub top_ids: Vec<u32>,
    pub top_logprobs: Vec<f32>,
}

impl RowTeacher {
    /// `Δ_l = ℓ^T_l − ℓ^S_l` per token, `[L]`, with `ℓ^S = row.old_logprobs`; 0 on mask-0
    /// tokens (never read).
    pub fn gaps(&self, row: &TurnRow) -> Vec<f64> {
        row.response_mask
            .iter()
            .enumerate()
            .map(|(l, &m)| {
                if m == 1 {
                    crate::gate::gap(row.old_logprobs[l], self.logprobs[l])
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// What [`score`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TeacherCounts {
    /// Rows with at least one trainable (mask 1) token.
    pub trainable_rows: usize,
    /// Trainable rows that got a teacher.
    pub with_teacher: usize,
    /// Trainable rows for which no skill was retrieved: no teacher signal.
    pub without_skill: usize,
    /// Rows dropped because a teacher or student log-prob was not finite on a trainable token.
    pub nonfinite: usize,
    /// Rows dropped because scoring their teacher failed while others' succeeded (e.g. a
    /// teacher context over the model's window).
    pub score_failed: usize,
    /// Trainable rows whose own prompt is not the kernel's render of their observation under
    /// their own variant (see the module docs).
    pub context_mismatch: usize,
    /// Skills skipped as longer than `skills.max_chars`.
    pub skills_too_long: usize,
    /// Skills injected, summed over the rows with a teacher.
    pub skills_injected: usize,
}

impl TeacherCounts {
    /// The counts as metrics `{prefix}/rows_with_teacher`, `{prefix}/rows_without_skill`,
    /// `{prefix}/rows_nonfinite`, `{prefix}/rows_score_failed`,
    /// `{prefix}/context_mismatch_rows`, `{prefix}/skills_too_long`
    /// and `{prefix}/skills_per_row` (mean over the rows with a teacher; 0 without any).
    pub fn metrics(&self, prefix: &str) -> Vec<(String, f64)> {
        let per_row = if self.with_teacher == 0 {
            0.0
        } else {
            self.skills_injected as f64 / self.with_teacher as f64
        };
        [
            ("rows_with_teacher", self.with_teacher as f64),
            ("rows_without_skill", self.without_skill as f64),
            ("rows_nonfinite", self.nonfinite as f64),
            ("rows_score_failed", self.score_failed as f64),
            ("context_mismatch_rows", self.context_mismatch as f64),
            ("skills_too_long", self.skills_too_long as f64),
            ("skills_per_row", per_row),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{prefix}/{k}"), v))
        .collect()
    }
}

/// The teachers of a batch, in row order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Teachers {
    pub rows: Vec<RowTeacher>,
    pub counts: TeacherCounts,
}

/// Scores `requests` in one call; when that call fails (e.g. one teacher context does not
/// fit the model's window), scores them one by one and answers `None` for those that fail.
/// Fails only when every request fails (a systematic failure: no scorer, no top-k), with the
/// first error.
fn score_each(host: &dyn Host, requests: &[ScoreRequest]) -> Result<Vec<Option<Scored>>> {
    let check = |answers: Vec<Scored>, n: usize| {
        if answers.len() == n {
            Ok(answers)
        } else {
            Err(PluginError::host(format!(
                "scoring {n} teacher requests returned {} results",
                answers.len()
            )))
        }
    };
    let first = match host.score(requests) {
        Ok(answers) => {
            return Ok(check(answers, requests.len())?
                .into_iter()
                .map(Some)
                .collect())
        }
        Err(e) => e,
    };
    let mut out = Vec::with_capacity(requests.len());
    for r in requests {
        out.push(
            host.score(std::slice::from_ref(r))
                .and_then(|a| check(a, 1))
                .ok()
                .and_then(|a| a.into_iter().next()),
        );
    }
    if out.iter().all(Option::is_none) {
        return Err(first);
    }
    Ok(out)
}

type RenderKey = (String, bool, String, Option<String>);

fn render_key(variant: &ContextVariant, row: &TurnRow) -> RenderKey {
    (
        variant.inject.clone(),
        variant.tools_enabled,
        row.observation.clone(),
        row.anchor.clone(),
    )
}

fn render_cached(
    cache: &mut HashMap<RenderKey, Vec<u32>>,
    variant: &ContextVariant,
    row: &TurnRow,
    host: &dyn Host,
) -> Result<Vec<u32>> {
    let key = render_key(variant, row);
    if let Some(ids) = cache.get(&key) {
        return Ok(ids.clone());
    }
    let ids = host.render_prompt(&RenderRequest::for_row(variant.clone(), row))?;
    cache.insert(key, ids.clone());
    Ok(ids)
}

/// Retrieves, renders and scores the teacher of every trainable row of `batch` (see the
/// module docs). `top_k > 0` also asks for the teacher's top-k ids and log-probs (the backend
/// must offer them; declare `Requirements::teacher_topk`).
///
/// Errors: a trainable row without `old_logprobs` (an input error naming the row: the
/// plugin runs inside the trainer, which fills them), a bank, render or scoring failure, or
/// scores of the wrong shape (a host error naming the row).
pub fn score(config: &SkillConfig, batch: &Batch, host: &dyn Host, top_k: u32) -> Result<Teachers> {
    batch.validate()?;
    let mut counts = TeacherCounts::default();
    let mut retrieved: HashMap<(&str, &str), Retrieval> = HashMap::new();
    let mut renders: HashMap<RenderKey, Vec<u32>> = HashMap::new();
    let mut pending: Vec<(usize, Vec<u64>)> = Vec::new();
    let mut requests: Vec<ScoreRequest> = Vec::new();
    for (i, row) in batch.rows.iter().enumerate() {
        if row.trainable_tokens() == 0 {
            continue;
        }
        if row.old_logprobs.len() != row.response_ids.len() {
            return Err(PluginError::input(format!(
                "row {i} has no old_logprobs (ℓ_old); the teacher's gap needs them: run the \
                 plugin inside the trainer, or give every row its old_logprobs"
            )));
        }
        counts.trainable_rows += 1;
        let key = (row.task_id.as_str(), row.observation.as_str());
        let skills = match retrieved.entry(key) {
            Entry::Occupied(e) => &e.into_mut().skills,
            Entry::Vacant(e) => {
                let r = retrieve(config, row, host)?;
                counts.skills_too_long += r.too_long;
                &e.insert(r).skills
            }
        };
        let own = render_cached(&mut renders, &row.variant, row, host)?;
        if own != row.train_prompt() {
            counts.context_mismatch += 1;
        }
        if skills.is_empty() {
            counts.without_skill += 1;
            continue;
        }
        let variant = teacher_variant(&row.variant, &config.header, skills);
        let context_ids = render_cached(&mut renders, &variant, row, host)?;
        pending.push((i, skills.iter().map(|e| e.id).collect()));
        requests.push(ScoreRequest {
            context_ids,
            response_ids: row.response_ids.clone(),
            weights: ScoreWeights::Current,
            temperature: None,
            top_k,
        });
    }
    if requests.is_empty() {
        return Ok(Teachers {
            rows: Vec::new(),
            counts,
        });
    }
    let answers = score_each(host, &requests)?;
    let k = top_k as usize;
    let mut rows = Vec::with_capacity(answers.len());
    for ((i, skill_ids), scored) in pending.into_iter().zip(answers) {
        let Some(scored) = scored else {
            counts.score_failed += 1;
            continue;
        };
        let row = &batch.rows[i];
        let l = row.response_ids.len();
        if scored.logprobs.len() != l
            || scored.top_ids.len() != l * k
            || scored.top_logprobs.len() != l * k
        {
            return Err(PluginError::host(format!(
                "row {i}: the teacher's scores have {} log-probs and {} / {} top-k entries for {l} \
                 response tokens and k = {k}",
                scored.logprobs.len(),
                scored.top_ids.len(),
                scored.top_logprobs.len()
            )));
        }
        let finite = (0..l).filter(|&t| row.response_mask[t] == 1).all(|t| {
            row.old_logprobs[t].is_finite()
                && scored.logprobs[t].is_finite()
                && scored.top_logprobs[t * k..(t + 1) * k]
                    .iter()
                    .all(|x| x.is_finite())
        });
        if !finite {
            counts.nonfinite += 1;
            continue;
        }
        counts.with_teacher += 1;
        counts.skills_injected += skill_ids.len();
        rows.push(RowTeacher {
            row: i,
            skill_ids,
            logprobs: scored.logprobs,
            top_ids: scored.top_ids,
            top_logprobs: scored.top_logprobs,
        });
    }
    Ok(Teachers { rows, counts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_plugin_sdk::testing::MockHost;

    fn skill(id: u64, task: Option<&str>, text: &str) -> BankEntry {
        BankEntry {
            id,
            kind: EntryKind::Skill,
            text: text.into(),
            task_id: task.map(str::to_string),
            ..BankEntry::default()
        }
    }

    #[test]
    fn the_teacher_variant_appends_the_skills_to_the_rows_own_context() {
        let skills = [
            skill(4, None, " open it first "),
            skill(9, Some("t"), "look"),
        ];
        let plain = ContextVariant::default();
        let v = teacher_variant(&plain, "Skills:", &skills);
        assert_eq!(v.label, "plain+skills:2");
        assert_eq!(v.inject, "Skills:\n- open it first\n- look");
        assert!(v.tools_enabled);
        assert_eq!(v.extra[SKILL_IDS_KEY], json!([4, 9]));
        let mut own = ContextVariant {
            label: "hint".into(),
            inject: "a hint".into(),
            tools_enabled: false,
            ..ContextVariant::default()
        };
        own.extra.insert("x".into(), json!(1));
        let v = teacher_variant(&own, "", &skills);
        assert_eq!(v.inject, "a hint\nopen it first\nlook");
        assert!(!v.tools_enabled);
        assert_eq!(v.extra["x"], 1);
    }

    /// A bank that returns `hits` for a non-empty query and `fallback` for an empty one,
    /// whatever the query's filters.
    fn bank(hits: Vec<BankEntry>, fallback: Vec<BankEntry>) -> MockHost {
        MockHost::default().with_retrieval(move |q, _| {
            if q.text.is_empty() {
                fallback.clone()
            } else {
                hits.clone()
            }
        })
    }

    fn row() -> TurnRow {
        TurnRow {
            task_id: "t".into(),
            observation: "a closed drawer".into(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn retrieval_is_one_bm25_query_of_the_observation_then_the_tasks_newest() {
        let config = SkillConfig {
            k: 2,
            max_chars: 10,
            ..SkillConfig::default()
        };
        let host = bank(
            vec![
                skill(1, None, "x".repeat(11).as_str()),
                skill(2, Some("other"), "theirs"),
                skill(3, Some("t"), "mine"),
            ],
            vec![skill(5, Some("t"), "newest")],
        );
        let r = retrieve(&config, &row(), &host).unwrap();
        // k = 2: the top two hits; the first is too long, the second another task's.
        assert_eq!(r.skills, []);
        assert_eq!(r.too_long, 1);
        let q = host.queries.lock().unwrap()[0].clone();
        assert_eq!(q.text, "a closed drawer");
        assert_eq!((q.k, q.kinds.as_slice()), (2, &[EntryKind::Skill][..]));
        assert_eq!(q.task_id.as_deref(), Some("t"));
        assert!(q.include_general);
        assert_eq!(q.statuses, [EntryStatus::Active]);
        // No hit at all: the task's newest skills.
        let host = bank(Vec::new(), vec![skill(5, Some("t"), "newest")]);
        let r = retrieve(&config, &row(), &host).unwrap();
        let ids: Vec<u64> = r.skills.iter().map(|e| e.id).collect();
        assert_eq!(ids, [5]);
        let queries = host.queries.lock().unwrap();
        assert_eq!(queries.len(), 2);
        assert_eq!(queries[1].text, "");
        assert!(!queries[1].include_general);
    }

    #[test]
    fn a_teacher_that_does_not_fit_is_a_counted_drop_and_a_systematic_failure_an_error() {
        use crate::testing::{mock_host, row, skill, Teacher};
        let host_with_window = |window| {
            let host = mock_host(Teacher {
                window: Some(window),
                ..Teacher::default()
            });
            host.put(skill(1, Some("t"), "short"));
            host.put(skill(2, Some("u"), &"long ".repeat(20)));
            host
        };
        let host = host_with_window(100);
        let batch = Batch {
            step: 0,
            rows: vec![
                row(1, 1, "t", &[5, 6], &[-1.0, -1.0]),
                row(2, 2, "u", &[5, 6], &[-1.0, -1.0]),
            ],
        };
        let config = SkillConfig::default();
        let t = score(&config, &batch, &host, 0).unwrap();
        let rows: Vec<usize> = t.rows.iter().map(|r| r.row).collect();
        assert_eq!(rows, [0]);
        assert_eq!((t.counts.with_teacher, t.counts.score_failed), (1, 1));
        assert!(t
            .counts
            .metrics("x")
            .contains(&("x/rows_score_failed".to_string(), 1.0)));
        let host = host_with_window(10);
        let e = score(&config, &batch, &host, 0).unwrap_err();
        assert!(e.message.contains("context window of 10"), "{e}");
    }
}
