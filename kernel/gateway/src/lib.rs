//! The gateway: an OpenAI-compatible front for the policy, so an agent harness that owns its
//! loop (tools, context, control flow) can be trained by pointing its `base_url` at Cairn
//! (Agent Lightning's design, arXiv 2508.03680; docs/gateway.md).
//!
//! This module is the HTTP-free part; the host's `serve` module maps routes onto
//! [`Gateway`]'s methods:
//!
//! - [`request`]: request bodies → a checked [`request::Job`] (prompt ids rendered by the
//!   model's chat template, sampling parameters);
//! - [`sampler::Sampler`]: batches concurrent requests into generation calls on the policy
//!   actor and hands each request its ids as they are sampled; pauses around weight updates;
//! - [`call::Call`]: a request being sampled, answered whole or streamed while it samples;
//! - [`response`]: sampled ids → response bodies and stream chunks, ids verbatim;
//! - [`store::EpisodeStore`] and [`segment`]: episodes, prefix merging, rewards, timeouts,
//!   training rows;
//! - [`source::EpisodeSource`]: the trainer's `CollectGroups` answered from finished episodes.
//!
//! A call belongs to an episode when the host passes its id (from the URL path
//! `/episodes/{id}/v1/...` or the `X-Cairn-Episode` header); other calls are served and not
//! recorded.

pub mod access;
pub mod api_error;
pub mod call;
pub mod engine;
pub mod request;
pub mod response;
pub mod sampler;
pub mod segment;
pub mod source;
pub mod store;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::Recipient;
use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, PluginError, TaskInfo, TaskRef,
};
use futures::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

pub use api_error::{ApiError, ApiErrorKind};
pub use cairn_kernel::actors::pull::{GatewayLink, PauseSampling, ResumeSampling};
pub use call::Call;
pub use request::{Job, RequestSettings, Route};
pub use response::Output;
pub use sampler::{Sample, SampleEvent, Sampler, SamplingStats, StopSampling};
pub use segment::{SampledChoice, Segment};
pub use source::{EpisodeSource, StopCollecting};
pub use store::{CallRecord, EpisodeListing, EpisodeSettings, EpisodeStore};

use cairn_kernel::config::PipelineConfig;
use cairn_kernel::text::ChatFormat;

/// How an episode's calls become training rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowMode {
    /// One row per segment: calls whose prompts extend the previous ids merge, observation
    /// ids masked (Agent Lightning's trajectory mode).
    #[default]
    Merged,
    /// One row per call and choice (transition mode): per-turn anchors for GiGPO.
    PerCall,
}

/// What a finished episode without a reward becomes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MissingReward {
    /// Not trained on.
    Drop,
    /// Trained on with this reward.
    Fill(f32),
}

/// `missing_reward` in the config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingRewardRule {
    #[default]
    Drop,
    Fill,
}

