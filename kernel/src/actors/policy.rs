//! The policy actor: owns the [`PolicyBackend`] on a `SyncArbiter` thread, so all tch work
//! (sampling, scoring, training, checkpoint I/O) runs off the async arbiters, one call at a
//! time.
//!
//! Each handler runs the backend under `catch_unwind`: a panic inside libtorch glue becomes an
//! error for the caller instead of killing the thread (actix's supervisor would only restart it
//! after `ctx.stop()`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use actix::prelude::*;

use crate::backend::{PolicyBackend, StepReport};
use crate::error::{Error, Result};
use crate::loss::TokenLoss;
pub use crate::messages::{
    ConfigureOptimizer, ExportModel, Generate, GenerateStream, Generated, LoadCheckpoint,
    LoadWeights, PolicyVersion, RetainVersions, SaveCheckpoint, Score, ScoreTopK,
    SnapshotReference, TrainStep,
};

/// Holds the backend. Start it with `SyncArbiter::start(1, ..)`.
pub struct PolicyActor {
    backend: Box<dyn PolicyBackend>,
}

impl PolicyActor {
    pub fn new(backend: Box<dyn PolicyBackend>) -> Self {
        PolicyActor { backend }
    }

    /// Exports the live weights as a HF model directory and returns their policy version
    /// (the external engine's weight sync, `cairn_gateway::engine::ExportForEngine`).
    pub fn export_versioned(
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

impl Handler<Score> for PolicyActor {
    type Result = Result<Vec<Vec<f32>>>;
    fn handle(&mut self, msg: Score, _: &mut Self::Context) -> Self::Result {
        self.guarded("score", |b| {
            b.score(&msg.sequences, msg.temperature, msg.weights)
        })
    }
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

impl Handler<SnapshotReference> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, _: SnapshotReference, _: &mut Self::Context) -> Self::Result {
        self.guarded("snapshot reference", |b| b.snapshot_reference())
    }
}

impl Handler<SaveCheckpoint> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: SaveCheckpoint, _: &mut Self::Context) -> Self::Result {
        self.guarded("save checkpoint", |b| b.save(&msg.dir))
    }
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

impl Handler<PolicyVersion> for PolicyActor {
    type Result = u64;
    fn handle(&mut self, _: PolicyVersion, _: &mut Self::Context) -> u64 {
        self.backend.policy_version()
    }
}

impl Handler<ConfigureOptimizer> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: ConfigureOptimizer, _: &mut Self::Context) -> Self::Result {
        self.guarded("configure optimizer", |b| b.configure_optimizer(&msg.0))
    }
}

impl Handler<ExportModel> for PolicyActor {
    type Result = Result<Vec<String>>;
    fn handle(&mut self, msg: ExportModel, _: &mut Self::Context) -> Self::Result {
        self.guarded("export model", |b| b.export(&msg.tokenizer_dir, &msg.dir))
    }
}

impl Handler<ScoreTopK> for PolicyActor {
    type Result = Result<Vec<cairn_plugin_sdk::Scored>>;
    fn handle(&mut self, msg: ScoreTopK, _: &mut Self::Context) -> Self::Result {
        self.guarded("score top-k", |b| {
            b.score_top_k(&msg.sequences, msg.temperature, msg.weights, msg.top_k)
        })
    }
}

impl Handler<RetainVersions> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: RetainVersions, _: &mut Self::Context) -> Self::Result {
        self.guarded("retain versions", |b| b.retain_versions(msg.0))
    }
}

impl Handler<LoadWeights> for PolicyActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: LoadWeights, _: &mut Self::Context) -> Self::Result {
        self.guarded("load weights", |b| b.load_weights(&msg.dir, msg.version))
    }
}
