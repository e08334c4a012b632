//! The messages the policy actor answers, in one module that depends only on data types
//! (token ids, sampling settings, losses, reports): the actors, the skill creator and the
//! gateway name these without naming the actor that answers them.

use std::ops::Range;
use std::path::PathBuf;

use actix::prelude::*;

use crate::backend::{Generation, SamplingParams, Sequence, StepReport, TokenSink, Weights};
use crate::error::Result;
use crate::loss::TokenLoss;

/// Sample one response per prompt.
#[derive(Message)]
#[rtype(result = "Result<Generated>")]
pub struct Generate {
    pub prompts: Vec<Vec<u32>>,
    pub params: SamplingParams,
}

/// Responses plus the version of the weights that sampled them.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    pub generations: Vec<Generation>,
    pub policy_version: u64,
}

/// [`Generate`], each token handed to `sink` as it is sampled (the gateway streams and
/// cancels with it; [`PolicyBackend::generate_streaming`]).
#[derive(Message)]
#[rtype(result = "Result<Generated>")]
pub struct GenerateStream {
    pub prompts: Vec<Vec<u32>>,
    pub params: SamplingParams,
    pub sink: Box<dyn TokenSink>,
}

/// Log-probs of response tokens after their prompts, no grad.
#[derive(Message)]
#[rtype(result = "Result<Vec<Vec<f32>>>")]
pub struct Score {
    pub sequences: Vec<Sequence>,
    pub temperature: f32,
    pub weights: Weights,
}

/// One optimizer step with a token-decomposed loss; the loss comes back with its report.
#[derive(Message)]
#[rtype(result = "Result<(StepReport, L)>")]
pub struct TrainStep<L: TokenLoss + Send + 'static> {
    pub sequences: Vec<Sequence>,
    pub micro_batches: Vec<Range<usize>>,
    pub temperature: f32,
    pub loss: L,
}

/// Copy the live weights into the reference weights.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct SnapshotReference;

/// Write a checkpoint of the backend into `dir`.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct SaveCheckpoint {
    pub dir: PathBuf,
}

/// Restore a checkpoint of the backend from `dir`.
#[derive(Message)]
#[rtype(result = "Result<u64>")]
pub struct LoadCheckpoint {
    pub dir: PathBuf,
}

/// The live policy version.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct PolicyVersion;

/// Reset the optimizer with new hyper-parameters.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ConfigureOptimizer(pub crate::backend::OptimizerSettings);

/// Export the live weights as a Hugging Face model directory.
#[derive(Message)]
#[rtype(result = "Result<Vec<String>>")]
pub struct ExportModel {
    /// Directory holding the tokenizer files to ship with the weights.
    pub tokenizer_dir: PathBuf,
    pub dir: PathBuf,
}

/// Log-probs plus the top-k ids and log-probs per response position, no grad.
#[derive(Message)]
#[rtype(result = "Result<Vec<cairn_plugin_sdk::Scored>>")]
pub struct ScoreTopK {
    pub sequences: Vec<Sequence>,
    pub temperature: f32,
    pub weights: Weights,
    pub top_k: u32,
}

/// Keep the weights of the last `n` policy versions for [`Weights::Version`] scoring.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct RetainVersions(pub usize);

/// Replace the live weights with those of a HF model directory (safetensors, every tensor of
/// the model with its shape), and set the policy version to `version`: `cairn serve` taking a
/// trainer's weights (`POST /update_weights_from_disk`).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct LoadWeights {
    pub dir: PathBuf,
    pub version: u64,
}