/// `[source]` with `kind = "gateway"`: the gateway's settings.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// `host:port` to listen on (port 0: any free port; the address is printed).
    #[serde(default = "default_bind")]
    pub bind: String,
    /// The model id `/v1/models` lists and requests must name.
    #[serde(default = "default_model_name")]
    pub model_name: String,
    #[serde(default)]
    pub rows: RowMode,
    /// The harness sends an anchor-state key (`cairn.anchor` or `X-Cairn-Anchor`) on every
    /// call, so algorithms that need anchor keys (GiGPO step groups) may train on its
    /// episodes. Off by default: the gateway then refuses such algorithms at load.
    #[serde(default)]
    pub anchors: bool,
    /// An open episode idle this long (seconds) is failed.
    #[serde(default = "default_episode_timeout_s")]
    pub episode_timeout_s: f64,
    #[serde(default)]
    pub missing_reward: MissingRewardRule,
    /// The reward of an episode without one when `missing_reward = "fill"`.
    #[serde(default)]
    pub fill_reward: f32,
    /// A training step that waited this long (seconds) trains on the episodes there are,
    /// partial groups included; 0 waits for complete groups.
    #[serde(default)]
    pub step_timeout_s: f64,
    /// How long the first request of a generation batch waits for others (milliseconds).
    #[serde(default = "default_batch_window_ms")]
    pub batch_window_ms: u64,
    /// Prompts per generation batch at most.
    #[serde(default = "default_max_batch_prompts")]
    pub max_batch_prompts: usize,
    /// Largest `n` a request may ask.
    #[serde(default = "default_max_n")]
    pub max_n: usize,
    /// Open episodes at most; `POST /episodes` past it is a 429 `too_many_open_episodes`.
    #[serde(default = "default_max_open_episodes")]
    pub max_open_episodes: usize,
    // Access to the routes (docs/gateway.md, "Security"); checked by `access::problem`.
    /// The environment variable holding the API key every route needs (`Authorization:
    /// Bearer KEY` or `x-api-key: KEY`). Without any key the gateway serves only on loopback.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A file holding the API key (one line), instead of `api_key_env`.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// The environment variable holding the control key: the only key the control routes
    /// (weight loading, episode open, reward, close, view) take; it also serves the others.
    #[serde(default)]
    pub control_key_env: Option<String>,
    /// A file holding the control key, instead of `control_key_env`.
    #[serde(default)]
    pub control_key_file: Option<PathBuf>,
    /// `Host` values served besides the bound address, `localhost`, `127.0.0.1` and `[::1]`
    /// at its port: `name` (any port) or `name:port`.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`http://host:port`) allowed to call the gateway, with CORS headers.
    /// None by default: a request with another page's `Origin` is refused.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Directories under which `POST /update_weights_from_disk` loads (symlinks resolved).
    /// Empty: `cairn serve --model DIR` takes directories beside DIR, otherwise none.
    #[serde(default)]
    pub weight_roots: Vec<PathBuf>,
    /// Deadline for a whole request body, from the end of its headers (seconds).
    #[serde(default = "default_body_timeout_s")]
    pub body_timeout_s: f64,
    /// Open connections one client address may hold; more are answered 429 and closed.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: usize,
}

fn default_bind() -> String {
    "127.0.0.1:8400".into()
}
fn default_model_name() -> String {
    "cairn".into()
}
fn default_episode_timeout_s() -> f64 {
    600.0
}
fn default_batch_window_ms() -> u64 {
    5
}
fn default_max_batch_prompts() -> usize {
    64
}
fn default_max_n() -> usize {
    16
}
fn default_max_open_episodes() -> usize {
    4096
}
fn default_body_timeout_s() -> f64 {
    60.0
}
fn default_max_connections_per_client() -> usize {
    256
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            bind: default_bind(),
            model_name: default_model_name(),
            rows: RowMode::default(),
            anchors: false,
            episode_timeout_s: default_episode_timeout_s(),
            missing_reward: MissingRewardRule::default(),
            fill_reward: 0.0,
            step_timeout_s: 0.0,
            batch_window_ms: default_batch_window_ms(),
            max_batch_prompts: default_max_batch_prompts(),
            max_n: default_max_n(),
            max_open_episodes: default_max_open_episodes(),
            api_key_env: None,
            api_key_file: None,
            control_key_env: None,
            control_key_file: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            weight_roots: Vec::new(),
            body_timeout_s: default_body_timeout_s(),
            max_connections_per_client: default_max_connections_per_client(),
        }
    }
}

/// Reads and checks a pipeline config ([`PipelineConfig::load`]) with the sections this
/// crate owns: the gateway source and the external engine. The `cairn` host loads every
/// config through it, so a bad key anywhere in the file fails before anything runs.
pub fn load_config(path: &Path) -> cairn_kernel::Result<PipelineConfig> {
    let config = PipelineConfig::load(path)?;
    check_config(&config)?;
    Ok(config)
}

