//! The TOML pipeline config: which plugins, which model, and how each actor is set up.
//!
//! Parsing is strict: an unknown key or a missing required key is an error that names the key,
//! the file and the line (toml's span reporting), before anything is loaded or computed.
//! Plugin sections (`environment.config`, `algorithm.config`) are free-form tables handed to the
//! plugin as JSON; the plugin rejects its own unknown keys, and [`PipelineConfig::line_of`]
//! maps the key it names back to a line of the file.
//!
//! The default main job lives in `examples/household-grpo.toml` and is embedded in the host.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::objective::ObjectiveConfig;

/// A whole pipeline.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    pub run: RunConfig,
    #[serde(default)]
    pub plugins: PluginsConfig,
    /// Where training episodes come from: the environment plugin (default) or the gateway.
    #[serde(default, rename = "source")]
    pub episode_source: SourceConfig,
    /// The environment plugin; required with the default source, absent with the gateway
    /// (the harness plays the episodes).
    pub environment: Option<PluginSection>,
    pub algorithm: PluginSection,
    pub model: ModelConfig,
    pub rollout: RolloutConfig,
    #[serde(default)]
    pub objective: ObjectiveConfig,
    pub optimizer: OptimizerConfig,
    /// Reward shaping in the reward actor.
    #[serde(default)]
    pub reward: crate::actors::reward::RewardConfig,
    /// Supervised warm start on expert demonstrations before RL (optional).
    pub warm_start: Option<WarmStartConfig>,
    /// Held-out evaluation (optional with the gateway source, which has no held-out tasks).
    #[serde(default)]
    pub eval: EvalConfig,
    #[serde(default)]
    pub bank: BankConfig,
    #[serde(default)]
    pub skills: SkillsConfig,

    /// Where the config came from (`<embedded default>` or a path); not a TOML key.
    #[serde(skip)]
    pub source: String,
    /// The TOML text, kept to map plugin-reported keys to lines; not a TOML key.
    #[serde(skip)]
    pub text: String,
}

/// `[run]`: identity, length and persistence of the run.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Run directory (metrics, trajectories, checkpoints, plots). Relative paths are relative
    /// to the working directory.
    pub dir: PathBuf,
    /// Master seed: task sampling, sampling RNGs and model init derive from it.
    pub seed: u64,
    /// Number of RL steps.
    pub steps: u64,
    /// Write a checkpoint every this many RL steps (0: only at the end).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// Resume from the run directory's last checkpoint when there is one.
    #[serde(default = "default_true")]
    pub resume: bool,
    /// Record every batch as JSON under `trajectories/` (the documented batch form).
    #[serde(default)]
    pub record_trajectories: bool,
}

fn default_checkpoint_every() -> u64 {
    10
}
fn default_true() -> bool {
    true
}

/// `[plugins]`: where plugin `.so` files are looked up.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// Directories scanned for `*.so`. Empty: the directory of the running executable (where
    /// `cargo build` puts the workspace's plugins) and `$CAIRN_PLUGIN_DIR` if set.
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
}

/// `[source]`: where a training step's episodes come from.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SourceConfig {
    /// The rollout actor plays the `[environment]` plugin.
    #[default]
    Environment,
    /// `cairn train` serves the policy through the OpenAI-compatible gateway and trains on
    /// the episodes an outside harness plays (`tasks_per_step` groups of `group_size`
    /// episodes sharing a task id per step).
    Gateway(crate::gateway::GatewayConfig),
}

impl SourceConfig {
    /// The gateway settings, when the source is the gateway.
    pub fn gateway(&self) -> Option<&crate::gateway::GatewayConfig> {
        match self {
            SourceConfig::Gateway(g) => Some(g),
            SourceConfig::Environment => None,
        }
    }
}

/// A plugin by name, with its own config table.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    pub plugin: String,
    #[serde(default)]
    pub config: toml::Table,
}

impl PluginSection {
    /// The plugin's config as JSON text.
    pub fn config_json(&self) -> String {
        serde_json::to_string(&self.config).expect("a TOML table always converts to JSON")
    }
}

