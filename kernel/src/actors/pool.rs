//! The data-pool actor: owns the run's [`Pool`] (`<run>/pool.sqlite`) and writes what the
//! optimizer and the trainer send it: one transaction per RL step ([`RecordStep`]), the
//! episodes of an evaluation ([`RecordEvaluation`]); it answers the optimizer's read of the
//! curated exclusions at the start of every step ([`ReadExclusions`]), and the trainer's
//! truncation on resume and reset on a fresh start.
//!
//! It runs on a `SyncArbiter` with one thread, like the experience bank's actor: every
//! request is blocking SQLite I/O, and one thread serialises them on the pool's single
//! connection, in arrival order (a step's write always precedes a later truncation).

use actix::prelude::*;

use crate::error::Result;
use crate::pool::{EpisodeWrite, Exclusions, Pool, StepWrite};

pub struct DataPoolActor {
    pool: Pool,
}

impl DataPoolActor {
    pub fn new(pool: Pool) -> Self {
        DataPoolActor { pool }
    }
}

impl Actor for DataPoolActor {
    type Context = SyncContext<Self>;
}

/// Write one RL step (its `steps` row, episodes and turns) in one transaction.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct RecordStep(pub StepWrite);

impl Handler<RecordStep> for DataPoolActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: RecordStep, _: &mut Self::Context) -> Self::Result {
        self.pool.record_step(&msg.0)
    }
}

/// Write the episodes of a held-out evaluation (source `eval:<label>`).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct RecordEvaluation(pub Vec<EpisodeWrite>);

impl Handler<RecordEvaluation> for DataPoolActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: RecordEvaluation, _: &mut Self::Context) -> Self::Result {
        self.pool.record_episodes(&msg.0)
    }
}

/// The curated exclusions in force now.
#[derive(Message)]
#[rtype(result = "Result<Exclusions>")]
pub struct ReadExclusions;

impl Handler<ReadExclusions> for DataPoolActor {
    type Result = Result<Exclusions>;
    fn handle(&mut self, _: ReadExclusions, _: &mut Self::Context) -> Self::Result {
        self.pool.exclusions()
    }
}

/// Resume: delete what was written after the checkpoint ([`Pool::truncate_after`]). Returns
/// the exclusions in force (the trainer notes them).
#[derive(Message)]
#[rtype(result = "Result<Exclusions>")]
pub struct TruncatePool {
    /// RL steps done at the checkpoint.
    pub rl_steps: u64,
    /// The checkpoint's global step.
    pub global_step: u64,
    /// The evaluations the checkpoint covers (its eval.jsonl lines), when it counted them.
    pub evals: Option<u64>,
}

impl Handler<TruncatePool> for DataPoolActor {
    type Result = Result<Exclusions>;
    fn handle(&mut self, msg: TruncatePool, _: &mut Self::Context) -> Self::Result {
        self.pool
            .truncate_after(msg.rl_steps, msg.global_step, msg.evals)?;
        self.pool.exclusions()
    }
}

/// A fresh start: empty the pool ([`Pool::reset`]; exclusions stay). Returns the exclusions in
/// force.
#[derive(Message)]
#[rtype(result = "Result<Exclusions>")]
pub struct ResetPool;

impl Handler<ResetPool> for DataPoolActor {
    type Result = Result<Exclusions>;
    fn handle(&mut self, _: ResetPool, _: &mut Self::Context) -> Self::Result {
        self.pool.reset()?;
        self.pool.exclusions()
    }
}