/// [`load_config`] of a config's text; `source` names it in errors.
pub fn parse_config(text: &str, source: &str) -> cairn_kernel::Result<PipelineConfig> {
    let config = PipelineConfig::parse(text, source)?;
    check_config(&config)?;
    Ok(config)
}

/// Reads and checks `[source]` (with `kind = "gateway"`) and `[rollout.engine]`.
pub fn check_config(config: &PipelineConfig) -> cairn_kernel::Result<()> {
    GatewayConfig::from_pipeline(config)?;
    engine::EngineConfig::from_pipeline(config)?;
    Ok(())
}

/// Reads a section the pipeline config keeps as written (`[source]`, `[rollout.engine]`) into
/// its typed settings: a bad key or value is a config error naming `PREFIX.KEY` and its line.
pub fn read_section<T: serde::de::DeserializeOwned>(
    config: &PipelineConfig,
    prefix: &str,
    table: &toml::Table,
) -> cairn_kernel::Result<T> {
    T::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        // toml's message ends with "in `KEY`" when it knows the key.
        let message = e.to_string();
        let message = message.trim_end();
        match message.rsplit_once("\nin `") {
            Some((what, key)) => {
                config.error(&format!("{prefix}.{}", key.trim_end_matches('`')), what)
            }
            None => match message
                .strip_prefix("unknown field `")
                .and_then(|m| m.split_once('`'))
            {
                // A key the section does not have, at the section's top level.
                Some((key, _)) => config.error(&format!("{prefix}.{key}"), message),
                None => config.error(prefix, message),
            },
        }
    })
}

impl GatewayConfig {
    /// The pipeline's gateway settings (`[source]` with `kind = "gateway"`), read and
    /// checked; `None` for another source. The host calls it when it loads a config, so a
    /// bad gateway key fails before anything runs.
    pub fn from_pipeline(config: &PipelineConfig) -> cairn_kernel::Result<Option<Self>> {
        let Some(table) = config.episode_source.gateway() else {
            return Ok(None);
        };
        let gateway: GatewayConfig = read_section(config, "source", table)?;
        if let Some((key, message)) = gateway.problem() {
            return Err(config.error(key, message));
        }
        Ok(Some(gateway))
    }

    /// A message naming the bad key, or `None` when the values are usable.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let seconds = |x: f64| x.is_finite() && x >= 0.0;
        if !(self.episode_timeout_s.is_finite() && self.episode_timeout_s > 0.0) {
            return Some(("source.episode_timeout_s", "must be > 0".into()));
        }
        if !seconds(self.step_timeout_s) {
            return Some(("source.step_timeout_s", "must be >= 0".into()));
        }
        if self.max_batch_prompts == 0 || self.max_n == 0 {
            return Some((
                "source.max_batch_prompts",
                "max_batch_prompts and max_n must be at least 1".into(),
            ));
        }
        if self.max_open_episodes == 0 {
            return Some(("source.max_open_episodes", "must be at least 1".into()));
        }
        if !self.fill_reward.is_finite() {
            return Some(("source.fill_reward", "must be a finite number".into()));
        }
        if let Some(problem) = access::problem(self) {
            return Some(problem);
        }
        None
    }

    /// The store settings these keys give.
    pub fn episode_settings(&self) -> EpisodeSettings {
        EpisodeSettings {
            timeout: Duration::from_secs_f64(self.episode_timeout_s),
            missing_reward: match self.missing_reward {
                MissingRewardRule::Drop => MissingReward::Drop,
                MissingRewardRule::Fill => MissingReward::Fill(self.fill_reward),
            },
            rows: self.rows,
            keep_finished: 4096,
            max_ready: 100_000,
            max_open: self.max_open_episodes,
        }
    }

    /// `None` when 0.
    pub fn step_timeout(&self) -> Option<Duration> {
        (self.step_timeout_s > 0.0).then(|| Duration::from_secs_f64(self.step_timeout_s))
    }
}

