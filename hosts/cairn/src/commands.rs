//! The subcommands.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use cairn_kernel::objective::tools::{parse_batch, run_loss, run_signals, LossToolInput};
use cairn_kernel::objective::ObjectiveConfig;
use cairn_kernel::plugins::{dirs_or_default, PluginRegistry};

/// `cairn compare LABEL=RUN_DIR ...`.
pub fn compare(pairs: &[String], metrics: &[String], out: &Path, force: bool) -> Result<()> {
    let mut groups: Vec<crate::plot::RunGroup> = Vec::new();
    for pair in pairs {
        let Some((label, dir)) = pair.split_once('=') else {
            bail!("`{pair}` is not LABEL=RUN_DIR");
        };
        match groups.iter_mut().find(|g| g.label == label) {
            Some(g) => g.runs.push(PathBuf::from(dir)),
            None => groups.push(crate::plot::RunGroup {
                label: label.to_string(),
                runs: vec![PathBuf::from(dir)],
            }),
        }
    }
    let stores: Vec<PathBuf> = groups
        .iter()
        .flat_map(|g| &g.runs)
        .flat_map(|run| crate::output::run_stores(run))
        .collect();
    let out = crate::output::Output {
        flag: "--out",
        path: out,
        stores: &stores,
        existing: crate::output::Existing::replace_if(force),
    };
    let table = crate::plot::compare_runs(&groups, metrics, &out)?;
    print!("{table}");
    eprintln!("plot: {}", out.path.display());
    Ok(())
}

