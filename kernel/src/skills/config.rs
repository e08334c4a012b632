//! `[skills]`: the skill creator's table, its defaults and its checks. The pipeline config
//! holds it ([`crate::config::PipelineConfig::skills`]) and reports a problem by key.

use serde::{Deserialize, Serialize};

/// `[skills]`: the skill-creator actor, which answers plugins' reflection requests with bank
/// entries (docs/skills.md).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsConfig {
    /// Who writes the entries: `template` (deterministic), `policy` (the policy itself) or
    /// `endpoint` (an OpenAI-compatible chat endpoint, `[skills.endpoint]`).
    #[serde(default)]
    pub reflector: ReflectorKind,
    /// Reflections queued or in flight at most; a `reflect` call that would exceed it is
    /// refused (and counted in `skills/queue_full`).
    #[serde(default = "default_skills_queue")]
    pub queue: usize,
    /// `[skills.policy]`: generation settings of the `policy` reflector.
    #[serde(default)]
    pub policy: PolicyReflectorConfig,
    /// `[skills.endpoint]`: required with `reflector = "endpoint"`.
    pub endpoint: Option<EndpointConfig>,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        SkillsConfig {
            reflector: ReflectorKind::default(),
            queue: default_skills_queue(),
            policy: PolicyReflectorConfig::default(),
            endpoint: None,
        }
    }
}

fn default_skills_queue() -> usize {
    64
}

/// `skills.reflector`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReflectorKind {
    #[default]
    Template,
    Policy,
    Endpoint,
}

impl ReflectorKind {
    /// The name used in configs and in the entries' writer (`skill-creator:<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReflectorKind::Template => "template",
            ReflectorKind::Policy => "policy",
            ReflectorKind::Endpoint => "endpoint",
        }
    }
}

/// `[skills.policy]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyReflectorConfig {
    /// Reply length limit in tokens.
    #[serde(default = "default_reflection_tokens")]
    pub max_new_tokens: u32,
    /// 0: greedy.
    #[serde(default)]
    pub temperature: f32,
}

impl Default for PolicyReflectorConfig {
    fn default() -> Self {
        PolicyReflectorConfig {
            max_new_tokens: default_reflection_tokens(),
            temperature: 0.0,
        }
    }
}

fn default_reflection_tokens() -> u32 {
    256
}

/// `[skills.endpoint]`: an OpenAI-compatible chat endpoint (`POST {base_url}/chat/completions`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// The API root, as OpenAI clients take it: `https://api.example.com/v1`,
    /// `http://127.0.0.1:8400/v1`.
    pub base_url: String,
    /// The `model` field of each request.
    pub model: String,
    /// Name of the environment variable holding the API key (sent as `Authorization: Bearer`);
    /// the host reads it at start ([`PipelineConfig::skills_api_key`]). Absent: no key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Limit of one HTTP attempt (connect, send and the whole reply), milliseconds.
    #[serde(default = "default_endpoint_timeout_ms")]
    pub timeout_ms: u64,
    /// Retries after a timeout, a failed connection, HTTP 408, 429 or 5xx (at most 10).
    #[serde(default = "default_endpoint_retries")]
    pub max_retries: u32,
    /// Wait before the first retry, doubled for each next one, milliseconds.
    #[serde(default = "default_endpoint_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// `max_tokens` of each request.
    #[serde(default = "default_reflection_tokens")]
    pub max_tokens: u32,
    /// `temperature` of each request (0: greedy).
    #[serde(default)]
    pub temperature: f32,
}

fn default_endpoint_timeout_ms() -> u64 {
    60_000
}
fn default_endpoint_retries() -> u32 {
    2
}
fn default_endpoint_backoff_ms() -> u64 {
    500
}

/// Most retries `skills.endpoint.max_retries` may ask for.
pub const MAX_ENDPOINT_RETRIES: u32 = 10;

impl SkillsConfig {
    /// `(dotted key, message)` of the first bad value: ranges, and the endpoint table the
    /// `endpoint` reflector needs; `None` when the table is usable.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let s = self;
        if s.queue == 0 {
            return Some(("skills.queue", "must be at least 1".into()));
        }
        if s.policy.max_new_tokens == 0 {
            return Some(("skills.policy.max_new_tokens", "must be at least 1".into()));
        }
        if !(s.policy.temperature >= 0.0 && s.policy.temperature.is_finite()) {
            return Some((
                "skills.policy.temperature",
                "must be a finite number >= 0 (0 is greedy)".into(),
            ));
        }
        let Some(e) = &s.endpoint else {
            if s.reflector == ReflectorKind::Endpoint {
                return Some((
                    "skills.reflector",
                    "`endpoint` needs a `[skills.endpoint]` table with `base_url` and `model`"
                        .into(),
                ));
            }
            return None;
        };
        if !(e.base_url.starts_with("http://") || e.base_url.starts_with("https://")) {
            return Some((
                "skills.endpoint.base_url",
                format!(
                    "`{}` is not an http:// or https:// URL (give the API root, e.g. \
                     `https://api.example.com/v1`)",
                    e.base_url
                ),
            ));
        }
        if e.model.is_empty() {
            return Some(("skills.endpoint.model", "must not be empty".into()));
        }
        if e.api_key_env.as_deref().is_some_and(str::is_empty) {
            return Some((
                "skills.endpoint.api_key_env",
                "must name an environment variable (or leave the key out for no API key)".into(),
            ));
        }
        if e.timeout_ms == 0 {
            return Some(("skills.endpoint.timeout_ms", "must be at least 1".into()));
        }
        if e.max_retries > MAX_ENDPOINT_RETRIES {
            return Some((
                "skills.endpoint.max_retries",
                format!("must be at most {MAX_ENDPOINT_RETRIES}"),
            ));
        }
        if e.max_tokens == 0 {
            return Some(("skills.endpoint.max_tokens", "must be at least 1".into()));
        }
        if !(0.0..=2.0).contains(&e.temperature) {
            return Some(("skills.endpoint.temperature", "must be in [0, 2]".into()));
        }
        None
    }
}