/// The environment stand-in of a gateway pipeline: the harness plays the episodes, so it has
/// no tasks of its own (no held-out evaluation, no expert). It reports only what a harness
/// really provides: an episode reward per episode (`POST /episodes/{id}/reward`), and anchor
/// keys when `[source] anchors = true` says the harness sends one on every call. No per-turn
/// rewards, no feedback, and no tools Cairn could turn off (the harness owns its tool list and
/// Cairn plans no slots), so algorithms needing those are refused at load.
#[derive(Clone, Copy, Debug, Default)]
pub struct HarnessEnvironment {
    /// The harness sends an anchor key on every call ([`GatewayConfig::anchors`]).
    pub anchor_keys: bool,
}

impl HarnessEnvironment {
    /// The stand-in for a gateway source with these settings.
    pub fn new(config: &GatewayConfig) -> Self {
        HarnessEnvironment {
            anchor_keys: config.anchors,
        }
    }
}

impl Environment for HarnessEnvironment {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            anchor_keys: self.anchor_keys,
            ..EnvironmentInfo::default()
        }
    }

    fn task(&self, task: TaskRef) -> cairn_plugin_sdk::Result<TaskInfo> {
        Err(PluginError::host(format!(
            "the gateway's harness plays the episodes; task {task:?} is not Cairn's"
        )))
    }

    fn start(
        &self,
        task: TaskRef,
        _: u64,
        _: &ContextVariant,
    ) -> cairn_plugin_sdk::Result<Box<dyn Episode>> {
        self.task(task).map(|_| unreachable!("task() always fails"))
    }
}

/// A sampled request, before it is returned and recorded.
#[derive(Clone, Debug)]
pub struct Completed {
    pub job: Job,
    /// `n` outputs per prompt, prompt-major.
    pub outputs: Vec<Output>,
    pub policy_version: u64,
    pub request_id: String,
    /// Unix seconds.
    pub created: u64,
}

struct Inner {
    format: ChatFormat,
    settings: RequestSettings,
    store: Arc<Mutex<EpisodeStore>>,
    sampler: Recipient<Sample>,
    sampling: Arc<SamplingStats>,
    requests: AtomicU64,
    /// The policy version `/health` reports: the served weights' at start
    /// ([`Gateway::with_policy_version`]), then the newest a sample ran on or a weight load set.
    version: AtomicU64,
}

/// The gateway's operations, one per route; cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenBody {
    episode_id: Option<String>,
    task_id: Option<String>,
}

#[derive(Deserialize)]
struct TokenizeBody {
    prompt: String,
    #[serde(default)]
    add_special_tokens: bool,
}

#[derive(Deserialize)]
struct WeightsBody {
    model_path: String,
    weight_version: Option<Json>,
}

/// What `POST /update_weights_from_disk` needs: the sampler's pause and resume around the
/// load, the policy actor's [`LoadWeights`](cairn_kernel::actors::policy::LoadWeights), and the
/// directories it may load from. Only `cairn serve` has one; a gateway in front of a training
/// run takes no outside weights.
#[derive(Clone)]
pub struct WeightLoader {
    pub pause: Recipient<PauseSampling>,
    pub resume: Recipient<ResumeSampling>,
    pub load: Recipient<cairn_kernel::actors::policy::LoadWeights>,
    /// The weight roots, symlinks resolved (`source.weight_roots`, or the directory beside
    /// `cairn serve --model`); a load outside them is refused before anything is read.
    pub roots: Vec<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RewardBody {
    reward: f32,
    success: Option<bool>,
}

fn body_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    request::parse_body(body)
}

