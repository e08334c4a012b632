//! `[rollout.engine]`: an external rollout engine (vLLM, SGLang, or any server speaking the
//! OpenAI completions API with token ids, such as `cairn serve`), chosen in the config.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cairn_kernel::config::PipelineConfig;
use serde::{Deserialize, Serialize};

/// Which protocol the engine speaks beyond `/v1/completions`: how it takes new weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// vLLM's OpenAI server. Weights: the new safetensors are written into the directory it
    /// serves (`weights_dir`), then `POST /collective_rpc {"method": "reload_weights"}` (needs
    /// `VLLM_SERVER_DEV_MODE=1`) and `POST /reset_prefix_cache`.
    Vllm,
    /// SGLang's server: `POST /update_weights_from_disk {"model_path", "weight_version"}`.
    Sglang,
    /// An OpenAI-compatible server taking weights the SGLang way and reporting the
    /// `policy_version` of each answer: `cairn serve` is one.
    Openai,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Openai => "openai",
        }
    }
}

/// `[rollout.engine]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    pub kind: EngineKind,
    /// Server roots (`http://host:port`, no `/v1`). Several share the load: each turn's
    /// prompts are split evenly across them, and a failed request is retried on the next.
    /// With `launch`, leave it empty (the launched server's address is used) or give one.
    #[serde(default)]
    pub base_urls: Vec<String>,
    /// The model name sent in requests; default: the first id the engine lists at
    /// `GET /v1/models`.
    pub model: Option<String>,
    /// Deadline of one HTTP request, seconds (a whole turn's completion for a share of the
    /// prompts).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Largest number of prompts in one request (a turn with more is sent as several requests
    /// at once); `cairn serve` takes at most `4 × source.max_n` (64 by default).
    #[serde(default = "default_max_prompts")]
    pub max_prompts_per_request: usize,
    /// Further attempts of a failed request (transport error, timeout, HTTP 408/429/5xx),
    /// each on the next URL, waiting 0.5 s and doubling.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Largest mean |engine − trainer| log-prob, nats per token, on the probe prompt checked
    /// at start-up and after every weight sync.
    #[serde(default = "default_probe_tolerance")]
    pub probe_tolerance: f64,
    /// Where the weights for the engine are written (HF format); default `<run.dir>/engine`.
    /// For `vllm`, the directory the server was started on (with `launch`, it is).
    pub weights_dir: Option<PathBuf>,
    /// Start a local server and stop it at the end of the run.
    pub launch: Option<LaunchConfig>,
}

/// `[rollout.engine.launch]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchConfig {
    /// Program and arguments. `{model}` becomes the directory of the policy's weights in HF
    /// format (written before the launch), `{port}` a free local port, `{host}` 127.0.0.1.
    pub command: Vec<String>,
    /// Wait at most this long for `GET /health` to answer 200, seconds.
    #[serde(default = "default_startup_timeout_s")]
    pub startup_timeout_s: f64,
    /// Extra environment variables of the server.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_timeout_s() -> f64 {
    300.0
}
fn default_max_prompts() -> usize {
    64
}
fn default_retries() -> u32 {
    2
}
fn default_probe_tolerance() -> f64 {
    0.02
}
fn default_startup_timeout_s() -> f64 {
    300.0
}

impl EngineConfig {
    /// The pipeline's `[rollout.engine]`, read and checked; `None` without one. The host
    /// calls it when it loads a config, so a bad engine key fails before anything runs.
    pub fn from_pipeline(config: &PipelineConfig) -> cairn_kernel::Result<Option<Self>> {
        let Some(table) = &config.rollout.engine else {
            return Ok(None);
        };
        let engine: EngineConfig = crate::read_section(config, "rollout.engine", table)?;
        if let Err((key, message)) = engine.check() {
            return Err(config.error(&format!("rollout.engine.{key}"), message));
        }
        Ok(Some(engine))
    }

    /// Range and combination checks: `(key under rollout.engine, message)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.base_urls.is_empty() && self.launch.is_none() {
            return Err((
                "base_urls",
                "give the engine's URLs (`base_urls = [\"http://127.0.0.1:8000\"]`) or a \
                 `launch` command"
                    .into(),
            ));
        }
        if self.launch.is_some() && self.base_urls.len() > 1 {
            return Err((
                "base_urls",
                "with `launch`, Cairn starts one server: give at most one URL (its address)".into(),
            ));
        }
        for url in &self.base_urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with("/v1")
            {
                return Err((
                    "base_urls",
                    format!("`{url}` is not a server root like http://127.0.0.1:8000 (no /v1)"),
                ));
            }
        }
        if !(self.timeout_s > 0.0 && self.timeout_s.is_finite()) {
            return Err(("timeout_s", "must be a finite number of seconds > 0".into()));
        }
        if self.max_prompts_per_request == 0 {
            return Err(("max_prompts_per_request", "must be at least 1".into()));
        }
        if !(self.probe_tolerance > 0.0 && self.probe_tolerance.is_finite()) {
            return Err((
                "probe_tolerance",
                "must be a finite number of nats > 0".into(),
            ));
        }
        if let Some(l) = &self.launch {
            if l.command.is_empty() {
                return Err((
                    "launch.command",
                    "give the program and its arguments".into(),
                ));
            }
            if self.base_urls.is_empty() && !l.command.iter().any(|a| a.contains("{port}")) {
                return Err((
                    "launch.command",
                    "no argument holds `{port}`, so Cairn cannot know where the server listens: \
                     pass `{port}` to its port option, or give its address in `base_urls`"
                        .into(),
                ));
            }
            if !(l.startup_timeout_s > 0.0 && l.startup_timeout_s.is_finite()) {
                return Err((
                    "launch.startup_timeout_s",
                    "must be a finite number of seconds > 0".into(),
                ));
            }
        }
        Ok(())
    }
}
