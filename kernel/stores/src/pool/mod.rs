//! The data pool: every trajectory a run plays, turn by turn, with what the trainer made of
//! it, in one SQLite file in the run directory (`<run>/pool.sqlite`, [`POOL_FILE`]). It
//! replaces the per-step JSON files; the batch JSON form (`docs/batch-json.md`) stays
//! available through export (`cairn pool export`). See `docs/pool.md`.
//!
//! [`Pool`] is the writer (one connection, owned by
//! the kernel's `DataPoolActor` in a run); [`PoolReader`] opens a pool read-only,
//! also while a trainer writes it (WAL mode), for `cairn pool`, `cairn inspect` and the
//! dashboard.
//!
//! # What is written, and when
//!
//! One transaction per RL step, written by the optimizer actor once the step is done (after
//! the signals, the update and `observe`), so every row carries its final reward, its
//! advantages and whether it was trained: rows of resample rounds included; rows that were
//! not trained (a dropped group, a stale trajectory, a curated exclusion) are written with
//! `trained = 0` and the reason. Episodes cut by an environment fault are written with their
//! failure and no turns. Held-out evaluations write their episodes too (source
//! `eval:<label>`), never trained. A resumed run first deletes what was written after its
//! checkpoint ([`Pool::truncate_after`]), so its pool equals an uninterrupted run's.
//!
//! # Schema (version [`SCHEMA_VERSION`], in `meta.pool_schema_version`)
//!
//! Arrays are little-endian BLOBs: token ids `u32` (4 bytes each), log-probs and advantages
//! `f32` (4 bytes, bit-exact), the mask `u8` (1 byte each). A turn's texts (anchor,
//! observation, info, extra) are kept per episode, compressed (`texts`), and each distinct
//! context variant once (`variants`): both repeat from turn to turn.
//!
//! * `steps` — one row per RL step: `step` (the batch's step: 0-based, metrics.jsonl's
//!   `rl_step` minus 1), `phase` (`rl`), `policy_version` (after the step), `metrics` (the
//!   step's metrics.jsonl values, JSON), `decisions` (JSON: `dropped_groups` by the plugins,
//!   `stale_groups` and `stale_trajectories` dropped by the staleness bound,
//!   `excluded_trajectories` and `excluded_turns` skipped by curation, `resample_rounds`,
//!   `extra_rows` the plugins trained in addition, `failed_episodes`).
//! * `episodes` — one row per trajectory: `id` (the pool's own episode id, unique in the
//!   file), `source` (`rollout` | `eval:<label>` | `gateway`), `step` (as above; for an
//!   evaluation the RL steps done when it ran), `global_step` (metrics.jsonl's / eval.jsonl's
//!   `step` of the line it belongs to), `round` (resample round, 0 first), `trajectory_id`,
//!   `group_id`, `task_id`, `seed` (the episode's environment seed; NULL where the kernel did
//!   not choose it: the gateway), `harness_episode` (gateway: the harness's episode id),
//!   `variant` (context-variant label), `policy_version` (the oldest of its turns), `turns`,
//!   `episode_reward` (NULL for a failed episode), `success`, `failure` (`<kind>: <reason>`
//!   for an episode cut by a fault), `trained` (any of its turns was trained), `skip_reason`.
//! * `turns` — one row per turn: `episode`, `turn`, `policy_version`, `prompt_shared` and
//!   `prompt_ids` (the prompt is stored as a delta: its first `prompt_shared` ids are the
//!   previous turn's prompt's, `prompt_ids` holds the rest — multi-turn prompts repeat their
//!   history), `train_prompt_ids`, `response_ids`, `response_logprobs`, `response_mask`,
//!   `old_logprobs`, `ref_logprobs`, `advantages` (per token, from the signals; NULL for a
//!   row that never reached them), `finish_reason`, `turn_reward`, `last_turn`, `feedback`,
//!   `tool_calls`, `variant` (→ `variants.id`), `trained`, `skip_reason`. `old_logprobs` is
//!   NULL where it equals `response_logprobs` bit for bit (log-prob reuse).
//! * `variants` — each distinct context variant once: `id`, `label`, `json` (the whole
//!   variant, JSON).
//! * `texts` — one row per episode with turns: `episode`, `data`: the zlib-compressed
//!   (RFC 1950) JSON array of its turns' texts, one object per turn: `turn`, `anchor` (or
//!   null), `observation`, `info`, `extra` (objects).
//! * `exclusions` — curation ([`ExclusionTarget`]): `kind` (`episode` | `turn` | `task` |
//!   `harness`), `target`, `reason`, `created_at` (Unix seconds). The optimizer reads them at
//!   the start of every step and skips matching rows, so an exclusion made on a live run
//!   takes effect from its next step. They survive [`Pool::reset`] and truncation: they are
//!   the user's, not the run's.
//!
//! Indexes: episodes by `(step, source)`, `global_step`, `task_id`, `trajectory_id` and
//! `harness_episode`; turns by `(episode, turn)`.

