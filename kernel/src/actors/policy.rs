//! The policy actor: owns the [`PolicyBackend`] on a `SyncArbiter` thread, so all tch work
//! (sampling, scoring, training, checkpoint I/O) runs off the async arbiters, one call at a
//! time.
//!
//! Each handler runs the backend under `catch_unwind`: a panic inside libtorch glue becomes an
//! error for the caller instead of killing the thread (actix's supervisor would only restart it
//! after `ctx.stop()`).

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use actix::prelude::*;

use crate::backend::{
    Generation, PolicyBackend, SamplingParams, Sequence, StepReport, TokenSink, Weights,
};
use crate::error::{Error, Result};
use crate::loss::TokenLoss;

/// Holds the backend. Start it with `SyncArbiter::start(1, ..)`.
pub struct PolicyActor {
    backend: Box<dyn PolicyBackend>,
}

impl PolicyActor {
    pub fn new(backend: Box<dyn PolicyBackend>) -> Self {
        PolicyActor { backend }
    }

    /// Exports the live weights as a HF model directory and returns their policy version
    /// (the external engine's weight sync, [`crate::engine::ExportForEngine`]).
    pub(crate) fn export_versioned(
        &mut self,
        tokenizer_dir: &std::path::Path,
        dir: &std::path::Path,
    ) -> Result<u64> {
        self.guarded("export for the engine", |b| {
            b.export(tokenizer_dir, dir)?;
            Ok(b.policy_version())
        })
    }

    fn guarded<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut dyn PolicyBackend) -> Result<T>,
    ) -> Result<T> {
        let backend = &mut *self.backend;
        match catch_unwind(AssertUnwindSafe(|| f(backend))) {
            Ok(r) => r,
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                Err(Error::Model(format!("{what} panicked: {msg}")))
            }
        }
    }
}

impl Actor for PolicyActor {
    type Context = SyncContext<Self>;
}

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

impl Handler<Generate> for PolicyActor {
    type Result = Result<Generated>;
    fn handle(&mut self, msg: Generate, _: &mut Self::Context) -> Self::Result {
        self.guarded("generate", |b| {
            let policy_version = b.policy_version();
            Ok(Generated {
                generations: b.generate(&msg.prompts, &msg.params)?,
                policy_version,
            })
        })
    }
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

impl Handler<GenerateStream> for PolicyActor {
    type Result = Result<Generated>;
    fn handle(&mut self, mut msg: GenerateStream, _: &mut Self::Context) -> Self::Result {
        self.guarded("generate", |b| {
            let policy_version = b.policy_version();
            msg.sink.begin(policy_version);
            Ok(Generated {
                generations: b.generate_streaming(&msg.prompts, &msg.params, &mut *msg.sink)?,
                policy_version,
            })
        })
    }
}

/// Log-probs of response tokens after their prompts, no grad.
#[derive(Message)]
#[rtype(result = "Result<Vec<Vec<f32>>>")]
pub struct Score {
    pub sequences: Vec<Sequence>,
    pub temperature: f32,
    pub weights: Weights,
}

impl Handler<Score> for PolicyActor {
    type Result = Result<Vec<Vec<f32>>>;
    fn handle(&mut self, msg: Score, _: &mut Self::Context) -> Self::Result {
        self.guarded("score", |b| {
            b.score(&msg.sequences, msg.temperature, msg.weights)
        })
    }
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

impl<L: TokenLoss + Send + 'static> Handler<TrainStep<L>> for PolicyActor {
    type Result = Result<(StepReport, L)>;
    fn handle(&mut self, mut msg: TrainStep<L>, _: &mut Self::Context) -> Self::Result {
        self.guarded("train step", |b| {
            let report = b.train_step(
                &msg.sequences,
                &msg.micro_batches,
                msg.temperature,
                &mut msg.loss,
            )?;
            Ok((report, msg.loss))
        })
    }
}

/// Copy the live weights into the reference weights.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct SnapshotReference;

impl Handler<SnapshotReference> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, _: SnapshotReference, _: &mut Self::Context) -> Self::Result {
        self.guarded("snapshot reference", |b| b.snapshot_reference())
    }
}

/// Write a checkpoint of the backend into `dir`.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct SaveCheckpoint {
    pub dir: PathBuf,
}

impl Handler<SaveCheckpoint> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: SaveCheckpoint, _: &mut Self::Context) -> Self::Result {
        self.guarded("save checkpoint", |b| b.save(&msg.dir))
    }
}

/// Restore a checkpoint of the backend from `dir`.
#[derive(Message)]
#[rtype(result = "Result<u64>")]
pub struct LoadCheckpoint {
    pub dir: PathBuf,
}

impl Handler<LoadCheckpoint> for PolicyActor {
    type Result = Result<u64>;
    fn handle(&mut self, msg: LoadCheckpoint, _: &mut Self::Context) -> Self::Result {
        self.guarded("load checkpoint", |b| {
            b.load(&msg.dir)?;
            Ok(b.policy_version())
        })
    }
}

/// The live policy version.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct PolicyVersion;

impl Handler<PolicyVersion> for PolicyActor {
    type Result = u64;
    fn handle(&mut self, _: PolicyVersion, _: &mut Self::Context) -> u64 {
        self.backend.policy_version()
    }
}

/// Reset the optimizer with new hyper-parameters.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ConfigureOptimizer(pub crate::backend::OptimizerSettings);

impl Handler<ConfigureOptimizer> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: ConfigureOptimizer, _: &mut Self::Context) -> Self::Result {
        self.guarded("configure optimizer", |b| b.configure_optimizer(&msg.0))
    }
}

/// Export the live weights as a Hugging Face model directory.
#[derive(Message)]
#[rtype(result = "Result<Vec<String>>")]
pub struct ExportModel {
    /// Directory holding the tokenizer files to ship with the weights.
    pub tokenizer_dir: PathBuf,
    pub dir: PathBuf,
}

impl Handler<ExportModel> for PolicyActor {
    type Result = Result<Vec<String>>;
    fn handle(&mut self, msg: ExportModel, _: &mut Self::Context) -> Self::Result {
        self.guarded("export model", |b| b.export(&msg.tokenizer_dir, &msg.dir))
    }
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

impl Handler<ScoreTopK> for PolicyActor {
    type Result = Result<Vec<cairn_plugin_sdk::Scored>>;
    fn handle(&mut self, msg: ScoreTopK, _: &mut Self::Context) -> Self::Result {
        self.guarded("score top-k", |b| {
            b.score_top_k(&msg.sequences, msg.temperature, msg.weights, msg.top_k)
        })
    }
}

/// Keep the weights of the last `n` policy versions for [`Weights::Version`] scoring.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct RetainVersions(pub usize);

impl Handler<RetainVersions> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: RetainVersions, _: &mut Self::Context) -> Self::Result {
        self.guarded("retain versions", |b| b.retain_versions(msg.0))
    }
}

/// Replace the live weights with those of a HF model directory (safetensors, every tensor of
/// the model with its shape), and set the policy version to `version`: `cairn serve` taking a
/// trainer's weights (`POST /update_weights_from_disk`).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct LoadWeights {
    pub dir: PathBuf,
    pub version: u64,
}

impl Handler<LoadWeights> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: LoadWeights, _: &mut Self::Context) -> Self::Result {
        self.guarded("load weights", |b| b.load_weights(&msg.dir, msg.version))
    }
}
