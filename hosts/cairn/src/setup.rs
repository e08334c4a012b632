//! Building a pipeline's parts from its config: plugins, requirement checks, tokenizer, model
//! backend and prompt format. Everything here fails before any compute starts, with an error
//! that names the file, key or plugin.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use cairn_gateway::HarnessEnvironment;
use cairn_kernel::config::AlgorithmSection;
use cairn_kernel::config::{PipelineConfig, PromptFormat};
use cairn_kernel::plugins::{dirs_or_default, PluginRegistry};
use cairn_kernel::rollout::prompt::{ChatPrompt, PlainPrompt, PromptBuilder};
use cairn_kernel::stack::{Member, Stack};
use cairn_kernel::text::{train_word_level, ChatFormat, Tokenizer, WordLevelConfig};
use cairn_plugin_sdk::host::foreign::ForeignAlgorithm;
use cairn_plugin_sdk::{Environment, ErrorKind, PluginError, Requirements};
use cairn_torch::{BackendConfig, DeviceOption, ModelSource, TorchBackend};

/// The `policy/` directory of a checkpoint (`<run>/checkpoints/step-NNNNNN`), checked to
/// exist before anything is built.
pub fn checkpoint_policy(checkpoint: &Path) -> Result<PathBuf> {
    if !checkpoint.exists() {
        anyhow::bail!(
            "checkpoint {} does not exist; checkpoints are the `step-NNNNNN` directories of \
             `<run>/checkpoints/` (`checkpoints/latest` names the newest)",
            checkpoint.display()
        );
    }
    let policy = checkpoint.join("policy");
    if !policy.is_dir() {
        anyhow::bail!(
            "{}: no `policy/` directory, so not a checkpoint; give a checkpoint directory \
             `<run>/checkpoints/step-NNNNNN`",
            checkpoint.display()
        );
    }
    Ok(policy)
}

/// Maps a plugin's error to a config error when it is about the config.
fn plugin_error(
    config: &PipelineConfig,
    section: &str,
    plugin: &str,
    e: PluginError,
) -> anyhow::Error {
    if e.kind == ErrorKind::Config {
        config
            .plugin_config_error(section, plugin, &e.message)
            .into()
    } else {
        anyhow::Error::new(e).context(format!("creating {section} plugin `{plugin}`"))
    }
}

/// The environment and algorithm stack of a pipeline, created and checked against each
/// other. With the gateway source the environment is the [`HarnessEnvironment`] stand-in.
pub struct Plugins {
    pub env: Arc<dyn Environment>,
    /// `[algorithm]` and its `[[algorithm.stack]]` (see `cairn_kernel::stack`).
    pub algorithm: Stack,
    /// What the environment reports (tasks per split, turns, the signals it provides).
    pub env_info: cairn_plugin_sdk::EnvironmentInfo,
    /// The plugins the pipeline uses: `(kind, name, version, file)`, environment first.
    pub used: Vec<(String, String, String, PathBuf)>,
    /// The directories scanned for plugins.
    pub dirs: Vec<PathBuf>,
    /// Plugin files in those directories that failed to load (each says why); the pipeline
    /// does not use them.
    pub failures: Vec<String>,
}

/// Everything `cairn train` checks before it builds anything costly, and all that
/// `cairn check` does: the config (already parsed and validated), the plugins (loaded and
/// created with their configs), each stack member's needs against the environment and the
/// host, the stack itself, the skill creator's API key, the model's settings (the device,
/// which must exist, the dtype, the model directory's `config.json`), and the memory the model
/// and batch sizes need against the device's ([`crate::memory`]). Errors name the file, the
/// line and the fix.
pub fn checked(config: &PipelineConfig) -> Result<Plugins> {
    let plugins = plugins(config)?;
    config.skills_api_key(|v| std::env::var(v).ok())?;
    let (device, dtype) = device_and_dtype(config)?;
    // A device that is not there fails here, before the run directory is written (`auto`
    // falls back to the CPU, so it always resolves).
    let device = match device.resolve() {
        Ok(device) => device,
        Err(e) => return Err(config.error("model.device", e).into()),
    };
    if let Some(dir) = &config.model.path {
        context_window(config).map_err(|e| {
            config.error(
                "model.path",
                format!(
                    "{e:#}; point it at a Hugging Face model directory (one with config.json, \
                     model.safetensors and the tokenizer files)"
                ),
            )
        })?;
        if !dir.join("tokenizer.json").is_file() {
            return Err(config
                .error(
                    "model.path",
                    format!(
                        "{} has no tokenizer.json; point it at a Hugging Face model directory",
                        dir.display()
                    ),
                )
                .into());
        }
    }
    // The model and batch sizes against the device's memory, before anything is allocated.
    crate::memory::check(config, device, dtype)?;
    Ok(plugins)
}