impl Gateway {
    /// `sampling`: the sampler's counters ([`Sampler::stats`]), shown by `/health`.
    pub fn new(
        format: ChatFormat,
        settings: RequestSettings,
        store: Arc<Mutex<EpisodeStore>>,
        sampler: Recipient<Sample>,
        sampling: Arc<SamplingStats>,
    ) -> Gateway {
        Gateway {
            inner: Arc::new(Inner {
                format,
                settings,
                store,
                sampler,
                sampling,
                requests: AtomicU64::new(0),
                version: AtomicU64::new(0),
            }),
        }
    }

    /// Sets the policy version `/health` reports before any sample: the version of the
    /// weights the policy holds when the gateway starts (`cairn serve --checkpoint` of step
    /// 376 serves version 376; every answer already says so, `/health` too from the start).
    pub fn with_policy_version(self, version: u64) -> Gateway {
        self.inner.version.fetch_max(version, Ordering::Relaxed);
        self
    }

    pub fn store(&self) -> &Arc<Mutex<EpisodeStore>> {
        &self.inner.store
    }

    pub fn settings(&self) -> &RequestSettings {
        &self.inner.settings
    }

    /// `GET /v1/models`.
    pub fn models(&self) -> Json {
        json!({"object": "list", "data": [{
            "id": self.inner.settings.model_name, "object": "model", "created": 0,
            "owned_by": "cairn", "max_model_len": self.inner.settings.context_window,
        }]})
    }

