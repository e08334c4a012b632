//! Reflectors: what turns a plugin's [`ReflectionRequest`] and the rows of its trajectories
//! into the text of a bank entry.
//!
//! The skill-creator actor (`actors::skills`) queues requests and hands each one, as a
//! [`Job`], to one [`Reflector`] on a thread of its own, so a slow reflector never holds up an
//! RL step. Three reflectors, picked by `skills.reflector` (docs/skills.md):
//!
//! - [`template::TemplateReflector`]: deterministic text from the rows (tests, CPU demos);
//! - [`policy::PolicyReflector`]: the policy answers the reflection prompt (SEED, OPID);
//! - [`endpoint::EndpointReflector`]: an OpenAI-compatible chat endpoint answers it.
//!
//! The two model-backed reflectors ask through [`ask`]: they send [`render_prompt`]'s text and
//! read the entry out of the reply with [`parse_reply`]; a reply without an entry is a
//! [`FailureKind::Unparseable`] failure and nothing is stored. A request whose `extra` holds a
//! `reply_format` ([`format::JsonReply`]) wants a JSON object with given keys instead: an
//! invalid reply is re-asked up to the format's `retries`, then fails as unparseable.

pub mod config;
pub mod endpoint;
pub mod format;
pub mod policy;
pub mod template;

use std::fmt;
use std::sync::Arc;

use actix::Recipient;
use cairn_plugin_sdk::{ReflectionRequest, TurnRow};

use crate::messages::Generate;
use crate::rollout::prompt::{PromptBuilder, TextCodec};
pub use config::{
    EndpointConfig, PolicyReflectorConfig, ReflectorKind, SkillsConfig, MAX_ENDPOINT_RETRIES,
};

/// One reflection, as the reflector gets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The ticket the requesting plugin got back.
    pub ticket: u64,
    pub request: ReflectionRequest,
    /// The rows of `request.trajectories` that the kernel attached, grouped by trajectory in
    /// the request's order, each trajectory's rows by turn.
    pub rows: Vec<TurnRow>,
}

impl Job {
    /// Builds a job from the rows of a whole `Reflect` message: keeps the rows of the
    /// request's trajectories, ordered as the request lists them, then by turn.
    pub fn new(ticket: u64, request: ReflectionRequest, all_rows: &[TurnRow]) -> Job {
        let mut rows = Vec::new();
        for (k, &id) in request.trajectories.iter().enumerate() {
            if request.trajectories[..k].contains(&id) {
                continue;
            }
            let mut mine: Vec<TurnRow> = all_rows
                .iter()
                .filter(|r| r.trajectory_id == id)
                .cloned()
                .collect();
            mine.sort_by_key(|r| r.turn);
            rows.extend(mine);
        }
        Job {
            ticket,
            request,
            rows,
        }
    }

    /// The job's trajectories in request order: `(trajectory id, its rows by turn)`; a
    /// requested trajectory without rows is left out.
    pub fn trajectories(&self) -> Vec<(u64, &[TurnRow])> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < self.rows.len() {
            let id = self.rows[start].trajectory_id;
            let len = self.rows[start..]
                .iter()
                .take_while(|r| r.trajectory_id == id)
                .count();
            out.push((id, &self.rows[start..start + len]));
            start += len;
        }
        out
    }

    /// Requested trajectories that came without rows.
    pub fn missing_trajectories(&self) -> Vec<u64> {
        self.request
            .trajectories
            .iter()
            .copied()
            .filter(|id| !self.rows.iter().any(|r| r.trajectory_id == *id))
            .collect()
    }
}

/// The entry a reflector produced: its text and optional trigger, and for a request with a
/// reply format the accepted JSON object. Everything else on the entry (kind, status, parent,
/// task, extra, provenance) comes from the request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Draft {
    pub text: String,
    pub trigger: Option<String>,
    /// The reply's JSON object (a request with a [`format::JsonReply`]); stored on the entry's
    /// `extra` as `reply`.
    pub reply: Option<serde_json::Map<String, serde_json::Value>>,
    /// Re-asks after invalid replies before this one was accepted (`skills/reasked`).
    pub reasked: u32,
}