/// `cairn plugins list`.
pub fn plugins_list(dirs: &[PathBuf]) -> Result<()> {
    let dirs = dirs_or_default(dirs);
    let registry = PluginRegistry::scan(&dirs)?;
    println!(
        "{:<12} {:<9} {:<12} {:<4} path",
        "name", "version", "kind", "abi"
    );
    for p in registry.plugins() {
        println!(
            "{:<12} {:<9} {:<12} {:<4} {}",
            p.info.name,
            p.info.version,
            p.info.kind.as_str(),
            p.info.abi,
            p.path.display()
        );
    }
    if registry.plugins().is_empty() {
        println!(
            "(no plugins in {})",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for failure in registry.failures() {
        eprintln!("error: {failure}");
    }
    Ok(())
}

/// Parses `KEY=VALUE` pairs into a JSON object; VALUE is JSON when it parses, else a string.
fn key_values(pairs: &[String]) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut map = serde_json::Map::new();
    for pair in pairs {
        let Some((k, v)) = pair.split_once('=') else {
            bail!("`{pair}` is not KEY=VALUE");
        };
        let value =
            serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
        map.insert(k.trim().to_string(), value);
    }
    Ok(map)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `cairn signals`.
pub fn signals(plugin: &str, config: &[String], batch_path: &Path, dirs: &[PathBuf]) -> Result<()> {
    let registry = PluginRegistry::scan(&dirs_or_default(dirs))?;
    let config_json = serde_json::Value::Object(key_values(config)?).to_string();
    let mut algorithm = registry.algorithm(plugin)?.create_algorithm(&config_json)?;
    // No model and no bank here: a plugin that would call them is refused before it runs.
    let requirements = algorithm
        .try_requirements()
        .with_context(|| format!("algorithm `{plugin}`"))?;
    cairn_kernel::config::check_services(
        plugin,
        &requirements,
        &cairn_kernel::config::HostServices::OFFLINE,
    )?;
    // Errors name the file and the place of the bad value (`rows[2].turn: ...`).
    let batch = parse_batch(&read(batch_path)?, &batch_path.display().to_string())?;
    let report =
        run_signals(&mut algorithm, &batch).with_context(|| batch_path.display().to_string())?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// `cairn loss`.
pub fn loss(
    input_path: &Path,
    aggregation: Option<String>,
    micro_batches: usize,
    kl: Option<String>,
    kl_coef: Option<f64>,
    set: &[String],
) -> Result<()> {
    let input = LossToolInput::from_json(&read(input_path)?).map_err(|e| match e {
        cairn_kernel::Error::Config { message, .. } => {
            anyhow::anyhow!(
                "{}: {message} (see docs/algorithms/loss-tool.md)",
                input_path.display()
            )
        }
        other => other.into(),
    })?;
    let mut settings = key_values(set)?;
    if let Some(a) = aggregation {
        settings.insert("aggregation".into(), a.into());
    }
    if let Some(k) = kl {
        settings.insert("kl_estimator".into(), k.into());
    }
    if let Some(c) = kl_coef {
        settings.insert("kl_coef".into(), c.into());
    }
    let config = ObjectiveConfig::from_json(&serde_json::Value::Object(settings).to_string())?;
    let report = run_loss(&input, &config, micro_batches)
        .with_context(|| input_path.display().to_string())?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

#[cfg(not(feature = "torch"))]
pub fn train(_: Option<&Path>, _: Option<PathBuf>, _: Option<u64>, _: bool) -> Result<()> {
    bail!("this cairn was built without the `torch` feature; rebuild with `cargo build --release` (default features)")
}

#[cfg(not(feature = "torch"))]
pub fn eval(
    _: &Path,
    _: Option<&Path>,
    _: Option<usize>,
    _: Option<f32>,
    _: Option<&Path>,
    _: bool,
) -> Result<()> {
    bail!("this cairn was built without the `torch` feature; rebuild with `cargo build --release` (default features)")
}

#[cfg(feature = "torch")]
pub use with_torch::*;

#[cfg(feature = "torch")]
mod with_torch {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use anyhow::{bail, Context, Result};
    use cairn_kernel::actors::optimizer::OptimizerSettings;
    use cairn_kernel::actors::{self, rollout::Evaluate, rollout::RolloutSettings, PipelineParts};
    use cairn_kernel::backend::{PolicyBackend, Sequence, Weights};
    use cairn_kernel::config::PipelineConfig;
    use cairn_kernel::run::RunDir;
    use cairn_kernel::trainer::{Summary, Trainer};
    use cairn_plugin_sdk::{Algorithm, Environment};
    use parking_lot::Mutex;

    use super::read;
    use crate::lifecycle::{exit_now, on_actor_system, Signals};
    use crate::output::{Existing, Output};
    use crate::progress::Progress;
    use crate::DEFAULT_CONFIG;
    use cairn::setup;

    /// The algorithm plugin, shared by the rollout and optimizer actors.
    type SharedAlgorithm = Arc<Mutex<Box<dyn Algorithm>>>;

    /// Where the tokenizer comes from.
    enum TokenizerSource {
        /// The model's, or trained for this run when missing.
        Training,
        /// The finished run's.
        Run,
    }

    fn parts(
        config: &PipelineConfig,
        run: &RunDir,
        source: TokenizerSource,
    ) -> Result<(PipelineParts, SharedAlgorithm)> {
        let plugins = setup::plugins(config)?;
        parts_and_tokenizer(config, run, plugins, source)
            .map(|(parts, algorithm, _)| (parts, algorithm))
    }

    /// The pipeline's parts and its tokenizer (the gateway renders prompts with it).
    fn parts_and_tokenizer(
        config: &PipelineConfig,
        run: &RunDir,
        plugins: setup::Plugins,
        source: TokenizerSource,
    ) -> Result<(
        PipelineParts,
        SharedAlgorithm,
        cairn_kernel::text::Tokenizer,
    )> {
        // Training writes the run's bank and data pool; an evaluation gets in-memory ones
        // (`eval` restores its checkpoint's bank snapshot into it) and never touches the run's
        // files.
        let (tokenizer, bank, pool) = match source {
            TokenizerSource::Training => (
                setup::tokenizer(
                    config,
                    &run.root,
                    plugins.env.as_ref(),
                    setup::keeps_knowledge(config, &plugins.algorithm.requirements()),
                )?,
                config.bank.open(&run.root)?,
                cairn_stores::pool::Pool::open(&cairn_stores::pool::pool_path(&run.root))?,
            ),
            TokenizerSource::Run => (
                setup::run_tokenizer(config, &run.root)?,
                cairn_stores::bank::Bank::in_memory()?,
                cairn_stores::pool::Pool::in_memory()?,
            ),
        };
        let builder = setup::prompt_builder(config, &tokenizer)?;
        let backend = setup::backend(config, tokenizer.vocab_size())?;
        let optimizer = OptimizerSettings::from_config(config, &plugins.algorithm.requirements());
        let algorithm: Arc<Mutex<Box<dyn Algorithm>>> =
            Arc::new(Mutex::new(Box::new(plugins.algorithm)));
        let env: Arc<dyn Environment> = plugins.env;
        let parts = PipelineParts {
            backend: Box::new(backend),
            env,
            algorithm: algorithm.clone(),
            algorithm_name: config.algorithm.label(),
            builder,
            codec: Arc::new(tokenizer.clone()),
            rollout: RolloutSettings {
                context_window: Some(setup::context_window(config)?),
                ..RolloutSettings::from_config(config)
            },
            optimizer,
            reward: config.reward.clone(),
            objective: config.objective.clone(),
            pool,
            bank,
            skills: config.skills.clone(),
            skills_api_key: config.skills_api_key(|v| std::env::var(v).ok())?,
            // Set by `train` (`crate::engine::prepare`); evaluations play on the backend.
            engine: None,
        };
        Ok((parts, algorithm, tokenizer))
    }

    fn load_config(path: Option<&Path>) -> Result<PipelineConfig> {
        Ok(match path {
            Some(p) => cairn_gateway::load_config(p)?,
            None => cairn_gateway::parse_config(
                DEFAULT_CONFIG,
                "<embedded default: examples/household-grpo.toml>",
            )?,
        })
    }

    /// `cairn train`.
    pub fn train(
        config_path: Option<&Path>,
        run_dir: Option<PathBuf>,
        steps: Option<u64>,
        no_resume: bool,
    ) -> Result<()> {
        let mut config = load_config(config_path)?;
        if let Some(dir) = run_dir {
            config.run.dir = dir;
        }
        if let Some(s) = steps {
            config.run.steps = s;
        }
        if no_resume {
            config.run.resume = false;
        }
        let started = std::time::Instant::now();
        // Plugins first: a missing or broken one is reported before anything is written; so is
        // a missing API key of the endpoint reflector.
        // (the checks `cairn check` runs).
        let plugins = setup::checked(&config)?;
        let run = RunDir::create(&config.run.dir)?;
        // Held until the run ends: a second `cairn train` on this directory is refused.
        let lock = run.lock()?;
        eprintln!("run directory: {}", run.root.display());
        // A seeded CPU run repeats to the bit only on CPUs of the same class (docs/models.md).
        eprintln!("cpu class: {}", cairn_torch::CpuClass::detect());
        if let Some(pid) = &lock.stale_holder {
            eprintln!(
                "note: took over the run directory's lock from pid {pid}, which is no longer \
                 running (a run that was killed); resuming from its last checkpoint"
            );
        }
        if config.run.resume {
            run.check_resumable(&config)?;
        }
        let (mut parts, algorithm, tokenizer) =
            parts_and_tokenizer(&config, &run, plugins, TokenizerSource::Training)?;
        // An external rollout engine: launched (kept alive until this function returns, then
        // stopped), connected and checked before anything trains.
        let window = setup::context_window(&config)?;
        let _launched = match crate::engine::prepare(
            &config,
            &run.root,
            parts.backend.as_ref(),
            &tokenizer,
            window,
        )? {
            Some(prepared) => {
                parts.engine = Some(cairn_gateway::engine::EngineActor::starter(
                    prepared.client,
                    prepared.settings,
                ));
                prepared.launched
            }
            None => None,
        };
        let mut progress = Progress::default();
        let summary: Summary = on_actor_system(async {
            // SIGINT / SIGTERM: the trainer finishes the step in flight, checkpoints it and
            // stops with an error saying how to resume; a second signal exits at once with
            // `_exit` (libtorch's threads may be computing: nothing may run its static
            // destructors), and an unfinished checkpoint is never taken for a good one.
            let mut signals = Signals::new();
            actix::spawn(async move {
                let signal = signals.next().await;
                eprintln!(
                    "{signal}: finishing the step in flight, then checkpointing and stopping \
                     (a second signal stops at once)"
                );
                cairn_kernel::trainer::request_stop(signal);
                let again = signals.next().await;
                eprintln!(
                    "{again} again: stopping now; the step in flight is lost, and the same \
                     command resumes the run from its last checkpoint"
                );
                exit_now(130);
            });
            let mut pipeline = actors::start(parts);
            let threads = pipeline.threads.clone();
            let summary = async {
                // The gateway source: serve the policy and train on the harness's episodes.
                let gateway = match cairn_gateway::GatewayConfig::from_pipeline(&config)? {
                    Some(g) => {
                        let policy = pipeline.policy.clone().recipient();
                        let started =
                            crate::serve::start(&config, &g, &tokenizer, policy, true, &g.bind)?;
                        pipeline
                            .attach_gateway(started.link.clone(), config.rollout.tasks_per_step);
                        Some(started)
                    }
                    None => None,
                };
                let mut observer = |e| progress.on_event(e);
                let mut trainer = Trainer {
                    config: config.clone(),
                    pipeline,
                    algorithm,
                    run: run.clone(),
                    observer: &mut observer,
                    export_tokenizer_dir: Some(setup::tokenizer_dir(&config, &run.root)),
                };
                let summary = trainer.run().await;
                // Whatever the outcome, the harness may still be calling: refuse its requests
                // and let the batches in flight finish before the actors go.
                if let Some(started) = gateway {
                    started.shutdown().await;
                }
                Ok::<_, anyhow::Error>(summary?)
            }
            .await;
            (threads, summary)
        })?;
        let plot = crate::plot::plot_run(&run.root)?;
        println!(
            "held-out success (seed {}, {} tasks, temperature {}):",
            config.run.seed, config.eval.tasks, config.eval.temperature
        );
        if config.episode_source.gateway().is_some() {
            println!(
                "  (gateway source: held-out evaluation is the harness's; see docs/gateway.md)"
            );
        }
        for (label, r) in summary.evals.iter().filter(|(_, r)| r.tasks > 0) {
            let cut = match r.failed {
                0 => String::new(),
                n => format!(", {n} cut by an environment fault"),
            };
            println!(
                "  {label:<18} {:>5.1}%  ({}/{}, policy version {}{cut})",
                r.success_rate * 100.0,
                r.successes,
                r.tasks,
                r.policy_version
            );
        }
        println!("metrics: {}", run.metrics_path().display());
        println!("plot:    {}", plot.display());
        println!("time:    {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    }

    /// The run directory of a checkpoint (`<run>/checkpoints/step-NNNNNN`).
    fn run_of(checkpoint: &Path) -> Result<PathBuf> {
        let dir = checkpoint
            .canonicalize()
            .with_context(|| format!("checkpoint {}", checkpoint.display()))?;
        match dir.parent().and_then(Path::parent) {
            Some(run) if dir.parent().is_some_and(|p| p.ends_with("checkpoints")) => Ok(run.to_path_buf()),
            _ => bail!(
                "{}: not a checkpoint directory (expected <run>/checkpoints/step-NNNNNN); pass --config too",
                checkpoint.display()
            ),
        }
    }

    /// `cairn eval CHECKPOINT`.
    pub fn eval(
        checkpoint: &Path,
        config_path: Option<&Path>,
        tasks: Option<usize>,
        temperature: Option<f32>,
        record: Option<&Path>,
        force: bool,
    ) -> Result<()> {
        let policy_dir = setup::checkpoint_policy(checkpoint)?;
        if tasks == Some(0) {
            bail!("--tasks 0: evaluate at least one held-out task");
        }
        if let Some(t) = temperature.filter(|t| !(t.is_finite() && *t >= 0.0)) {
            bail!("--temperature {t}: must be a finite number ≥ 0 (0 is greedy)");
        }
        // The run directory holds the config and (scratch models) the tokenizer: the
        // checkpoint's own run, or the one the given config names.
        let (config, run_root) = match config_path {
            Some(path) => {
                let config = cairn_gateway::load_config(path)?;
                let root = config.run.dir.clone();
                (config, root)
            }
            None => {
                let root = run_of(checkpoint)?;
                (cairn_gateway::load_config(&root.join("config.toml"))?, root)
            }
        };
        // --record never lands on the run's stores (nor the checkpoint's bank); a refused path
        // fails now, not after the evaluation, and the file is written only at the end.
        let mut stores = crate::output::run_stores(&run_root);
        stores.extend(crate::output::run_stores(checkpoint));
        let record = record.map(|path| Output {
            flag: "--record",
            path,
            stores: &stores,
            existing: Existing::replace_if(force),
        });
        if let Some(record) = &record {
            record.check()?;
        }
        let run = RunDir { root: run_root };
        let (mut parts, _algorithm) = parts(&config, &run, TokenizerSource::Run)?;
        parts.backend.load(&policy_dir)?;
        let bank_snapshot = cairn_stores::bank::snapshot_path(checkpoint);
        if bank_snapshot.exists() {
            parts.bank.restore_from(&bank_snapshot)?;
        }
        let tasks = tasks.unwrap_or(config.eval.tasks);
        let held_out = parts.env.info().test_tasks as usize;
        if !(1..=held_out).contains(&tasks) {
            bail!(
                "--tasks {tasks}: environment `{}` has {held_out} held-out tasks; ask for 1 to \
                 {held_out}",
                config.environment_name()
            );
        }
        let temperature = temperature.unwrap_or(config.eval.temperature);
        let seed = cairn_kernel::rollout::mix(config.run.seed, 0xE7A1);
        let report = on_actor_system(async {
            let pipeline = actors::start(parts);
            let report = pipeline
                .rollout
                .send(Evaluate {
                    tasks,
                    temperature,
                    seed,
                    record: record.is_some(),
                })
                .await
                .map_err(|e| anyhow::anyhow!("rollout actor: {e}"))
                .and_then(|r| r.map_err(anyhow::Error::from));
            (pipeline.threads.clone(), report)
        })?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        if let Some(record) = &record {
            let batch = cairn_plugin_sdk::Batch {
                step: 0,
                rows: report.rows.clone(),
            };
            record.write(|w| Ok(serde_json::to_writer(w, &batch)?))?;
        }
        eprintln!("{}", report.summary());
        Ok(())
    }

    /// `cairn logprobs MODEL_DIR --input FILE`.
    pub fn logprobs(model_dir: &Path, input: &Path, temperature: f32, device: &str) -> Result<()> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Item {
            prompt_ids: Vec<u32>,
            response_ids: Vec<u32>,
        }
        let items: Vec<Item> = serde_json::from_str(&read(input)?).with_context(|| {
            format!(
                "{}: expected a JSON list of {{\"prompt_ids\": [...], \"response_ids\": [...]}}",
                input.display()
            )
        })?;
        if temperature.is_nan() || temperature <= 0.0 {
            bail!("--temperature must be > 0");
        }
        let config = cairn_torch::BackendConfig {
            model: cairn_torch::ModelSource::Pretrained {
                dir: model_dir.to_path_buf(),
            },
            device: serde_json::from_value(serde_json::json!(device))
                .with_context(|| format!("--device {device}"))?,
            dtype: None,
            seed: 0,
            threads: None,
            optimizer: Default::default(),
            warmup_steps: 0,
            score_batch_size: 32,
        };
        let mut backend =
            cairn_torch::TorchBackend::new(&config).map_err(cairn_kernel::Error::from)?;
        let sequences: Vec<Sequence> = items
            .into_iter()
            .map(|i| Sequence {
                prompt_ids: i.prompt_ids,
                response_ids: i.response_ids,
            })
            .collect();
        let out = backend
            .score(&sequences, temperature, Weights::Current)
            .with_context(|| input.display().to_string())?;
        println!("{}", serde_json::to_string(&out)?);
        Ok(())
    }
}
