//! [`PoolReader`]: read-only queries (episodes by filter, per-step summaries, one episode turn
//! by turn, the rows of an export), also while a trainer writes the pool.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use cairn_plugin_sdk::{ContextVariant, FinishReason, TurnRow};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row};
use serde::Serialize;

use super::schema::{self, blob_f32, blob_ids, sql, TurnText};
use super::{Exclusion, ExclusionTarget, Exclusions, Source};
use crate::error::{Error, Result};

/// Which episodes a query returns. Every field narrows; the default is everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Steps `≥ step_min` (the batch's 0-based step; for evaluations, the RL steps done).
    pub step_min: Option<u64>,
    /// Steps `≤ step_max`.
    pub step_max: Option<u64>,
    pub task: Option<String>,
    /// Episode reward `≥ reward_min` (failed episodes, without a reward, never match).
    pub reward_min: Option<f64>,
    pub reward_max: Option<f64>,
    pub success: Option<bool>,
    /// Episodes whose (oldest) policy version is in `[version_min, version_max]`.
    pub version_min: Option<u64>,
    pub version_max: Option<u64>,
    /// Context-variant label.
    pub variant: Option<String>,
    /// `rollout`, `gateway`, `eval:<label>`, or the groups `train` (rollout and gateway) and
    /// `eval` (every evaluation).
    pub source: Option<String>,
    /// Only episodes a curated exclusion matches (`true`) or does not (`false`).
    pub excluded: Option<bool>,
    /// Only failed episodes (`true`) or finished ones (`false`).
    pub failed: Option<bool>,
    pub trajectory: Option<u64>,
    /// At most this many episodes (the first by id).
    pub limit: Option<usize>,
}

/// One RL step's (or one evaluation's) totals over the episodes a filter selects.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepSummary {
    pub step: u64,
    /// Turn rows.
    pub rows: u64,
    pub episodes: u64,
    /// Mean episode reward over the finished (not failed) episodes; `None` when there is none.
    pub mean_reward: Option<f64>,
    /// Successes over episodes (a failed episode counts as no success).
    pub success_rate: f64,
    /// Episodes a curated exclusion matches.
    pub excluded: u64,
    pub failed: u64,
    /// Episodes with at least one trained turn.
    pub trained: u64,
    /// The `steps` row's policy version (after the step), for training steps.
    pub policy_version: Option<u64>,
}

/// One episode's row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpisodeSummary {
    /// The pool's episode id (unique in the file).
    pub id: u64,
    pub source: String,
    pub step: u64,
    pub global_step: u64,
    pub round: u32,
    pub trajectory_id: u64,
    pub group_id: u64,
    pub task_id: String,
    pub seed: Option<u64>,
    pub harness_episode: Option<String>,
    pub variant: String,
    pub policy_version: u64,
    pub turns: u32,
    pub episode_reward: Option<f32>,
    pub success: bool,
    pub failure: Option<String>,
    pub trained: bool,
    pub skip_reason: Option<String>,
    /// The first curated exclusion that matches it now (`<kind> <target>: <reason>`).
    pub excluded: Option<String>,
}

/// One turn, as written: the row (its prompt rebuilt whole), advantages, trained or not.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnRecord {
    pub episode: u64,
    pub row: TurnRow,
    pub advantages: Option<Vec<f32>>,
    pub trained: bool,
    pub skip_reason: Option<String>,
}

/// A pool opened read-only (`mode=ro`): never writes, never creates, and works while a
/// trainer writes the same file (WAL: a reader sees the last committed step).
pub struct PoolReader {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for PoolReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolReader")
            .field("path", &self.path)
            .finish()
    }
}

/// `(SELECT …)`: the first exclusion matching episode `e`, as text, or NULL.
const EXCLUDED: &str = "(SELECT x.kind || ' ' || x.target || ': ' || x.reason FROM exclusions x \
    WHERE (x.kind = 'task' AND x.target = e.task_id) \
    OR (x.kind = 'episode' AND e.source NOT LIKE 'eval:%' AND x.target = CAST(e.trajectory_id AS TEXT)) \
    OR (x.kind = 'harness' AND x.target = e.harness_episode) ORDER BY x.id LIMIT 1)";

const EPISODE_COLUMNS: &str = "e.id, e.source, e.step, e.global_step, e.round, e.trajectory_id, \
    e.group_id, e.task_id, e.seed, e.harness_episode, e.variant, e.policy_version, e.turns, \
    e.episode_reward, e.success, e.failure, e.trained, e.skip_reason";