impl Draft {
    /// A draft with this text and trigger (no JSON reply, no re-asks).
    pub fn new(text: impl Into<String>, trigger: Option<String>) -> Draft {
        Draft {
            text: text.into(),
            trigger,
            ..Draft::default()
        }
    }
}

/// Why a reflection produced no entry; counted under its kind's metric and reported to the
/// plugin as `(ticket, reason)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReflectionFailure {
    pub kind: FailureKind,
    /// What happened, naming the URL, key or trajectory involved.
    pub reason: String,
    /// Re-asks after invalid replies before the reflection failed (`skills/reasked`).
    pub reasked: u32,
}

/// The metric a failure counts under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The reply holds no entry (`skills/unparseable`).
    Unparseable,
    /// The reflector ran out of time (`skills/timeouts`).
    Timeout,
    /// Anything else: a refused connection, an HTTP error, a generation or bank error, rows
    /// the template cannot use (`skills/errors`).
    Error,
}

impl ReflectionFailure {
    pub fn unparseable(reason: impl Into<String>) -> Self {
        ReflectionFailure {
            kind: FailureKind::Unparseable,
            reason: reason.into(),
            reasked: 0,
        }
    }
    pub fn timeout(reason: impl Into<String>) -> Self {
        ReflectionFailure {
            kind: FailureKind::Timeout,
            reason: reason.into(),
            reasked: 0,
        }
    }
    pub fn error(reason: impl Into<String>) -> Self {
        ReflectionFailure {
            kind: FailureKind::Error,
            reason: reason.into(),
            reasked: 0,
        }
    }
}

impl fmt::Display for ReflectionFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Writes one entry for one job. Runs on the skill creator's reflector thread, one job at a
/// time, so implementations may block (an HTTP call, a generation).
pub trait Reflector: Send {
    /// `template`, `policy` or `endpoint`: the entries' writer is `skill-creator:<name>`.
    fn name(&self) -> &'static str;

    fn reflect(&mut self, job: &Job) -> Result<Draft, ReflectionFailure>;
}

/// What the reflectors may need from the pipeline.
pub struct ReflectorPeers {
    /// The policy actor's generation (the `policy` reflector).
    pub generate: Recipient<Generate>,
    /// Frames the reflection prompt as the policy's prompts are framed (chat template or
    /// plain), and gives the stop ids.
    pub builder: Arc<dyn PromptBuilder>,
    /// Decodes replies, and responses of rows without an `info.action`.
    pub codec: Arc<dyn TextCodec>,
    /// The endpoint's API key, from [`crate::config::PipelineConfig::skills_api_key`].
    pub api_key: Option<String>,
}

/// The reflector `config.reflector` names.
pub fn reflector(config: &SkillsConfig, peers: ReflectorPeers) -> Box<dyn Reflector> {
    match (config.reflector, &config.endpoint) {
        (ReflectorKind::Template, _) => Box::new(template::TemplateReflector),
        (ReflectorKind::Policy, _) => Box::new(policy::PolicyReflector::new(
            &config.policy,
            peers.generate,
            peers.builder,
            peers.codec,
        )),
        (ReflectorKind::Endpoint, Some(endpoint)) => Box::new(endpoint::EndpointReflector::new(
            endpoint,
            peers.api_key,
            peers.codec,
        )),
        (ReflectorKind::Endpoint, None) => Box::new(Unconfigured),
    }
}

/// `reflector = "endpoint"` without `[skills.endpoint]`, which config validation refuses; a
/// hand-built config that skipped validation gets an error per reflection instead of a panic.
struct Unconfigured;

impl Reflector for Unconfigured {
    fn name(&self) -> &'static str {
        "endpoint"
    }
    fn reflect(&mut self, _job: &Job) -> Result<Draft, ReflectionFailure> {
        Err(ReflectionFailure::error(
            "`skills.reflector = \"endpoint\"` needs a `[skills.endpoint]` table",
        ))
    }
}

