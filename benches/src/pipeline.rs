//! The kernel-overhead benchmark: the main job's [`Trainer`] over the real actors and the
//! plugins loaded from their `.so` files, with every backend and plugin call timed
//! ([`crate::probes`]).
//!
//! The pipeline is built as `cairn train` builds it (plugins by name from the config, a
//! word-level tokenizer trained on the environment's training text, the plain or chat prompt
//! format, the scratch model of `[model.scratch]`), then run with a short RL phase: no
//! checkpoints and no evaluation between RL steps, a small held-out evaluation at the ends.
//!
//! Two backends:
//! - `torch`: the real [`TorchBackend`]. A step's kernel overhead is measured in place: its
//!   wall time minus the time spent inside backend calls.
//! - `null`: [`NullBackend`], which answers every prompt with the same action
//!   (`--null-action`, tokenised, plus the stop id) without a model. Episodes then run to the
//!   turn limit, so a step has more rows than the real one; the step's wall time is the
//!   kernel's (and the plugins') cost alone, reported as turn rows per second.
//!
//! One JSON line: per RL step, wall seconds, CPU seconds (the process's, all threads: on a
//! machine shared with other work this is the steadier number), backend/algorithm/environment
//! seconds, rows and tokens, and the trainer's own `metrics.jsonl` timings; with the null
//! backend, the median cost per turn row in wall and CPU microseconds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cairn::setup;
use cairn_kernel::actors::{self, rollout::RolloutSettings, PipelineParts};
use cairn_kernel::backend::{NullBackend, PolicyBackend};
use cairn_kernel::run::RunDir;
use cairn_kernel::trainer::{Event, Trainer};
use cairn_plugin_sdk::{Algorithm, Environment};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::measure::{cpu_seconds, median, rss_kb};
use crate::probes::{Clock, TimedAlgorithm, TimedBackend, TimedEnvironment, Totals};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Null,
    Torch,
}

#[derive(Debug, clap::Args)]
pub struct PipelineArgs {
    /// Pipeline config (the main job's by default).
    #[arg(long, default_value = "examples/household-grpo.toml")]
    config: PathBuf,
    #[arg(long, value_enum)]
    backend: BackendKind,
    /// RL steps to run (all are reported; the suite takes medians).
    #[arg(long, default_value_t = 3)]
    steps: u64,
    /// libtorch intra-op threads (`model.threads`).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Held-out tasks of the evaluations the trainer runs after the warm start and at the end.
    #[arg(long, default_value_t = 4)]
    eval_tasks: usize,
    /// Run directory (created; its previous content is not resumed).
    #[arg(long)]
    run_dir: PathBuf,
    /// Overrides `model.device` (`cpu`, `cuda`, `auto`).
    #[arg(long)]
    device: Option<String>,
    /// The action the null backend answers every turn with.
    #[arg(long, default_value = "go to countertop 1")]
    null_action: String,
}

/// One RL step as seen from outside the trainer.
#[derive(Clone, Debug)]
struct StepSample {
    wall_s: f64,
    /// CPU seconds of the whole process during the step, all threads.
    cpu_s: f64,
    totals: Totals,
    /// The step's `metrics.jsonl` values.
    values: serde_json::Map<String, Value>,
}

pub fn run(args: &PipelineArgs) -> Result<()> {
    let mut config = cairn_gateway::load_config(&args.config)?;
    config.run.dir = args.run_dir.clone();
    config.run.steps = args.steps;
    config.run.resume = false;
    config.run.checkpoint_every = 0;
    config.eval.tasks = args.eval_tasks;
    config.eval.every = 0;
    config.model.threads = args.threads;
    if let Some(device) = &args.device {
        config.model.device = device.clone();
    }
    if args.run_dir.exists() {
        std::fs::remove_dir_all(&args.run_dir)
            .with_context(|| format!("clearing {}", args.run_dir.display()))?;
    }
    let run = RunDir::create(&config.run.dir)?;

    // Built exactly as `cairn train` builds it.
    let plugins = setup::plugins(&config)?;
    let knowledge = setup::keeps_knowledge(&config, &plugins.algorithm.requirements());
    let env = plugins.env;
    let tokenizer = setup::tokenizer(&config, &run.root, env.as_ref(), knowledge)?;
    let builder = setup::prompt_builder(&config, &tokenizer)?;
    let clock = Clock::default();
    let backend: Box<dyn PolicyBackend> = match args.backend {
        BackendKind::Null => {
            let mut response = tokenizer.encode(&args.null_action)?;
            response.push(
                *builder
                    .stop_ids()
                    .first()
                    .context("the prompt format has no stop id")?,
            );
            Box::new(TimedBackend {
                inner: NullBackend {
                    version: 0,
                    response,
                    ..Default::default()
                },
                clock: clock.clone(),
            })
        }
        BackendKind::Torch => Box::new(TimedBackend {
            inner: setup::backend(&config, tokenizer.vocab_size())?,
            clock: clock.clone(),
        }),
    };
    let optimizer = cairn_kernel::actors::optimizer::OptimizerSettings::from_config(
        &config,
        &plugins.algorithm.requirements(),
    );
    let algorithm: Arc<Mutex<Box<dyn Algorithm>>> =
        Arc::new(Mutex::new(Box::new(TimedAlgorithm {
            inner: Box::new(plugins.algorithm),
            clock: clock.clone(),
        })));
    let env: Arc<dyn Environment> = Arc::new(TimedEnvironment {
        inner: env,
        clock: clock.clone(),
    });
    let parts = PipelineParts {
        backend,
        env,
        algorithm: algorithm.clone(),
        algorithm_name: config.algorithm.label(),
        builder,
        codec: Arc::new(tokenizer),
        rollout: RolloutSettings::from_config(&config),
        optimizer,
        reward: config.reward.clone(),
        objective: config.objective.clone(),
        // The run's data pool, as `cairn train` writes it: every step's write is in its time.
        pool: cairn_stores::pool::Pool::open(&cairn_stores::pool::pool_path(&args.run_dir))?,
        bank: cairn_stores::bank::Bank::in_memory()?,
        skills: config.skills.clone(),
        skills_api_key: None,
        engine: None,
    };

    let setup_rss = rss_kb().0;
    let mut samples: Vec<StepSample> = Vec::new();
    let mut mark: Option<(Instant, f64, Totals)> = None;
    let started = Instant::now();
    {
        let mut observer = |event: Event| match event {
            Event::PhaseStarted { name, .. } if name == "rl" => {
                mark = Some((Instant::now(), cpu_seconds(), clock.totals()));
            }
            Event::Step(record) if record.phase == "rl" => {
                let (now, cpu) = (Instant::now(), cpu_seconds());
                let totals = clock.totals();
                if let Some((then, cpu_then, before)) = mark.replace((now, cpu, totals.clone())) {
                    samples.push(StepSample {
                        wall_s: (now - then).as_secs_f64(),
                        cpu_s: cpu - cpu_then,
                        totals: difference(&totals, &before),
                        values: record.values,
                    });
                }
            }
            _ => {}
        };
        actix::System::new().block_on(async {
            let pipeline = actors::start(parts);
            let mut trainer = Trainer {
                config: config.clone(),
                pipeline,
                algorithm,
                run: run.clone(),
                observer: &mut observer,
                export_tokenizer_dir: None,
            };
            trainer.run().await
        })?;
    }
    if samples.is_empty() {
        bail!("the trainer reported no RL step");
    }
    println!(
        "{}",
        report(args, &samples, started.elapsed().as_secs_f64(), setup_rss)
    );
    Ok(())
}

