//! [`Pool`]: the writer — steps, episodes, evaluations, truncation on resume, exclusions.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::schema::{f32_blob, ids_blob, sql, texts_blob, to_i64, TurnText, BUSY_TIMEOUT, POOL};
use super::{EpisodeWrite, ExclusionTarget, Exclusions, StepWrite};
use crate::error::{Error, Result};

/// The data pool's writer: one SQLite connection to `<run>/pool.sqlite` (or memory).
/// Every write is one transaction, so a failed write changes nothing.
pub struct Pool {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("path", &self.path).finish()
    }
}

impl Pool {
    /// Opens the pool at `path`, creating the file and the schema when it is absent or empty.
    ///
    /// A file that is not SQLite, another program's database, or a pool of a newer schema
    /// version is refused ([`Error::Pool`], [`Error::PoolSchema`]) and left as it is (the
    /// stores' shared SQLite helper, `sqlite.rs`, checks it before anything is
    /// written). WAL mode (readers never block the writer), `synchronous = NORMAL` (a killed
    /// process loses no committed step), foreign keys on (deleting an episode deletes its
    /// turns). The write lock is taken once at open (waiting up to [`BUSY_TIMEOUT`] for another
    /// writer), so a pool another process holds fails here rather than at the first step.
    pub fn open(path: &Path) -> Result<Pool> {
        Ok(Pool {
            conn: POOL.open(path, BUSY_TIMEOUT)?,
            path: path.to_path_buf(),
        })
    }

    /// Opens an existing pool for curation (`cairn pool exclude`): refuses a missing file
    /// rather than creating one, and refuses what [`PoolReader::open`] refuses (an empty file
    /// or database, a file that is not a pool) rather than turning it into a pool.
    ///
    /// [`PoolReader::open`]: super::PoolReader::open
    pub fn open_existing(path: &Path) -> Result<Pool> {
        if !path.is_file() {
            return Err(Error::NoPool {
                run: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            });
        }
        drop(super::PoolReader::open(path)?);
        Pool::open(path)
    }

    /// A pool in memory only (`cairn eval`, benchmarks, tests).
    pub fn in_memory() -> Result<Pool> {
        Ok(Pool {
            conn: POOL.open_in_memory()?,
            path: PathBuf::from(":memory:"),
        })
    }

    fn begin(&mut self, doing: &'static str) -> Result<Transaction<'_>> {
        let path = self.path.clone();
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql(&path, doing))
    }