/// The instruction appended to every reflection prompt: the reply format [`parse_reply`]
/// reads.
pub const REPLY_FORMAT: &str = "Answer with the entry between <entry> and </entry>. If it \
applies only in some situations, add the situation between <trigger> and </trigger>.";

/// The text a model-backed reflector sends: the request's prompt, each trajectory (task,
/// outcome, then per turn the observation, the action and the environment's feedback), then
/// [`REPLY_FORMAT`], or the JSON instruction of the request's reply format
/// ([`format::JsonReply::instruction`]). An action is the row's `info.action` (set by the
/// rollout actor), else the decoded sampled ids. A malformed reply format is an error.
pub fn render_prompt(job: &Job, codec: &dyn TextCodec) -> Result<String, ReflectionFailure> {
    let instruction = match format::JsonReply::of(&job.request)? {
        Some(json) => json.instruction(),
        None => REPLY_FORMAT.to_string(),
    };
    let mut out = String::new();
    if !job.request.prompt.is_empty() {
        out.push_str(job.request.prompt.trim_end());
        out.push_str("\n\n");
    }
    for (id, rows) in job.trajectories() {
        let first = &rows[0];
        out.push_str(&format!(
            "Trajectory {id} (task {}): {}, reward {}\n",
            first.task_id,
            if first.success { "succeeded" } else { "failed" },
            first.episode_reward
        ));
        for row in rows {
            out.push_str(&format!(
                "Turn {}\nObservation: {}\nAction: {}\nFeedback: {}, reward {}\n",
                row.turn,
                row.observation.trim(),
                action(row, codec)?,
                feedback_word(row.feedback),
                row.turn_reward
            ));
        }
        out.push('\n');
    }
    out.push_str(&instruction);
    Ok(out)
}

/// Asks a model-backed reflector's question and reads the entry out of the reply.
///
/// `reply_to(prompt, attempt)` sends one prompt and returns the model's reply text (attempt 0
/// is the first ask); its errors end the reflection as they are. `who` names the replier in
/// failure reasons (`the policy's reply`, `the reply of <url>`).
/// - Without a reply format: one ask, read with [`parse_reply`]; no entry is unparseable.
/// - With a [`format::JsonReply`]: a reply that is not a JSON object with the format's keys is
///   re-asked ([`format::JsonReply::reask`]) up to `retries` times; after the last invalid
///   reply the reflection fails as unparseable, naming the fault and the attempts.
pub fn ask(
    job: &Job,
    codec: &dyn TextCodec,
    who: &str,
    mut reply_to: impl FnMut(&str, u32) -> Result<String, ReflectionFailure>,
) -> Result<Draft, ReflectionFailure> {
    let prompt = render_prompt(job, codec)?;
    let Some(json) = format::JsonReply::of(&job.request)? else {
        let reply = reply_to(&prompt, 0)?;
        return parse_reply(&reply).ok_or_else(|| {
            ReflectionFailure::unparseable(format!(
                "{who} has no <entry>…</entry> and no JSON object with a \"text\": {}",
                excerpt(&reply)
            ))
        });
    };
    let mut asked = prompt.clone();
    let mut attempt = 0;
    loop {
        let reply = reply_to(&asked, attempt).map_err(|mut failure| {
            failure.reasked = attempt;
            failure
        })?;
        match json.check(&reply) {
            Ok(object) => return Ok(json.draft(object, attempt)),
            Err(fault) if attempt == json.retries => {
                let mut failure = ReflectionFailure::unparseable(format!(
                    "{who} is not a JSON object with the requested keys ({fault}) after {} \
                     attempt{}: {}",
                    attempt + 1,
                    if attempt == 0 { "" } else { "s" },
                    excerpt(&reply)
                ));
                failure.reasked = attempt;
                return Err(failure);
            }
            Err(fault) => {
                tracing::debug!(ticket = job.ticket, attempt, %fault, "invalid JSON reply; re-asking");
                asked = json.reask(&prompt, &reply, &fault);
                attempt += 1;
            }
        }
    }
}

