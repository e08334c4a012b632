//! [`EngineClient`]: the HTTP side of an external rollout engine, token ids in and out.
//!
//! **Token-in, token-out.** Each request is `POST {url}/v1/completions` with the prompts as
//! lists of token ids and `logprobs`, `return_token_ids` and `return_tokens_as_token_ids` set
//! (vLLM's names; `cairn serve` answers the same). The sampled ids come back in
//! `choices[i].token_ids` (or, failing that, as the `token_id:N` strings of
//! `logprobs.tokens`) and their log-probs in `logprobs.token_logprobs`; both are taken
//! verbatim, never re-tokenised, and checked: one choice per prompt, one log-prob per id, ids in
//! the vocabulary, at most `max_tokens`, and a `stop` finish only on one of the stop ids. Stop
//! ids go as `stop_token_ids` with `ignore_eos` (the engine stops where Cairn's own backend
//! would, and nowhere else), and `skip_special_tokens = false`.
//!
//! **Several engines.** A turn's prompts are split into contiguous shares, at least one per
//! URL and none over `max_prompts_per_request`, dealt to the URLs in turn, sent at once (one
//! thread each), and put back in order. A share's seed is mixed with its index, so the samples
//! depend on the URL count and the limit but not on timing.
//!
//! **Failures.** A transport error, a timeout, or HTTP 408, 429 or 5xx is retried up to
//! `retries` times ([`cairn_kernel::retry::with_retries`]), each time on the next URL still in the
//! run, waiting 0.5 s and doubling (at most 30 s). The last failure is an [`Error::Engine`]
//! naming the URL; the rollout fails the turn's episodes with it
//! (kind `engine`) and the run goes on. Other HTTP errors and malformed answers are not
//! retried. A URL that refuses or drops the connection is taken out of the run (a warning
//! says so): later turns and weight syncs use the others. Once none is left, generation is an
//! [`Error::Other`] that stops the run, naming every URL; restart the engines and run the same
//! command to resume.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_plugin_sdk::FinishReason;
use serde_json::{json, Value};

use super::config::{EngineConfig, EngineKind};
use cairn_kernel::backend::{Generation, SamplingParams};
use cairn_kernel::error::{Error, Result};
use cairn_kernel::retry::{retryable_status, Attempt};
use cairn_kernel::rollout::mix;

/// Largest answer body read, bytes.
const MAX_REPLY_BYTES: u64 = 256 << 20;
/// First wait before a retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What `GET /v1/models` says about one engine.
#[derive(Clone, Debug, PartialEq)]
pub struct ServedModel {
    pub url: String,
    pub id: String,
    /// `max_model_len`, when listed.
    pub context_window: Option<usize>,
}

/// The sampled rows of one request, and the policy version the engine reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completion {
    pub generations: Vec<Generation>,
    /// The answer's `policy_version` (`cairn serve` reports it; vLLM does not).
    pub policy_version: Option<u64>,
}

/// The client: one [`ureq::Agent`], the URLs and the model name.
#[derive(Clone, Debug)]
pub struct EngineClient {
    agent: ureq::Agent,
    kind: EngineKind,
    pub(super) urls: Vec<String>,
    model: String,
    retries: u32,
    vocab_size: usize,
    /// Per URL: taken out of the run after a refused or dropped connection.
    pub(super) down: Arc<Vec<AtomicBool>>,
    /// Largest number of prompts in one request (`rollout.engine.max_prompts_per_request`).
    max_prompts: usize,
}

/// How one attempt failed.
struct Failure {
    message: String,
    retry: bool,
    /// The connection failed (refused, reset): the engine is gone, not just slow.
    transport: bool,
}