    /// The database file (`:memory:` for an in-memory pool).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one RL step in one transaction: its `steps` row and its episodes with their
    /// turns. Whatever an earlier attempt wrote for the same step (training sources) is
    /// replaced, so writing a step twice leaves it once.
    pub fn record_step(&mut self, step: &StepWrite) -> Result<()> {
        let path = self.path.clone();
        let tx = self.begin("starting a step")?;
        let s = to_i64(&path, "step", step.step)?;
        tx.execute(
            "DELETE FROM episodes WHERE step = ?1 AND source NOT LIKE 'eval:%'",
            [s],
        )
        .map_err(sql(&path, "replacing a step"))?;
        tx.execute(
            "INSERT OR REPLACE INTO steps (step, phase, policy_version, metrics, decisions) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![
                s,
                step.phase,
                to_i64(&path, "policy_version", step.policy_version)?,
                serde_json::Value::Object(step.metrics.clone()).to_string(),
                step.decisions.to_string(),
            ],
        )
        .map_err(sql(&path, "writing a step"))?;
        for e in &step.episodes {
            insert_episode(&tx, &path, e)?;
        }
        tx.commit().map_err(sql(&path, "committing a step"))
    }

    /// Writes episodes outside a step (an evaluation's) in one transaction.
    pub fn record_episodes(&mut self, episodes: &[EpisodeWrite]) -> Result<()> {
        let path = self.path.clone();
        let tx = self.begin("starting a write")?;
        for e in episodes {
            insert_episode(&tx, &path, e)?;
        }
        tx.commit().map_err(sql(&path, "committing episodes"))
    }

    /// Deletes what was written after a checkpoint: training steps `≥ rl_steps` (the
    /// checkpoint had `rl_steps` RL steps done) and the evaluations after it — all but the
    /// first `evals` evaluations when the checkpoint counted them (its eval.jsonl lines; each
    /// evaluation writes the pool before its line), else those with a `global_step` above
    /// `global_step` (eval.jsonl's older rule). Exclusions stay.
    pub fn truncate_after(
        &mut self,
        rl_steps: u64,
        global_step: u64,
        evals: Option<u64>,
    ) -> Result<()> {
        let path = self.path.clone();
        let rl = to_i64(&path, "rl_steps", rl_steps)?;
        let g = to_i64(&path, "global_step", global_step)?;
        let tx = self.begin("starting a truncation")?;
        tx.execute("DELETE FROM steps WHERE step >= ?1", [rl])
            .map_err(sql(&path, "truncating the steps"))?;
        tx.execute(
            "DELETE FROM episodes WHERE source NOT LIKE 'eval:%' AND step >= ?1",
            [rl],
        )
        .map_err(sql(&path, "truncating the episodes"))?;
        match evals {
            Some(n) => {
                let first_dropped: Option<i64> = tx
                    .query_row(
                        "SELECT min(id) AS first FROM episodes WHERE source LIKE 'eval:%' \
                         GROUP BY source, global_step ORDER BY first LIMIT 1 OFFSET ?1",
                        [to_i64(&path, "evals", n)?],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(sql(&path, "truncating the evaluations"))?;
                if let Some(id) = first_dropped {
                    tx.execute(
                        "DELETE FROM episodes WHERE source LIKE 'eval:%' AND id >= ?1",
                        [id],
                    )
                    .map_err(sql(&path, "truncating the evaluations"))?;
                }
            }
            None => {
                tx.execute(
                    "DELETE FROM episodes WHERE source LIKE 'eval:%' AND global_step > ?1",
                    [g],
                )
                .map_err(sql(&path, "truncating the evaluations"))?;
            }
        }
        tx.commit().map_err(sql(&path, "committing a truncation"))
    }

    /// Empties the pool for a run that starts over (steps, episodes, turns; episode ids
    /// restart at 1). Exclusions stay: they are the user's curation, not the run's output.
    pub fn reset(&mut self) -> Result<()> {
        let path = self.path.clone();
        let tx = self.begin("starting a reset")?;
        tx.execute_batch(
            "DELETE FROM texts; DELETE FROM turns; DELETE FROM episodes; DELETE FROM steps; \
             DELETE FROM variants;",
        )
        .map_err(sql(&path, "emptying the pool"))?;
        tx.commit().map_err(sql(&path, "committing a reset"))
    }

    /// Marks `target` excluded with `reason` (replacing the reason of an existing exclusion
    /// of the same target). Returns whether it is new.
    pub fn exclude(&mut self, target: &ExclusionTarget, reason: &str) -> Result<bool> {
        if reason.trim().is_empty() {
            return Err(Error::Pool {
                path: self.path.clone(),
                doing: "excluding",
                detail: "the reason is empty; say why (it is written on every skipped row)".into(),
            });
        }
        let path = self.path.clone();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let tx = self.begin("starting an exclusion")?;
        let existed: i64 = tx
            .query_row(
                "SELECT count(*) FROM exclusions WHERE kind = ?1 AND target = ?2",
                (target.kind(), target.target()),
                |r| r.get(0),
            )
            .map_err(sql(&path, "reading the exclusions"))?;
        tx.execute(
            "INSERT INTO exclusions (kind, target, reason, created_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT(kind, target) DO UPDATE SET reason = excluded.reason",
            (target.kind(), target.target(), reason, now),
        )
        .map_err(sql(&path, "writing an exclusion"))?;
        tx.commit().map_err(sql(&path, "committing an exclusion"))?;
        Ok(existed == 0)
    }

    /// Removes the exclusion of `target`. Returns whether there was one.
    pub fn include(&mut self, target: &ExclusionTarget) -> Result<bool> {
        let n = self
            .conn
            .execute(
                "DELETE FROM exclusions WHERE kind = ?1 AND target = ?2",
                (target.kind(), target.target()),
            )
            .map_err(sql(&self.path, "removing an exclusion"))?;
        Ok(n > 0)
    }

    /// The exclusions in force, oldest first.
    pub fn exclusions(&self) -> Result<Exclusions> {
        super::read::exclusions(&self.conn, &self.path)
    }
}

