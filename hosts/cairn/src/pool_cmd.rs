//! `cairn pool query|exclude|include|export RUN_DIR` and `cairn inspect RUN_DIR`: the run's
//! data pool (`RUN_DIR/pool.sqlite`, see docs/pool.md). Queries, exports and inspection open
//! the pool read-only, so they are safe while the run trains; `exclude` and `include` write
//! only the `exclusions` table, which the trainer reads at the start of every step.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use cairn_kernel::config::PipelineConfig;
use cairn_kernel::text::Tokenizer;
use cairn_plugin_sdk::Batch;
use cairn_stores::pool::{
    existing_pool_path, EpisodeSummary, ExclusionTarget, Filter, Pool, PoolReader, TurnRecord,
};
use clap::{Subcommand, ValueEnum};

use crate::output::{Existing, Output};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// A table of the episodes matching the filters (one line each), or JSON lines (--json).
    Query {
        run_dir: PathBuf,
        #[command(flatten)]
        filter: FilterArgs,
        /// One JSON object per episode instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Mark an episode, a turn, a task or a gateway harness episode excluded: training skips
    /// the matching rows from the next step on (also on a live run). An exclusion that
    /// matches nothing yet is kept (with a warning): it applies when such rows appear.
    Exclude {
        run_dir: PathBuf,
        #[command(flatten)]
        target: TargetArgs,
        /// Why (written on every row the trainer skips for it).
        #[arg(long)]
        reason: String,
    },
    /// Remove an exclusion made with `cairn pool exclude`.
    Include {
        run_dir: PathBuf,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Write the matching episodes' turns as batch JSON (docs/batch-json.md: `cairn signals
    /// --batch` reads it; `cairn loss` wants the batch with its signals) or JSON lines (one turn per line, with the decoded prompt and
    /// response text when the run's tokenizer is found: for SFT). Excluded episodes and turns
    /// are left out unless --with-excluded.
    Export {
        run_dir: PathBuf,
        #[arg(long, value_enum)]
        format: ExportFormat,
        #[command(flatten)]
        filter: FilterArgs,
        /// Keep the rows a curated exclusion matches.
        #[arg(long)]
        with_excluded: bool,
        /// Write to this file instead of stdout (written whole or not at all): a new file, or
        /// an existing regular file with --force. Never a directory, device, FIFO, socket or
        /// symbolic link, nor the run's pool or bank, nor any SQLite file.
        #[arg(short = 'o', long)]
        out: Option<PathBuf>,
        /// With -o: replace an existing file.
        #[arg(long, requires = "out")]
        force: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    Batch,
    Jsonl,
}

/// What `exclude` / `include` name: exactly one.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// A training trajectory id (the `traj` column of `cairn pool query --source train`).
    /// Evaluations reuse trajectory ids; they are never trained, and this never matches them.
    #[arg(long)]
    episode: Option<u64>,
    /// One turn of a training trajectory: `TRAJECTORY:TURN` (a training trajectory id, as
    /// for --episode, and the 0-based turn).
    #[arg(long)]
    turn: Option<String>,
    /// Every trajectory of this task id.
    #[arg(long)]
    task: Option<String>,
    /// Every gateway episode with this harness episode id.
    #[arg(long)]
    harness: Option<String>,
}

impl TargetArgs {
    fn target(&self) -> Result<ExclusionTarget> {
        Ok(if let Some(id) = self.episode {
            ExclusionTarget::Episode(id)
        } else if let Some(t) = &self.turn {
            ExclusionTarget::parse("turn", t).with_context(|| {
                format!("--turn {t}: give TRAJECTORY:TURN, two integers (e.g. --turn 40:2)")
            })?
        } else if let Some(t) = &self.task {
            ExclusionTarget::Task(t.clone())
        } else if let Some(h) = &self.harness {
            ExclusionTarget::Harness(h.clone())
        } else {
            bail!("name what to exclude: --episode, --turn, --task or --harness")
        })
    }
}

/// The query filters (docs/pool.md).
#[derive(clap::Args, Default)]
pub struct FilterArgs {
    /// Steps ≥ this (the batch's 0-based RL step; for an evaluation, the RL steps done).
    #[arg(long)]
    step_min: Option<u64>,
    /// Steps ≤ this.
    #[arg(long)]
    step_max: Option<u64>,
    /// Only this task id.
    #[arg(long)]
    task: Option<String>,
    /// Episode reward ≥ this.
    #[arg(long, allow_negative_numbers = true)]
    reward_min: Option<f64>,
    /// Episode reward ≤ this.
    #[arg(long, allow_negative_numbers = true)]
    reward_max: Option<f64>,
    /// Only successes (true) or failures (false).
    #[arg(long)]
    success: Option<bool>,
    /// Only episodes cut by a fault (true) or finished ones (false).
    #[arg(long)]
    failed: Option<bool>,
    /// Policy version ≥ this.
    #[arg(long)]
    version_min: Option<u64>,
    /// Policy version ≤ this.
    #[arg(long)]
    version_max: Option<u64>,
    /// Only this context-variant label.
    #[arg(long)]
    variant: Option<String>,
    /// rollout | gateway | eval:LABEL | train (rollout and gateway) | eval (every evaluation).
    #[arg(long)]
    source: Option<String>,
    /// Only episodes a curated exclusion matches (true) or does not (false).
    #[arg(long)]
    excluded: Option<bool>,
    /// Only this trajectory id.
    #[arg(long)]
    trajectory: Option<u64>,
    /// At most this many episodes (at least 1).
    #[arg(long)]
    limit: Option<usize>,
}

impl FilterArgs {
    /// Refuses filters that can match nothing by construction (naming the flags).
    fn check(&self) -> Result<()> {
        fn range<T: PartialOrd + std::fmt::Display>(
            name: &str,
            min: Option<T>,
            max: Option<T>,
        ) -> Result<()> {
            if let (Some(min), Some(max)) = (min, max) {
                if min > max {
                    bail!(
                        "--{name}-min {min} is above --{name}-max {max}: no episode can match; \
                         give --{name}-min ≤ --{name}-max"
                    );
                }
            }
            Ok(())
        }
        for (flag, v) in [
            ("--reward-min", self.reward_min),
            ("--reward-max", self.reward_max),
        ] {
            if v.is_some_and(f64::is_nan) {
                bail!("{flag} NaN: give a number (rewards are compared as numbers)");
            }
        }
        range("step", self.step_min, self.step_max)?;
        range("version", self.version_min, self.version_max)?;
        // Rewards compare in f32 precision (as the pool stores them).
        range(
            "reward",
            self.reward_min.map(|v| v as f32),
            self.reward_max.map(|v| v as f32),
        )?;
        if self.limit == Some(0) {
            bail!("--limit 0: give at least 1 (or leave --limit out for every episode)");
        }
        Ok(())
    }

    fn filter(&self) -> Result<Filter> {
        if let Some(s) = &self.source {
            if !matches!(s.as_str(), "rollout" | "gateway" | "train" | "eval")
                && !s.starts_with("eval:")
            {
                bail!("--source {s}: give rollout, gateway, eval:LABEL, train or eval");
            }
        }
        self.check()?;
        Ok(Filter {
            step_min: self.step_min,
            step_max: self.step_max,
            task: self.task.clone(),
            reward_min: self.reward_min,
            reward_max: self.reward_max,
            success: self.success,
            version_min: self.version_min,
            version_max: self.version_max,
            variant: self.variant.clone(),
            source: self.source.clone(),
            excluded: self.excluded,
            failed: self.failed,
            trajectory: self.trajectory,
            limit: self.limit,
        })
    }
}

pub fn run(command: PoolCommand) -> Result<()> {
    quiet_broken_pipe(run_command(command))
}

/// `Ok` for an error that is a write to a closed pipe (`cairn pool query RUN | head -1`):
/// like other Unix tools, a printing command whose reader went away ends quietly, with
/// status 0. Only for commands that print (SIGPIPE stays ignored process-wide: `cairn serve`
/// writes to sockets).
pub(crate) fn quiet_broken_pipe(result: Result<()>) -> Result<()> {
    match result {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// The I/O error inside a store's error, if it is one.
fn store_io(e: &cairn_stores::Error) -> Option<&std::io::Error> {
    match e {
        cairn_stores::Error::Io { error, .. } => Some(error),
        _ => None,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        // The stores' errors reach here bare (the bank and pool commands open the stores
        // themselves) or inside the kernel's `Error::Store`.
        let io = cause
            .downcast_ref::<std::io::Error>()
            .or_else(
                || match cause.downcast_ref::<cairn_kernel::error::Error>() {
                    Some(cairn_kernel::error::Error::Io { error, .. }) => Some(error),
                    Some(cairn_kernel::error::Error::Store(e)) => store_io(e),
                    _ => None,
                },
            )
            .or_else(|| {
                cause
                    .downcast_ref::<cairn_stores::Error>()
                    .and_then(store_io)
            });
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run_command(command: PoolCommand) -> Result<()> {
    match command {
        PoolCommand::Query {
            run_dir,
            filter,
            json,
        } => {
            let pool = PoolReader::open_run(&run_dir)?;
            let episodes = pool.episodes(&filter.filter()?)?;
            let mut out = std::io::stdout().lock();
            if json {
                for e in &episodes {
                    writeln!(out, "{}", serde_json::to_string(e)?)?;
                }
            } else {
                write_episode_table(&mut out, &episodes)?;
            }
            Ok(())
        }
        PoolCommand::Exclude {
            run_dir,
            target,
            reason,
        } => {
            let target = target.target()?;
            let mut pool = open_for_curation(&run_dir)?;
            let new = pool.exclude(&target, &reason)?;
            let (episodes, turns) = PoolReader::open(pool.path())?.exclusion_matches(&target)?;
            if episodes == 0 {
                eprintln!(
                    "warning: nothing in {} matches {} {} yet (no {}); the exclusion is \
                     kept and applies when such rows appear. `cairn pool query {} --source \
                     train` lists the trajectory ids and tasks (--episode and --turn name \
                     training trajectory ids, not evaluations')",
                    pool.path().display(),
                    target.kind(),
                    target.target(),
                    match &target {
                        ExclusionTarget::Episode(_) => "training trajectory with this id",
                        ExclusionTarget::Turn { .. } => "such turn of a training trajectory",
                        ExclusionTarget::Task(_) => "episode of this task",
                        ExclusionTarget::Harness(_) => "episode with this harness episode id",
                    },
                    run_dir.display()
                );
            }
            writeln!(
                std::io::stdout().lock(),
                "{} {} {}: training skips its rows from the next step on (it matches {} \
                 recorded now: {episodes} episodes, {turns} turns)",
                if new {
                    "excluded"
                } else {
                    "updated the reason of"
                },
                target.kind(),
                target.target(),
                if matches!(target, ExclusionTarget::Turn { .. }) {
                    "the turns"
                } else {
                    "the rows"
                }
            )?;
            Ok(())
        }
        PoolCommand::Include { run_dir, target } => {
            let target = target.target()?;
            let mut pool = open_for_curation(&run_dir)?;
            if !pool.include(&target)? {
                bail!(
                    "{}: no exclusion of {} {} (cairn pool query --excluded true lists the \
                     excluded episodes)",
                    run_dir.display(),
                    target.kind(),
                    target.target()
                );
            }
            writeln!(
                std::io::stdout().lock(),
                "included {} {} again: training uses its rows from the next step on",
                target.kind(),
                target.target()
            )?;
            Ok(())
        }
        PoolCommand::Export {
            run_dir,
            format,
            filter,
            with_excluded,
            out,
            force,
        } => export(
            &run_dir,
            format,
            &filter,
            with_excluded,
            out.as_deref(),
            force,
        ),
    }
}

/// The run's pool, for writing exclusions; an empty or foreign `pool.sqlite` is refused as
/// `query` refuses it, never turned into a pool.
fn open_for_curation(run_dir: &Path) -> Result<Pool> {
    Ok(Pool::open_existing(&existing_pool_path(run_dir)?)?)
}

fn export(
    run_dir: &Path,
    format: ExportFormat,
    filter: &FilterArgs,
    with_excluded: bool,
    out: Option<&Path>,
    force: bool,
) -> Result<()> {
    let pool = PoolReader::open_run(run_dir)?;
    let mut filter = filter.filter()?;
    let stores = crate::output::run_stores(run_dir);
    let out = out.map(|path| Output {
        flag: "-o",
        path,
        stores: &stores,
        existing: Existing::replace_if(force),
    });
    if let Some(out) = &out {
        out.check()?;
    }
    if !with_excluded && filter.excluded.is_none() {
        filter.excluded = Some(false);
    }
    let exclusions = pool.exclusions()?;
    let episodes = pool.episodes(&filter)?;
    let mut turns: Vec<(EpisodeSummary, TurnRecord)> = Vec::new();
    for e in &episodes {
        for t in pool.turns(e.id)? {
            if with_excluded || exclusions.turn_reason(&t.row).is_none() {
                turns.push((e.clone(), t));
            }
        }
    }
    let text = match format {
        ExportFormat::Batch => {
            let batch = Batch {
                step: episodes.iter().map(|e| e.step).min().unwrap_or(0),
                rows: turns.into_iter().map(|(_, t)| t.row).collect(),
            };
            serde_json::to_string(&batch)? + "\n"
        }
        ExportFormat::Jsonl => {
            let tokenizer = run_tokenizer(run_dir);
            let mut text = String::new();
            for (e, t) in &turns {
                let mut line = serde_json::json!({
                    "episode": e.id,
                    "source": e.source,
                    "step": e.step,
                    "trajectory_id": e.trajectory_id,
                    "group_id": e.group_id,
                    "task_id": e.task_id,
                    "turn": t.row.turn,
                    "policy_version": t.row.policy_version,
                    "variant": t.row.variant.label,
                    "episode_reward": e.episode_reward,
                    "success": e.success,
                    "turn_reward": t.row.turn_reward,
                    "trained": t.trained,
                    "prompt_ids": t.row.prompt_ids,
                    "response_ids": t.row.response_ids,
                    "response_mask": t.row.response_mask,
                    "response_logprobs": t.row.response_logprobs,
                    "advantages": t.advantages,
                });
                if let Some(tok) = &tokenizer {
                    line["prompt"] = tok.decode(&t.row.prompt_ids)?.into();
                    line["response"] = tok.decode(&t.row.response_ids)?.into();
                }
                text.push_str(&serde_json::to_string(&line)?);
                text.push('\n');
            }
            text
        }
    };
    match out {
        Some(out) => out.write(|w| Ok(w.write_all(text.as_bytes())?)),
        None => {
            std::io::stdout().lock().write_all(text.as_bytes())?;
            Ok(())
        }
    }
}

/// The run's tokenizer (`RUN_DIR/tokenizer` for a scratch model, the model's own for a
/// pretrained one, as its `config.toml` says); `None` when it cannot be found.
fn run_tokenizer(run_dir: &Path) -> Option<Tokenizer> {
    let config = PipelineConfig::load(&run_dir.join("config.toml")).ok();
    let dir = config
        .and_then(|c| {
            c.model
                .path
                .clone()
                .or_else(|| c.model.scratch.as_ref().and_then(|s| s.tokenizer.clone()))
        })
        .unwrap_or_else(|| run_dir.join("tokenizer"));
    Tokenizer::from_dir(&dir).ok()
}

fn fmt_reward(r: Option<f32>) -> String {
    r.map_or("-".into(), |r| format!("{r:.3}"))
}

fn write_episode_table(out: &mut impl Write, episodes: &[EpisodeSummary]) -> Result<()> {
    writeln!(
        out,
        "{:>6} {:<18} {:>5} {:>7} {:>6} {:<24} {:<12} {:>5} {:>5} {:>7} {:>4} {:>7}  note",
        "id",
        "source",
        "step",
        "traj",
        "group",
        "task",
        "variant",
        "ver",
        "turns",
        "reward",
        "ok",
        "trained"
    )?;
    for e in episodes {
        let note = e
            .failure
            .as_ref()
            .map(|f| format!("failed: {f}"))
            .or_else(|| e.excluded.as_ref().map(|x| format!("excluded: {x}")))
            .or_else(|| e.skip_reason.clone())
            .unwrap_or_default();
        writeln!(
            out,
            "{:>6} {:<18} {:>5} {:>7} {:>6} {:<24} {:<12} {:>5} {:>5} {:>7} {:>4} {:>7}  {note}",
            e.id,
            e.source,
            e.step,
            e.trajectory_id,
            e.group_id,
            e.task_id,
            e.variant,
            e.policy_version,
            e.turns,
            fmt_reward(e.episode_reward),
            if e.success { "yes" } else { "no" },
            if e.trained { "yes" } else { "no" },
        )?;
    }
    writeln!(out, "{} episodes", episodes.len())?;
    Ok(())
}

/// Which episode `cairn inspect --episode` shows.
pub struct EpisodeChoice {
    pub trajectory: Option<u64>,
    pub pool_id: Option<u64>,
    pub source: Option<String>,
}

/// `cairn inspect RUN_DIR [--episode ID [--source S] | --id N]`.
pub fn inspect(run_dir: &Path, choice: EpisodeChoice) -> Result<()> {
    quiet_broken_pipe(inspect_to_stdout(run_dir, choice))
}

fn inspect_to_stdout(run_dir: &Path, choice: EpisodeChoice) -> Result<()> {
    let pool = PoolReader::open_run(run_dir)?;
    let mut out = std::io::stdout().lock();
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let episode = match (choice.pool_id, choice.trajectory) {
        (Some(id), _) => Some(pool.episode(id)?.with_context(|| {
            format!(
                "{}: no episode with pool id {id} (cairn pool query lists them)",
                run_dir.display()
            )
        })?),
        (None, Some(t)) => {
            let source = choice.source.clone().unwrap_or_else(|| "train".into());
            let found = pool.episodes(&Filter {
                trajectory: Some(t),
                source: Some(source.clone()),
                ..Filter::default()
            })?;
            match found.len() {
                0 => bail!(
                    "{}: no episode with trajectory id {t} from source `{source}` (cairn pool \
                     query lists them; --source eval:LABEL picks an evaluation's)",
                    run_dir.display()
                ),
                1 => found.into_iter().next(),
                _ => {
                    let ids: Vec<String> = found
                        .iter()
                        .map(|e| format!("{} ({} step {})", e.id, e.source, e.step))
                        .collect();
                    bail!(
                        "{}: trajectory id {t} names {} episodes: {}; pick one with --id \
                         POOL_ID or narrow with --source",
                        run_dir.display(),
                        found.len(),
                        ids.join(", ")
                    )
                }
            }
        }
        (None, None) => None,
    };
    match episode {
        Some(e) => {
            let tokenizer = run_tokenizer(run_dir);
            write_episode(&mut out, &e, &pool.turns(e.id)?, tokenizer.as_ref(), colour)
        }
        None => write_summaries(&mut out, &pool),
    }
}

fn write_summaries(out: &mut impl Write, pool: &PoolReader) -> Result<()> {
    let steps = pool.step_summaries(&Filter {
        source: Some("train".into()),
        ..Filter::default()
    })?;
    writeln!(out, "training steps ({}):", steps.len())?;
    writeln!(
        out,
        "{:>5} {:>6} {:>8} {:>6} {:>7} {:>6} {:>8} {:>11} {:>8}",
        "step",
        "ver",
        "episodes",
        "rows",
        "trained",
        "failed",
        "excluded",
        "mean reward",
        "success"
    )?;
    for s in &steps {
        writeln!(
            out,
            "{:>5} {:>6} {:>8} {:>6} {:>7} {:>6} {:>8} {:>11} {:>8.3}",
            s.step,
            s.policy_version.map_or("-".into(), |v| v.to_string()),
            s.episodes,
            s.rows,
            s.trained,
            s.failed,
            s.excluded,
            s.mean_reward.map_or("-".into(), |r| format!("{r:.3}")),
            s.success_rate
        )?;
    }
    // Evaluations: one line per evaluation (source and step).
    let evals = pool.episodes(&Filter {
        source: Some("eval".into()),
        ..Filter::default()
    })?;
    // In the order they ran (episode ids grow), one line per (source, global step).
    let mut by_eval: Vec<(String, u64, u64, u64, f64, u64)> = Vec::new();
    for e in &evals {
        let i = match by_eval
            .iter()
            .position(|v| v.0 == e.source && v.1 == e.global_step)
        {
            Some(i) => i,
            None => {
                by_eval.push((e.source.clone(), e.global_step, 0, 0, 0.0, 0));
                by_eval.len() - 1
            }
        };
        let entry = &mut by_eval[i];
        entry.2 += 1;
        entry.3 += u64::from(e.success);
        if let Some(r) = e.episode_reward {
            entry.4 += f64::from(r);
            entry.5 += 1;
        }
    }
    if !by_eval.is_empty() {
        writeln!(out, "\nevaluations ({}):", by_eval.len())?;
        writeln!(
            out,
            "{:<28} {:>11} {:>8} {:>11} {:>8}",
            "source", "global step", "episodes", "mean reward", "success"
        )?;
        for (source, global, n, ok, sum, rewarded) in &by_eval {
            writeln!(
                out,
                "{:<28} {:>11} {:>8} {:>11} {:>8.3}",
                source,
                global,
                n,
                if *rewarded == 0 {
                    "-".into()
                } else {
                    format!("{:.3}", sum / *rewarded as f64)
                },
                *ok as f64 / *n as f64
            )?;
        }
    }
    let exclusions = pool.exclusions()?;
    if !exclusions.is_empty() {
        writeln!(out, "\nexclusions ({}):", exclusions.0.len())?;
        for x in &exclusions.0 {
            writeln!(out, "  {}", x.describe())?;
        }
    }
    Ok(())
}

fn write_episode(
    out: &mut impl Write,
    e: &EpisodeSummary,
    turns: &[TurnRecord],
    tokenizer: Option<&Tokenizer>,
    colour: bool,
) -> Result<()> {
    writeln!(
        out,
        "episode {} — {} step {} (round {}), trajectory {}, group {}, task {}",
        e.id, e.source, e.step, e.round, e.trajectory_id, e.group_id, e.task_id
    )?;
    writeln!(
        out,
        "variant {}, policy version {}, seed {}, {} turns, reward {}, success {}, trained {}",
        e.variant,
        e.policy_version,
        e.seed.map_or("-".into(), |s| s.to_string()),
        e.turns,
        fmt_reward(e.episode_reward),
        if e.success { "yes" } else { "no" },
        if e.trained { "yes" } else { "no" }
    )?;
    for (what, v) in [
        ("failed", &e.failure),
        ("excluded", &e.excluded),
        ("not trained", &e.skip_reason),
        ("harness episode", &e.harness_episode),
    ] {
        if let Some(v) = v {
            writeln!(out, "{what}: {v}")?;
        }
    }
    if tokenizer.is_none() {
        writeln!(
            out,
            "(no tokenizer found for this run: token ids only; scratch models keep theirs in \
             RUN_DIR/tokenizer)"
        )?;
    }
    let decode = |ids: &[u32]| -> String {
        match tokenizer {
            Some(t) => t
                .decode(ids)
                .unwrap_or_else(|e| format!("<undecodable: {e}>")),
            None => format!("{ids:?}"),
        }
    };
    let mut previous: Vec<u32> = Vec::new();
    for t in turns {
        let r = &t.row;
        writeln!(
            out,
            "\n── turn {} · policy version {} · turn reward {:.3} · finish {:?} · {}",
            r.turn,
            r.policy_version,
            r.turn_reward,
            r.finish_reason,
            if t.trained {
                "trained".to_string()
            } else {
                format!(
                    "not trained ({})",
                    t.skip_reason.as_deref().unwrap_or("no reason recorded")
                )
            }
        )?;
        // Later prompts repeat the history: show what is new since the previous turn's.
        let shared = previous
            .iter()
            .zip(&r.prompt_ids)
            .take_while(|(a, b)| a == b)
            .count();
        if shared > 0 {
            writeln!(
                out,
                "prompt (+{} new ids after {shared} ids of the previous prompt):",
                r.prompt_ids.len() - shared
            )?;
        } else {
            writeln!(out, "prompt ({} ids):", r.prompt_ids.len())?;
        }
        writeln!(out, "{}", indent(&decode(&r.prompt_ids[shared..])))?;
        previous = r.prompt_ids.clone();
        writeln!(out, "response ({} ids):", r.response_ids.len())?;
        writeln!(out, "{}", indent(&decode(&r.response_ids)))?;
        writeln!(
            out,
            "  {:>4} {:>7} {:<16} {:>4} {:>9} {:>9}",
            "#", "id", "token", "mask", "logprob", "advantage"
        )?;
        for (i, &id) in r.response_ids.iter().enumerate() {
            let mask = r.response_mask.get(i).copied().unwrap_or(0);
            let lp = r.response_logprobs.get(i).copied().unwrap_or(f32::NAN);
            let adv = t.advantages.as_ref().and_then(|a| a.get(i).copied());
            let token = tokenizer
                .map(|tk| tk.decode(&[id]).unwrap_or_default())
                .unwrap_or_default();
            let line = format!(
                "  {:>4} {:>7} {:<16} {:>4} {:>9.4} {:>9}",
                i,
                id,
                format!("{token:?}"),
                mask,
                lp,
                adv.map_or("-".into(), |a| format!("{a:+.4}"))
            );
            let styled = match (colour, mask, adv) {
                (false, _, _) => line,
                (true, 0, _) => format!("\x1b[2m{line}\x1b[0m"),
                (true, _, Some(a)) if a > 0.0 => format!("\x1b[32m{line}\x1b[0m"),
                (true, _, Some(a)) if a < 0.0 => format!("\x1b[31m{line}\x1b[0m"),
                (true, _, _) => line,
            };
            writeln!(out, "{styled}")?;
        }
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  │ {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
