//! The data-pool actor: owns the run's [`Pool`] (`<run>/pool.sqlite`) and writes what the
//! optimizer and the trainer send it: one transaction per RL step ([`RecordStep`]), the
//! episodes of an evaluation ([`RecordEvaluation`]); it answers the optimizer's read of the
//! curated exclusions when a step is prepared ([`ReadExclusions`]), and the trainer's
//! truncation on resume and reset on a fresh start.
//!
//! A step's write is a send: the optimizer goes on with the next step while it is written.
//! A failed write is kept and returned by the next [`Flush`], which the trainer sends before
//! every checkpoint and at the end of the RL phase, so a checkpoint never covers a step whose
//! rows the pool lacks.
//!
//! It runs on a `SyncArbiter` with one thread, like the experience bank's actor: every
//! request is blocking SQLite I/O, and one thread serialises them on the pool's single
//! connection, in arrival order (a step's write always precedes a later truncation).

use actix::prelude::*;

use cairn_stores::pool::{EpisodeWrite, Exclusions, Pool, Source, StepWrite};

use crate::error::Result;
use crate::rollout::FailedEpisode;

pub struct DataPoolActor {
    pool: Pool,
    /// The first step write that failed since the last [`Flush`].
    failed: Option<crate::error::Error>,
}

impl DataPoolActor {
    pub fn new(pool: Pool) -> Self {
        DataPoolActor { pool, failed: None }
    }
}

impl Actor for DataPoolActor {
    type Context = SyncContext<Self>;
}

/// The pool's row for an episode that failed (no turns): its failure is `<kind>: <reason>`.
pub fn failed_episode(
    source: &Source,
    step: u64,
    global_step: u64,
    failed: &FailedEpisode,
) -> EpisodeWrite {
    EpisodeWrite {
        source: source.clone(),
        step,
        global_step,
        round: 0,
        trajectory_id: failed.trajectory_id,
        group_id: failed.group_id,
        task_id: failed.task_id.clone(),
        seed: None,
        harness_episode: None,
        episode_reward: None,
        success: false,
        failure: Some(format!("{}: {}", failed.kind, failed.reason)),
        turns: Vec::new(),
    }
}

/// Write one RL step (its `steps` row, episodes and turns) in one transaction. Sent, not
/// asked: a failure is kept for the next [`Flush`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct RecordStep(pub StepWrite);

impl Handler<RecordStep> for DataPoolActor {
    type Result = ();
    fn handle(&mut self, msg: RecordStep, _: &mut Self::Context) {
        let started = std::time::Instant::now();
        let written = self.pool.record_step(&msg.0);
        tracing::debug!(
            step = msg.0.step,
            seconds = started.elapsed().as_secs_f64(),
            "data pool: step written"
        );
        if let Err(e) = written {
            tracing::error!(step = msg.0.step, "data pool: writing the step failed: {e}");
            self.failed
                .get_or_insert(crate::error::Error::Other(format!(
                    "the data pool could not record RL step {}: {e}",
                    msg.0.step
                )));
        }
    }
}

/// Waits for every write sent before it; returns the first one that failed since the last
/// flush.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct Flush;

impl Handler<Flush> for DataPoolActor {
    type Result = Result<()>;
    fn handle(&mut self, _: Flush, _: &mut Self::Context) -> Self::Result {
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Write the episodes of a held-out evaluation (source `eval:<label>`).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct RecordEvaluation(pub Vec<EpisodeWrite>);

impl Handler<RecordEvaluation> for DataPoolActor {
    type Result = Result<()>;
    fn handle(&mut self, msg: RecordEvaluation, _: &mut Self::Context) -> Self::Result {
        self.pool.record_episodes(&msg.0).map_err(Into::into)
    }
}

/// The curated exclusions in force now.
#[derive(Message)]
#[rtype(result = "Result<Exclusions>")]
pub struct ReadExclusions;

impl Handler<ReadExclusions> for DataPoolActor {
    type Result = Result<Exclusions>;
    fn handle(&mut self, _: ReadExclusions, _: &mut Self::Context) -> Self::Result {
        self.pool.exclusions().map_err(Into::into)
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
        self.pool.exclusions().map_err(Into::into)
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
        self.pool.exclusions().map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64) -> StepWrite {
        StepWrite {
            step,
            phase: "rl".into(),
            policy_version: 0,
            metrics: serde_json::Map::new(),
            decisions: serde_json::json!({}),
            episodes: Vec::new(),
        }
    }

    /// A step write is a send: its failure waits for the next `Flush`, which returns it once.
    #[test]
    fn a_failed_step_write_is_returned_by_the_next_flush_once() {
        actix::System::new().block_on(async {
            let pool = parking_lot::Mutex::new(Some(Pool::in_memory().unwrap()));
            let actor = SyncArbiter::start(1, move || {
                DataPoolActor::new(pool.lock().take().expect("started once"))
            });
            // A step number SQLite cannot hold fails the write.
            actor.do_send(RecordStep(step(u64::MAX)));
            actor.do_send(RecordStep(step(0)));
            let err = actor.send(Flush).await.unwrap().unwrap_err().to_string();
            assert!(
                err.contains(&format!("could not record RL step {}", u64::MAX)),
                "{err}"
            );
            assert!(actor.send(Flush).await.unwrap().is_ok(), "returned once");
        });
    }
}
