//! The services a plugin calls: the [`Host`] trait (re-exported at the crate root, which is
//! where an author finds it) and its request types: the shared policy backend (scoring,
//! generation, prompt rendering), the experience bank, the skill creator and the logger. Every
//! method has a default that returns a `Host` error, so a test host implements only what it
//! offers; the kernel's host implements all of them. A plugin that calls a service declares it
//! in [`crate::Requirements`], and the kernel refuses the pipeline at load when the service is
//! missing.

use serde::{Deserialize, Serialize};

use crate::bank::StatsUpdate;
use crate::batch::{ContextVariant, TurnRow};
use crate::env::Observation;
use crate::error::{PluginError, Result};

/// Which weights score a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreWeights {
    /// The live weights, as they are now (inside `signals`: before this step's update).
    #[default]
    Current,
    /// The weights of a given policy version, e.g. the version that sampled a row
    /// (`TurnRow::policy_version`). The backend keeps the last `rollout.max_staleness + 1`
    /// versions; an older one is refused with an error, never approximated.
    Version(u64),
    /// The frozen reference policy.
    Reference,
}

/// Score `response_ids` after `context_ids` (no grad).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScoreRequest {
    pub context_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub weights: ScoreWeights,
    /// Softmax temperature; `None`: the rollout temperature.
    pub temperature: Option<f32>,
    /// Also return the `top_k` most likely ids and their log-probs at each response position
    /// (0: none). A backend that cannot refuses with an error.
    pub top_k: u32,
}

/// What scoring returns for one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Scored {
    /// Log-probs of the response ids, `[L]`, nats.
    pub logprobs: Vec<f32>,
    /// With `top_k = k > 0`: the top-k ids per position, row-major `[L, k]`, most likely first.
    pub top_ids: Vec<u32>,
    /// Their log-probs, `[L, k]`, nats (full-vocabulary softmax at the request's temperature).
    pub top_logprobs: Vec<f32>,
}

/// Generate a continuation of `prompt_ids`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_new_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

/// A sampled continuation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    pub ids: Vec<u32>,
    /// Log-probs of `ids` under the sampling distribution, nats.
    pub logprobs: Vec<f32>,
    pub finish_reason: crate::batch::FinishReason,
}

/// One earlier turn of a trajectory, as text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistoryTurn {
    /// The observation the policy acted on.
    pub observation: String,
    /// The action it took (decoded response).
    pub action: String,
}

/// Render the prompt a slot with `variant` would see for `observation` after `history`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RenderRequest {
    pub variant: ContextVariant,
    pub observation: Observation,
    pub history: Vec<HistoryTurn>,
}

impl RenderRequest {
    /// The prompt `row`'s observation (text, anchor and the tool schemas it offered, no
    /// history) gets under `variant`: the context of a live teacher that scores the row's own
    /// response with the knowledge the row's slot did not see (EDGE's, Pats' and the hint
    /// plugin's distillation). The tool schemas come from the row's `extra.tools`, where the
    /// kernel's rollout records them, so with the row's own variant this renders the row's
    /// prompt exactly (for rows of the kernel's own prompt builder, without a per-turn prompt
    /// override); `variant.tools_enabled` decides whether the prompt shows them.
    pub fn for_row(variant: ContextVariant, row: &TurnRow) -> RenderRequest {
        let tools = match row.extra.get("tools") {
            Some(serde_json::Value::Array(tools)) => tools.clone(),
            _ => Vec::new(),
        };
        RenderRequest {
            variant,
            observation: Observation {
                text: row.observation.clone(),
                anchor: row.anchor.clone(),
                tools,
                ..Observation::default()
            },
            history: Vec::new(),
        }
    }
}

fn unavailable<T>(what: &str) -> Result<T> {
    Err(PluginError::host(format!(
        "this host offers no {what}; declare the need in the plugin's requirements so the \
         pipeline is refused at load instead"
    )))
}