impl EngineClient {
    /// Lists the model of every URL (`GET /v1/models`) and checks they serve the same one;
    /// `urls` are server roots. Errors name the URL that did not answer.
    pub fn connect(config: &EngineConfig, urls: &[String], vocab_size: usize) -> Result<Self> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(config.timeout_s)))
            .http_status_as_error(false)
            .proxy(None)
            .build()
            .into();
        let mut client = EngineClient {
            agent,
            kind: config.kind,
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            model: config.model.clone().unwrap_or_default(),
            retries: config.retries,
            vocab_size,
            down: Arc::new(urls.iter().map(|_| AtomicBool::new(false)).collect()),
            max_prompts: config.max_prompts_per_request.max(1),
        };
        let served = client.models()?;
        if client.model.is_empty() {
            client.model = served[0].id.clone();
        }
        for s in &served {
            if s.id != client.model {
                return Err(Error::Engine {
                    url: s.url.clone(),
                    message: format!(
                        "serves model `{}`, but the run asks for `{}` (`rollout.engine.model`, or \
                         the first engine's model); serve the same model on every URL",
                        s.id, client.model
                    ),
                });
            }
        }
        Ok(client)
    }

    /// Every configured URL.
    pub fn all_urls(&self) -> &[String] {
        &self.urls
    }

    /// The URLs still in the run (see the module docs).
    pub fn urls(&self) -> Vec<String> {
        self.live()
            .into_iter()
            .map(|i| self.urls[i].clone())
            .collect()
    }

    fn live(&self) -> Vec<usize> {
        (0..self.urls.len())
            .filter(|&i| !self.down[i].load(Ordering::SeqCst))
            .collect()
    }

    /// Takes `url` out of the run.
    pub fn mark_down(&self, url: &str, why: &str) {
        if let Some(i) = self.urls.iter().position(|u| u == url) {
            if !self.down[i].swap(true, Ordering::SeqCst) {
                eprintln!("engine: {url} is taken out of the run ({why}); the other engines go on");
            }
        }
    }

    /// Errors once no URL is left.
    pub(crate) fn check_live(&self) -> Result<Vec<usize>> {
        let live = self.live();
        if live.is_empty() {
            return Err(Error::Other(format!(
                "every rollout engine is down ({}): restart them (or fix `rollout.engine`) and run \
                 the same command; it resumes from the last checkpoint",
                self.urls.join(", ")
            )));
        }
        Ok(live)
    }

    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// `GET /v1/models` of every URL (first listed model of each).
    pub fn models(&self) -> Result<Vec<ServedModel>> {
        self.urls
            .iter()
            .map(|url| {
                let body = self
                    .once(url, "GET", "/v1/models", None)
                    .map_err(|f| engine(url, f.message))?;
                let first = body["data"]
                    .get(0)
                    .ok_or_else(|| engine(url, "GET /v1/models listed no model".to_owned()))?;
                Ok(ServedModel {
                    url: url.clone(),
                    id: first["id"].as_str().unwrap_or_default().to_owned(),
                    context_window: first["max_model_len"].as_u64().map(|n| n as usize),
                })
            })
            .collect()
    }

    /// The engine's ids for `text` (`POST /tokenize`, no special tokens added), per URL;
    /// `None` where the engine has no such route (HTTP 404).
    pub fn tokenize(&self, url: &str, text: &str) -> Result<Option<Vec<u32>>> {
        let body = json!({"model": self.model, "prompt": text, "add_special_tokens": false});
        match self.once(url, "POST", "/tokenize", Some(&body)) {
            Ok(v) => {
                let ids = v["tokens"]
                    .as_array()
                    .ok_or_else(|| engine(url, "POST /tokenize answered without `tokens`".into()))?
                    .iter()
                    .map(|t| t.as_u64().map(|t| t as u32))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| engine(url, "POST /tokenize: `tokens` are not ids".into()))?;
                Ok(Some(ids))
            }
            Err(f) if f.message.contains("HTTP 404") => Ok(None),
            Err(f) => Err(engine(url, f.message)),
        }
    }

    /// Samples one response per prompt across the URLs (module docs).
    ///
    /// # Errors
    /// [`Error::Engine`] when a share failed on every attempt, or an answer is malformed.
    pub fn generate(&self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Completion> {
        if prompts.is_empty() {
            return Ok(Completion::default());
        }
        let live = self.check_live()?;
        // At least one request per URL, none over the per-request limit.
        let parts = live
            .len()
            .max(prompts.len().div_ceil(self.max_prompts))
            .min(prompts.len());
        let size = prompts.len().div_ceil(parts);
        let shares: Vec<&[Vec<u32>]> = prompts.chunks(size).collect();
        let results: Vec<Result<Completion>> = std::thread::scope(|scope| {
            let handles: Vec<_> = shares
                .iter()
                .enumerate()
                .map(|(i, share)| {
                    let mut p = params.clone();
                    p.seed = mix(params.seed, i as u64);
                    let live = &live;
                    scope.spawn(move || self.complete(live, i, share, &p))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Other("an engine request panicked".into())))
                })
                .collect()
        });
        let mut out = Completion::default();
        for r in results {
            let c = r?;
            out.generations.extend(c.generations);
            out.policy_version = match (out.policy_version, c.policy_version) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(out)
    }

    /// One share, starting at the `first` live URL and moving on at each retry.
    fn complete(
        &self,
        live: &[usize],
        first: usize,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Completion> {
        let body = self.request_body(prompts, params);
        // Attempt `n` goes to the `n`-th live URL from `first`, or the next one after it that
        // is still up (a URL can be taken out of the run while the share is retried).
        let pick = |n: u32| {
            let turn = |k: usize| live[(first + n as usize + k) % live.len()];
            (0..live.len())
                .map(turn)
                .find(|&i| !self.down[i].load(Ordering::SeqCst))
                .unwrap_or_else(|| turn(0))
        };
        // The failure: the URL's index, the message, and whether the request itself failed
        // (not the answer it got).
        let outcome = cairn_kernel::retry::with_retries(
            self.retries,
            FIRST_BACKOFF,
            MAX_BACKOFF,
            |n| {
                let i = pick(n);
                let url = &self.urls[i];
                match self.once(url, "POST", "/v1/completions", Some(&body)) {
                    Ok(answer) => parse_completion(&answer, prompts.len(), params, self.vocab_size)
                        .map_err(|m| Attempt {
                            failure: (i, m, false),
                            retry: false,
                        }),
                    Err(f) => {
                        // A refused or dropped connection: the engine is gone (the last one
                        // too: the next generation then stops the run).
                        if f.transport {
                            self.mark_down(url, &f.message);
                        }
                        Err(Attempt {
                            failure: (i, f.message, true),
                            retry: f.retry,
                        })
                    }
                }
            },
            |attempt, (i, message, _), _| tracing::warn!(url = %self.urls[*i], error = %message, attempt, "engine request failed; retrying"),
        );
        outcome.map_err(|((i, message, request), tries)| {
            let url = &self.urls[i];
            if !request {
                return engine(url, message);
            }
            engine(
                url,
                format!(
                    "{message} (after {tries} attempt{}; `rollout.engine.retries` = {})",
                    if tries == 1 { "" } else { "s" },
                    self.retries
                ),
            )
        })
    }

    /// The `/v1/completions` body of one share.
    pub fn request_body(&self, prompts: &[Vec<u32>], params: &SamplingParams) -> Value {
        json!({
            "model": self.model,
            "prompt": prompts,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            // Engines take a signed 64-bit seed.
            "seed": params.seed & (i64::MAX as u64),
            "n": 1,
            "logprobs": 1,
            "stop_token_ids": params.stop_ids,
            "ignore_eos": true,
            "skip_special_tokens": false,
            "return_token_ids": true,
            "return_tokens_as_token_ids": true,
            "stream": false,
        })
    }

    /// Has the engine at `url` load the weights in `dir` (HF format) as `version`.
    pub fn load_weights(&self, url: &str, dir: &std::path::Path, version: u64) -> Result<()> {
        let path = dir.display().to_string();
        match self.kind {
            EngineKind::Vllm => {
                let rpc = json!({"method": "reload_weights"});
                self.once(url, "POST", "/collective_rpc", Some(&rpc))
                    .map_err(|f| {
                        engine(
                            url,
                            format!(
                                "{}; vLLM reloads weights through `/collective_rpc`, which it \
                                 serves only with VLLM_SERVER_DEV_MODE=1, from the directory it \
                                 was started on ({path})",
                                f.message
                            ),
                        )
                    })?;
                self.once(url, "POST", "/reset_prefix_cache", Some(&json!({})))
                    .map_err(|f| engine(url, f.message))?;
            }
            EngineKind::Sglang | EngineKind::Openai => {
                let body = json!({"model_path": path, "weight_version": version.to_string()});
                let answer = self
                    .once(url, "POST", "/update_weights_from_disk", Some(&body))
                    .map_err(|f| engine(url, f.message))?;
                if answer["success"].as_bool() == Some(false) {
                    return Err(engine(
                        url,
                        format!(
                            "refused the weights in {path}: {}",
                            answer["message"].as_str().unwrap_or("no message")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The probe: `params.max_new_tokens` ids sampled after `prompt` by the engine at `url`
    /// (one request, no retry).
    pub fn probe(&self, url: &str, prompt: &[u32], params: &SamplingParams) -> Result<Completion> {
        let prompts = [prompt.to_vec()];
        let body = self.request_body(&prompts, params);
        let answer = self
            .once(url, "POST", "/v1/completions", Some(&body))
            .map_err(|f| engine(url, f.message))?;
        parse_completion(&answer, 1, params, self.vocab_size).map_err(|m| engine(url, m))
    }

    /// `GET /health` answers 2xx.
    pub fn healthy(&self, url: &str) -> bool {
        self.agent
            .get(format!("{url}/health"))
            .call()
            .is_ok_and(|r| r.status().is_success())
    }

    /// One request; JSON answer of a 2xx, else a [`Failure`].
    fn once(
        &self,
        url: &str,
        method: &str,
        route: &str,
        body: Option<&Value>,
    ) -> std::result::Result<Value, Failure> {
        let target = format!("{url}{route}");
        let sent = match body {
            Some(b) => self
                .agent
                .post(&target)
                .header("Content-Type", "application/json")
                .send(b.to_string()),
            None => self.agent.get(&target).call(),
        };
        let mut response = sent.map_err(|e| transport(method, route, e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_REPLY_BYTES)
            .read_to_string()
            .map_err(|e| transport(method, route, e))?;
        if !(200..300).contains(&status) {
            return Err(Failure {
                message: format!(
                    "{method} {route} answered HTTP {status}: {}",
                    excerpt(&text)
                ),
                retry: retryable_status(status),
                transport: false,
            });
        }
        serde_json::from_str(&text).map_err(|e| Failure {
            message: format!(
                "{method} {route} answered with no JSON body ({e}): {}",
                excerpt(&text)
            ),
            retry: false,
            transport: false,
        })
    }
}

fn engine(url: &str, message: String) -> Error {
    Error::Engine {
        url: url.to_owned(),
        message,
    }
}

fn transport(method: &str, route: &str, e: ureq::Error) -> Failure {
    let (what, transport) = match &e {
        ureq::Error::Timeout(_) => ("timed out (`rollout.engine.timeout_s`)".to_owned(), false),
        ureq::Error::Io(io) => (format!("failed: {io} (is the engine running?)"), true),
        ureq::Error::ConnectionFailed => (
            "could not connect (is the engine running?)".to_owned(),
            true,
        ),
        other => (format!("failed: {other}"), false),
    };
    Failure {
        message: format!("{method} {route} {what}"),
        retry: true,
        transport,
    }
}

fn excerpt(text: &str) -> String {
    let t: String = text.chars().take(300).collect();
    if t.len() < text.len() {
        format!("{t}…")
    } else {
        t
    }
}

/// Reads a `/v1/completions` answer for `rows` prompts (one choice each), checked against
/// the request's `params` (module docs). The message says what is wrong.
pub fn parse_completion(
    answer: &Value,
    rows: usize,
    params: &SamplingParams,
    vocab_size: usize,
) -> std::result::Result<Completion, String> {
    let choices = answer["choices"]
        .as_array()
        .ok_or("the answer has no `choices` array")?;
    if choices.len() != rows {
        return Err(format!(
            "{} choices answered {rows} prompts (n = 1)",
            choices.len()
        ));
    }
    let mut generations: Vec<Option<Generation>> = vec![None; rows];
    for (k, c) in choices.iter().enumerate() {
        let index = c["index"].as_u64().map_or(k, |i| i as usize);
        if index >= rows || generations[index].is_some() {
            return Err(format!(
                "choice {k} has index {index}, out of 0..{rows} or repeated"
            ));
        }
        let ids = choice_ids(c).ok_or_else(|| {
            format!(
                "choice {index} carries no token ids (`token_ids`, or `logprobs.tokens` as \
                 `token_id:N`); the engine must honour `return_token_ids` or \
                 `return_tokens_as_token_ids`"
            )
        })?;
        let logprobs: Vec<f32> = c["logprobs"]["token_logprobs"]
            .as_array()
            .ok_or_else(|| format!("choice {index} has no `logprobs.token_logprobs`"))?
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("choice {index}: a log-prob is not a number"))?;
        if logprobs.len() != ids.len() {
            return Err(format!(
                "choice {index}: {} token ids but {} log-probs",
                ids.len(),
                logprobs.len()
            ));
        }
        if ids.is_empty() || ids.len() > params.max_new_tokens as usize {
            return Err(format!(
                "choice {index}: {} tokens, outside 1..={} (max_tokens)",
                ids.len(),
                params.max_new_tokens
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(format!(
                "choice {index}: token id {bad} is outside the trainer's vocabulary (0..{vocab_size}); \
                 the engine serves another tokenizer"
            ));
        }
        let last_is_stop = ids.last().is_some_and(|id| params.stop_ids.contains(id));
        let finish = match c["finish_reason"].as_str() {
            Some("stop") if last_is_stop => FinishReason::Stop,
            Some("stop") => {
                return Err(format!(
                    "choice {index} stopped (finish_reason `stop`) without ending on one of the \
                     stop ids {:?}; the engine must stop only at `stop_token_ids` \
                     (`ignore_eos`), with the stop id in the output",
                    params.stop_ids
                ))
            }
            Some("length") if last_is_stop => FinishReason::Stop,
            Some("length") => FinishReason::Length,
            Some("abort") => FinishReason::Aborted,
            other => return Err(format!("choice {index}: finish_reason {other:?}")),
        };
        generations[index] = Some(Generation {
            ids,
            logprobs,
            finish_reason: finish,
        });
    }
    Ok(Completion {
        generations: generations
            .into_iter()
            .map(|g| g.unwrap_or_default())
            .collect(),
        policy_version: answer["policy_version"].as_u64(),
    })
}

/// A choice's sampled ids: `token_ids`, else `logprobs.tokens` as `token_id:N`.
fn choice_ids(c: &Value) -> Option<Vec<u32>> {
    if let Some(ids) = c["token_ids"].as_array() {
        return ids.iter().map(|v| v.as_u64().map(|x| x as u32)).collect();
    }
    c["logprobs"]["tokens"]
        .as_array()?
        .iter()
        .map(|t| t.as_str()?.strip_prefix("token_id:")?.parse::<u32>().ok())
        .collect()
}