impl PoolReader {
    /// Opens `<run>/pool.sqlite` read-only; a run directory without one is
    /// [`Error::NoPool`], a path that is no directory [`Error::NotARunDir`].
    pub fn open_run(run: &Path) -> Result<PoolReader> {
        PoolReader::open(&super::existing_pool_path(run)?)
    }

    /// Opens the pool file at `path` read-only.
    pub fn open(path: &Path) -> Result<PoolReader> {
        let (conn, _version) = schema::POOL.open_read_only(path, schema::BUSY_TIMEOUT)?;
        Ok(PoolReader {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Episodes matching `filter`, by id.
    pub fn episodes(&self, filter: &Filter) -> Result<Vec<EpisodeSummary>> {
        let (clause, params) = where_clause(filter);
        let limit = filter
            .limit
            .map_or(String::new(), |n| format!(" LIMIT {n}"));
        let sql_text = format!(
            "SELECT {EPISODE_COLUMNS}, {EXCLUDED} FROM episodes e {clause} ORDER BY e.id{limit}"
        );
        let mut stmt = self
            .conn
            .prepare(&sql_text)
            .map_err(sql(&self.path, "querying episodes"))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), episode_from)
            .map_err(sql(&self.path, "querying episodes"))?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(sql(&self.path, "querying episodes"))
    }

    /// The episode with pool id `id`.
    pub fn episode(&self, id: u64) -> Result<Option<EpisodeSummary>> {
        self.conn
            .query_row(
                &format!("SELECT {EPISODE_COLUMNS}, {EXCLUDED} FROM episodes e WHERE e.id = ?1"),
                [id as i64],
                episode_from,
            )
            .optional()
            .map_err(sql(&self.path, "reading an episode"))
    }

    /// Per-step totals over the episodes matching `filter` (its `limit` is ignored), by step.
    pub fn step_summaries(&self, filter: &Filter) -> Result<Vec<StepSummary>> {
        let (clause, params) = where_clause(filter);
        let sql_text = format!(
            "SELECT e.step, sum(e.turns), count(*), avg(e.episode_reward), avg(e.success), \
             sum({EXCLUDED} IS NOT NULL), sum(e.failure IS NOT NULL), sum(e.trained), \
             (SELECT s.policy_version FROM steps s WHERE s.step = e.step) \
             FROM episodes e {clause} GROUP BY e.step ORDER BY e.step"
        );
        let mut stmt = self
            .conn
            .prepare(&sql_text)
            .map_err(sql(&self.path, "summarising steps"))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |r| {
                Ok(StepSummary {
                    step: r.get::<_, i64>(0)? as u64,
                    rows: r.get::<_, i64>(1)? as u64,
                    episodes: r.get::<_, i64>(2)? as u64,
                    mean_reward: r.get(3)?,
                    success_rate: r.get::<_, Option<f64>>(4)?.unwrap_or(0.0),
                    excluded: r.get::<_, i64>(5)? as u64,
                    failed: r.get::<_, i64>(6)? as u64,
                    trained: r.get::<_, i64>(7)? as u64,
                    policy_version: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
                })
            })
            .map_err(sql(&self.path, "summarising steps"))?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(sql(&self.path, "summarising steps"))
    }