    /// Checks a completion request and queues it (`episode`: the episode it belongs to);
    /// resolves once its batch started, with the call whose tokens then come as sampled.
    pub async fn start(
        &self,
        route: Route,
        body: &[u8],
        episode: Option<&str>,
        anchor: Option<String>,
    ) -> Result<Call, ApiError> {
        let inner = &self.inner;
        if let Some(id) = episode {
            inner.store.lock().check_open(id, Instant::now())?;
        }
        let in_episode = episode.is_some();
        let mut job = match route {
            Route::Chat => inner.settings.chat(body, &inner.format, in_episode)?,
            Route::Completions => inner.settings.completion(body, &inner.format, in_episode)?,
        };
        if job.anchor.is_none() {
            if let Some(anchor) = &anchor {
                request::check_anchor("X-Cairn-Anchor", anchor)?;
            }
            job.anchor = anchor;
        }
        let mut params = job.params.clone();
        params.stop_ids = if job.ignore_eos {
            Vec::new()
        } else {
            inner.format.stop_ids().to_vec()
        };
        for &id in &job.stop_token_ids {
            if !params.stop_ids.contains(&id) {
                params.stop_ids.push(id);
            }
        }
        let prompts: Vec<Vec<u32>> = job
            .prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), job.n))
            .collect();
        let rows = prompts.len();
        let (events, mut received) = sampler::events_channel(rows, params.max_new_tokens);
        inner
            .sampler
            .send(Sample {
                prompts,
                params,
                seeded: job.seeded,
                events,
            })
            .await
            // The sampler stops only on shutdown (`StopSampling`).
            .map_err(|_| sampler::shutting_down())??;
        let mut responses = sampler::Responses::new(rows);
        while responses.policy_version.is_none() {
            match received.next().await {
                Some(event) => {
                    responses.apply(event)?;
                }
                None => return Err(sampler::ended_early(false)),
            }
        }
        let version = responses.policy_version.unwrap_or(0);
        inner.version.fetch_max(version, Ordering::Relaxed);
        let request_id = format!("{:x}", inner.requests.fetch_add(1, Ordering::Relaxed));
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Call::new(job, request_id, created, received, responses))
    }

    /// Checks and samples a completion request, answered whole ([`Gateway::start`], then
    /// [`Call::finish`]).
    pub async fn complete(
        &self,
        route: Route,
        body: &[u8],
        episode: Option<&str>,
        anchor: Option<String>,
    ) -> Result<Completed, ApiError> {
        self.start(route, body, episode, anchor)
            .await?
            .finish(self)
            .await
    }

    fn meta<'a>(&'a self, c: &'a Completed) -> response::Meta<'a> {
        response::Meta {
            request_id: &c.request_id,
            model: &self.inner.settings.model_name,
            created: c.created,
            policy_version: c.policy_version,
        }
    }

    /// The non-streaming response body.
    pub fn body(&self, c: &Completed) -> Json {
        response::body(
            &c.job,
            &c.outputs,
            &self.meta(c),
            self.inner.format.tokenizer(),
        )
    }

    /// Records a delivered response in its episode: one call per prompt. Returns the receipt
    /// added to the response as `cairn`.
    pub fn record(&self, c: &Completed, episode: &str) -> Result<Json, ApiError> {
        let now = Instant::now();
        let mut store = self.inner.store.lock();
        let mut calls = Vec::new();
        for (i, prompt) in c.job.prompts.iter().enumerate() {
            let choices = c.outputs[i * c.job.n..(i + 1) * c.job.n]
                .iter()
                .map(|o| SampledChoice {
                    ids: o.ids.clone(),
                    logprobs: o.logprobs.clone(),
                    finish_reason: o.finish_reason,
                    tool_calls: o.tool_calls.len() as u32,
                })
                .collect();
            let receipt = store.record(
                episode,
                now,
                CallRecord {
                    index: 0,
                    prompt_ids: prompt.clone(),
                    choices,
                    policy_version: c.policy_version,
                    temperature: c.job.params.temperature,
                    anchor: c.job.anchor.clone(),
                    observation: c.job.observation.clone(),
                },
            )?;
            calls.push(json!({"call": receipt.call, "merged": receipt.merged,
                              "segments": receipt.segments}));
        }
        Ok(
            json!({"episode_id": episode, "policy_version": c.policy_version,
                  "temperature": c.job.params.temperature, "calls": calls}),
        )
    }

    /// `POST /episodes`: `{"episode_id"?, "task_id"?}` → the id and its base URL path.
    pub fn open_episode(&self, body: &[u8]) -> Result<Json, ApiError> {
        let body: OpenBody = body_json(body)?;
        let id =
            self.inner
                .store
                .lock()
                .open(Instant::now(), body.episode_id, body.task_id.clone())?;
        Ok(json!({"episode_id": id, "task_id": body.task_id,
                  "base_path": format!("/episodes/{id}/v1")}))
    }

    /// `POST /episodes/{id}/reward`: `{"reward", "success"?}`; closes the episode.
    pub fn reward(&self, id: &str, body: &[u8]) -> Result<Json, ApiError> {
        let body: RewardBody = body_json(body)?;
        self.inner
            .store
            .lock()
            .reward(id, Instant::now(), body.reward, body.success)?;
        Ok(json!({"episode_id": id, "status": "rewarded", "reward": body.reward}))
    }

    /// `POST /episodes/{id}/close`: ends the episode without a reward.
    pub fn close(&self, id: &str) -> Result<Json, ApiError> {
        self.inner.store.lock().close(id, Instant::now())?;
        Ok(json!({"episode_id": id, "status": "closed"}))
    }

    /// `GET /episodes/{id}`.
    pub fn view(&self, id: &str) -> Result<Json, ApiError> {
        self.inner.store.lock().view(id, Instant::now())
    }

    /// `POST /tokenize`: `{"prompt": text, "add_special_tokens"?: bool}` → `{"tokens": [ids],
    /// "count", "max_model_len"}` (vLLM's shape): a rollout engine's client compares them with
    /// its own tokenizer's. Special tokens in the text are matched either way.
    pub fn tokenize(&self, body: &[u8]) -> Result<Json, ApiError> {
        let body: TokenizeBody = body_json(body)?;
        let tokenizer = self.inner.format.tokenizer();
        // A text that cannot fit the context window is not encoded (nor could it be sent).
        self.inner
            .settings
            .check_prompt_bytes("prompt", body.prompt.len(), tokenizer)?;
        let ids = if body.add_special_tokens {
            tokenizer.encode_with_special_tokens(&body.prompt)
        } else {
            tokenizer.encode(&body.prompt)
        }
        .map_err(ApiError::from)?;
        Ok(json!({"tokens": ids, "count": ids.len(),
                  "max_model_len": self.inner.settings.context_window}))
    }

    /// `POST /update_weights_from_disk` (SGLang's route): `{"model_path": HF dir,
    /// "weight_version": N}`. New batches wait while the weights load; the batches in flight
    /// finish on the old ones first, so every answer's `policy_version` names the weights that
    /// sampled all of it. Answers `{"success": true, "policy_version": N}`; a directory that
    /// does not fit the model is a 400 and the old weights stay. Only a directory under the
    /// loader's roots is read (a 403 otherwise); every attempt is logged with `client` (the
    /// peer address) and the path.
    pub async fn update_weights(
        &self,
        loader: &WeightLoader,
        body: &[u8],
        client: &str,
    ) -> Result<Json, ApiError> {
        let body: WeightsBody = body_json(body)?;
        let Some(dir) = access::weight_dir_under(&loader.roots, Path::new(&body.model_path)) else {
            tracing::warn!(
                client,
                path = %body.model_path,
                "weight load refused: not a directory under the weight roots"
            );
            let roots = if loader.roots.is_empty() {
                "none is configured".to_owned()
            } else {
                let shown: Vec<String> = loader
                    .roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect();
                shown.join(", ")
            };
            return Err(ApiError::new(
                ApiErrorKind::Forbidden,
                format!(
                    "model_path {}: not a directory under the weight roots ({roots}); the \
                     server's operator lists the directories it loads from in \
                     `[source] weight_roots` or with `cairn serve --weight-root DIR`",
                    body.model_path
                ),
            )
            .with_param("model_path")
            .with_code("path_not_allowed"));
        };
        let version = match &body.weight_version {
            Some(Json::Number(n)) => n.as_u64(),
            Some(Json::String(s)) => s.parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| {
            ApiError::invalid(
                "weight_version",
                "give the policy version of the weights as a non-negative integer \
                 (`\"weight_version\": \"12\"`): every later answer carries it",
            )
        })?;
        // At warn, the default level of `cairn serve`: a weight load is an audit event.
        tracing::warn!(client, path = %dir.display(), version, "weight load requested");
        let unavailable = |_| ApiError::internal("the policy actor has stopped");
        loader
            .pause
            .send(PauseSampling)
            .await
            .map_err(unavailable)?;
        let loaded = loader
            .load
            .send(cairn_kernel::actors::policy::LoadWeights {
                dir: dir.clone(),
                version,
            })
            .await;
        // Resume whatever happened: the old weights serve on after a refused load.
        let resumed = loader.resume.send(ResumeSampling).await;
        match loaded.map_err(unavailable)? {
            Ok(()) => tracing::info!(client, path = %dir.display(), version, "weights loaded"),
            Err(e) => {
                tracing::warn!(client, path = %dir.display(), error = %e, "weight load failed");
                return Err(ApiError::invalid(
                    "model_path",
                    format!("the weights in {} were not loaded: {e}", body.model_path),
                ));
            }
        }
        resumed.map_err(unavailable)?;
        self.inner.version.store(version, Ordering::Relaxed);
        Ok(json!({"success": true, "policy_version": version,
                  "message": format!("loaded {} as policy version {version}", body.model_path)}))
    }

    /// `GET /health`: policy version and episode counters.
    pub fn health(&self) -> Json {
        let mut store = self.inner.store.lock();
        store.sweep(Instant::now());
        json!({
            "status": "ok",
            "model": self.inner.settings.model_name,
            "policy_version": self.inner.version.load(Ordering::Relaxed),
            "episodes_open": store.open_count(),
            "episodes_ready": store.ready_count(),
            "stats": store.stats(),
            "sampling": self.inner.sampling.to_json(),
        })
    }
}