/// `model.device` and `model.dtype`, parsed, with the file and line when they do not.
fn device_and_dtype(config: &PipelineConfig) -> Result<(DeviceOption, cairn_torch::Dtype)> {
    let device: DeviceOption = serde_json::from_value(serde_json::json!(config.model.device))
        .map_err(|e| config.error("model.device", format!("{e}; use cpu, cuda or auto")))?;
    let dtype = serde_json::from_value(serde_json::json!(config.model.dtype))
        .map_err(|e| config.error("model.dtype", e))?;
    Ok((device, dtype))
}

/// The pipeline's plugins, created from their config sections and checked against each
/// other ([`checked`] adds the rest of the pre-flight checks).
pub fn plugins(config: &PipelineConfig) -> Result<Plugins> {
    let dirs = dirs_or_default(&config.plugins.dirs);
    let registry = PluginRegistry::scan(&dirs).map_err(|e| match e {
        cairn_kernel::Error::Config { message, .. } if !config.plugins.dirs.is_empty() => {
            config.error("plugins.dirs", message)
        }
        e => e,
    })?;
    let failures: Vec<String> = registry.failures().iter().map(|f| f.to_string()).collect();
    for failure in &failures {
        tracing::warn!("{failure}");
    }
    let version = |kind: cairn_plugin_sdk::host::foreign::PluginKind, name: &str| {
        registry
            .plugins()
            .iter()
            .find(|p| p.info.kind == kind && p.info.name == name)
            .map(|p| {
                (
                    kind.as_str().to_string(),
                    name.to_string(),
                    p.info.version.clone(),
                    p.path.clone(),
                )
            })
    };
    let mut used = Vec::new();
    let (env_name, algo_name) = (config.environment_name(), &config.algorithm.plugin);
    let (env, info): (Arc<dyn Environment>, _) = match &config.environment {
        Some(section) => {
            let env = registry
                .environment(env_name)
                .map_err(|e| config.error("environment.plugin", e))?
                .create_environment(&section.config_json())
                .map_err(|e| plugin_error(config, "environment", env_name, e))?;
            let info = env
                .try_info()
                .with_context(|| format!("environment `{env_name}`"))?;
            used.extend(version(
                cairn_plugin_sdk::host::foreign::PluginKind::Environment,
                env_name,
            ));
            (Arc::new(env), info)
        }
        None => {
            let harness = HarnessEnvironment::new(
                &cairn_gateway::GatewayConfig::from_pipeline(config)?.unwrap_or_default(),
            );
            (Arc::new(harness), harness.info())
        }
    };
    let estimator = cairn_kernel::config::PluginSection {
        plugin: algo_name.clone(),
        config: config.algorithm.config.clone(),
    };
    let mut members = Vec::new();
    for (i, section) in std::iter::once(&estimator)
        .chain(&config.algorithm.stack)
        .enumerate()
    {
        let key = AlgorithmSection::member_key(i);
        let name = &section.plugin;
        let algorithm: ForeignAlgorithm = registry
            .algorithm(name)
            .map_err(|e| config.error(&key, e))?
            .create_algorithm(&section.config_json())
            .map_err(|e| {
                let section = match i {
                    0 => "algorithm".to_string(),
                    i => format!("algorithm.stack[{}]", i - 1),
                };
                plugin_error(config, &section, name, e)
            })?;
        let requirements = algorithm
            .try_requirements()
            .with_context(|| format!("algorithm `{name}` ({key})"))?;
        config.check_member_requirements(name, &requirements, &info)?;
        used.extend(version(
            cairn_plugin_sdk::host::foreign::PluginKind::Algorithm,
            name,
        ));
        members.push(Member {
            name: name.clone(),
            requirements,
            algorithm: Box::new(algorithm),
        });
    }
    let algorithm = Stack::new(members)
        .map_err(|e| config.error(&AlgorithmSection::member_key(e.member), e.message))?;
    Ok(Plugins {
        env,
        algorithm,
        env_info: info,
        used,
        dirs,
        failures,
    })
}

/// Special tokens of the tokenizers Cairn trains for scratch models.
const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// The policy's tokenizer for training: the model directory's, or (scratch models) one trained
/// on the environment's training-task text and kept in `<run>/tokenizer/`, so a resumed run or
/// an evaluation reuses it.
///
/// A trained tokenizer also always holds the skill creator's template words
/// ([`cairn_kernel::skills::template::TEMPLATE_WORDS`]) when `knowledge` is set: the stack
/// keeps bank entries or reflects, or the warm start shows hinted demonstrations. (Without
/// it the vocabulary is the environment's alone, as before.)
pub fn tokenizer(
    config: &PipelineConfig,
    run_dir: &Path,
    env: &dyn Environment,
    knowledge: bool,
) -> Result<Tokenizer> {
    let mut words = WordLevelConfig::default();
    if knowledge {
        words.required_words.extend(
            cairn_kernel::skills::template::TEMPLATE_WORDS
                .iter()
                .map(|w| w.to_string()),
        );
    }
    let dir = tokenizer_dir(config, run_dir);
    // A model directory or a given tokenizer directory is loaded as is; a scratch model's
    // tokenizer is trained once into the run directory, then reused.
    let scratch = match &config.model.scratch {
        Some(scratch) if scratch.tokenizer.is_none() && config.model.path.is_none() => scratch,
        _ => return Ok(Tokenizer::from_dir(&dir)?),
    };
    if dir.join("tokenizer.json").is_file() {
        return Ok(Tokenizer::from_dir(&dir)?);
    }
    if let Some(path) = &scratch.tokenizer_corpus {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("model.scratch.tokenizer_corpus: reading {}", path.display())
        })?;
        let tokenizer = train_word_level(text.lines(), &words)?;
        tokenizer.save(&dir)?;
        return Ok(Tokenizer::from_dir(&dir)?);
    }
    let max_turns = config.rollout.max_turns.max(env.info().max_turns);
    let corpus = cairn_kernel::rollout::corpus(env, scratch.tokenizer_episodes, max_turns)
        .context("collecting environment text for the tokenizer")?;
    let tokenizer = train_word_level(corpus, &words)?;
    tokenizer.save(&dir)?;
    Ok(Tokenizer::from_dir(&dir)?)
}