    /// The turns of episode `id`, in turn order.
    pub fn turns(&self, id: u64) -> Result<Vec<TurnRecord>> {
        let Some(e) = self.episode(id)? else {
            return Ok(Vec::new());
        };
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT t.turn, t.policy_version, t.prompt_shared, t.prompt_ids, \
                 t.train_prompt_ids, t.response_ids, t.response_logprobs, t.response_mask, \
                 t.old_logprobs, t.ref_logprobs, t.advantages, t.finish_reason, t.turn_reward, \
                 t.last_turn, t.feedback, t.tool_calls, v.json, t.trained, t.skip_reason \
                 FROM turns t JOIN variants v ON v.id = t.variant \
                 WHERE t.episode = ?1 ORDER BY t.turn",
            )
            .map_err(sql(&self.path, "reading turns"))?;
        let raw = stmt
            .query_map([id as i64], RawTurn::from_row)
            .map_err(sql(&self.path, "reading turns"))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(sql(&self.path, "reading turns"))?;
        if raw.is_empty() {
            return Ok(Vec::new());
        }
        let data: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT data FROM texts WHERE episode = ?1")
            .and_then(|mut s| s.query_row([id as i64], |r| r.get(0)).optional())
            .map_err(sql(&self.path, "reading turns"))?;
        let mut texts = match data {
            Some(data) => schema::blob_texts(&data, &self.path, id)?,
            None => Vec::new(),
        };
        let mut previous: Vec<u32> = Vec::new();
        let mut out = Vec::with_capacity(raw.len());
        for t in raw {
            let Some(at) = texts.iter().position(|x| x.turn == t.turn) else {
                return Err(Error::Pool {
                    path: self.path.clone(),
                    doing: "reading a turn",
                    detail: format!(
                        "episode {id} turn {}: no texts for it: the file is damaged",
                        t.turn
                    ),
                });
            };
            let record = t.into_record(&e, texts.swap_remove(at), &previous, &self.path)?;
            previous = record.row.prompt_ids.clone();
            out.push(record);
        }
        Ok(out)
    }

    /// Every turn of the episodes matching `filter`, episode by episode (the rows of an
    /// export).
    pub fn turns_matching(&self, filter: &Filter) -> Result<Vec<TurnRecord>> {
        let mut out = Vec::new();
        for e in self.episodes(filter)? {
            out.extend(self.turns(e.id)?);
        }
        Ok(out)
    }

    /// The `steps` row of `step`: its metrics and decisions JSON.
    pub fn step_record(&self, step: u64) -> Result<Option<(serde_json::Value, serde_json::Value)>> {
        let row: Option<(String, String)> = self
            .conn
            .query_row(
                "SELECT metrics, decisions FROM steps WHERE step = ?1",
                [step as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(sql(&self.path, "reading a step"))?;
        row.map(|(m, d)| {
            let parse = |text: &str| {
                serde_json::from_str(text).map_err(|e| Error::Pool {
                    path: self.path.clone(),
                    doing: "reading a step",
                    detail: format!("step {step}: {e}"),
                })
            };
            Ok((parse(&m)?, parse(&d)?))
        })
        .transpose()
    }

    /// The exclusions in force, oldest first.
    pub fn exclusions(&self) -> Result<Exclusions> {
        exclusions(&self.conn, &self.path)
    }

    /// `(episodes, turns)` that `target` matches now: for an episode or a turn, those of
    /// training trajectories (evaluations reuse trajectory ids and are never trained); for a
    /// task or a harness episode id, those of every source.
    pub fn exclusion_matches(&self, target: &ExclusionTarget) -> Result<(u64, u64)> {
        let training = "e.source NOT LIKE 'eval:%'";
        let (episodes, turns, params): (String, String, Vec<Value>) = match target {
            ExclusionTarget::Episode(t) => (
                format!("{training} AND e.trajectory_id = ?1"),
                String::new(),
                vec![Value::Integer(*t as i64)],
            ),
            ExclusionTarget::Turn { trajectory, turn } => (
                format!(
                    "{training} AND e.trajectory_id = ?1 AND EXISTS (SELECT 1 FROM turns t \
                     WHERE t.episode = e.id AND t.turn = ?2)"
                ),
                " AND t.turn = ?2".into(),
                vec![
                    Value::Integer(*trajectory as i64),
                    Value::Integer(i64::from(*turn)),
                ],
            ),
            ExclusionTarget::Task(task) => (
                "e.task_id = ?1".into(),
                String::new(),
                vec![Value::Text(task.clone())],
            ),
            ExclusionTarget::Harness(h) => (
                "e.harness_episode = ?1".into(),
                String::new(),
                vec![Value::Text(h.clone())],
            ),
        };
        let sql_text = format!(
            "SELECT (SELECT count(*) FROM episodes e WHERE {episodes}), \
             (SELECT count(*) FROM turns t JOIN episodes e ON e.id = t.episode \
              WHERE {episodes}{turns})"
        );
        self.conn
            .query_row(&sql_text, rusqlite::params_from_iter(params), |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })
            .map_err(sql(&self.path, "counting an exclusion's rows"))
    }

    /// `(episodes, turns)` in the pool.
    pub fn counts(&self) -> Result<(u64, u64)> {
        self.conn
            .query_row(
                "SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM turns)",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .map_err(sql(&self.path, "counting rows"))
    }
}

pub(super) fn exclusions(conn: &Connection, path: &Path) -> Result<Exclusions> {
    let mut stmt = conn
        .prepare_cached("SELECT kind, target, reason, created_at FROM exclusions ORDER BY id")
        .map_err(sql(path, "reading the exclusions"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .map_err(sql(path, "reading the exclusions"))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(sql(path, "reading the exclusions"))?;
    rows.into_iter()
        .map(|(k, t, reason, at)| exclusion_from(&k, &t, reason, at, path))
        .collect::<Result<Vec<_>>>()
        .map(Exclusions)
}

fn where_clause(f: &Filter) -> (String, Vec<Value>) {
    let mut conds: Vec<String> = Vec::new();
    let mut params: Vec<Value> = Vec::new();
    let mut push = |cond: &str, v: Value| {
        params.push(v);
        conds.push(cond.replace('?', &format!("?{}", params.len())));
    };
    if let Some(v) = f.step_min {
        push("e.step >= ?", Value::Integer(v as i64));
    }
    if let Some(v) = f.step_max {
        push("e.step <= ?", Value::Integer(v as i64));
    }
    if let Some(v) = &f.task {
        push("e.task_id = ?", Value::Text(v.clone()));
    }
    // Rewards are f32 (stored widened to REAL): compare in f32 precision, so that
    // `reward_min: 0.9` matches the reward 0.9f32 (0.89999997…).
    let reward = |v: f64| Value::Real(f64::from(v as f32));
    if let Some(v) = f.reward_min {
        push("e.episode_reward >= ?", reward(v));
    }
    if let Some(v) = f.reward_max {
        push("e.episode_reward <= ?", reward(v));
    }
    if let Some(v) = f.success {
        push("e.success = ?", Value::Integer(i64::from(v)));
    }
    if let Some(v) = f.version_min {
        push("e.policy_version >= ?", Value::Integer(v as i64));
    }
    if let Some(v) = f.version_max {
        push("e.policy_version <= ?", Value::Integer(v as i64));
    }
    if let Some(v) = &f.variant {
        push("e.variant = ?", Value::Text(v.clone()));
    }
    if let Some(v) = f.trajectory {
        push("e.trajectory_id = ?", Value::Integer(v as i64));
    }
    match f.source.as_deref() {
        None => {}
        Some("train") => conds.push("e.source IN ('rollout', 'gateway')".into()),
        Some("eval") => conds.push("e.source LIKE 'eval:%'".into()),
        Some(s) => push("e.source = ?", Value::Text(s.into())),
    }
    match f.excluded {
        None => {}
        Some(true) => conds.push(format!("{EXCLUDED} IS NOT NULL")),
        Some(false) => conds.push(format!("{EXCLUDED} IS NULL")),
    }
    match f.failed {
        None => {}
        Some(true) => conds.push("e.failure IS NOT NULL".into()),
        Some(false) => conds.push("e.failure IS NULL".into()),
    }
    if conds.is_empty() {
        (String::new(), params)
    } else {
        (format!("WHERE {}", conds.join(" AND ")), params)
    }
}

fn episode_from(r: &Row<'_>) -> rusqlite::Result<EpisodeSummary> {
    Ok(EpisodeSummary {
        id: r.get::<_, i64>(0)? as u64,
        source: r.get(1)?,
        step: r.get::<_, i64>(2)? as u64,
        global_step: r.get::<_, i64>(3)? as u64,
        round: r.get(4)?,
        trajectory_id: r.get::<_, i64>(5)? as u64,
        group_id: r.get::<_, i64>(6)? as u64,
        task_id: r.get(7)?,
        seed: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
        harness_episode: r.get(9)?,
        variant: r.get(10)?,
        policy_version: r.get::<_, i64>(11)? as u64,
        turns: r.get(12)?,
        episode_reward: r.get::<_, Option<f64>>(13)?.map(|v| v as f32),
        success: r.get(14)?,
        failure: r.get(15)?,
        trained: r.get(16)?,
        skip_reason: r.get(17)?,
        excluded: r.get(18)?,
    })
}

/// A `turns` row as stored (prompt still a delta).
struct RawTurn {
    turn: u32,
    policy_version: i64,
    prompt_shared: i64,
    prompt: Vec<u8>,
    train_prompt: Option<Vec<u8>>,
    response: Vec<u8>,
    logprobs: Vec<u8>,
    mask: Vec<u8>,
    /// `None`: the sampled log-probs (`logprobs`).
    old: Option<Vec<u8>>,
    reference: Vec<u8>,
    advantages: Option<Vec<u8>>,
    finish: String,
    turn_reward: f64,
    last_turn: bool,
    feedback: i64,
    tool_calls: u32,
    variant: String,
    trained: bool,
    skip_reason: Option<String>,
}

impl RawTurn {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<RawTurn> {
        Ok(RawTurn {
            turn: r.get(0)?,
            policy_version: r.get(1)?,
            prompt_shared: r.get(2)?,
            prompt: r.get(3)?,
            train_prompt: r.get(4)?,
            response: r.get(5)?,
            logprobs: r.get(6)?,
            mask: r.get(7)?,
            old: r.get(8)?,
            reference: r.get(9)?,
            advantages: r.get(10)?,
            finish: r.get(11)?,
            turn_reward: r.get(12)?,
            last_turn: r.get(13)?,
            feedback: r.get(14)?,
            tool_calls: r.get(15)?,
            variant: r.get(16)?,
            trained: r.get(17)?,
            skip_reason: r.get(18)?,
        })
    }

    fn into_record(
        self,
        e: &EpisodeSummary,
        text: TurnText<'static>,
        previous: &[u32],
        path: &Path,
    ) -> Result<TurnRecord> {
        let damaged = |detail: String| Error::Pool {
            path: path.to_path_buf(),
            doing: "reading a turn",
            detail: format!("episode {} turn {}: {detail}", e.id, self.turn),
        };
        let shared = self.prompt_shared as usize;
        if shared > previous.len() {
            return Err(damaged(format!(
                "the prompt shares {shared} ids with a previous prompt of {}",
                previous.len()
            )));
        }
        let mut prompt_ids = previous[..shared].to_vec();
        prompt_ids.extend(blob_ids(&self.prompt, path, "prompt_ids")?);
        let variant: ContextVariant = serde_json::from_str(&self.variant)
            .map_err(|err| damaged(format!("variant: {err}")))?;
        let finish_reason: FinishReason =
            serde_json::from_value(serde_json::Value::String(self.finish.clone()))
                .map_err(|err| damaged(format!("finish_reason `{}`: {err}", self.finish)))?;
        let row = TurnRow {
            group_id: e.group_id,
            trajectory_id: e.trajectory_id,
            turn: self.turn,
            task_id: e.task_id.clone(),
            policy_version: self.policy_version as u64,
            variant,
            prompt_ids,
            response_ids: blob_ids(&self.response, path, "response_ids")?,
            response_logprobs: blob_f32(&self.logprobs, path, "response_logprobs")?,
            response_mask: self.mask,
            finish_reason,
            turn_reward: self.turn_reward as f32,
            episode_reward: e.episode_reward.unwrap_or(0.0),
            success: e.success,
            last_turn: self.last_turn,
            anchor: text.anchor.map(Cow::into_owned),
            observation: text.observation.into_owned(),
            feedback: self.feedback as i8,
            tool_calls: self.tool_calls,
            info: text.info.into_owned(),
            extra: text.extra.into_owned(),
            old_logprobs: blob_f32(
                self.old.as_deref().unwrap_or(&self.logprobs),
                path,
                "old_logprobs",
            )?,
            ref_logprobs: blob_f32(&self.reference, path, "ref_logprobs")?,
            train_prompt_ids: self
                .train_prompt
                .map(|b| blob_ids(&b, path, "train_prompt_ids"))
                .transpose()?,
        };
        Ok(TurnRecord {
            episode: e.id,
            row,
            advantages: self
                .advantages
                .map(|b| blob_f32(&b, path, "advantages"))
                .transpose()?,
            trained: self.trained,
            skip_reason: self.skip_reason,
        })
    }
}

impl Source {
    /// Whether a `source` column value is a training source (rollout or gateway).
    pub fn is_training(text: &str) -> bool {
        matches!(Source::parse(text), Some(Source::Rollout | Source::Gateway))
    }
}

/// An exclusion row back into its type.
fn exclusion_from(
    kind: &str,
    target: &str,
    reason: String,
    created_at: i64,
    path: &Path,
) -> Result<Exclusion> {
    let target = ExclusionTarget::parse(kind, target).ok_or_else(|| Error::Pool {
        path: path.to_path_buf(),
        doing: "reading the exclusions",
        detail: format!("an exclusion `{kind}` `{target}` this cairn does not read"),
    })?;
    Ok(Exclusion {
        target,
        reason,
        created_at,
    })
}
