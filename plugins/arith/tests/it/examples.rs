//! The SmolLM2 example configs (`examples/smollm2-*.toml`): valid pipeline configs whose
//! `arith` environment config this plugin accepts, evaluated on held-out tasks that exist,
//! with the model directory `scripts/smollm2.sh` imports.

use std::path::{Path, PathBuf};

use cairn_arith::Arith;
use cairn_kernel::config::{PipelineConfig, PromptFormat};
use cairn_plugin_sdk::Environment;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory `scripts/smollm2.sh` writes, relative to the repository root.
const MODEL_DIR: &str = ".cache/models/smollm2-135m-instruct";

fn check(name: &str, device: &str) -> (PipelineConfig, Arith) {
    let config = PipelineConfig::load(&repo().join("examples").join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        config.model.path.as_deref(),
        Some(Path::new(MODEL_DIR)),
        "{name}"
    );
    assert!(
        config.model.scratch.is_none() && config.warm_start.is_none(),
        "{name}"
    );
    assert_eq!(config.model.device, device, "{name}");
    assert_eq!(config.rollout.prompt, PromptFormat::Chat, "{name}");
    assert_eq!(config.algorithm.plugin, "grpo", "{name}");
    let section = config
        .environment
        .as_ref()
        .expect("an [environment] section");
    assert_eq!(section.plugin, "arith", "{name}");
    let env = Arith::from_config_json(&section.config_json())
        .unwrap_or_else(|e| panic!("{name}: environment.config: {e}"));
    let info = env.info();
    assert!(
        config.eval.tasks as u64 <= info.test_tasks,
        "{name}: eval.tasks"
    );
    assert_eq!(
        config.rollout.max_turns, info.max_turns,
        "{name}: rollout.max_turns"
    );
    (config, env)
}

#[test]
fn the_smollm2_example_configs_load() {
    let (cpu, cpu_env) = check("smollm2-cpu.toml", "cpu");
    let (gpu, _) = check("smollm2-gpu.toml", "cuda");
    // The CPU run evaluates every held-out task of its environment, as docs/smollm2.md says.
    assert_eq!(cpu.eval.tasks as u64, cpu_env.info().test_tasks);
    assert_eq!(
        (
            cpu.run.steps,
            cpu.rollout.tasks_per_step,
            cpu.rollout.group_size
        ),
        (12, 4, 8)
    );
    assert!(gpu.run.steps > cpu.run.steps);
    assert!(
        gpu.rollout.tasks_per_step * gpu.rollout.group_size
            > cpu.rollout.tasks_per_step * cpu.rollout.group_size
    );
    let script = std::fs::read_to_string(repo().join("scripts/smollm2.sh")).unwrap();
    assert!(
        script.contains(&format!("$CAIRN_ROOT/{MODEL_DIR}")),
        "scripts/smollm2.sh"
    );
}