fn insert_episode(tx: &Transaction<'_>, path: &Path, e: &EpisodeWrite) -> Result<()> {
    let policy_version = e
        .turns
        .iter()
        .map(|t| t.row.policy_version)
        .min()
        .unwrap_or(0);
    let variant = e
        .turns
        .first()
        .map_or("plain", |t| t.row.variant.label.as_str());
    let trained = e.turns.iter().any(|t| t.trained);
    let skip_reason = if trained {
        e.turns
            .iter()
            .find_map(|t| t.skip_reason.as_ref())
            .map(|r| format!("some turns: {r}"))
    } else {
        e.turns
            .iter()
            .find_map(|t| t.skip_reason.clone())
            .or_else(|| e.failure.as_ref().map(|_| "failed".to_string()))
    };
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO episodes (source, step, global_step, round, trajectory_id, group_id, \
             task_id, seed, harness_episode, variant, policy_version, turns, episode_reward, \
             success, failure, trained, skip_reason) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
        )
        .map_err(sql(path, "writing an episode"))?;
    insert
        .execute(rusqlite::params![
            e.source.as_text(),
            to_i64(path, "step", e.step)?,
            to_i64(path, "global_step", e.global_step)?,
            e.round,
            to_i64(path, "trajectory_id", e.trajectory_id)?,
            to_i64(path, "group_id", e.group_id)?,
            e.task_id,
            e.seed.map(|s| s as i64),
            e.harness_episode,
            variant,
            to_i64(path, "policy_version", policy_version)?,
            e.turns.len() as i64,
            e.episode_reward.map(f64::from),
            e.success,
            e.failure,
            trained,
            skip_reason,
        ])
        .map_err(sql(path, "writing an episode"))?;
    let episode = tx.last_insert_rowid();
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO turns (episode, turn, policy_version, prompt_shared, prompt_ids, \
             train_prompt_ids, response_ids, response_logprobs, response_mask, old_logprobs, \
             ref_logprobs, advantages, finish_reason, turn_reward, last_turn, feedback, \
             tool_calls, variant, trained, skip_reason) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
             ?17, ?18, ?19, ?20)",
        )
        .map_err(sql(path, "writing a turn"))?;
    let mut previous: &[u32] = &[];
    // The episode's variants' ids (its turns mostly share one).
    let mut variants: Vec<(&cairn_plugin_sdk::ContextVariant, i64)> = Vec::new();
    let mut texts = Vec::with_capacity(e.turns.len());
    for t in &e.turns {
        let r = &t.row;
        let shared = previous
            .iter()
            .zip(&r.prompt_ids)
            .take_while(|(a, b)| a == b)
            .count();
        previous = &r.prompt_ids;
        let variant = match variants.iter().find(|(v, _)| **v == r.variant) {
            Some((_, id)) => *id,
            None => {
                let id = variant_id(tx, path, &r.variant)?;
                variants.push((&r.variant, id));
                id
            }
        };
        let finish = serde_json::to_value(r.finish_reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let logprobs = f32_blob(&r.response_logprobs);
        let old = f32_blob(&r.old_logprobs);
        insert
            .execute(rusqlite::params![
                episode,
                r.turn,
                to_i64(path, "policy_version", r.policy_version)?,
                shared as i64,
                ids_blob(&r.prompt_ids[shared..]),
                r.train_prompt_ids.as_deref().map(ids_blob),
                ids_blob(&r.response_ids),
                logprobs,
                r.response_mask.clone(),
                // NULL: the sampled log-probs, bit for bit (log-prob reuse).
                (old != logprobs).then_some(old),
                f32_blob(&r.ref_logprobs),
                t.advantages.as_deref().map(f32_blob),
                finish,
                f64::from(r.turn_reward),
                r.last_turn,
                i64::from(r.feedback),
                r.tool_calls,
                variant,
                t.trained,
                t.skip_reason,
            ])
            .map_err(sql(path, "writing a turn"))?;
        texts.push(TurnText {
            turn: r.turn,
            anchor: r.anchor.as_deref().map(Cow::Borrowed),
            observation: Cow::Borrowed(&r.observation),
            info: Cow::Borrowed(&r.info),
            extra: Cow::Borrowed(&r.extra),
        });
    }
    if !texts.is_empty() {
        tx.prepare_cached("INSERT INTO texts (episode, data) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute((episode, texts_blob(&texts))))
            .map_err(sql(path, "writing the turn texts"))?;
    }
    Ok(())
}

/// The `variants` row of `variant` (its JSON, whole), added when it is new.
fn variant_id(
    tx: &Transaction<'_>,
    path: &Path,
    variant: &cairn_plugin_sdk::ContextVariant,
) -> Result<i64> {
    let json = serde_json::to_string(variant).expect("a context variant serialises");
    tx.prepare_cached(
        "INSERT INTO variants (label, json) VALUES (?1, ?2) \
         ON CONFLICT (json) DO UPDATE SET label = excluded.label RETURNING id",
    )
    .and_then(|mut s| s.query_row((&variant.label, &json), |r| r.get(0)))
    .map_err(sql(path, "writing a context variant"))
}