mod read;
mod schema;
mod store;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cairn_plugin_sdk::TurnRow;
use serde::{Deserialize, Serialize};

pub use read::{EpisodeSummary, Filter, PoolReader, StepSummary, TurnRecord};
pub use schema::SCHEMA_VERSION;
pub use store::Pool;

/// The pool's file name in a run directory.
pub const POOL_FILE: &str = "pool.sqlite";

/// `<run>/pool.sqlite` of an existing run directory: [`Error::NotARunDir`] when `run` does
/// not exist or is not a directory, [`Error::NoPool`] when the directory has no pool.
pub fn existing_pool_path(run: &Path) -> crate::error::Result<PathBuf> {
    use crate::error::Error;
    if !run.is_dir() {
        return Err(Error::NotARunDir {
            run: run.to_path_buf(),
            what: if run.exists() {
                "not a directory"
            } else {
                "no such directory"
            },
        });
    }
    let path = pool_path(run);
    if !path.is_file() {
        return Err(Error::NoPool {
            run: run.to_path_buf(),
        });
    }
    Ok(path)
}

/// `<run>/pool.sqlite`.
pub fn pool_path(run_root: &Path) -> PathBuf {
    run_root.join(POOL_FILE)
}

/// Where an episode came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Played by the rollout actor for an RL step.
    Rollout,
    /// A held-out evaluation (`eval:<label>`, the label of eval.jsonl).
    Eval(String),
    /// An episode an agent harness played through the gateway.
    Gateway,
}

impl Source {
    /// `rollout`, `eval:<label>` or `gateway`: the `source` column.
    pub fn as_text(&self) -> String {
        match self {
            Source::Rollout => "rollout".into(),
            Source::Eval(label) => format!("eval:{label}"),
            Source::Gateway => "gateway".into(),
        }
    }

    /// The inverse of [`Source::as_text`].
    pub fn parse(text: &str) -> Option<Source> {
        match text {
            "rollout" => Some(Source::Rollout),
            "gateway" => Some(Source::Gateway),
            _ => text
                .strip_prefix("eval:")
                .map(|label| Source::Eval(label.into())),
        }
    }
}

/// One turn to write: the row as trained (final reward, `ℓ_old`), its per-token advantages,
/// and whether it was trained (if not, why).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnWrite {
    pub row: TurnRow,
    /// `[L]`, from the step's signals; `None` for a row that never reached them.
    pub advantages: Option<Vec<f32>>,
    pub trained: bool,
    pub skip_reason: Option<String>,
}

/// One episode to write.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeWrite {
    pub source: Source,
    /// The batch's step (0-based RL step); for an evaluation, the RL steps done.
    pub step: u64,
    /// The metrics.jsonl / eval.jsonl `step` of the line this episode belongs to.
    pub global_step: u64,
    /// Resample round (0: the step's first collection).
    pub round: u32,
    pub trajectory_id: u64,
    pub group_id: u64,
    pub task_id: String,
    pub seed: Option<u64>,
    /// Gateway: the harness's episode id (`info.episode_id` of its rows).
    pub harness_episode: Option<String>,
    /// `episode_reward` of its rows; `None` for a failed episode.
    pub episode_reward: Option<f32>,
    pub success: bool,
    /// `<kind>: <reason>` for an episode cut by an environment or harness fault.
    pub failure: Option<String>,
    /// In turn order.
    pub turns: Vec<TurnWrite>,
}

impl EpisodeWrite {
    /// The episodes of `turns` (rows in any order): grouped by trajectory id in order of
    /// first appearance, each in turn order, their fields taken from the first row.
    /// `round` and `seed` are left 0 and `None` (the caller knows them).
    pub fn group(
        source: &Source,
        step: u64,
        global_step: u64,
        turns: Vec<TurnWrite>,
    ) -> Vec<EpisodeWrite> {
        let mut order: Vec<u64> = Vec::new();
        let mut by_trajectory: HashMap<u64, Vec<TurnWrite>> = HashMap::new();
        for t in turns {
            let id = t.row.trajectory_id;
            by_trajectory
                .entry(id)
                .or_insert_with(|| {
                    order.push(id);
                    Vec::new()
                })
                .push(t);
        }
        order
            .into_iter()
            .map(|id| {
                let mut turns = by_trajectory.remove(&id).expect("grouped above");
                turns.sort_by_key(|t| t.row.turn);
                let first = &turns[0].row;
                let harness_episode = match source {
                    Source::Gateway => first
                        .info
                        .get("episode_id")
                        .and_then(|v| v.as_str())
                        .map(str::to_owned),
                    _ => None,
                };
                EpisodeWrite {
                    source: source.clone(),
                    step,
                    global_step,
                    round: 0,
                    trajectory_id: id,
                    group_id: first.group_id,
                    task_id: first.task_id.clone(),
                    seed: None,
                    harness_episode,
                    episode_reward: Some(first.episode_reward),
                    success: first.success,
                    failure: None,
                    turns,
                }
            })
            .collect()
    }
}

