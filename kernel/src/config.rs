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
use crate::skills::{ReflectorKind, SkillsConfig};

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
    pub algorithm: AlgorithmSection,
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
    /// Run directory (metrics, the data pool, checkpoints, plots). Relative paths are relative
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
    /// Deadline of each algorithm plugin call (`plan_group`, `next_context`, `signals`,
    /// `observe`) and of the environment's `task`, seconds, host callbacks included; a miss
    /// stops the run with an error naming the actor, the plugin, the call and the step. 0: no
    /// deadline. See docs/faults.md.
    #[serde(default = "default_plugin_timeout_s")]
    pub plugin_timeout_s: f64,
}

fn default_plugin_timeout_s() -> f64 {
    600.0
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
#[derive(Clone, Debug, Default, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SourceConfig {
    /// The rollout actor plays the `[environment]` plugin.
    #[default]
    Environment,
    /// `cairn train` serves the policy through the OpenAI-compatible gateway and trains on
    /// the episodes an outside harness plays (`tasks_per_step` groups of `group_size`
    /// episodes sharing a task id per step). The table holds the gateway's own settings as
    /// written (without `kind`): the gateway crate reads and checks them
    /// (`cairn_gateway::GatewayConfig::from_pipeline`), so the kernel names no gateway type.
    Gateway(toml::Table),
}

/// By hand rather than derived: serde's internally tagged enums buffer the table before they
/// read `kind`, and the TOML parser then reports a bad value at the `[source]` header without
/// its key. Here the table is read first, so an error names `source.KEY`.
impl<'de> Deserialize<'de> for SourceConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut table = toml::Table::deserialize(d)?;
        let kind = table.remove("kind").ok_or_else(|| {
            D::Error::custom(
                "key `source.kind`: missing; a `[source]` table starts with `kind = \
                 \"environment\"` (the `[environment]` plugin plays the episodes; no other \
                 key) or `kind = \"gateway\"` (serve the policy to an outside harness; the \
                 keys of docs/gateway.md, such as `api_key_env`, need it)",
            )
        })?;
        match kind.as_str() {
            Some("environment") => match table.keys().next() {
                Some(key) => Err(D::Error::custom(format!(
                    "key `source.{key}`: unknown with `kind = \"environment\"` (the gateway's \
                     settings need `kind = \"gateway\"`)"
                ))),
                None => Ok(SourceConfig::Environment),
            },
            Some("gateway") => Ok(SourceConfig::Gateway(table)),
            _ => Err(D::Error::custom(format!(
                "key `source.kind`: {kind} is not a source; use \"environment\" or \"gateway\""
            ))),
        }
    }
}

impl SourceConfig {
    /// The gateway's settings as written, when the source is the gateway.
    pub fn gateway(&self) -> Option<&toml::Table> {
        match self {
            SourceConfig::Gateway(g) => Some(g),
            SourceConfig::Environment => None,
        }
    }
}

/// Lives here rather than beside the struct so the config is the only side that knows the
/// other: `actors/rollout.rs` imports nothing from `config.rs`, which breaks the import circle
/// config → gateway → actors/rollout → config.
impl crate::actors::rollout::RolloutSettings {
    /// The settings of a pipeline config's `[run]` and `[rollout]`.
    pub fn from_config(config: &PipelineConfig) -> Self {
        let r = &config.rollout;
        crate::actors::rollout::RolloutSettings {
            seed: config.run.seed,
            tasks_per_step: r.tasks_per_step,
            group_size: r.group_size,
            temperature: r.temperature,
            top_p: r.top_p,
            max_new_tokens: r.max_new_tokens,
            max_turns: r.max_turns,
            context_window: None,
            env_timeout: crate::deadline::seconds(r.env_timeout_s),
            plugin_timeout: crate::deadline::seconds(config.run.plugin_timeout_s),
            env_name: config
                .environment
                .as_ref()
                .map(|e| e.plugin.clone())
                .unwrap_or_default(),
            on_failure: r.on_episode_failure,
        }
    }
}

/// `[algorithm]`: the advantage estimator, and the planners and auxiliary-loss plugins
/// stacked on it (`[[algorithm.stack]]`, in order). See `kernel/src/stack.rs`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AlgorithmSection {
    pub plugin: String,
    #[serde(default)]
    pub config: toml::Table,
    #[serde(default)]
    pub stack: Vec<PluginSection>,
}

impl AlgorithmSection {
    /// The estimator's config as JSON text.
    pub fn config_json(&self) -> String {
        serde_json::to_string(&self.config).expect("a TOML table always converts to JSON")
    }

    /// The stack's plugin names, estimator first, joined by `+` (`gigpo+edge`).
    pub fn label(&self) -> String {
        std::iter::once(self.plugin.as_str())
            .chain(self.stack.iter().map(|s| s.plugin.as_str()))
            .collect::<Vec<_>>()
            .join("+")
    }

    /// The config key of stack member `i` (0: `[algorithm]`, `i`: `algorithm.stack[i-1]`).
    pub fn member_key(i: usize) -> String {
        if i == 0 {
            "algorithm.plugin".into()
        } else {
            format!("algorithm.stack[{}].plugin", i - 1)
        }
    }
}

