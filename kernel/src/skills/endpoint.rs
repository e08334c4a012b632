//! The `endpoint` reflector: any OpenAI-compatible chat endpoint answers the reflection prompt.
//!
//! One `POST {base_url}/chat/completions` per reflection, body
//! `{"model", "messages": [{"role": "user", "content": <prompt>}], "max_tokens",
//! "temperature"}`, with `Authorization: Bearer <key>` when a key is configured; the entry is
//! read out of `choices[0].message.content` with [`super::parse_reply`].
//!
//! **Why `ureq`:** a small, well-kept *blocking* client suits a reflector that already runs on
//! a thread of its own (the skill creator's `SyncArbiter`), one request at a time; an async
//! client (awc) would need the reply awaited on an actix arbiter and buys nothing here. It is
//! built with rustls for `https://` endpoints, without proxy support (the `*_PROXY`
//! variables are not read: the kernel reads no environment), and with one timeout covering
//! connect, send and the whole reply.
//!
//! **Failures.** A timeout, a failed connection, or HTTP 408, 429 or 5xx is retried up to
//! `max_retries` times, waiting `retry_backoff_ms` and doubling the wait each time; other HTTP
//! errors are not retried. The last failure is reported: a timeout as
//! [`FailureKind::Timeout`](super::FailureKind::Timeout), everything else as an error. A reply
//! without an entry is unparseable and not retried (the endpoint answered). A request with a
//! JSON reply format ([`super::format::JsonReply`]) is different: a reply that is not the
//! requested JSON object is re-asked, up to the format's `retries` ([`super::ask`]); each
//! re-ask is a new request with its own transport retries.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::config::EndpointConfig;
use super::{ask, excerpt, Draft, Job, ReflectionFailure, Reflector};
use crate::retry::{retryable_status, Attempt};
use crate::rollout::prompt::TextCodec;

/// Largest reply body read, bytes.
const MAX_REPLY_BYTES: u64 = 4 << 20;
/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub struct EndpointReflector {
    settings: EndpointConfig,
    /// `{base_url}/chat/completions`.
    url: String,
    /// Kept out of `Debug` output and every message.
    api_key: Option<String>,
    agent: ureq::Agent,
    codec: Arc<dyn TextCodec>,
}

impl std::fmt::Debug for EndpointReflector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointReflector")
            .field("url", &self.url)
            .field("model", &self.settings.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl EndpointReflector {
    /// `codec` decodes the responses of rows without an `info.action` when rendering the
    /// prompt.
    pub fn new(
        settings: &EndpointConfig,
        api_key: Option<String>,
        codec: Arc<dyn TextCodec>,
    ) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(settings.timeout_ms)))
            .http_status_as_error(false)
            .proxy(None)
            .build()
            .into();
        EndpointReflector {
            url: format!(
                "{}/chat/completions",
                settings.base_url.trim_end_matches('/')
            ),
            settings: settings.clone(),
            api_key,
            agent,
            codec,
        }
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn attempt(&self, body: &str) -> Result<String, Attempt<ReflectionFailure>> {
        let mut request = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = request.send(body).map_err(|e| self.transport_failure(e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_REPLY_BYTES)
            .read_to_string()
            .map_err(|e| self.transport_failure(e))?;
        if !(200..300).contains(&status) {
            return Err(Attempt {
                failure: ReflectionFailure::error(format!(
                    "{} answered HTTP {status}: {}",
                    self.url,
                    excerpt(&text)
                )),
                retry: retryable_status(status),
            });
        }
        let json: Value = serde_json::from_str(&text).map_err(|e| Attempt {
            failure: ReflectionFailure::error(format!(
                "{} answered HTTP {status} with a body that is not JSON ({e}): {}",
                self.url,
                excerpt(&text)
            )),
            retry: false,
        })?;
        match json
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
        {
            Some(content) => Ok(content.to_string()),
            None => Err(Attempt {
                failure: ReflectionFailure::error(format!(
                    "{} answered without `choices[0].message.content` (is it an \
                     OpenAI-compatible chat endpoint?): {}",
                    self.url,
                    excerpt(&text)
                )),
                retry: false,
            }),
        }
    }

    /// The content of the endpoint's reply to one prompt, retrying transport failures
    /// (timeouts, failed connections, HTTP 408, 429, 5xx) up to `max_retries` times.
    fn content(&self, prompt: &str) -> Result<String, ReflectionFailure> {
        let body = json!({
            "model": self.settings.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.settings.max_tokens,
            "temperature": self.settings.temperature,
        })
        .to_string();
        let url = &self.url;
        crate::retry::with_retries(
            self.settings.max_retries,
            Duration::from_millis(self.settings.retry_backoff_ms),
            MAX_BACKOFF,
            |_| self.attempt(&body),
            |attempt, reason, _| {
                tracing::debug!(url = %url, attempt, reason = %reason, "reflection attempt failed; retrying")
            },
        )
        .map_err(|(mut failure, attempts)| {
            if attempts > 1 {
                failure
                    .reason
                    .push_str(&format!(" (after {attempts} attempts)"));
            }
            failure
        })
    }

    fn transport_failure(&self, e: ureq::Error) -> Attempt<ReflectionFailure> {
        let timed_out = match &e {
            ureq::Error::Timeout(_) => true,
            ureq::Error::Io(io) => matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        };
        if timed_out {
            return Attempt {
                failure: ReflectionFailure::timeout(format!(
                    "{} did not answer within skills.endpoint.timeout_ms = {} ms",
                    self.url, self.settings.timeout_ms
                )),
                retry: true,
            };
        }
        let (what, retry) = match &e {
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => (
                "connection refused (is the endpoint running, and is `skills.endpoint.base_url` \
                 right?)"
                    .to_string(),
                true,
            ),
            ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::Protocol(_) => {
                (e.to_string(), true)
            }
            ureq::Error::HostNotFound => (
                "host not found (check `skills.endpoint.base_url`)".to_string(),
                true,
            ),
            _ => (e.to_string(), false),
        };
        Attempt {
            failure: ReflectionFailure::error(format!("{}: {what}", self.url)),
            retry,
        }
    }
}

impl Reflector for EndpointReflector {
    fn name(&self) -> &'static str {
        "endpoint"
    }

    fn reflect(&mut self, job: &Job) -> Result<Draft, ReflectionFailure> {
        let codec = self.codec.clone();
        let who = format!("the reply of {}", self.url);
        ask(job, codec.as_ref(), &who, |prompt, _attempt| {
            self.content(prompt)
        })
    }
}