/// The host services that cross the boundary as JSON ([`ffi::FfiHost::call_json`]), declared
/// once. A row gives a [`Host`] method (docs, argument, result) and what a host without the
/// service lacks; `json_services!(m)` hands the rows to macro `m`. From them come the
/// trait's methods with their refusing defaults (here), the plugin side's calls
/// ([`crate::export::ForeignHost`]), the host side's dispatch ([`foreign`]) and
/// [`JSON_SERVICES`].
///
/// A new service is one row here, plus its implementation in the kernel's host and in
/// [`crate::testing::MockHost`]; the method name is its name on the wire, so a row is never
/// renamed or removed. Scoring, generation and tokenizing carry hot data and have typed
/// [`ffi::FfiHost`] methods of their own, fixed by the ABI.
macro_rules! json_services {
    ($then:ident) => {
        $then! {
            /// The exact prompt ids the policy would see for a request: the kernel's prompt
            /// builder, the same one rollouts use.
            fn render_prompt(request: &$crate::services::RenderRequest) -> Vec<u32>,
                lacking "prompt builder";
            /// Top-k entries of the experience bank for a query.
            fn bank_query(query: &$crate::bank::BankQuery) -> Vec<$crate::bank::Retrieved>,
                lacking "experience bank";
            /// Inserts entries; returns their ids, in order.
            fn bank_put(entries: &[$crate::bank::NewEntry]) -> Vec<u64>,
                lacking "experience bank";
            /// Applies statistics and status updates, all in one transaction.
            fn bank_update(updates: &[$crate::bank::StatsUpdate]) -> (),
                lacking "experience bank";
            /// Queues reflections with the skill creator; returns one ticket per request. The
            /// entries arrive in the bank at a later step (see
            /// [`crate::StepReport::new_entries`]).
            fn reflect(requests: &[$crate::bank::ReflectionRequest]) -> Vec<u64>,
                lacking "skill creator";
        }
    };
}
pub(crate) use json_services;

/// [`Host`] methods that refuse with [`unavailable`], one per [`json_services!`] row.
macro_rules! refusing_defaults {
    ($($(#[$doc:meta])* fn $name:ident($arg:ident: &$payload:ty) -> $result:ty,
        lacking $what:literal;)*) => {
        $(
            $(#[$doc])*
            #[allow(unused_variables)]
            fn $name(&self, $arg: &$payload) -> Result<$result> {
                unavailable($what)
            }
        )*
    };
}

/// [`JSON_SERVICES`] from the [`json_services!`] rows.
macro_rules! service_names {
    ($($(#[$doc:meta])* fn $name:ident($arg:ident: &$payload:ty) -> $result:ty,
        lacking $what:literal;)*) => {
        /// The names of the services a plugin reaches through [`ffi::FfiHost::call_json`], in
        /// declaration order. A host answers any other name with a `Host` error that lists
        /// these, so a plugin built for a newer SDK gets a clear refusal from an older host
        /// instead of undefined behaviour.
        pub const JSON_SERVICES: &[&str] = &[$(stringify!($name)),*];
    };
}
json_services!(service_names);

/// Host services available to a plugin during a call.
pub trait Host {
    /// Scores each request (log-probs of its response tokens, and top-k when asked). One
    /// result per request, in order.
    fn score(&self, _requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        unavailable("scoring (no policy model)")
    }

    /// Samples one continuation per request.
    fn generate(&self, _requests: &[GenerateRequest]) -> Result<Vec<Generation>> {
        unavailable("generation (no policy model)")
    }

    /// Token ids of `text` under the policy's tokenizer (no special tokens added).
    fn tokenize(&self, _text: &str) -> Result<Vec<u32>> {
        unavailable("tokenizer")
    }

    json_services!(refusing_defaults);

    /// Retires entries (kept for provenance, no longer retrieved by default).
    fn bank_retire(&self, ids: &[u64]) -> Result<()> {
        let updates: Vec<StatsUpdate> = ids
            .iter()
            .map(|&id| StatsUpdate {
                id,
                status: Some(crate::bank::EntryStatus::Retired),
                ..Default::default()
            })
            .collect();
        self.bank_update(&updates)
    }

    /// Logs a scalar metric for the current step (`metrics.jsonl`). From `plan_group` and
    /// `next_context`, which run once per group or per turn, the step's values of one name are
    /// summed (log counts there); from `signals` and `observe`, the last value of a name wins.
    fn log_metric(&self, _name: &str, _value: f64) {}
}

/// A host that offers nothing but logging, for running plugins without a model
/// (`cairn signals`, tests). Every other callback returns a `Host` error.
#[derive(Debug, Default)]
pub struct OfflineHost {
    pub metrics: std::sync::Mutex<Vec<(String, f64)>>,
}

impl Host for OfflineHost {
    fn log_metric(&self, name: &str, value: f64) {
        if let Ok(mut m) = self.metrics.lock() {
            m.push((name.to_string(), value));
        }
    }
}