/// Lives here for the same reason as `RolloutSettings::from_config`.
impl crate::actors::optimizer::OptimizerSettings {
    /// The optimizer actor's settings of a pipeline config whose algorithm stack needs
    /// `requirements` (a plugin reading `ref_logprobs` keeps the reference pass on).
    pub fn from_config(
        config: &PipelineConfig,
        requirements: &cairn_plugin_sdk::Requirements,
    ) -> Self {
        let (r, o) = (&config.rollout, &config.optimizer);
        crate::actors::optimizer::OptimizerSettings {
            micro_batch_rows: o.micro_batch_rows,
            updates_per_batch: o.updates_per_batch,
            temperature: r.temperature,
            tasks_per_step: r.tasks_per_step,
            max_resample_rounds: r.max_resample_rounds,
            max_staleness: r.max_staleness,
            reuse_rollout_logprobs: o.reuse_rollout_logprobs,
            plugin_reads_reference: requirements.ref_logprobs,
            plugin_timeout: crate::deadline::seconds(config.run.plugin_timeout_s),
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
    /// Memory of the training device, GiB, that the pre-flight memory estimate
    /// ([`crate::memory`]) compares against. Default: the machine's RAM for `cpu`, the GPU's
    /// memory for `cuda`. Set it to plan for a share of the device (a shared GPU), or where
    /// the size cannot be queried.
    #[serde(default)]
    pub memory_gib: Option<f64>,
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
    /// Asynchronous rollouts: the rollout producer runs ahead of the optimizer by at most this
    /// many policy versions (0: synchronous; each step is sampled by the weights after the
    /// previous update). A row staler than this when it trains is dropped and counted.
    #[serde(default)]
    pub max_staleness: u64,
    /// Deadline of each environment call of an episode (`start` with its first observation,
    /// `step`), seconds; an episode with no reply within it fails (kind `timeout`) and the
    /// others go on. 0: no deadline (a hung environment then hangs the run). See
    /// docs/faults.md.
    #[serde(default = "default_env_timeout_s")]
    pub env_timeout_s: f64,
    /// What becomes of a group with a failed episode: `drop_group` (the default; the group is
    /// left out of the step) or `zero_reward` (the failed episode is a member with episode
    /// reward 0 and no success).
    #[serde(default)]
    pub on_episode_failure: crate::rollout::FailureRule,
    /// An external rollout engine (vLLM, SGLang, `cairn serve`) instead of the trainer's own
    /// backend, as written: `cairn_gateway::engine::EngineConfig::from_pipeline` reads and
    /// checks it (docs/engine.md).
    pub engine: Option<toml::Table>,
}

fn default_env_timeout_s() -> f64 {
    60.0
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
    /// Use a row's sampled log-probs as `ℓ_old` when the live weights sampled it, instead of a
    /// second scoring pass (rows of older versions, and extra rows, are still scored). Needs
    /// `rollout.top_p = 1` and the environment source, where the sampled log-probs are the
    /// scoring distribution's.
    #[serde(default)]
    pub reuse_rollout_logprobs: bool,
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
    /// Share of the demonstration episodes (0 to 1, spread evenly over them) whose prompts
    /// carry that episode's own solution as an injected experience, in the text the
    /// skill creator's `template` reflector writes (`solved in {n} turns: {a_0}; …`). It
    /// teaches a small policy the *format* of injected knowledge (EDGE, ReSkill, Pats), not
    /// the answers of other tasks. Default 0.
    #[serde(default)]
    pub hinted_share: f64,
    /// Also train on expert episodes the expert did not finish within the rollout's turn
    /// limit (their turns are still the expert's moves). Default false: only solved episodes.
    /// Where the expert searches blind and the limit is tight (the household's knowledge
    /// regime), keeping only the solved ones would keep the tasks whose answer happened to
    /// come early, and so teach answers.
    #[serde(default)]
    pub keep_unsolved: bool,
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

/// `[bank]`: the experience bank (`<run>/bank.sqlite`, see `docs/bank.md`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BankConfig {
    /// How long a bank write waits for another connection's write lock before failing with
    /// an error naming the file, in ms (readers such as `cairn bank list` never hold one).
    #[serde(default = "default_bank_busy_timeout_ms")]
    pub busy_timeout_ms: u64,
}

fn default_bank_busy_timeout_ms() -> u64 {
    cairn_stores::bank::DEFAULT_BUSY_TIMEOUT.as_millis() as u64
}

impl Default for BankConfig {
    fn default() -> Self {
        BankConfig {
            busy_timeout_ms: default_bank_busy_timeout_ms(),
        }
    }
}

impl BankConfig {
    /// Opens (or creates) the run's bank, `<run>/bank.sqlite`.
    pub fn open(&self, run_root: &Path) -> Result<cairn_stores::bank::Bank> {
        cairn_stores::bank::Bank::open_with(
            &cairn_stores::bank::bank_path(run_root),
            std::time::Duration::from_millis(self.busy_timeout_ms),
        )
        .map_err(Into::into)
    }
}

/// The range a numeric key must lie in. Every range also excludes NaN and ±inf: a non-finite
/// learning rate or penalty passes every comparison-free code path and only surfaces steps
/// later as a NaN loss.
#[derive(Clone, Copy, Debug)]
enum Range {
    /// Any finite number.
    Finite,
    /// `> 0`.
    Positive,
    /// `≥ 0`.
    NonNegative,
    /// `[0, 1)`.
    UnitOpen,
}

impl Range {
    fn contains(self, x: f64) -> bool {
        x.is_finite()
            && match self {
                Range::Finite => true,
                Range::Positive => x > 0.0,
                Range::NonNegative => x >= 0.0,
                Range::UnitOpen => (0.0..1.0).contains(&x),
            }
    }

    fn describe(self) -> &'static str {
        match self {
            Range::Finite => "a finite number",
            Range::Positive => "a finite number > 0",
            Range::NonNegative => "a finite number ≥ 0",
            Range::UnitOpen => "a number in [0, 1)",
        }
    }
}

impl PipelineConfig {
    /// Parses and validates a config. `source` names it in errors (a path, or
    /// `<embedded default>`).
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let mut config: PipelineConfig = toml::from_str(text).map_err(|e| {
            let mut message = e.to_string().trim_end().to_string();
            if message.contains("algorithm.stack") && message.contains("expected a sequence") {
                message.push_str(
                    "\nstack entries are an array of tables: write each as `[[algorithm.stack]]` \
                     (double brackets), one per plugin",
                );
            }
            Error::Config {
                file: source.to_string(),
                message,
            }
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

    /// `key` is `value`: an error naming the key, the value and the range unless `range`
    /// holds it.
    fn number(&self, key: &str, value: f64, range: Range) -> Result<()> {
        if range.contains(value) {
            return Ok(());
        }
        Err(self.error(key, format!("is {value}, must be {}", range.describe())))
    }

    /// The numeric keys no other check covers (the objective, the engine, the gateway and
    /// the skills tables check their own): each must be finite and in its range.
    fn validate_numbers(&self) -> Result<()> {
        let o = &self.optimizer;
        self.number("optimizer.lr", o.lr, Range::Positive)?;
        self.number("optimizer.betas", o.betas.0, Range::UnitOpen)?;
        self.number("optimizer.betas", o.betas.1, Range::UnitOpen)?;
        self.number("optimizer.eps", o.eps, Range::Positive)?;
        self.number("optimizer.weight_decay", o.weight_decay, Range::NonNegative)?;
        self.number("optimizer.max_grad_norm", o.max_grad_norm, Range::Positive)?;
        if let Some(w) = &self.warm_start {
            self.number("warm_start.lr", w.lr, Range::Positive)?;
        }
        self.number(
            "eval.temperature",
            f64::from(self.eval.temperature),
            Range::NonNegative,
        )?;
        self.number(
            "reward.invalid_action_penalty",
            f64::from(self.reward.invalid_action_penalty),
            Range::Finite,
        )?;
        if let Some(gib) = self.model.memory_gib {
            self.number("model.memory_gib", gib, Range::Positive)?;
        }
        // The sampler divides the logits by the temperature: below this they overflow to inf
        // and every log-prob is NaN (the gateway refuses such requests by the same bound).
        let min = crate::backend::MIN_TEMPERATURE;
        for (key, t) in [
            ("rollout.temperature", self.rollout.temperature),
            ("eval.temperature", self.eval.temperature),
            ("skills.policy.temperature", self.skills.policy.temperature),
        ] {
            if t > 0.0 && t < min {
                return Err(self.error(
                    key,
                    format!(
                        "is {t:e}, below {min:e}: the logits divided by it overflow; use 0 for \
                         greedy decoding or a temperature of at least {min:e}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks values serde cannot: ranges and combinations.
    pub fn validate(&self) -> Result<()> {
        self.validate_numbers()?;
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
        if !(r.env_timeout_s >= 0.0 && r.env_timeout_s.is_finite()) {
            return Err(self.error(
                "rollout.env_timeout_s",
                "must be a finite number of seconds ≥ 0 (0: no deadline)",
            ));
        }
        if !(self.run.plugin_timeout_s >= 0.0 && self.run.plugin_timeout_s.is_finite()) {
            return Err(self.error(
                "run.plugin_timeout_s",
                "must be a finite number of seconds ≥ 0 (0: no deadline)",
            ));
        }
        if self.optimizer.micro_batch_rows == 0 || self.optimizer.updates_per_batch == 0 {
            return Err(self.error(
                "optimizer.micro_batch_rows",
                "micro_batch_rows and updates_per_batch must be at least 1",
            ));
        }
        if self.optimizer.reuse_rollout_logprobs {
            if r.top_p < 1.0 {
                return Err(self.error(
                    "optimizer.reuse_rollout_logprobs",
                    "needs `rollout.top_p = 1`: under a nucleus the sampled log-probs are not \
                     the full-softmax log-probs the ratio needs; set top_p = 1 or turn reuse off",
                ));
            }
            if self.episode_source.gateway().is_some() {
                return Err(self.error(
                    "optimizer.reuse_rollout_logprobs",
                    "a gateway harness picks its own sampling settings per request, so its \
                     log-probs are rescored; turn reuse off",
                ));
            }
        }
        if r.engine.is_some() {
            if self.episode_source.gateway().is_some() {
                return Err(self.error(
                    "rollout.engine",
                    "the gateway source serves its harness from the trainer's own backend; an \
                     external engine is for rollouts of the environment plugin (remove one)",
                ));
            }
            if self.optimizer.reuse_rollout_logprobs {
                return Err(self.error(
                    "optimizer.reuse_rollout_logprobs",
                    "an external engine's log-probs come from another implementation (and \
                     maybe another precision), so ℓ_old is always recomputed by the trainer; \
                     turn reuse off",
                ));
            }
        }
        if r.max_staleness > 0 && self.episode_source.gateway().is_some() {
            return Err(self.error(
                "rollout.max_staleness",
                "the gateway source trains on the harness's episodes as they finish and \
                 pauses sampling around each update; it runs synchronously (set 0)",
            ));
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
            if w.epochs == 0 || w.batch_rows == 0 {
                return Err(self.error("warm_start", "epochs and batch_rows must be >= 1"));
            }
            if !(0.0..=1.0).contains(&w.hinted_share) {
                return Err(self.error(
                    "warm_start.hinted_share",
                    format!(
                        "is {}, must be a share between 0 and 1 (0: no hinted demonstrations)",
                        w.hinted_share
                    ),
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
        self.validate_skills()?;
        self.validate_source()
    }

    /// `[skills]`: the skill creator checks its own table.
    fn validate_skills(&self) -> Result<()> {
        match self.skills.problem() {
            Some((key, message)) => Err(self.error(key, message)),
            None => Ok(()),
        }
    }

    /// The `endpoint` reflector's API key: `lookup` (the host passes `std::env::var`) of the
    /// variable `skills.endpoint.api_key_env` names. `None` when no key is configured or the
    /// reflector is not `endpoint`; a config error naming the key and the variable when the
    /// variable is unset or empty.
    pub fn skills_api_key(
        &self,
        lookup: impl FnOnce(&str) -> Option<String>,
    ) -> Result<Option<String>> {
        if self.skills.reflector != ReflectorKind::Endpoint {
            return Ok(None);
        }
        let Some(var) = self
            .skills
            .endpoint
            .as_ref()
            .and_then(|e| e.api_key_env.as_deref())
        else {
            return Ok(None);
        };
        match lookup(var) {
            Some(key) if !key.is_empty() => Ok(Some(key)),
            _ => Err(self.error(
                "skills.endpoint.api_key_env",
                format!(
                    "the environment variable `{var}` is not set (or empty); export the \
                     endpoint's API key in it, or remove `api_key_env` for an endpoint \
                     without a key"
                ),
            )),
        }
    }

    /// The source's combinations: the environment source needs `[environment]`; the
    /// gateway has no environment, no expert for a warm start, and a scratch model needs a
    /// tokenizer from somewhere.
    fn validate_source(&self) -> Result<()> {
        if self.episode_source.gateway().is_none() {
            if self.environment.is_none() {
                return Err(self.error(
                    "environment",
                    "missing table `[environment]` (the environment plugin to train on)",
                ));
            }
            return Ok(());
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
    /// finds the innermost table header or inline table, then the key inside it. A key of a
    /// stack entry, `algorithm.stack[i].config.coef`, is looked up inside the `i`-th
    /// `[[algorithm.stack]]` table.
    pub fn line_of(&self, dotted: &str) -> Option<usize> {
        if let Some(rest) = dotted.strip_prefix("algorithm.stack[") {
            let (index, key) = rest.split_once(']')?;
            return self.stack_line_of(index.parse().ok()?, key.trim_start_matches('.'));
        }
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

    /// Checks what the algorithm needs against what the environment, the rollout settings and
    /// the training host provide; an unmet need is a config error naming the plugin, the
    /// `Requirements` flag and the key to change, before any compute. Every flag of
    /// [`cairn_plugin_sdk::Requirements`] is checked here or in [`check_services`]. Errors name
    /// the whole stack (`grpo`, or `gigpo+edge`); [`PipelineConfig::check_member_requirements`]
    /// names one member.
    pub fn check_requirements(
        &self,
        requirements: &cairn_plugin_sdk::Requirements,
        environment: &cairn_plugin_sdk::EnvironmentInfo,
    ) -> Result<()> {
        self.check_member_requirements(&self.algorithm.label(), requirements, environment)
    }

    /// [`PipelineConfig::check_requirements`] for one plugin of the algorithm stack: errors name
    /// `algo` (the plugin whose requirements these are).
    pub fn check_member_requirements(
        &self,
        algo: &str,
        requirements: &cairn_plugin_sdk::Requirements,
        environment: &cairn_plugin_sdk::EnvironmentInfo,
    ) -> Result<()> {
        let env = self.environment_name();
        // The key to name: the member's own `plugin` line (a stack member's, or `[algorithm]`'s
        // for the estimator and for the stack as a whole).
        let key = self
            .algorithm
            .stack
            .iter()
            .position(|s| s.plugin == algo && algo != self.algorithm.plugin)
            .map_or_else(
                || "algorithm.plugin".to_string(),
                |i| AlgorithmSection::member_key(i + 1),
            );
        // With the gateway source the "environment" is whatever the harness posts.
        let fix = if self.environment.is_some() {
            "pick an environment that does, or another algorithm"
        } else {
            "a gateway harness posts episode rewards, and anchor keys only when it sends \
             `cairn.anchor` on every call and `[source] anchors = true` says so; pick another \
             algorithm, or train on an environment plugin"
        };
        let unmet = |flag: &str, what: &str| {
            self.error(
                &key,
                format!(
                    "algorithm `{algo}` sets `requirements.{flag}` (it needs {what}), but \
                     environment `{env}` does not provide it; {fix}"
                ),
            )
        };
        if requirements.anchor_keys && !environment.anchor_keys {
            return Err(unmet("anchor_keys", "an anchor-state key on every turn"));
        }
        if requirements.step_rewards && !environment.step_rewards {
            return Err(unmet("step_rewards", "per-turn rewards"));
        }
        if requirements.feedback && !environment.feedback {
            return Err(unmet("feedback", "short-term environment feedback"));
        }
        if requirements.tool_free_slots && !environment.tools {
            return Err(unmet(
                "tool_free_slots",
                "an environment with tools, since it turns them off for some slots",
            ));
        }
        let min = requirements.min_group_size as usize;
        if min > self.rollout.group_size {
            return Err(self.error(
                "rollout.group_size",
                format!(
                    "algorithm `{algo}` sets `requirements.min_group_size = {min}`, but the \
                     groups have {}; raise it to {min} or more",
                    self.rollout.group_size
                ),
            ));
        }
        if requirements.even_group_size && self.rollout.group_size % 2 == 1 {
            return Err(self.error(
                "rollout.group_size",
                format!(
                    "algorithm `{algo}` sets `requirements.even_group_size` (it splits each \
                     group in halves), but the groups have {}; use an even group size",
                    self.rollout.group_size
                ),
            ));
        }
        if requirements.turn_context && self.environment.is_none() {
            return Err(unmet(
                "turn_context",
                "to set the context of every turn, which only the rollout actor's own \
                 episodes allow (a gateway harness builds its own prompts)",
            ));
        }
        if requirements.dynamic_sampling && self.rollout.max_resample_rounds == 0 {
            return Err(self.error(
                "rollout.max_resample_rounds",
                format!(
                    "algorithm `{algo}` sets `requirements.dynamic_sampling` (it drops groups \
                     and needs more sampled in their place), but resampling is off; set it to \
                     1 or more, or turn the plugin's dynamic sampling off"
                ),
            ));
        }
        check_services(algo, requirements, &HostServices::TRAINING)
            .map_err(|e| self.error(&key, e))?;
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
            _ => match stack_index(section) {
                Some(i) => self.algorithm.stack.get(i).map_or(&empty, |m| &m.config),
                None => &self.algorithm.config,
            },
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

/// `Some(i)` for the section name `algorithm.stack[i]`.
fn stack_index(section: &str) -> Option<usize> {
    section
        .strip_prefix("algorithm.stack[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

impl PipelineConfig {
    /// The line of `key` (`plugin`, `config`, `config.coef`, or empty for the header) in the
    /// `index`-th `[[algorithm.stack]]` table.
    fn stack_line_of(&self, index: usize, key: &str) -> Option<usize> {
        let lines: Vec<&str> = self.text.lines().collect();
        let header = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim() == "[[algorithm.stack]]")
            .nth(index)?
            .0;
        if key.is_empty() {
            return Some(header + 1);
        }
        let (first, inner) = key.split_once('.').unwrap_or((key, ""));
        let block = lines[header + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with('['));
        let mut fallback = None;
        for (offset, raw) in block.enumerate() {
            let line = raw.trim();
            let Some((k, _)) = line.split_once('=') else {
                continue;
            };
            if k.trim().trim_matches('"') != first {
                continue;
            }
            let n = header + 2 + offset;
            if inner.is_empty()
                || line.contains(&format!("{inner} ="))
                || line.contains(&format!("{inner}="))
            {
                return Some(n);
            }
            fallback = Some(n);
        }
        fallback.or(Some(header + 1))
    }
}

/// The [`cairn_plugin_sdk::Host`] services a host offers an algorithm plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostServices {
    /// Where the host runs; named in errors (`the training pipeline`, `cairn signals`).
    pub name: &'static str,
    /// `Host::score` works (a policy model is loaded).
    pub scoring: bool,
    /// `Host::generate` works (a policy model is loaded).
    pub generation: bool,
    /// The experience bank is wired in.
    pub bank: bool,
}

impl HostServices {
    /// A training pipeline (`cairn train`, either source): the policy actor scores and
    /// generates, and the bank actor is always started (there is no switch that turns it off).
    pub const TRAINING: HostServices = HostServices {
        name: "the training pipeline",
        scoring: true,
        generation: true,
        bank: true,
    };
    /// The offline runners (`cairn signals`): no model and no bank, only metric logging.
    pub const OFFLINE: HostServices = HostServices {
        name: "`cairn signals` (offline, no model)",
        scoring: false,
        generation: false,
        bank: false,
    };
}

/// Checks the host-side needs of `plugin` (`teacher_scores`, `generation`, `bank`) against what
/// `host` offers, so a plugin that would call a missing service is refused up front instead of
/// failing inside `signals`.
pub fn check_services(
    plugin: &str,
    requirements: &cairn_plugin_sdk::Requirements,
    host: &HostServices,
) -> Result<()> {
    let unmet = |flag: &'static str, need: &'static str| {
        Err(Error::UnmetRequirement {
            plugin: plugin.to_string(),
            flag,
            need,
            host: host.name,
        })
    };
    if requirements.teacher_scores && !host.scoring {
        return unmet("teacher_scores", "`Host::score` to re-score responses");
    }
    if requirements.generation && !host.generation {
        return unmet("generation", "`Host::generate`");
    }
    if requirements.teacher_topk && !host.scoring {
        return unmet("teacher_topk", "top-k teacher scores from a policy model");
    }
    if !requirements.bank.is_empty() && !host.bank {
        return unmet("bank", "the experience bank");
    }
    if requirements.reflection && !host.bank {
        return unmet(
            "reflection",
            "the skill creator, which writes into the bank",
        );
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_stack_entry_in_single_brackets_says_to_use_double_ones() {
        let text = MINIMAL.replace(
            "[algorithm]\nplugin = \"grpo\"\n",
            "[algorithm]\nplugin = \"grpo\"\n[algorithm.stack]\nplugin = \"hint\"\n",
        );
        assert_ne!(text, MINIMAL);
        let e = PipelineConfig::parse(&text, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("write each as `[[algorithm.stack]]` (double brackets)"),
            "{e}"
        );
    }

    /// A bad `[source]` is reported with its key, not only at the table's header (serde's
    /// tagged enums lose the key). The gateway's own keys are the gateway crate's to check.
    #[test]
    fn source_errors_name_their_key() {
        let text = format!("{MINIMAL}\n[source]\nkind = \"nowhere\"\n");
        let e = PipelineConfig::parse(&text, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`source.kind`") && e.contains("\"gateway\""),
            "{e}"
        );
        let text = format!("{MINIMAL}\n[source]\nkind = \"environment\"\nbind = \"x\"\n");
        let e = PipelineConfig::parse(&text, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`source.bind`"), "{e}");
        let text = format!("{MINIMAL}\n[source]\nkind = \"environment\"\n");
        assert!(PipelineConfig::parse(&text, "p.toml").is_ok());
        // A `[source]` without `kind` (keys copied from docs/gateway.md) names the key and
        // both values, not serde's bare "missing field".
        let text = format!("{MINIMAL}\n[source]\napi_key_env = \"CAIRN_API_KEY\"\n");
        let e = PipelineConfig::parse(&text, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`source.kind`: missing")
                && e.contains("\"environment\"")
                && e.contains("\"gateway\""),
            "{e}"
        );
    }

    /// A temperature so small that the divided logits overflow is refused by its key.
    #[test]
    fn temperatures_that_overflow_the_logits_are_refused() {
        for (from, to, key) in [
            (
                "temperature = 1.0\n",
                "temperature = 1e-30\n",
                "rollout.temperature",
            ),
            (
                "tasks = 4\n",
                "tasks = 4\ntemperature = 1e-30\n",
                "eval.temperature",
            ),
        ] {
            let text = MINIMAL.replace(from, to);
            assert_ne!(text, MINIMAL);
            let e = PipelineConfig::parse(&text, "p.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("overflow"), "{e}");
        }
        let greedy = MINIMAL.replace("tasks = 4\n", "tasks = 4\ntemperature = 0\n");
        assert!(PipelineConfig::parse(&greedy, "p.toml").is_ok());
    }

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
    fn the_gateway_source_needs_a_tokenizer_and_no_environment() {
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
        assert!(c.episode_source.gateway().is_some());
        assert_eq!(c.environment_name(), "gateway harness");
        let e = err(&gateway.replace("tokenizer = \"tok\"\n", ""));
        assert!(
            e.contains("`model.scratch`") && e.contains("tokenizer_corpus"),
            "{e}"
        );
        let e = err(&MINIMAL.replace(
            "[environment]\nplugin = \"household\"\nconfig = { max_turns = 8 }\n",
            "",
        ));
        assert!(e.contains("missing table `[environment]`"), "{e}");
    }

    #[test]
    fn fault_deadlines_and_the_failure_rule_are_read_and_checked() {
        use crate::actors::optimizer::OptimizerSettings;
        use crate::actors::rollout::RolloutSettings;
        use crate::rollout::FailureRule;
        use std::time::Duration;
        let c = PipelineConfig::parse(MINIMAL, "test.toml").unwrap();
        let r = RolloutSettings::from_config(&c);
        assert_eq!(r.env_timeout, Some(Duration::from_secs(60)));
        assert_eq!(r.plugin_timeout, Some(Duration::from_secs(600)));
        assert_eq!(r.on_failure, FailureRule::DropGroup);
        let text = MINIMAL
            .replace(
                "group_size = 4",
                "group_size = 4\nenv_timeout_s = 0.25\non_episode_failure = \"zero_reward\"",
            )
            .replace("seed = 1\n", "seed = 1\nplugin_timeout_s = 0\n");
        let c = PipelineConfig::parse(&text, "test.toml").unwrap();
        let r = RolloutSettings::from_config(&c);
        assert_eq!(r.env_timeout, Some(Duration::from_millis(250)));
        assert_eq!(r.plugin_timeout, None, "0 is no deadline");
        assert_eq!(r.on_failure, FailureRule::ZeroReward);
        let o = OptimizerSettings::from_config(&c, &Default::default());
        assert_eq!(o.plugin_timeout, None);
        let e = err(&MINIMAL.replace("group_size = 4", "group_size = 4\nenv_timeout_s = -1"));
        assert!(
            e.contains("`rollout.env_timeout_s`") && e.contains("≥ 0"),
            "{e}"
        );
        let e = err(&MINIMAL.replace("seed = 1\n", "seed = 1\nplugin_timeout_s = nan\n"));
        assert!(e.contains("`run.plugin_timeout_s`"), "{e}");
        let e = err(&MINIMAL.replace(
            "group_size = 4",
            "group_size = 4\non_episode_failure = \"retry\"",
        ));
        assert!(e.contains("drop_group") && e.contains("zero_reward"), "{e}");
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

    /// `MINIMAL` with every optional table that holds a number: a warm start, every objective
    /// key, reward shaping, an evaluation temperature, an external engine with a launch
    /// command, the endpoint reflector and a memory budget.
    fn every_float_key() -> String {
        MINIMAL
            .replace("[model]\n", "[model]\nmemory_gib = 64.0\n")
            .replace(
                "max_turns = 8\n\n[optimizer]",
                "max_turns = 8\n\n[rollout.engine]\nkind = \"vllm\"\n\n\
                 [rollout.engine.launch]\ncommand = [\"serve\", \"{port}\"]\n\n[optimizer]",
            )
            .replace("tasks = 4\n", "tasks = 4\ntemperature = 0.5\n")
            + "\n[warm_start]\ndemonstrations = 4\nepochs = 1\nlr = 1e-3\nhinted_share = 0.5\n\
               \n[objective]\nkl_coef = 0.01\nentropy_coef = 0.001\n\
               aggregation = \"seq-mean-token-sum-norm\"\nnorm_constant = 64.0\n\
               \n[reward]\ninvalid_action_penalty = 0.1\n\
               \n[skills]\nreflector = \"endpoint\"\n\
               [skills.endpoint]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n"
    }

    /// The dotted keys of every float in `value` (plugin tables left out: their plugins
    /// check them), an array's floats under the array's key.
    fn float_keys(prefix: &str, value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::Float(_) => out.push(prefix.to_string()),
            toml::Value::Array(items) => {
                for item in items {
                    float_keys(prefix, item, out);
                }
            }
            toml::Value::Table(table) => {
                for (k, v) in table {
                    if k == "config" && matches!(prefix, "environment" | "algorithm") {
                        continue;
                    }
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    float_keys(&key, v, out);
                }
            }
            _ => {}
        }
    }

    /// Sets every float at `key` in `value` to `x`.
    fn set_floats(value: &mut toml::Value, key: &str, x: f64) {
        let mut node = value;
        for part in key.split('.') {
            node = node
                .get_mut(part)
                .expect("the key was listed from this value");
        }
        match node {
            toml::Value::Array(items) => items.iter_mut().for_each(|i| *i = toml::Value::Float(x)),
            leaf => *leaf = toml::Value::Float(x),
        }
    }

    #[test]
    fn every_float_key_refuses_inf_and_nan_by_name() {
        let mut checked = 0;
        for text in [every_float_key()] {
            // The keys come from the parsed config as it serialises, defaults included, so a
            // new float key is covered without touching this test.
            let config = PipelineConfig::parse(&text, "test.toml").unwrap();
            let value = toml::Value::try_from(&config).unwrap();
            let mut keys = Vec::new();
            float_keys("", &value, &mut keys);
            assert!(keys.len() > 20, "{keys:?}");
            for key in &keys {
                for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
                    let mut value = value.clone();
                    set_floats(&mut value, key, bad);
                    let text = toml::to_string(&value).unwrap();
                    let e = PipelineConfig::parse(&text, "test.toml")
                        .map(|_| ())
                        .expect_err(&format!("{key} = {bad} passes"))
                        .to_string();
                    assert!(e.contains(&format!("key `{key}`")), "{key} = {bad}: {e}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 60);
    }

    #[test]
    fn optimizer_numbers_are_checked_for_range() {
        for (from, to, key) in [
            ("lr = 1e-3", "lr = inf", "optimizer.lr"),
            (
                "lr = 1e-3",
                "lr = 1e-3\nbetas = [0.9, 1.0]",
                "optimizer.betas",
            ),
            ("lr = 1e-3", "lr = 1e-3\neps = 0.0", "optimizer.eps"),
            (
                "lr = 1e-3",
                "lr = 1e-3\nweight_decay = -0.1",
                "optimizer.weight_decay",
            ),
            (
                "lr = 1e-3",
                "lr = 1e-3\nmax_grad_norm = 0",
                "optimizer.max_grad_norm",
            ),
            (
                "tasks = 4",
                "tasks = 4\ntemperature = -1.0",
                "eval.temperature",
            ),
            ("[model]\n", "[model]\nmemory_gib = 0\n", "model.memory_gib"),
        ] {
            let text = MINIMAL.replace(from, to);
            assert_ne!(text, MINIMAL);
            let e = err(&text);
            assert!(
                e.contains(&format!("key `{key}`")) && e.contains("must be"),
                "{e}"
            );
        }
        let e = err(&format!(
            "{MINIMAL}\n[reward]\ninvalid_action_penalty = nan\n"
        ));
        assert!(
            e.contains("key `reward.invalid_action_penalty`") && e.contains("is NaN"),
            "{e}"
        );
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
            e.contains("`algorithm.plugin`, line 12")
                && e.contains("algorithm `gigpo` sets `requirements.anchor_keys`")
                && e.contains("environment `household` does not provide it"),
            "{e}"
        );
        let needs = cairn_plugin_sdk::Requirements {
            min_group_size: 8,
            ..Default::default()
        };
        let e = c.check_requirements(&needs, &env).unwrap_err().to_string();
        assert!(
            e.contains("rollout.group_size")
                && e.contains("`requirements.min_group_size = 8`, but the groups have 4"),
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

    /// `check(config text, requirements, environment, expected key, expected text)`: every
    /// `Requirements` flag is refused, with the flag and the key to change, when unmet.
    fn check_unmet(
        text: &str,
        needs: cairn_plugin_sdk::Requirements,
        env: &cairn_plugin_sdk::EnvironmentInfo,
        key: &str,
        expected: &str,
    ) {
        let c = PipelineConfig::parse(text, "test.toml").unwrap();
        let e = c.check_requirements(&needs, env).unwrap_err().to_string();
        assert!(
            e.starts_with("test.toml: key `") && e.contains(key) && e.contains(expected),
            "{e}"
        );
    }

    #[test]
    fn every_requirement_flag_is_checked() {
        use cairn_plugin_sdk::{EnvironmentInfo, Requirements};
        let env = EnvironmentInfo {
            test_tasks: 500,
            ..Default::default()
        };
        let unmet = [
            (
                Requirements {
                    step_rewards: true,
                    ..Default::default()
                },
                "`requirements.step_rewards` (it needs per-turn rewards)",
            ),
            (
                Requirements {
                    feedback: true,
                    ..Default::default()
                },
                "`requirements.feedback`",
            ),
            (
                Requirements {
                    tool_free_slots: true,
                    ..Default::default()
                },
                "`requirements.tool_free_slots` (it needs an environment with tools",
            ),
        ];
        for (needs, expected) in unmet {
            check_unmet(
                MINIMAL,
                needs,
                &env,
                "`algorithm.plugin`, line 12",
                expected,
            );
        }
        let with_tools = EnvironmentInfo {
            tools: true,
            ..env.clone()
        };
        let c = PipelineConfig::parse(MINIMAL, "test.toml").unwrap();
        let tool_free = Requirements {
            tool_free_slots: true,
            ..Default::default()
        };
        assert!(c.check_requirements(&tool_free, &with_tools).is_ok());

        let dynamic = Requirements {
            dynamic_sampling: true,
            ..Default::default()
        };
        assert!(c.check_requirements(&dynamic, &env).is_ok());
        check_unmet(
            &MINIMAL.replace(
                "max_turns = 8\n\n[optimizer]",
                "max_turns = 8\nmax_resample_rounds = 0\n\n[optimizer]",
            ),
            dynamic,
            &env,
            "`rollout.max_resample_rounds`, line 28",
            "sets `requirements.dynamic_sampling`",
        );

        // The training pipeline has a policy model and a bank: these pass.
        let services = Requirements {
            teacher_scores: true,
            generation: true,
            bank: vec![cairn_plugin_sdk::EntryKind::Experience],
            ..Default::default()
        };
        assert!(c.check_requirements(&services, &env).is_ok());
    }

    #[test]
    fn a_stack_member_is_named_with_its_own_key() {
        let text = MINIMAL.replace(
            "[algorithm]\nplugin = \"grpo\"\n",
            "[algorithm]\nplugin = \"grpo\"\n\n[[algorithm.stack]]\nplugin = \"hint\"\n",
        );
        let c = PipelineConfig::parse(&text, "test.toml").unwrap();
        let needs = cairn_plugin_sdk::Requirements {
            feedback: true,
            ..Default::default()
        };
        let env = cairn_plugin_sdk::EnvironmentInfo {
            test_tasks: 500,
            ..Default::default()
        };
        let e = c
            .check_member_requirements("hint", &needs, &env)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `algorithm.stack[0].plugin`")
                && e.contains("algorithm `hint` sets `requirements.feedback`"),
            "{e}"
        );
        let e = c.check_requirements(&needs, &env).unwrap_err().to_string();
        assert!(
            e.contains("key `algorithm.plugin`, line 12")
                && e.contains("algorithm `grpo+hint` sets `requirements.feedback`"),
            "{e}"
        );
    }

    #[test]
    fn the_offline_host_refuses_model_and_bank_needs() {
        use cairn_plugin_sdk::Requirements;
        let cases = [
            (
                Requirements {
                    teacher_scores: true,
                    ..Default::default()
                },
                "algorithm `edge` sets `requirements.teacher_scores` (it calls `Host::score` to \
                 re-score responses), but `cairn signals` (offline, no model) offers no such \
                 service; run it in a training pipeline (`cairn train`) with a policy model, or \
                 turn that part of the plugin off",
            ),
            (
                Requirements {
                    generation: true,
                    ..Default::default()
                },
                "algorithm `edge` sets `requirements.generation` (it calls `Host::generate`), but \
                 `cairn signals` (offline, no model) offers no such service; run it in a \
                 training pipeline (`cairn train`) with a policy model, or turn that part of the \
                 plugin off",
            ),
            (
                Requirements {
                    bank: vec![cairn_plugin_sdk::EntryKind::Skill],
                    ..Default::default()
                },
                "algorithm `edge` sets `requirements.bank` (it calls the experience bank), but \
                 `cairn signals` (offline, no model) offers no such service; run it in a \
                 training pipeline (`cairn train`) with a policy model, or turn that part of the \
                 plugin off",
            ),
        ];
        for (needs, expected) in cases {
            let e = check_services("edge", &needs, &HostServices::OFFLINE).unwrap_err();
            assert_eq!(e.to_string(), expected);
            assert!(check_services("edge", &needs, &HostServices::TRAINING).is_ok());
        }
        assert!(check_services("edge", &Requirements::default(), &HostServices::OFFLINE).is_ok());
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