/// The action text of a row: `info.action`, else its sampled (mask 1) ids decoded.
pub fn action(row: &TurnRow, codec: &dyn TextCodec) -> Result<String, ReflectionFailure> {
    if let Some(a) = row.info.get("action").and_then(|a| a.as_str()) {
        return Ok(a.to_string());
    }
    let sampled: Vec<u32> = row
        .response_ids
        .iter()
        .zip(row.response_mask.iter().chain(std::iter::repeat(&1)))
        .filter(|(_, &m)| m == 1)
        .map(|(&id, _)| id)
        .collect();
    codec
        .decode(&sampled)
        .map(|t| t.trim().to_string())
        .map_err(|e| {
            ReflectionFailure::error(format!(
                "decoding the response of trajectory {} turn {}: {e}",
                row.trajectory_id, row.turn
            ))
        })
}

/// The environment's short-term feedback (`TurnRow::feedback`) in words.
pub fn feedback_word(feedback: i8) -> &'static str {
    match feedback {
        f if f < 0 => "rejected",
        0 => "no change",
        _ => "progress",
    }
}

/// The start of a reply, quoted, for failure reasons.
pub(crate) fn excerpt(reply: &str) -> String {
    const CHARS: usize = 120;
    let mut out: String = reply.chars().take(CHARS).collect();
    if reply.chars().nth(CHARS).is_some() {
        out.push('…');
    }
    format!("{out:?}")
}

const ENTRY: (&str, &str) = ("<entry>", "</entry>");
const TRIGGER: (&str, &str) = ("<trigger>", "</trigger>");
/// JSON objects tried at most per reply (each try parses from one `{`).
const MAX_JSON_TRIES: usize = 64;

/// Reads the entry out of a model's reply: the first `<entry>…</entry>` (its text, with a
/// `<trigger>…</trigger>` inside or anywhere in the reply as the trigger), else the first JSON
/// object with a non-empty string `"text"` (and an optional string `"trigger"`), anywhere in
/// the reply (a code fence around it is fine). Text and trigger are trimmed; an empty text is
/// no entry. `None`: the reply is unparseable.
pub fn parse_reply(reply: &str) -> Option<Draft> {
    tagged(reply).or_else(|| json_object(reply))
}

fn tagged(reply: &str) -> Option<Draft> {
    let entry = span(reply, 0, ENTRY)?;
    let trigger = span(reply, 0, TRIGGER);
    let mut text = reply[entry.inner.clone()].to_string();
    if let Some(t) = &trigger {
        if t.outer.start >= entry.inner.start && t.outer.end <= entry.inner.end {
            let (a, b) = (
                t.outer.start - entry.inner.start,
                t.outer.end - entry.inner.start,
            );
            text.replace_range(a..b, "");
        }
    }
    let text = text.trim();
    (!text.is_empty()).then(|| {
        Draft::new(
            text,
            trigger
                .map(|t| reply[t.inner].trim().to_string())
                .filter(|t| !t.is_empty()),
        )
    })
}

struct Span {
    /// The tags included.
    outer: std::ops::Range<usize>,
    inner: std::ops::Range<usize>,
}

/// The first `open…close` at or after `from`.
fn span(text: &str, from: usize, (open, close): (&str, &str)) -> Option<Span> {
    let start = from + text[from..].find(open)?;
    let inner_start = start + open.len();
    let inner_end = inner_start + text[inner_start..].find(close)?;
    Some(Span {
        outer: start..inner_end + close.len(),
        inner: inner_start..inner_end,
    })
}

fn json_object(reply: &str) -> Option<Draft> {
    reply
        .match_indices('{')
        .take(MAX_JSON_TRIES)
        .find_map(|(at, _)| {
            let mut values =
                serde_json::Deserializer::from_str(&reply[at..]).into_iter::<serde_json::Value>();
            let serde_json::Value::Object(object) = values.next()?.ok()? else {
                return None;
            };
            let text = object.get("text")?.as_str()?.trim();
            (!text.is_empty()).then(|| {
                Draft::new(
                    text,
                    object
                        .get("trigger")
                        .and_then(|t| t.as_str())
                        .map(|t| t.trim().to_string())
                        .filter(|t| !t.is_empty()),
                )
            })
        })
}
