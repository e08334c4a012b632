//! `cairn-bench pool`: what the data pool costs and how fast it answers.
//!
//! 1. **Write cost and size, from a real run** (`--run RUN_DIR`, a run `cairn train` wrote):
//!    every training step of its pool is read back and written again into a scratch pool with
//!    [`Pool::record_step`], timed (the transaction the pool actor runs for each step, off the
//!    step's path since the optimizer sends it), against the run's median `step_time_s`. Size: the run's `pool.sqlite` (and WAL) per RL step;
//!    the scratch pool's, which holds the training steps only (no evaluations), per RL step;
//!    and what the prompts would take without the shared-prefix delta.
//! 2. **Queries over `--rows` synthetic turn rows** (default 10⁶: 64 episodes of 8 turns per
//!    step): per-step summaries, an episode filter (task and reward range), a step range, one
//!    episode's turns, and the excluded episodes under one task exclusion.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use cairn_plugin_sdk::TurnRow;
use cairn_stores::pool::{
    pool_path, EpisodeWrite, ExclusionTarget, Filter, Pool, PoolReader, Source, StepWrite,
    TurnWrite,
};
use serde_json::{json, Value};

use crate::measure::median;

#[derive(Debug, clap::Args)]
pub struct PoolArgs {
    /// A run directory `cairn train` wrote (its pool.sqlite and metrics.jsonl are read).
    #[arg(long)]
    run: PathBuf,
    /// Turn rows of the synthetic pool the queries run over.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Timed repeats of each query (median reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Scratch directory (created; holds the rewritten and the synthetic pools).
    #[arg(long, default_value = "target/bench/pool")]
    dir: PathBuf,
}

/// One timed query: returns how many rows it matched.
type Query<'a> = dyn Fn() -> Result<usize> + 'a;

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn pool_bytes(run: &Path) -> u64 {
    let p = pool_path(run);
    file_size(&p) + file_size(&p.with_extension("sqlite-wal"))
}