/// Whether the pipeline shows the policy bank entries: a stack that keeps entries or reflects,
/// or a warm start with hinted demonstrations.
pub fn keeps_knowledge(config: &PipelineConfig, requirements: &Requirements) -> bool {
    !requirements.bank.is_empty()
        || requirements.reflection
        || config
            .warm_start
            .as_ref()
            .is_some_and(|w| w.hinted_share > 0.0)
}

/// The directory of the policy's tokenizer files: the model directory, the configured
/// tokenizer directory, or the run's trained tokenizer.
pub fn tokenizer_dir(config: &PipelineConfig, run_dir: &Path) -> PathBuf {
    match (
        &config.model.path,
        config
            .model
            .scratch
            .as_ref()
            .and_then(|s| s.tokenizer.clone()),
    ) {
        (Some(path), _) => path.clone(),
        (None, Some(dir)) => dir,
        (None, None) => run_dir.join("tokenizer"),
    }
}

/// The tokenizer a finished run trained with (evaluation never trains one).
pub fn run_tokenizer(config: &PipelineConfig, run_dir: &Path) -> Result<Tokenizer> {
    let dir = tokenizer_dir(config, run_dir);
    Tokenizer::from_dir(&dir).with_context(|| {
        format!(
            "the run's tokenizer ({}) is missing: evaluate a checkpoint inside its run directory, \
             or pass the run's config with --config",
            dir.display()
        )
    })
}

/// The prompt format of the pipeline.
pub fn prompt_builder(
    config: &PipelineConfig,
    tokenizer: &Tokenizer,
) -> Result<Arc<dyn PromptBuilder>> {
    Ok(match config.rollout.prompt {
        PromptFormat::Plain => Arc::new(PlainPrompt {
            codec: tokenizer.clone(),
            separator: vec![tokenizer.require_id(IM_START)?],
            stop_ids: {
                let end = tokenizer.require_id(IM_END)?;
                let mut ids = vec![end];
                ids.extend(tokenizer.eos_ids().iter().filter(|&&i| i != end));
                ids
            },
        }),
        PromptFormat::Chat => Arc::new(ChatPrompt {
            format: ChatFormat::from_tokenizer(tokenizer.clone())?,
            system: String::new(),
        }),
    })
}

/// The backend config of a pipeline (weights from `model.path`, or a fresh scratch model).
pub fn backend_config(config: &PipelineConfig, vocab_size: usize) -> Result<BackendConfig> {
    let model = match (&config.model.path, &config.model.scratch) {
        (Some(dir), _) => ModelSource::Pretrained { dir: dir.clone() },
        (None, Some(s)) => ModelSource::Random {
            config: Box::new(crate::scratch::model_config(s, vocab_size)),
        },
        (None, None) => unreachable!("config validation requires model.path or model.scratch"),
    };
    let (device, dtype) = device_and_dtype(config)?;
    let o = &config.optimizer;
    Ok(BackendConfig {
        model,
        device,
        dtype: Some(dtype),
        seed: config.run.seed,
        threads: (config.model.threads > 0).then_some(config.model.threads),
        optimizer: cairn_kernel::backend::OptimizerSettings {
            lr: o.lr,
            betas: o.betas,
            eps: o.eps,
            weight_decay: o.weight_decay,
            max_grad_norm: o.max_grad_norm,
        },
        warmup_steps: 0,
        score_batch_size: 64,
    })
}

pub use crate::scratch::SCRATCH_CONTEXT;

/// The context window of the pipeline's model: `max_position_embeddings` of the model
/// directory's `config.json`, or [`SCRATCH_CONTEXT`].
pub fn context_window(config: &PipelineConfig) -> Result<usize> {
    let Some(dir) = &config.model.path else {
        return Ok(SCRATCH_CONTEXT);
    };
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(json
        .get("max_position_embeddings")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(4096) as usize)
}

/// Builds the backend.
pub fn backend(config: &PipelineConfig, vocab_size: usize) -> Result<TorchBackend> {
    let bc = backend_config(config, vocab_size)?;
    TorchBackend::new(&bc).map_err(|e| anyhow::Error::new(cairn_kernel::Error::from(e)))
}