/// `[model]`: the policy model.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A Hugging Face model directory (config.json, safetensors, tokenizer.json). Exclusive
    /// with `scratch`.
    pub path: Option<PathBuf>,
    /// Build a small model from scratch, with a tokenizer trained on the environment's text.
    pub scratch: Option<ScratchModel>,
    /// "cpu", "cuda" or "auto".
    #[serde(default = "default_device")]
    pub device: String,
    /// "f32" or "bf16" (log-probs and losses are always f32).
    #[serde(default = "default_dtype")]
    pub dtype: String,
    /// Intra-op threads for the backend (0: all cores).
    #[serde(default)]
    pub threads: usize,
}

fn default_device() -> String {
    "cpu".into()
}
fn default_dtype() -> String {
    "f32".into()
}

/// `[model.scratch]`: a Qwen3-layout model initialised at random.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScratchModel {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Episodes (expert and random-action) whose text trains the word-level tokenizer.
    #[serde(default = "default_tokenizer_episodes")]
    pub tokenizer_episodes: usize,
    /// A Hugging Face tokenizer directory (`tokenizer.json`, `tokenizer_config.json` with a
    /// chat template) to use as is instead of training one.
    pub tokenizer: Option<PathBuf>,
    /// A text file whose lines train the word-level tokenizer instead of the environment's
    /// text (the gateway source has no environment).
    pub tokenizer_corpus: Option<PathBuf>,
}

fn default_tokenizer_episodes() -> usize {
    400
}

/// How the prompt of a turn is built from the environment's observation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// `inject + observation` tokenised as is, then the separator id; the policy answers with
    /// the action and a stop id. For small models with their own tokenizer.
    #[default]
    Plain,
    /// The model's chat template: the observation as a user message, generation prompt added.
    Chat,
}

/// `[rollout]`: how episodes are played.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    /// Task groups per step (B).
    pub tasks_per_step: usize,
    /// Rollouts per task (G).
    pub group_size: usize,
    pub temperature: f32,
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// Response length limit per turn, tokens.
    pub max_new_tokens: u32,
    /// Turn limit per episode (the environment's own limit applies too).
    pub max_turns: u32,
    #[serde(default)]
    pub prompt: PromptFormat,
    /// Maximum resample rounds when the algorithm drops groups (dynamic sampling).
    #[serde(default = "default_resample_rounds")]
    pub max_resample_rounds: u32,
}

fn default_top_p() -> f32 {
    1.0
}
fn default_resample_rounds() -> u32 {
    3
}

/// `[optimizer]`: AdamW and micro-batching.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    pub lr: f64,
    #[serde(default = "default_betas")]
    pub betas: (f64, f64),
    #[serde(default = "default_adam_eps")]
    pub eps: f64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "default_grad_norm")]
    pub max_grad_norm: f64,
    /// Rows per micro-batch; gradients accumulate across micro-batches and the loss does not
    /// depend on this split.
    #[serde(default = "default_micro_batch_rows")]
    pub micro_batch_rows: usize,
    /// Optimizer steps per RL batch (PPO mini-batches); 1 is plain on-policy.
    #[serde(default = "default_one")]
    pub updates_per_batch: usize,
}

impl OptimizerConfig {
    /// The AdamW settings of the RL phase.
    pub fn settings(&self) -> crate::backend::OptimizerSettings {
        crate::backend::OptimizerSettings {
            lr: self.lr,
            betas: self.betas,
            eps: self.eps,
            weight_decay: self.weight_decay,
            max_grad_norm: self.max_grad_norm,
        }
    }
}

fn default_betas() -> (f64, f64) {
    (0.9, 0.999)
}
fn default_adam_eps() -> f64 {
    1e-8
}
fn default_grad_norm() -> f64 {
    1.0
}
fn default_micro_batch_rows() -> usize {
    64
}
fn default_one() -> usize {
    1
}

/// `[warm_start]`: supervised fine-tuning on expert demonstrations.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WarmStartConfig {
    /// Expert episodes on training tasks (the demonstration budget).
    pub demonstrations: usize,
    pub epochs: usize,
    pub lr: f64,
    /// Rows per optimizer step.
    #[serde(default = "default_sft_batch")]
    pub batch_rows: usize,
}

fn default_sft_batch() -> usize {
    64
}

/// `[eval]`: held-out evaluation.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Held-out tasks evaluated (the first N of the test split).
    pub tasks: usize,
    /// 0 is greedy.
    #[serde(default)]
    pub temperature: f32,
    /// Also evaluate every this many RL steps (0: only before and after RL).
    #[serde(default)]
    pub every: u64,
}

