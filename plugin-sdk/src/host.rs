//! Callbacks a plugin can make into the host (the shared policy backend and the logger).

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// Score `response_ids` after `context_ids` under the current policy weights.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScoreRequest {
    pub context_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
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

/// Host services available to a plugin during a call.
pub trait Host {
    /// Log-probs `[len(response_ids)]` of each request's response tokens after its context,
    /// at the rollout temperature. One result per request, in order.
    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Vec<f32>>>;

    /// Samples one continuation per request.
    fn generate(&self, requests: &[GenerateRequest]) -> Result<Vec<Generation>>;

    /// Token ids of `text` under the policy's tokenizer (no special tokens added).
    fn tokenize(&self, text: &str) -> Result<Vec<u32>>;

    /// Logs a scalar metric for the current step.
    fn log_metric(&self, name: &str, value: f64);
}

/// A host that offers nothing but logging, for running plugins without a model
/// (`cairn signals`, tests). Model callbacks return a `Host` error.
#[derive(Debug, Default)]
pub struct OfflineHost {
    pub metrics: std::sync::Mutex<Vec<(String, f64)>>,
}

impl Host for OfflineHost {
    fn score(&self, _requests: &[ScoreRequest]) -> Result<Vec<Vec<f32>>> {
        Err(crate::PluginError::host(
            "no policy model is loaded: scoring is unavailable offline",
        ))
    }
    fn generate(&self, _requests: &[GenerateRequest]) -> Result<Vec<Generation>> {
        Err(crate::PluginError::host(
            "no policy model is loaded: generation is unavailable offline",
        ))
    }
    fn tokenize(&self, _text: &str) -> Result<Vec<u32>> {
        Err(crate::PluginError::host("no tokenizer is loaded offline"))
    }
    fn log_metric(&self, name: &str, value: f64) {
        if let Ok(mut m) = self.metrics.lock() {
            m.push((name.to_string(), value));
        }
    }
}
