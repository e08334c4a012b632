//! `cairn check CONFIG`: the pre-flight checks of `cairn train`, and nothing else.
//!
//! It parses and validates the config (every key, ranges, combinations), loads the plugins and
//! creates them with their config sections, checks each stack member's declared needs
//! (`Requirements`) against the environment, the rollout settings and the training host, and
//! builds the algorithm stack; it checks the model settings too, and that an engine's launch
//! program exists (the engine itself is contacted only by `cairn train`). It builds no model,
//! trains no tokenizer and writes nothing, so it answers in well under a second. Each error
//! names the file, the line and the fix (the same errors `cairn train` would stop with).

use std::path::Path;

use anyhow::Result;

/// `cairn check CONFIG`: prints a short summary on success (plugins and their versions, the
/// stack, the model, the run); returns the first error otherwise.
pub fn check(path: &Path) -> Result<()> {
    let config = cairn_gateway::load_config(path)?;
    let plugins = cairn::setup::checked(&config)?;
    // Every check before the first line printed: "ok" is never followed by an error.
    let engine = match cairn_gateway::engine::EngineConfig::from_pipeline(&config)? {
        Some(engine) => {
            let at = match &engine.launch {
                Some(launch) => format!(
                    "launched: {} (waits up to {} s for /health)",
                    crate::engine::launch_program(launch)?.display(),
                    launch.startup_timeout_s
                ),
                None => engine.base_urls.join(", "),
            };
            Some(format!(
                "{} at {at}; probe tolerance {} nats/token (checked when training starts)",
                engine.kind.as_str(),
                engine.probe_tolerance
            ))
        }
        None => None,
    };
    println!("{}: ok", path.display());
    for (kind, name, version, file) in &plugins.used {
        println!("  {kind:<12} {name} {version} ({})", file.display());
    }
    if config.environment.is_none() {
        println!("  environment  gateway harness (episodes posted to the gateway)");
    }
    let info = &plugins.env_info;
    if config.environment.is_some() {
        println!(
            "  tasks        {} train, {} held-out, up to {} turns",
            info.train_tasks, info.test_tasks, info.max_turns
        );
    }
    println!("  stack        {}", config.algorithm.label());
    let model = match (&config.model.path, &config.model.scratch) {
        (Some(dir), _) => format!("{}", dir.display()),
        (None, Some(s)) => format!(
            "scratch ({} layers, hidden {})",
            s.num_hidden_layers, s.hidden_size
        ),
        (None, None) => "none".into(),
    };
    println!(
        "  model        {model}, device {}, dtype {}",
        config.model.device, config.model.dtype
    );
    if let Some(engine) = engine {
        println!("  engine       {engine}");
    }
    println!(
        "  run          {} ({} RL steps, seed {}, checkpoint every {})",
        config.run.dir.display(),
        config.run.steps,
        config.run.seed,
        config.run.checkpoint_every
    );
    println!(
        "  plugin dirs  {}",
        plugins
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