/// `[bank]`: the experience bank actor.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BankConfig {
    /// Trajectories kept in memory for plugins that replay them (0: none).
    #[serde(default)]
    pub capacity: usize,
}

/// `[skills]`: the skill-creator actor.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsConfig {
    /// Run the skill creator every this many steps (0: off).
    #[serde(default)]
    pub every: u64,
}

/// `x > 0`, false for NaN.
fn positive(x: f64) -> bool {
    x > 0.0
}

impl PipelineConfig {
    /// Parses and validates a config. `source` names it in errors (a path, or
    /// `<embedded default>`).
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let mut config: PipelineConfig = toml::from_str(text).map_err(|e| Error::Config {
            file: source.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        config.source = source.to_string();
        config.text = text.to_string();
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::Config {
                file: path.display().to_string(),
                message: "no such config file; `cairn config > pipeline.toml` writes the default \
                          pipeline to start from"
                    .into(),
            },
            _ => Error::io(path, e),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// A config error naming this file, the dotted `key` and its line.
    pub fn error(&self, key: &str, message: impl std::fmt::Display) -> Error {
        let line = self
            .line_of(key)
            .map(|l| format!(", line {l}"))
            .unwrap_or_default();
        Error::Config {
            file: self.source.clone(),
            message: format!("key `{key}`{line}: {message}"),
        }
    }

    /// Checks values serde cannot: ranges and combinations.
    pub fn validate(&self) -> Result<()> {
        let r = &self.rollout;
        if r.tasks_per_step == 0 {
            return Err(self.error("rollout.tasks_per_step", "must be at least 1"));
        }
        if r.group_size == 0 {
            return Err(self.error("rollout.group_size", "must be at least 1"));
        }
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            return Err(self.error(
                "rollout.temperature",
                "must be a finite number > 0 (RL samples; greedy decoding is for `eval.temperature = 0`)",
            ));
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return Err(self.error("rollout.top_p", "must be in (0, 1]"));
        }
        if r.max_new_tokens == 0 || r.max_turns == 0 {
            return Err(self.error(
                "rollout.max_new_tokens",
                "max_new_tokens and max_turns must be at least 1",
            ));
        }
        if !positive(self.optimizer.lr) {
            return Err(self.error("optimizer.lr", "must be > 0"));
        }
        if self.optimizer.micro_batch_rows == 0 || self.optimizer.updates_per_batch == 0 {
            return Err(self.error(
                "optimizer.micro_batch_rows",
                "micro_batch_rows and updates_per_batch must be at least 1",
            ));
        }
        if !positive(self.optimizer.max_grad_norm) {
            return Err(self.error("optimizer.max_grad_norm", "must be > 0"));
        }
        match (&self.model.path, &self.model.scratch) {
            (Some(_), Some(_)) => {
                return Err(self.error(
                    "model.path",
                    "give either `model.path` or `[model.scratch]`, not both",
                ))
            }
            (None, None) => return Err(self.error(
                "model",
                "give `model.path` (a Hugging Face model directory) or a `[model.scratch]` table",
            )),
            _ => {}
        }
        if !matches!(self.model.device.as_str(), "cpu" | "cuda" | "auto") {
            return Err(self.error(
                "model.device",
                format!("`{}` is not one of cpu, cuda, auto", self.model.device),
            ));
        }
        if !matches!(self.model.dtype.as_str(), "f32" | "bf16") {
            return Err(self.error(
                "model.dtype",
                format!("`{}` is not one of f32, bf16", self.model.dtype),
            ));
        }
        if let Some(w) = &self.warm_start {
            if w.epochs == 0 || w.batch_rows == 0 || !positive(w.lr) {
                return Err(self.error(
                    "warm_start",
                    "epochs and batch_rows must be >= 1 and lr > 0",
                ));
            }
        }
        self.objective.validate().map_err(|e| match e {
            // Each objective message starts with the key it is about.
            Error::Config { message, .. } => {
                let key: String = message
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let key = if key.is_empty() {
                    "objective".to_string()
                } else {
                    format!("objective.{key}")
                };
                self.error(&key, message)
            }
            other => other,
        })?;
        self.validate_source()
    }

    /// The source's combinations: the environment source needs `[environment]`; the
    /// gateway has no environment, no expert for a warm start, and a scratch model needs a
    /// tokenizer from somewhere.
    fn validate_source(&self) -> Result<()> {
        let Some(gateway) = self.episode_source.gateway() else {
            if self.environment.is_none() {
                return Err(self.error(
                    "environment",
                    "missing table `[environment]` (the environment plugin to train on)",
                ));
            }
            return Ok(());
        };
        if let Some((key, message)) = gateway.problem() {
            return Err(self.error(key, message));
        }
        if self.environment.is_some() {
            return Err(self.error(
                "environment",
                "the gateway source trains on the harness's episodes; remove `[environment]`",
            ));
        }
        if self.warm_start.is_some() {
            return Err(self.error(
                "warm_start",
                "a warm start needs an environment's expert; the gateway source has none",
            ));
        }
        if let Some(s) = &self.model.scratch {
            if s.tokenizer.is_none() && s.tokenizer_corpus.is_none() {
                return Err(self.error(
                    "model.scratch",
                    "with the gateway source a scratch model needs `tokenizer` (a tokenizer \
                     directory) or `tokenizer_corpus` (a text file to train one on)",
                ));
            }
        }
        Ok(())
    }

    /// The environment plugin's name, or `gateway harness` for the gateway source.
    pub fn environment_name(&self) -> &str {
        self.environment
            .as_ref()
            .map_or("gateway harness", |e| e.plugin.as_str())
    }

    /// Best-effort line number (1-based) of a dotted key such as `algorithm.config.omega`:
    /// finds the innermost table header or inline table, then the key inside it.
    pub fn line_of(&self, dotted: &str) -> Option<usize> {
        let parts: Vec<&str> = dotted.split('.').collect();
        let lines: Vec<&str> = self.text.lines().collect();
        let mut section = String::new();
        let mut best = None;
        for (i, raw) in lines.iter().enumerate() {
            let line = raw.trim();
            if line.starts_with('[') && line.ends_with(']') {
                section = line
                    .trim_matches(|c| c == '[' || c == ']')
                    .trim()
                    .to_string();
                if section == dotted {
                    return Some(i + 1);
                }
                continue;
            }
            let Some((key, _)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim().trim_matches('"');
            let full = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            if full == dotted {
                return Some(i + 1);
            }
            // `config = { omega = 2 }` inline tables, and keys named inside them.
            if dotted.starts_with(&format!("{full}.")) {
                let rest = &dotted[full.len() + 1..];
                if line.contains(&format!("{rest} =")) || line.contains(&format!("{rest}=")) {
                    return Some(i + 1);
                }
                best = best.or(Some(i + 1));
            }
            if best.is_none() && parts.len() > 1 && full == parts[..parts.len() - 1].join(".") {
                best = Some(i + 1);
            }
        }
        best
    }

    /// Checks what the algorithm needs against what the environment and the rollout settings
    /// provide; an unmet need is a config error naming the key to change, before any compute.
    pub fn check_requirements(
        &self,
        requirements: &cairn_plugin_sdk::Requirements,
        environment: &cairn_plugin_sdk::EnvironmentInfo,
    ) -> Result<()> {
        let (algo, env) = (&self.algorithm.plugin, self.environment_name());
        let unmet = |what: &str| {
            self.error(
                "algorithm.plugin",
                format!(
                    "algorithm `{algo}` needs {what}, but environment `{env}` provides none; \
                     pick an environment that does, or another algorithm"
                ),
            )
        };
        if requirements.anchor_keys && !environment.anchor_keys {
            return Err(unmet("anchor-state keys"));
        }
        if requirements.step_rewards && !environment.step_rewards {
            return Err(unmet("per-turn rewards"));
        }
        if requirements.feedback && !environment.feedback {
            return Err(unmet("environment feedback"));
        }
        if requirements.tool_free_slots && !environment.tools {
            return Err(unmet("tools (it disables them for some slots)"));
        }
        let min = requirements.min_group_size as usize;
        if min > self.rollout.group_size {
            return Err(self.error(
                "rollout.group_size",
                format!(
                    "algorithm `{algo}` needs groups of at least {min}; raise it to {min} or more"
                ),
            ));
        }
        // The gateway source has no environment plugin: the harness evaluates.
        let held_out = environment.test_tasks;
        let tasks = self.eval.tasks as u64;
        if self.environment.is_some() && !(1..=held_out).contains(&tasks) {
            return Err(self.error(
                "eval.tasks",
                format!(
                    "{tasks} held-out tasks asked, but environment `{env}` has {held_out}; set it \
                     between 1 and {held_out}"
                ),
            ));
        }
        Ok(())
    }

    /// Wraps a plugin's config error with the file and the line of the key it names.
    pub fn plugin_config_error(&self, section: &str, plugin: &str, message: &str) -> Error {
        let message = message
            .strip_prefix(&format!("plugin `{plugin}`: "))
            .unwrap_or(message);
        let empty = toml::Table::new();
        let table = match (section, &self.environment) {
            ("environment", Some(env)) => &env.config,
            ("environment", None) => &empty,
            _ => &self.algorithm.config,
        };
        // The key is the first backticked word the section's table has (a key the user set);
        // failing that, the first backticked word (a key the plugin defaulted).
        let named: Vec<&str> = message.split('`').skip(1).step_by(2).collect();
        let key = named
            .iter()
            .find(|k| table.contains_key(**k))
            .or(named.first())
            .map(|k| format!("{section}.config.{k}"))
            .unwrap_or_else(|| format!("{section}.config"));
        let line = self
            .line_of(&key)
            .or_else(|| self.line_of(&format!("{section}.config")))
            .map(|l| format!(", line {l}"))
            .unwrap_or_default();
        Error::Config {
            file: self.source.clone(),
            message: format!("key `{key}`{line}: plugin `{plugin}` rejected its config: {message}"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small valid pipeline config (also used by `run.rs` tests).
    pub(crate) const MINIMAL: &str = r#"
[run]
dir = "runs/t"
seed = 1
steps = 2

[environment]
plugin = "household"
config = { max_turns = 8 }

[algorithm]
plugin = "grpo"

[model]
[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1

[rollout]
tasks_per_step = 2
group_size = 4
temperature = 1.0
max_new_tokens = 8
max_turns = 8

[optimizer]
lr = 1e-3

[eval]
tasks = 4
"#;

    fn err(text: &str) -> String {
        PipelineConfig::parse(text, "test.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn minimal_config_parses() {
        let c = PipelineConfig::parse(MINIMAL, "test.toml").unwrap();
        assert_eq!(c.rollout.group_size, 4);
        let env = c
            .environment
            .as_ref()
            .expect("the environment source has one");
        assert_eq!(env.config_json(), r#"{"max_turns":8}"#);
        assert!(c.episode_source.gateway().is_none());
    }

    #[test]
    fn gateway_source_parses_and_checks_its_combinations() {
        let gateway = MINIMAL
            .replace(
                "[environment]\nplugin = \"household\"\nconfig = { max_turns = 8 }\n",
                "[source]\nkind = \"gateway\"\nbind = \"127.0.0.1:0\"\nmissing_reward = \"fill\"\n",
            )
            .replace(
                "num_key_value_heads = 1\n",
                "num_key_value_heads = 1\ntokenizer = \"tok\"\n",
            );
        let c = PipelineConfig::parse(&gateway, "test.toml").unwrap();
        let g = c.episode_source.gateway().expect("gateway source");
        assert_eq!(
            (g.bind.as_str(), g.model_name.as_str()),
            ("127.0.0.1:0", "cairn")
        );
        assert_eq!(c.environment_name(), "gateway harness");
        let e = err(&gateway.replace("bind = ", "bnd = "));
        assert!(e.contains("unknown field `bnd`"), "{e}");
        let e = err(&gateway.replace("tokenizer = \"tok\"\n", ""));
        assert!(
            e.contains("`model.scratch`") && e.contains("tokenizer_corpus"),
            "{e}"
        );
        let e = err(&gateway.replace("missing_reward = \"fill\"", "episode_timeout_s = 0"));
        assert!(e.contains("source.episode_timeout_s"), "{e}");
        let e = err(&MINIMAL.replace(
            "[environment]\nplugin = \"household\"\nconfig = { max_turns = 8 }\n",
            "",
        ));
        assert!(e.contains("missing table `[environment]`"), "{e}");
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let text = MINIMAL.replace("group_size = 4", "group_size = 4\ngroup_sise = 3");
        let e = err(&text);
        assert!(e.contains("test.toml"), "{e}");
        assert!(e.contains("group_sise"), "{e}");
        assert!(e.contains("line 25"), "{e}");
    }

    #[test]
    fn missing_key_is_named() {
        let e = err(&MINIMAL.replace("seed = 1\n", ""));
        assert!(e.contains("missing field `seed`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_line() {
        let e = err(&MINIMAL.replace("group_size = 4", "group_size = 0"));
        assert!(e.contains("`rollout.group_size`, line 24"), "{e}");
        let e = err(&MINIMAL.replace("lr = 1e-3", "lr = -1.0"));
        assert!(e.contains("optimizer.lr"), "{e}");
        let e = err(&MINIMAL.replace("[model]\n", "[model]\npath = \"x\"\n"));
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn unmet_plugin_needs_are_config_errors() {
        let c =
            PipelineConfig::parse(&MINIMAL.replace("\"grpo\"", "\"gigpo\""), "test.toml").unwrap();
        let needs = cairn_plugin_sdk::Requirements {
            anchor_keys: true,
            ..Default::default()
        };
        let env = cairn_plugin_sdk::EnvironmentInfo::default();
        let e = c.check_requirements(&needs, &env).unwrap_err().to_string();
        assert!(
            e.contains("`algorithm.plugin`, line 12") && e.contains("anchor-state keys"),
            "{e}"
        );
        let needs = cairn_plugin_sdk::Requirements {
            min_group_size: 8,
            ..Default::default()
        };
        let e = c.check_requirements(&needs, &env).unwrap_err().to_string();
        assert!(
            e.contains("rollout.group_size") && e.contains("at least 8"),
            "{e}"
        );
        let ok = cairn_plugin_sdk::EnvironmentInfo {
            anchor_keys: true,
            test_tasks: 500,
            ..Default::default()
        };
        let needs = cairn_plugin_sdk::Requirements {
            anchor_keys: true,
            ..Default::default()
        };
        assert!(c.check_requirements(&needs, &ok).is_ok());
    }

    #[test]
    fn eval_tasks_must_fit_the_held_out_split() {
        let needs = cairn_plugin_sdk::Requirements::default();
        let env = cairn_plugin_sdk::EnvironmentInfo {
            test_tasks: 50,
            ..Default::default()
        };
        for tasks in ["0", "51"] {
            let text = MINIMAL.replace("tasks = 4", &format!("tasks = {tasks}"));
            let c = PipelineConfig::parse(&text, "test.toml").unwrap();
            let e = c.check_requirements(&needs, &env).unwrap_err().to_string();
            assert!(
                e.contains("`eval.tasks`") && e.contains("between 1 and 50"),
                "{e}"
            );
        }
        let text = MINIMAL.replace("tasks = 4", "tasks = 50");
        let c = PipelineConfig::parse(&text, "test.toml").unwrap();
        assert!(c.check_requirements(&needs, &env).is_ok());
    }

    #[test]
    fn objective_errors_name_the_objective_key_and_its_line() {
        let text =
            format!("{MINIMAL}\n[objective]\naggregation = \"token-mean\"\nclip_low = -0.2\n");
        let e = err(&text);
        assert!(e.contains("`objective.clip_low`, line"), "{e}");
        let line = text
            .lines()
            .position(|l| l.starts_with("clip_low"))
            .unwrap()
            + 1;
        assert!(e.contains(&format!("line {line}:")), "{e}");
    }

    #[test]
    fn plugin_keys_map_to_lines() {
        let c = PipelineConfig::parse(MINIMAL, "test.toml").unwrap();
        let e = c.plugin_config_error(
            "environment",
            "household",
            "plugin `household`: unknown field `max_turns`, expected ...",
        );
        assert!(
            e.to_string()
                .contains("environment.config.max_turns`, line 9"),
            "{e}"
        );
        // The plugin's name in backticks is not taken for a key; a key the user did not set
        // points at the section's config line.
        let e = c.plugin_config_error(
            "environment",
            "household",
            "plugin `household`: config key `max_expert_steps`: is 14, must be <= max_turns",
        );
        let e = e.to_string();
        assert!(
            e.contains("`environment.config.max_expert_steps`, line 9"),
            "{e}"
        );
    }
}