pub fn run(args: &PoolArgs) -> Result<()> {
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir)?;
    }
    std::fs::create_dir_all(&args.dir)?;
    let mut out = serde_json::Map::new();

    // 1. The run's own measurements.
    let metrics = std::fs::read_to_string(args.run.join("metrics.jsonl"))
        .with_context(|| format!("reading {}/metrics.jsonl", args.run.display()))?;
    let mut step = Vec::new();
    for line in metrics.lines() {
        let v: Value = serde_json::from_str(line)?;
        if let (Some("rl"), Some(s)) = (v["phase"].as_str(), v["step_time_s"].as_f64()) {
            step.push(s);
        }
    }
    let reader = PoolReader::open_run(&args.run)?;
    let summaries = reader.step_summaries(&Filter {
        source: Some("train".into()),
        ..Filter::default()
    })?;
    let steps = summaries.len().max(1) as f64;
    let (episodes, turns) = reader.counts()?;
    out.insert("run_rl_steps".into(), json!(summaries.len()));
    out.insert("run_episodes".into(), json!(episodes));
    out.insert("run_turns".into(), json!(turns));
    let step_median = median(&step);
    if let Some(s) = step_median {
        out.insert("in_run_step_median_s".into(), json!(s));
    }
    let bytes = pool_bytes(&args.run);
    out.insert("run_pool_bytes".into(), json!(bytes));
    out.insert(
        "pool_bytes_per_1000_steps".into(),
        json!(bytes as f64 / steps * 1000.0),
    );

    // Rewrite the run's steps into a scratch pool, timed; and the prompt bytes without delta.
    let scratch = args.dir.join("rewrite");
    std::fs::create_dir_all(&scratch)?;
    let mut pool = Pool::open(&pool_path(&scratch))?;
    let (mut full_prompt_bytes, mut delta_prompt_bytes) = (0u64, 0u64);
    let mut secs = Vec::new();
    for s in &summaries {
        let (metrics, decisions) = reader.step_record(s.step)?.unwrap_or_default();
        let mut episodes = Vec::new();
        for e in reader.episodes(&Filter {
            source: Some("train".into()),
            step_min: Some(s.step),
            step_max: Some(s.step),
            ..Filter::default()
        })? {
            let turns: Vec<TurnWrite> = reader
                .turns(e.id)?
                .into_iter()
                .map(|t| TurnWrite {
                    row: t.row,
                    advantages: t.advantages,
                    trained: t.trained,
                    skip_reason: t.skip_reason,
                })
                .collect();
            let mut previous: &[u32] = &[];
            for t in &turns {
                let shared = previous
                    .iter()
                    .zip(&t.row.prompt_ids)
                    .take_while(|(a, b)| a == b)
                    .count();
                full_prompt_bytes += 4 * t.row.prompt_ids.len() as u64;
                delta_prompt_bytes += 4 * (t.row.prompt_ids.len() - shared) as u64;
                previous = &t.row.prompt_ids;
            }
            let mut grouped = EpisodeWrite::group(&Source::Rollout, e.step, e.global_step, turns);
            for g in &mut grouped {
                g.seed = e.seed;
                g.round = e.round;
            }
            episodes.extend(grouped);
        }
        let write = StepWrite {
            step: s.step,
            phase: "rl".into(),
            policy_version: s.policy_version.unwrap_or(0),
            metrics: metrics.as_object().cloned().unwrap_or_default(),
            decisions,
            episodes,
        };
        let t = Instant::now();
        pool.record_step(&write)?;
        secs.push(t.elapsed().as_secs_f64());
    }
    let rewrite = median(&secs);
    out.insert("rewrite_step_median_s".into(), json!(rewrite));
    if let (Some(w), Some(s)) = (rewrite, step_median) {
        out.insert("write_fraction_of_step".into(), json!(w / s));
    }
    out.insert("prompt_bytes_full".into(), json!(full_prompt_bytes));
    out.insert("prompt_bytes_delta".into(), json!(delta_prompt_bytes));
    drop(pool);
    // The rewrite holds the training steps only (the run's pool also has its evaluations,
    // whose number does not grow with the steps).
    let rewrite_bytes = pool_bytes(&scratch);
    out.insert("train_pool_bytes".into(), json!(rewrite_bytes));
    out.insert(
        "train_pool_bytes_per_1000_steps".into(),
        json!(rewrite_bytes as f64 / steps * 1000.0),
    );

    // 2. Queries over synthetic rows.
    let synth = args.dir.join("synthetic");
    std::fs::create_dir_all(&synth)?;
    let mut pool = Pool::open(&pool_path(&synth))?;
    let (per_step_episodes, turns_per_episode) = (64usize, 8u32);
    let steps = args
        .rows
        .div_ceil(per_step_episodes * turns_per_episode as usize);
    let t = Instant::now();
    for s in 0..steps as u64 {
        let mut turns = Vec::with_capacity(per_step_episodes * turns_per_episode as usize);
        for e in 0..per_step_episodes as u64 {
            let trajectory = s * per_step_episodes as u64 + e;
            for k in 0..turns_per_episode {
                let prompt: Vec<u32> = (0..(24 + 16 * k)).collect();
                turns.push(TurnWrite {
                    row: TurnRow {
                        group_id: trajectory / 8,
                        trajectory_id: trajectory,
                        turn: k,
                        task_id: format!("task-{}", trajectory % 500),
                        policy_version: s,
                        prompt_ids: prompt,
                        response_ids: vec![1, 2, 3, 4, 5, 6],
                        response_logprobs: vec![-0.5; 6],
                        response_mask: vec![1; 6],
                        episode_reward: (trajectory % 7) as f32 / 6.0,
                        success: trajectory.is_multiple_of(3),
                        last_turn: k + 1 == turns_per_episode,
                        old_logprobs: vec![-0.5; 6],
                        ..TurnRow::default()
                    },
                    advantages: Some(vec![0.25; 6]),
                    trained: true,
                    skip_reason: None,
                });
            }
        }
        pool.record_step(&StepWrite {
            step: s,
            phase: "rl".into(),
            policy_version: s + 1,
            metrics: Default::default(),
            decisions: json!({}),
            episodes: EpisodeWrite::group(&Source::Rollout, s, s + 1, turns),
        })?;
    }
    out.insert("synthetic_fill_s".into(), json!(t.elapsed().as_secs_f64()));
    pool.exclude(&ExclusionTarget::Task("task-7".into()), "bench")?;
    drop(pool);
    let reader = PoolReader::open_run(&synth)?;
    let (episodes, turns) = reader.counts()?;
    out.insert("synthetic_episodes".into(), json!(episodes));
    out.insert("synthetic_turns".into(), json!(turns));
    out.insert("synthetic_bytes".into(), json!(pool_bytes(&synth)));
    let time = |f: &dyn Fn() -> Result<usize>| -> Result<(f64, usize)> {
        let mut secs = Vec::new();
        let mut n = 0;
        for _ in 0..args.repeats.max(1) {
            let t = Instant::now();
            n = f()?;
            secs.push(t.elapsed().as_secs_f64());
        }
        Ok((median(&secs).unwrap_or(0.0), n))
    };
    let queries: Vec<(&str, Box<Query>)> = vec![
        (
            "step_summaries_all",
            Box::new(|| Ok(reader.step_summaries(&Filter::default())?.len())),
        ),
        (
            "episodes_task_and_reward",
            Box::new(|| {
                Ok(reader
                    .episodes(&Filter {
                        task: Some("task-42".into()),
                        reward_min: Some(0.5),
                        ..Filter::default()
                    })?
                    .len())
            }),
        ),
        (
            "episodes_step_range_successes",
            Box::new(|| {
                Ok(reader
                    .episodes(&Filter {
                        step_min: Some(100),
                        step_max: Some(109),
                        success: Some(true),
                        ..Filter::default()
                    })?
                    .len())
            }),
        ),
        (
            "episodes_excluded",
            Box::new(|| {
                Ok(reader
                    .episodes(&Filter {
                        excluded: Some(true),
                        ..Filter::default()
                    })?
                    .len())
            }),
        ),
        (
            "one_episode_turns",
            Box::new(|| Ok(reader.turns(episodes / 2)?.len())),
        ),
    ];
    for (name, q) in &queries {
        let (s, n) = time(q.as_ref())?;
        out.insert(format!("query_{name}_median_s"), json!(s));
        out.insert(format!("query_{name}_results"), json!(n));
    }
    println!("{}", serde_json::to_string(&Value::Object(out))?);
    Ok(())
}