/// What one RL step writes ([`Pool::record_step`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepWrite {
    pub step: u64,
    pub phase: String,
    /// After the step.
    pub policy_version: u64,
    /// The step's metrics.jsonl values.
    pub metrics: serde_json::Map<String, serde_json::Value>,
    /// The plugins' and the kernel's decisions (see the schema above).
    pub decisions: serde_json::Value,
    pub episodes: Vec<EpisodeWrite>,
}

/// What an exclusion names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExclusionTarget {
    /// Every turn of the training trajectory with this id.
    Episode(u64),
    /// One turn of a training trajectory: kept in its group's statistics, but its tokens are
    /// not trained (its mask is zeroed).
    Turn { trajectory: u64, turn: u32 },
    /// Every trajectory of this task id.
    Task(String),
    /// Every gateway episode with this harness episode id.
    Harness(String),
}

impl ExclusionTarget {
    /// The `kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            ExclusionTarget::Episode(_) => "episode",
            ExclusionTarget::Turn { .. } => "turn",
            ExclusionTarget::Task(_) => "task",
            ExclusionTarget::Harness(_) => "harness",
        }
    }

    /// The `target` column: the trajectory id, `trajectory:turn`, the task id or the
    /// harness episode id.
    pub fn target(&self) -> String {
        match self {
            ExclusionTarget::Episode(id) => id.to_string(),
            ExclusionTarget::Turn { trajectory, turn } => format!("{trajectory}:{turn}"),
            ExclusionTarget::Task(t) | ExclusionTarget::Harness(t) => t.clone(),
        }
    }

    /// The inverse of `kind()` / `target()`; `None` for anything else.
    pub fn parse(kind: &str, target: &str) -> Option<ExclusionTarget> {
        match kind {
            "episode" => target.parse().ok().map(ExclusionTarget::Episode),
            "turn" => {
                let (t, k) = target.split_once(':')?;
                Some(ExclusionTarget::Turn {
                    trajectory: t.parse().ok()?,
                    turn: k.parse().ok()?,
                })
            }
            "task" => Some(ExclusionTarget::Task(target.into())),
            "harness" => Some(ExclusionTarget::Harness(target.into())),
            _ => None,
        }
    }

    /// Whether this names the whole trajectory of `row` (episode, task or harness).
    fn matches_trajectory(&self, row: &TurnRow) -> bool {
        match self {
            ExclusionTarget::Episode(id) => row.trajectory_id == *id,
            ExclusionTarget::Task(t) => row.task_id == *t,
            ExclusionTarget::Harness(h) => {
                row.info.get("episode_id").and_then(|v| v.as_str()) == Some(h.as_str())
            }
            ExclusionTarget::Turn { .. } => false,
        }
    }
}

/// A curated exclusion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exclusion {
    pub target: ExclusionTarget,
    pub reason: String,
    /// Unix seconds.
    pub created_at: i64,
}

impl Exclusion {
    /// `excluded (<kind> <target>): <reason>`, the skip reason written on matching rows.
    pub fn describe(&self) -> String {
        format!(
            "excluded ({} {}): {}",
            self.target.kind(),
            self.target.target(),
            self.reason
        )
    }
}

/// The exclusions in force for a step, as the optimizer matches them against its rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exclusions(pub Vec<Exclusion>);

impl Exclusions {
    /// Why the whole trajectory of `row` is excluded (the first matching episode, task or
    /// harness exclusion), if it is.
    pub fn trajectory_reason(&self, row: &TurnRow) -> Option<String> {
        self.0
            .iter()
            .find(|x| x.target.matches_trajectory(row))
            .map(Exclusion::describe)
    }

    /// Why this one turn is excluded (a turn exclusion), if it is.
    pub fn turn_reason(&self, row: &TurnRow) -> Option<String> {
        self.0
            .iter()
            .find(|x| {
                x.target
                    == ExclusionTarget::Turn {
                        trajectory: row.trajectory_id,
                        turn: row.turn,
                    }
            })
            .map(Exclusion::describe)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