/// `after − before` for the accumulated fields; the `last_*` fields are `after`'s.
fn difference(after: &Totals, before: &Totals) -> Totals {
    Totals {
        backend: after.backend.saturating_sub(before.backend),
        generate_calls: after.generate_calls - before.generate_calls,
        score: after.score.saturating_sub(before.score),
        score_calls: after.score_calls - before.score_calls,
        signals: after.signals.saturating_sub(before.signals),
        algorithm: after.algorithm.saturating_sub(before.algorithm),
        algorithm_calls: after.algorithm_calls - before.algorithm_calls,
        environment: after.environment.saturating_sub(before.environment),
        environment_calls: after.environment_calls - before.environment_calls,
        last_train_rows: after.last_train_rows,
        last_train_tokens: after.last_train_tokens,
    }
}

fn report(args: &PipelineArgs, samples: &[StepSample], total_s: f64, setup_rss: u64) -> Value {
    let steps: Vec<Value> = samples
        .iter()
        .map(|s| {
            let t = &s.totals;
            let backend_s = t.backend.as_secs_f64();
            let metric = |k: &str| s.values.get(k).cloned().unwrap_or(Value::Null);
            json!({
                "wall_s": s.wall_s,
                "cpu_s": s.cpu_s,
                "backend_s": backend_s,
                "overhead_s": (s.wall_s - backend_s).max(0.0),
                "algorithm_plugin_s": t.algorithm.as_secs_f64(),
                "algorithm_calls": t.algorithm_calls,
                "environment_plugin_s": t.environment.as_secs_f64(),
                "environment_calls": t.environment_calls,
                "generate_calls": t.generate_calls,
                "score_s": t.score.as_secs_f64(),
                "score_calls": t.score_calls,
                "signals_s": t.signals.as_secs_f64(),
                "rows": t.last_train_rows,
                "response_tokens": t.last_train_tokens,
                "trainer_step_time_s": metric("step_time_s"),
                "trainer_rollout_time_s": metric("rollout_time_s"),
                "trainer_train_time_s": metric("train_time_s"),
            })
        })
        .collect();
    let col = |f: &dyn Fn(&StepSample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    let (rss_end, hwm) = rss_kb();
    // Per turn row, in µs: the null backend's figure of merit (BENCHMARKS.md, "The cost per
    // turn row"); the torch backend's rows are dominated by the model.
    let per_row = |f: &dyn Fn(&StepSample) -> f64| {
        col(&|s| f(s) / (s.totals.last_train_rows.max(1) as f64) * 1e6)
    };
    json!({
        "kind": "pipeline",
        "impl": match args.backend { BackendKind::Null => "cairn-null", BackendKind::Torch => "cairn-torch" },
        "threads": args.threads,
        "median": {
            "wall_s": col(&|s| s.wall_s),
            "cpu_s": col(&|s| s.cpu_s),
            "wall_us_per_row": per_row(&|s| s.wall_s),
            "cpu_us_per_row": per_row(&|s| s.cpu_s),
            "backend_s": col(&|s| s.totals.backend.as_secs_f64()),
            "overhead_s": col(&|s| (s.wall_s - s.totals.backend.as_secs_f64()).max(0.0)),
            "algorithm_plugin_s": col(&|s| s.totals.algorithm.as_secs_f64()),
            "environment_plugin_s": col(&|s| s.totals.environment.as_secs_f64()),
            "score_s": col(&|s| s.totals.score.as_secs_f64()),
            "signals_s": col(&|s| s.totals.signals.as_secs_f64()),
            "rows": col(&|s| s.totals.last_train_rows as f64),
            "response_tokens": col(&|s| s.totals.last_train_tokens as f64),
        },
        "steps": steps,
        "total_s": total_s,
        "rss_setup_kb": setup_rss,
        "rss_end_kb": rss_end,
        "hwm_kb": hwm,
    })
}
