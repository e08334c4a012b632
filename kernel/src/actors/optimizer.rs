//! The optimizer actor, the last stage of an RL step ([`super::flow`]): it buffers the steps
//! the reward actor forwards and trains them in order, each in named stages:
//!
//! 1. **prepare** ([`OptimizerActor::prepare`]), as soon as the step's batch is in and the
//!    step before it is trained: drop rows staler than the bound, skip the curated exclusions,
//!    fill in `ℓ_old` (and `ℓ_ref` when needed);
//! 2. **signals** with resampling: the algorithm's signals, sampling more groups while dynamic
//!    sampling drops some; run only once step `t + lag` has arrived, so the algorithm's hooks
//!    see its state in one fixed order;
//! 3. **update**: the f32 objective and the policy actor's optimizer step(s);
//! 4. **observe**: the step reported to the algorithm ([`cairn_plugin_sdk::Algorithm::observe`]);
//! 5. **record**: the step's rows sent to the data pool (off the step's path: the trainer
//!    waits for the pool only before a checkpoint, [`crate::actors::pool::Flush`]), and the
//!    report to the trainer ([`StepDone`]).
//!
//! The warm start's supervised steps go through it too ([`SupervisedStep`]).
//!
//! It is an async actor on an arbiter of its own: every request to another actor (the policy's
//! scoring and update, the pool, the skill creator) is awaited, and only the algorithm's hooks
//! ([`Hooks`]: synchronous, under the plugin deadline, with host callbacks that block their
//! calling thread) hold its thread, never one another actor needs.
//!
//! Scoring is skipped where it would only repeat known numbers: with
//! `optimizer.reuse_rollout_logprobs`, a row sampled by the live weights (same version, full
//! nucleus, rollout temperature) keeps its sampled log-probs as `ℓ_old`; the reference pass
//! runs only when the objective uses the KL or a plugin reads `ref_logprobs`.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use cairn_plugin_sdk::{Batch, Signals, StepReport as AlgorithmReport, TurnRow};
use serde_json::{json, Map, Value};

use crate::actors::flow::{Arrived, Collected, Proceed, StartRl, StepDone, StepOutcome};
use crate::actors::hooks::Hooks;
use crate::actors::policy::{PolicyVersion, Score, TrainStep};
use crate::actors::pool::{ReadExclusions, RecordStep};
use crate::actors::pull::{PauseSampling, ResumeSampling};
use crate::actors::reward::{reward_rollouts, RewardConfig};
use crate::actors::rollout::CollectGroups;
use crate::actors::skills::TakeFinished;
use crate::backend::{Sequence, StepReport, Weights};
use crate::error::{Error, Result};
use crate::loss::SftLoss;
use crate::objective::{
    all_rows, apply_kl_to_rewards, train_sequences, trained_rows, KlMode, LossReport,
    ObjectiveConfig, RlLoss,
};
use cairn_stores::pool::{EpisodeWrite, Exclusions, Source, StepWrite, TurnWrite};

/// What the optimizer needs from the pipeline config.
#[derive(Clone, Debug)]
pub struct OptimizerSettings {
    /// Rows per micro-batch.
    pub micro_batch_rows: usize,
    /// Optimizer steps per batch (mini-batches); 1 is plain on-policy.
    pub updates_per_batch: usize,
    /// Rollout temperature: scoring and training use it too (trl #4159).
    pub temperature: f32,
    /// Task groups per step (B).
    pub tasks_per_step: usize,
    pub max_resample_rounds: u32,
    /// A row whose version is more than this many policy versions behind the live weights
    /// when its step trains is dropped (counted), never trained on.
    pub max_staleness: u64,
    /// Reuse a row's sampled log-probs as `ℓ_old` when the live weights sampled it. The
    /// config allows it only where the sampled log-probs are the scoring distribution's: the
    /// environment source, full nucleus (`top_p = 1`), the rollout temperature.
    pub reuse_rollout_logprobs: bool,
    /// Run the reference pass even with the KL off (a plugin reads `ref_logprobs`).
    pub plugin_reads_reference: bool,
    /// Deadline of the algorithm's `signals` and `observe` (`run.plugin_timeout_s`; `None`:
    /// no deadline): a miss stops the run with [`Error::PluginHang`].
    pub plugin_timeout: Option<std::time::Duration>,
}

/// The optimizer actor: the RL phase's state ([`RlPhase`]) and the [`Stages`] that train a
/// step. Start it on an arbiter of its own ([`super::start`]): its algorithm hooks run
/// synchronously (under the plugin deadline) and must not hold up the other actors.
pub struct OptimizerActor {
    pub stages: Stages,
    /// The RL phase under way ([`StartRl`]); `None` before it and after a failed step.
    pub phase: Option<RlPhase>,
    /// A stage is running (its future holds the actor's context).
    pub busy: bool,
    /// The arbiter the actor runs on alone, stopped when the actor stops.
    pub arbiter: Option<ArbiterHandle>,
}

/// Everything a step's stages need: the algorithm and the addresses of the actors they ask.
/// Cheap to clone (shared handles), so each stage runs as a future that owns one.
#[derive(Clone)]
pub struct Stages {
    pub hooks: Hooks,
    pub score: Recipient<Score>,
    pub version: Recipient<PolicyVersion>,
    pub train: Recipient<TrainStep<RlLoss>>,
    pub sft: Recipient<TrainStep<SftLoss>>,
    /// Where resample rounds are collected: the serving rollout actor, or the gateway.
    pub source: Recipient<CollectGroups>,
    /// The reward rules, applied to resample rounds here (the producer's steps come through
    /// the reward actor).
    pub reward: RewardConfig,
    /// The data pool: every step is sent there once it is trained.
    pub record: Recipient<RecordStep>,
    /// The curated exclusions, read when a step is prepared.
    pub exclusions: Recipient<ReadExclusions>,
    pub take_finished: Recipient<TakeFinished>,
    pub objective: ObjectiveConfig,
    pub settings: OptimizerSettings,
    /// With the gateway: generation pauses around each weight update.
    pub gateway: Option<(Recipient<PauseSampling>, Recipient<ResumeSampling>)>,
    /// With an external rollout engine: its sync counters go into each step's metrics.
    pub engine: Option<Recipient<crate::actors::engine::ReadEngineStats>>,
}

/// Where the optimizer is in the RL phase (see [`super::flow`] for the rules).
pub struct RlPhase {
    end: u64,
    lag: u64,
    /// The next step to train.
    next: u64,
    /// The trainer has written every step before this one.
    acked: u64,
    /// The `metrics.jsonl` step of `next`.
    global_step: u64,
    next_group_id: Arc<AtomicU64>,
    /// Steps arrived and not yet prepared.
    arrived: BTreeMap<u64, Result<Collected>>,
    /// The highest step arrived so far.
    latest: Option<u64>,
    /// Step `next`, prepared.
    prepared: Option<Prepared>,
    reports: futures::channel::mpsc::UnboundedSender<StepDone>,
}

/// A step after its prepare stage.
struct Prepared {
    collected: Collected,
    /// The live policy version while the step was prepared (and trains).
    version: u64,
    stale: Staleness,
    exclusions: Exclusions,
    curated: Curated,
    /// The log-prob mismatch of the rows scored.
    mismatch: Vec<(String, f64)>,
    started: Instant,
}

impl Actor for OptimizerActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(arbiter) = self.arbiter.take() {
            arbiter.stop();
        }
    }
}

/// One supervised step of the warm start: imitate every response token.
#[derive(Message)]
#[rtype(result = "Result<(StepReport, SftLoss)>")]
pub struct SupervisedStep {
    pub sequences: Vec<Sequence>,
}

impl Handler<SupervisedStep> for OptimizerActor {
    type Result = ResponseFuture<Result<(StepReport, SftLoss)>>;
    fn handle(&mut self, msg: SupervisedStep, _: &mut Self::Context) -> Self::Result {
        let masks = msg
            .sequences
            .iter()
            .map(|s| vec![1u8; s.response_ids.len()])
            .collect();
        let micro = micro_batches(msg.sequences.len(), self.stages.settings.micro_batch_rows);
        let sft = self.stages.sft.clone();
        Box::pin(async move {
            sft.send(TrainStep {
                sequences: msg.sequences,
                micro_batches: micro,
                temperature: 1.0,
                loss: SftLoss::new(masks),
            })
            .await?
        })
    }
}

/// Trains on the episodes of an OpenAI-compatible gateway: resample rounds are collected
/// through `collect`, and generation pauses around each update.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachGateway {
    pub collect: Recipient<CollectGroups>,
    pub pause: Recipient<PauseSampling>,
    pub resume: Recipient<ResumeSampling>,
}

impl Handler<AttachGateway> for OptimizerActor {
    type Result = ();
    fn handle(&mut self, msg: AttachGateway, _: &mut Self::Context) {
        self.stages.source = msg.collect;
        self.stages.gateway = Some((msg.pause, msg.resume));
    }
}

impl Handler<StartRl> for OptimizerActor {
    type Result = ();
    fn handle(&mut self, msg: StartRl, _: &mut Self::Context) {
        self.phase = Some(RlPhase {
            end: msg.end,
            lag: msg.lag,
            next: msg.first,
            acked: msg.first,
            global_step: msg.global_step,
            next_group_id: msg.next_group_id,
            arrived: BTreeMap::new(),
            latest: None,
            prepared: None,
            reports: msg.reports,
        });
    }
}

impl Handler<Arrived> for OptimizerActor {
    type Result = ();
    fn handle(&mut self, msg: Arrived, ctx: &mut Self::Context) {
        let Some(phase) = &mut self.phase else {
            tracing::warn!(
                step = msg.step,
                "a step arrived outside the RL phase; dropped"
            );
            return;
        };
        phase.latest = Some(phase.latest.map_or(msg.step, |l| l.max(msg.step)));
        phase.arrived.insert(msg.step, msg.collected);
        self.advance(ctx);
    }
}

impl Handler<Proceed> for OptimizerActor {
    type Result = ();
    fn handle(&mut self, msg: Proceed, ctx: &mut Self::Context) {
        if let Some(phase) = &mut self.phase {
            phase.acked = phase.acked.max(msg.step);
        }
        self.advance(ctx);
    }
}

impl OptimizerActor {
    /// Starts the next stage the rules allow ([`super::flow`]): prepare step `next` once its
    /// batch is in, train it once the trainer has acknowledged the step before and step
    /// `next + lag` has arrived. Each stage runs as a future that holds the actor's context
    /// (`ctx.wait`), so messages arriving meanwhile wait; its end calls `advance` again.
    fn advance(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        let Some(phase) = &mut self.phase else {
            return;
        };
        let step = phase.next;
        if step >= phase.end {
            return;
        }
        if phase.prepared.is_none() {
            let Some(collected) = phase.arrived.remove(&step) else {
                return;
            };
            self.busy = true;
            let stages = self.stages.clone();
            let prepare = async move { stages.prepare(step, collected?).await };
            ctx.wait(prepare.into_actor(self).map(move |prepared, act, ctx| {
                act.busy = false;
                match prepared {
                    Ok(p) => {
                        if let Some(phase) = &mut act.phase {
                            phase.prepared = Some(p);
                        }
                        act.advance(ctx);
                    }
                    Err(e) => act.fail(step, e, ctx),
                }
            }));
            return;
        }
        let lead_in =
            phase.latest.is_some_and(|l| l >= step + phase.lag) || step + phase.lag >= phase.end;
        if phase.acked < step || !lead_in {
            return;
        }
        let prepared = phase.prepared.take().expect("checked above");
        let (global_step, next_group_id) = (phase.global_step, phase.next_group_id.clone());
        self.busy = true;
        let stages = self.stages.clone();
        let train = async move {
            let outcome = stages
                .train(step, global_step, &next_group_id, prepared)
                .await;
            let resumed = stages.resume_sampling().await;
            outcome.and_then(|o| resumed.map(|()| o))
        };
        ctx.wait(train.into_actor(self).map(move |outcome, act, ctx| {
            act.busy = false;
            match outcome {
                Ok(outcome) => {
                    let Some(phase) = &mut act.phase else {
                        return;
                    };
                    let _ = phase.reports.unbounded_send(StepDone {
                        step,
                        outcome: Ok(outcome),
                    });
                    phase.next += 1;
                    phase.global_step += 1;
                    act.advance(ctx);
                }
                Err(e) => act.fail(step, e, ctx),
            }
        }));
    }

    /// Step `step` failed: the phase ends here (nothing after a failed step is trained), the
    /// gateway samples again, and the trainer gets the error.
    fn fail(&mut self, step: u64, error: Error, ctx: &mut Context<Self>) {
        let Some(phase) = self.phase.take() else {
            return;
        };
        let stages = self.stages.clone();
        ctx.spawn(
            async move {
                if let Err(e) = stages.resume_sampling().await {
                    tracing::warn!("resuming the gateway's sampling after a failed step: {e}");
                }
                let _ = phase.reports.unbounded_send(StepDone {
                    step,
                    outcome: Err(error),
                });
            }
            .into_actor(self),
        );
    }
}

/// What the signals stage decided.
struct Decided {
    signals: Signals,
    /// Metrics the plugin logged through the host while computing them.
    host_metrics: Vec<(String, f64)>,
    /// Resample rounds run.
    rounds: u32,
}

impl Stages {
    async fn pause_sampling(&self) -> Result<()> {
        if let Some((pause, _)) = &self.gateway {
            pause.send(PauseSampling).await?;
        }
        Ok(())
    }

    async fn resume_sampling(&self) -> Result<()> {
        if let Some((_, resume)) = &self.gateway {
            resume.send(ResumeSampling).await?;
        }
        Ok(())
    }

    /// The prepare stage: staleness, exclusions, `ℓ_old` and `ℓ_ref` of the step's batch,
    /// with the weights after the previous step's update.
    async fn prepare(&self, step: u64, mut collected: Collected) -> Result<Prepared> {
        let started = Instant::now();
        if collected.step != step {
            return Err(Error::Other(format!(
                "the reward actor delivered step {} while step {step} trains",
                collected.step
            )));
        }
        // Under the gateway the policy's thread runs one generation pass for as long as
        // clients keep joining it, and every policy call of the step (its version, the
        // scoring, the update, host services of the plugins) waits behind that pass: sampling
        // pauses from the moment the step's groups are in until the step is done.
        self.pause_sampling().await?;
        let version = self.version.send(PolicyVersion).await?;
        let stale = drop_stale(self.settings.max_staleness, &mut collected.batch, version);
        // Curation: rows the user excluded in the pool are skipped from this step on.
        let exclusions = self.exclusions.send(ReadExclusions).await??;
        let mut curated = Curated::default();
        curated.apply(&mut collected.batch, &exclusions, 0);
        let mismatch = self
            .fill_logprobs(&mut collected.batch.rows, version)
            .await?;
        Ok(Prepared {
            collected,
            version,
            stale,
            exclusions,
            curated,
            mismatch,
            started,
        })
    }

    /// The signals, update, observe and record stages of a prepared step.
    async fn train(
        &self,
        step: u64,
        global_step: u64,
        next_group_id: &AtomicU64,
        mut prepared: Prepared,
    ) -> Result<StepOutcome> {
        let decided = self.decide(step, next_group_id, &mut prepared).await?;
        let Prepared {
            mut collected,
            version,
            stale,
            curated,
            mismatch,
            started,
            ..
        } = prepared;
        let Decided {
            mut signals,
            host_metrics,
            rounds,
        } = decided;
        self.fill_extra_rows(&mut signals.extra_rows).await?;
        let mut metrics = StepMetrics::collected(&collected, &signals, &stale, rounds);
        metrics.mismatch = mismatch;
        metrics.signals = signals
            .metrics
            .iter()
            .cloned()
            .chain(host_metrics)
            .collect();
        if let Some(engine) = &self.engine {
            metrics.engine = Some(engine.send(crate::actors::engine::ReadEngineStats).await?);
        }
        metrics.excluded_rows = curated.rows();
        let seeds = std::mem::take(&mut collected.seeds);
        let failed = std::mem::take(&mut collected.failed);
        let failure_dropped = std::mem::take(&mut collected.failure_dropped);

        // Update.
        let t = Instant::now();
        let (updates, losses) = self.update(&collected.batch, &signals).await?;
        metrics.train_time_s = t.elapsed().as_secs_f64();
        let trained: usize = updates.iter().map(|s| s.tokens).sum();
        metrics.loss = losses.last().cloned();
        metrics.grad_norm = updates.last().map(|s| s.grad_norm);
        metrics.train_tokens_per_s = trained as f64 / metrics.train_time_s.max(1e-9);
        let policy_version = updates.last().map_or(version, |s| s.policy_version);

        // Observe: the algorithm updates its state once, from every row of the step.
        let finished = self.take_finished.send(TakeFinished).await??;
        metrics.reflections = finished.metrics;
        let mut dropped_groups = signals.dropped_groups.clone();
        dropped_groups.extend(stale.groups.iter().copied());
        let report = AlgorithmReport {
            step,
            policy_version,
            batch: collected.batch,
            dropped_groups,
            new_entries: finished.new_entries,
            failed_reflections: finished.failed,
        };
        let (report, observed, observe_metrics) = self.hooks.call(
            "observe",
            step,
            policy_version,
            || format!("RL step {step}"),
            report,
            |r| &r.batch.rows,
            |algorithm, report, host| algorithm.observe(report, host),
        )?;
        observed?;
        metrics.observe = observe_metrics;
        metrics.step_time_s = started.elapsed().as_secs_f64();
        let values = metrics.into_values();
        // The step's rows go to the pool as they were trained (moved, not copied): excluded
        // turns stayed in the batch for the signals with their mask zeroed.
        let pool_rows = report.batch.rows;

        // Record, off the step's path: the pool actor writes it while the next step runs,
        // and keeps a failure for the trainer's next `Flush`.
        let terms = term_decisions(&pool_rows, &signals);
        self.record.do_send(RecordStep(step_write(StepParts {
            step,
            global_step,
            policy_version,
            source: if self.gateway.is_some() {
                Source::Gateway
            } else {
                Source::Rollout
            },
            rows: pool_rows,
            advantages: signals.advantages,
            dropped_groups: &signals.dropped_groups,
            terms,
            resample_rounds: rounds,
            stale,
            curated,
            seeds,
            failed,
            failure_dropped,
            metrics: &values,
        })));
        Ok(StepOutcome {
            values,
            policy_version,
        })
    }

    /// The signals stage: the algorithm's signals on the batch, with dynamic sampling's
    /// resample rounds (more groups collected and prepared while it drops some).
    async fn decide(
        &self,
        step: u64,
        next_group_id: &AtomicU64,
        prepared: &mut Prepared,
    ) -> Result<Decided> {
        let b = self.settings.tasks_per_step;
        let version = prepared.version;
        // Under the deadline too: with rollouts running ahead, a planning call that hung on
        // the producer's side holds the algorithm.
        let (dynamic, _) = self.hooks.call_plain(
            "requirements",
            step,
            version,
            || format!("RL step {step}; the plugin may be stuck in an earlier call"),
            |algorithm, _| algorithm.requirements().dynamic_sampling,
        )?;
        let mut rounds = 0u32;
        loop {
            let rows = prepared.collected.batch.rows.len();
            let (batch, signals, host_metrics) = self.hooks.call(
                "signals",
                step,
                version,
                || format!("RL step {step}, {rows} rows"),
                std::mem::take(&mut prepared.collected.batch),
                |b| &b.rows,
                |algorithm, batch, host| algorithm.signals(batch, host),
            )?;
            prepared.collected.batch = batch;
            let signals = signals.map_err(|error| Error::Signals { step, error })?;
            signals
                .validate_against(&prepared.collected.batch)
                .map_err(|error| Error::Signals { step, error })?;
            let groups: std::collections::HashSet<u64> = prepared
                .collected
                .batch
                .rows
                .iter()
                .map(|r| r.group_id)
                .collect();
            let kept = groups.len().saturating_sub(signals.dropped_groups.len());
            if !dynamic || kept >= b || rounds >= self.settings.max_resample_rounds {
                return Ok(Decided {
                    signals,
                    host_metrics,
                    rounds,
                });
            }
            // Dynamic sampling: collect more groups; only the new rows are scored, and the
            // (pure) signals run again on the grown batch.
            rounds += 1;
            let want = b - kept;
            // More episodes are sampled meanwhile (the gateway's clients play them).
            self.resume_sampling().await?;
            let started = Instant::now();
            let more = self
                .source
                .send(CollectGroups {
                    step,
                    round: rounds,
                    groups: want,
                    first_group_id: next_group_id.fetch_add(want as u64, Ordering::SeqCst),
                })
                .await;
            self.pause_sampling().await?;
            let mut more =
                reward_rollouts(&self.reward, step, more??, started.elapsed().as_secs_f64());
            let more_stale = drop_stale(self.settings.max_staleness, &mut more.batch, version);
            prepared
                .stale
                .removed
                .extend(more_stale.removed.into_iter().map(|(r, _)| (r, rounds)));
            for r in more.batch.rows.iter().chain(&more.failure_dropped) {
                prepared.curated.rounds.insert(r.trajectory_id, rounds);
            }
            prepared
                .curated
                .apply(&mut more.batch, &prepared.exclusions, rounds);
            let more_mismatch = self.fill_logprobs(&mut more.batch.rows, version).await?;
            prepared.mismatch =
                merge_mismatch(std::mem::take(&mut prepared.mismatch), more_mismatch);
            prepared.collected.extend(more);
        }
    }

    /// Fills `old_logprobs` (and `ref_logprobs` when needed) of `rows`, and applies the KL
    /// penalty to their rewards with `kl_mode = reward`. Returns the log-prob mismatch metrics
    /// of the recomputed rows.
    async fn fill_logprobs(
        &self,
        rows: &mut [TurnRow],
        version_now: u64,
    ) -> Result<Vec<(String, f64)>> {
        let s = &self.settings;
        let recompute: Vec<usize> = (0..rows.len())
            .filter(|&i| {
                !(s.reuse_rollout_logprobs
                    && rows[i].policy_version == version_now
                    && rows[i].train_prompt_ids.is_none())
            })
            .collect();
        for (i, row) in rows.iter_mut().enumerate() {
            if recompute.binary_search(&i).is_err() {
                row.old_logprobs = row.response_logprobs.clone();
            }
        }
        let mut metrics = Vec::new();
        if !recompute.is_empty() {
            let scored = self.score_rows(rows, &recompute, Weights::Current).await?;
            let mut checked = Vec::with_capacity(recompute.len());
            for (&i, lp) in recompute.iter().zip(scored) {
                rows[i].old_logprobs = lp;
                checked.push(i);
            }
            metrics = logprob_mismatch(rows, &checked);
        }
        if self.needs_reference() {
            let all: Vec<usize> = (0..rows.len()).collect();
            let scored = self.score_rows(rows, &all, Weights::Reference).await?;
            for (row, lp) in rows.iter_mut().zip(scored) {
                row.ref_logprobs = lp;
            }
        }
        if self.objective.kl_mode == KlMode::Reward && self.objective.uses_reference() {
            let mut batch = Batch {
                step: 0,
                rows: rows.to_vec(),
            };
            let old: Vec<Vec<f32>> = batch.rows.iter().map(|r| r.old_logprobs.clone()).collect();
            let reference: Vec<Vec<f32>> =
                batch.rows.iter().map(|r| r.ref_logprobs.clone()).collect();
            apply_kl_to_rewards(&self.objective, &mut batch, &old, &reference)?;
            rows.clone_from_slice(&batch.rows);
        }
        Ok(metrics)
    }

    /// `ℓ_old` of a plugin's extra rows, under their training prompts. No `ℓ_ref`: an extra
    /// row takes no part in the KL (nor in the surrogate), only in the aux and teacher terms
    /// that target it, so no reference pass is spent on it.
    async fn fill_extra_rows(&self, rows: &mut [TurnRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let all: Vec<usize> = (0..rows.len()).collect();
        let old = self.score_rows(rows, &all, Weights::Current).await?;
        for (row, lp) in rows.iter_mut().zip(old) {
            row.old_logprobs = lp;
        }
        Ok(())
    }

    fn needs_reference(&self) -> bool {
        self.objective.uses_reference() || self.settings.plugin_reads_reference
    }

    async fn score_rows(
        &self,
        rows: &[TurnRow],
        which: &[usize],
        weights: Weights,
    ) -> Result<Vec<Vec<f32>>> {
        let refs: Vec<&TurnRow> = rows.iter().collect();
        let sequences = train_sequences(&refs, which)?;
        self.score
            .send(Score {
                sequences,
                temperature: self.settings.temperature,
                weights,
            })
            .await?
    }

    /// The update stage: the optimizer step(s) of a batch, one per mini-batch of the trained
    /// rows.
    async fn update(
        &self,
        batch: &Batch,
        signals: &Signals,
    ) -> Result<(Vec<StepReport>, Vec<LossReport>)> {
        let rows = all_rows(batch, signals);
        let keep = trained_rows(batch, signals);
        let mut updates = Vec::new();
        let mut losses = Vec::new();
        if keep.is_empty() {
            return Ok((updates, losses));
        }
        for mini in split_even(&keep, self.settings.updates_per_batch) {
            let loss = RlLoss::from_rows(&self.objective, &rows, signals, &mini)?;
            let sequences = train_sequences(&rows, &mini)?;
            let micro_batches = micro_batches(sequences.len(), self.settings.micro_batch_rows);
            let (report, loss) = self
                .train
                .send(TrainStep {
                    sequences,
                    micro_batches,
                    temperature: self.settings.temperature,
                    loss,
                })
                .await??;
            loss.check_complete()?;
            updates.push(report);
            losses.push(loss.report());
        }
        Ok((updates, losses))
    }
}

/// The metrics of one RL step, filled stage by stage and written as its `metrics.jsonl` line
/// by [`StepMetrics::into_values`]. Plugin metrics keep the names the plugins gave them.
#[derive(Debug, Default)]
struct StepMetrics {
    /// [`crate::objective::metrics::batch_metrics`]: rewards, success, advantages, lengths.
    batch: Vec<(String, f64)>,
    /// `logprob_mismatch/*` of the rows scored ([`logprob_mismatch`]).
    mismatch: Vec<(String, f64)>,
    /// The signals' own metrics, then what the plugin logged through the host meanwhile.
    signals: Vec<(String, f64)>,
    /// Episodes cut by a fault, in all and by kind.
    failed: usize,
    failed_by_kind: Vec<(crate::rollout::FailureKind, usize)>,
    resample_rounds: u32,
    /// Sampling throughput and wall time of the step's rollouts.
    tokens_per_s: f64,
    rollout_time_s: f64,
    /// Trajectories whose reward had no policy token to go on.
    unplaceable: usize,
    /// What planning and the per-turn hook logged, summed by name.
    planned: Vec<(String, f64)>,
    staleness: Staleness,
    engine: Option<crate::actors::engine::EngineStats>,
    /// Rows the data pool's curated exclusions kept out.
    excluded_rows: usize,
    /// The last mini-batch's loss report.
    loss: Option<LossReport>,
    grad_norm: Option<f32>,
    train_tokens_per_s: f64,
    train_time_s: f64,
    /// The skill creator's counters (`skills/*`).
    reflections: Vec<(String, f64)>,
    /// What the plugin logged in `observe`.
    observe: Vec<(String, f64)>,
    step_time_s: f64,
}

impl StepMetrics {
    /// The metrics the collected rows and the signals give.
    fn collected(
        collected: &Collected,
        signals: &Signals,
        stale: &Staleness,
        rounds: u32,
    ) -> StepMetrics {
        // Planning and per-turn metrics run once per group or turn: summed by name.
        let mut planned: Vec<(String, f64)> = Vec::new();
        for (k, v) in &collected.metrics {
            match planned.iter_mut().find(|(name, _)| name == k) {
                Some((_, total)) => *total += v,
                None => planned.push((k.clone(), *v)),
            }
        }
        StepMetrics {
            batch: crate::objective::metrics::batch_metrics(&collected.batch, signals),
            failed: collected.failed.len(),
            failed_by_kind: crate::rollout::FailureKind::ALL
                .into_iter()
                .map(|kind| {
                    let n = collected.failed.iter().filter(|f| f.kind == kind).count();
                    (kind, n)
                })
                .collect(),
            resample_rounds: rounds,
            tokens_per_s: collected.sampled_tokens as f64 / collected.rollout_secs.max(1e-9),
            rollout_time_s: collected.rollout_secs,
            unplaceable: collected.unplaceable,
            planned,
            staleness: Staleness {
                mean: stale.mean,
                max: stale.max,
                rows_dropped: stale.rows_dropped,
                trajectories_dropped: stale.trajectories_dropped,
                ..Staleness::default()
            },
            ..StepMetrics::default()
        }
    }

    /// The `metrics.jsonl` values, in a fixed order (a later name replaces an earlier one).
    fn into_values(self) -> Map<String, Value> {
        let mut values = Map::new();
        let mut put = |k: String, v: Value| {
            values.insert(k, v);
        };
        for (k, v) in self
            .batch
            .into_iter()
            .chain(self.mismatch)
            .chain(self.signals)
        {
            put(k, json!(v));
        }
        put("episodes/failed".into(), json!(self.failed));
        for (kind, n) in self.failed_by_kind {
            put(format!("episodes/failed_{kind}"), json!(n));
        }
        put("resample_rounds".into(), json!(self.resample_rounds));
        put("tokens_per_s".into(), json!(self.tokens_per_s));
        put("rollout_time_s".into(), json!(self.rollout_time_s));
        put("reward/unplaceable".into(), json!(self.unplaceable));
        for (k, v) in self.planned {
            put(k, json!(v));
        }
        let s = &self.staleness;
        put("staleness/mean".into(), json!(s.mean));
        put("staleness/max".into(), json!(s.max));
        put("staleness/rows_dropped".into(), json!(s.rows_dropped));
        put(
            "staleness/trajectories_dropped".into(),
            json!(s.trajectories_dropped),
        );
        if let Some(e) = self.engine {
            put("engine/syncs".into(), json!(e.syncs));
            put("engine/probe_mismatch".into(), json!(e.probe_mismatch));
            if let Some(v) = e.served_version {
                put("engine/served_version".into(), json!(v));
            }
        }
        put("pool/excluded_rows".into(), json!(self.excluded_rows));
        if let Some(Value::Object(m)) = self
            .loss
            .map(|l| serde_json::to_value(l).unwrap_or_default())
        {
            for (k, v) in m {
                put(k, v);
            }
        }
        if let Some(g) = self.grad_norm {
            put("grad_norm".into(), json!(g));
        }
        put("train_tokens_per_s".into(), json!(self.train_tokens_per_s));
        put("train_time_s".into(), json!(self.train_time_s));
        for (k, v) in self.reflections.into_iter().chain(self.observe) {
            put(k, json!(v));
        }
        put("step_time_s".into(), json!(self.step_time_s));
        values
    }
}

/// Drops every trajectory with a row more than `bound` versions behind `now`.
fn drop_stale(bound: u64, batch: &mut Batch, now: u64) -> Staleness {
    let mut out = Staleness::default();
    let stale_trajectories: std::collections::HashSet<u64> = batch
        .rows
        .iter()
        .filter(|r| now.saturating_sub(r.policy_version) > bound)
        .map(|r| r.trajectory_id)
        .collect();
    let mut sum = 0u64;
    for r in &batch.rows {
        let lag = now.saturating_sub(r.policy_version);
        out.max = out.max.max(lag);
        sum += lag;
    }
    out.mean = if batch.rows.is_empty() {
        0.0
    } else {
        sum as f64 / batch.rows.len() as f64
    };
    if !stale_trajectories.is_empty() {
        let (removed, kept): (Vec<TurnRow>, Vec<TurnRow>) = std::mem::take(&mut batch.rows)
            .into_iter()
            .partition(|r| stale_trajectories.contains(&r.trajectory_id));
        batch.rows = kept;
        let groups: std::collections::BTreeSet<u64> = removed.iter().map(|r| r.group_id).collect();
        out.rows_dropped = removed.len();
        out.removed = removed.into_iter().map(|r| (r, 0)).collect();
        out.trajectories_dropped = stale_trajectories.len();
        let live: std::collections::HashSet<u64> = batch.rows.iter().map(|r| r.group_id).collect();
        out.groups = groups.into_iter().filter(|g| !live.contains(g)).collect();
        tracing::warn!(
            rows = out.rows_dropped,
            trajectories = out.trajectories_dropped,
            bound,
            "dropped rows staler than rollout.max_staleness"
        );
    }
    out
}

/// What the staleness bound did to a step's batch.
#[derive(Debug, Default)]
struct Staleness {
    /// Mean and max of `live version − row version` over the rows received.
    mean: f64,
    max: u64,
    rows_dropped: usize,
    trajectories_dropped: usize,
    /// Groups none of whose rows is left.
    groups: Vec<u64>,
    /// The dropped rows, with their resample round (the data pool records them untrained).
    removed: Vec<(TurnRow, u32)>,
}

/// What the step's pool rows need beyond the batch: the rows curation skipped (whole
/// trajectories, out of the batch), the original masks of excluded turns (kept in the batch
/// with their mask zeroed), and the resample round of each trajectory.
#[derive(Debug, Default)]
struct Curated {
    /// Excluded trajectories' rows, with their round and reason.
    removed: Vec<(TurnRow, u32, String)>,
    /// `(trajectory, turn)` → (original mask, reason) of excluded turns.
    turns: HashMap<(u64, u32), (Vec<u8>, String)>,
    /// Trajectory → resample round (absent: round 0).
    rounds: HashMap<u64, u32>,
}

impl Curated {
    /// Skips what `exclusions` name in `batch` (collected in resample round `round`): the
    /// rows of an excluded trajectory (episode, task, harness) leave the batch; an excluded
    /// turn stays, for its group's statistics, with its mask zeroed so none of its tokens
    /// trains.
    fn apply(&mut self, batch: &mut Batch, exclusions: &Exclusions, round: u32) {
        if exclusions.is_empty() {
            return;
        }
        let mut kept = Vec::with_capacity(batch.rows.len());
        for mut row in std::mem::take(&mut batch.rows) {
            if let Some(reason) = exclusions.trajectory_reason(&row) {
                self.removed.push((row, round, reason));
                continue;
            }
            if let Some(reason) = exclusions.turn_reason(&row) {
                let mask =
                    std::mem::replace(&mut row.response_mask, vec![0; row.response_ids.len()]);
                self.turns
                    .insert((row.trajectory_id, row.turn), (mask, reason));
            }
            kept.push(row);
        }
        batch.rows = kept;
    }

    /// Rows skipped by curation (whole trajectories and single turns): `pool/excluded_rows`.
    fn rows(&self) -> usize {
        self.removed.len() + self.turns.len()
    }
}

/// Everything one step writes to the data pool.
struct StepParts<'a> {
    step: u64,
    global_step: u64,
    policy_version: u64,
    source: Source,
    /// The trained batch's rows (excluded turns with their mask zeroed).
    rows: Vec<TurnRow>,
    /// Per row of `rows` (then the extra rows): the signals' advantages.
    advantages: Vec<Vec<f32>>,
    dropped_groups: &'a [u64],
    /// The plugins' per-row decisions beyond advantages ([`term_decisions`]).
    terms: Value,
    resample_rounds: u32,
    stale: Staleness,
    curated: Curated,
    seeds: Vec<(u64, u64)>,
    failed: Vec<crate::rollout::FailedEpisode>,
    /// Rows of groups the failure rule dropped ([`Collected::failure_dropped`]).
    failure_dropped: Vec<TurnRow>,
    metrics: &'a Map<String, Value>,
}

/// What the stack decided per row beyond advantages, for the data pool's step decisions, with
/// rows named `[trajectory_id, turn]` (indices past `rows` are the signals' extra rows):
/// - `teacher_terms`: per term its name, coefficient, form, and the rows it distills with the
///   kind of teacher (`context` or `fixed`) and how many tokens carry a non-zero weight: the
///   admitted pairs of EDGE-style distillation, the routing of OPID-style teacher targets;
/// - `aux_terms`: per term its name, coefficient and the rows with a non-zero coefficient;
/// - `extra_rows`: the auxiliary rows trained under another prompt, each with the row it
///   copies and its training prompt's length.
fn term_decisions(rows: &[TurnRow], signals: &Signals) -> Value {
    let all: Vec<&TurnRow> = rows.iter().chain(&signals.extra_rows).collect();
    let name = |i: usize| {
        all.get(i)
            .map_or(Value::Null, |r| json!([r.trajectory_id, r.turn]))
    };
    let teacher: Vec<Value> = signals
        .teacher
        .iter()
        .map(|t| {
            let targets: Vec<Value> = t
                .targets
                .iter()
                .map(|g| {
                    let kind = match g.source {
                        cairn_plugin_sdk::TeacherSource::Context { .. } => "context",
                        cairn_plugin_sdk::TeacherSource::Fixed { .. } => "fixed",
                    };
                    json!({
                        "row": name(g.row),
                        "teacher": kind,
                        "tokens": g.weights.iter().filter(|w| **w != 0.0).count(),
                    })
                })
                .collect();
            json!({"name": t.name, "coef": t.coef, "form": t.form, "targets": targets})
        })
        .collect();
    let aux: Vec<Value> = signals
        .aux
        .iter()
        .map(|a| {
            let rows: Vec<Value> = a
                .coefficients
                .iter()
                .enumerate()
                .filter(|(_, c)| c.iter().any(|x| *x != 0.0))
                .map(|(i, _)| name(i))
                .collect();
            json!({"name": a.name, "coef": a.coef, "rows": rows})
        })
        .collect();
    let extra: Vec<Value> = signals
        .extra_rows
        .iter()
        .map(|r| {
            json!({
                "row": [r.trajectory_id, r.turn],
                "train_prompt_tokens": r.train_prompt_ids.as_ref().map(Vec::len),
            })
        })
        .collect();
    json!({"teacher_terms": teacher, "aux_terms": aux, "extra_rows": extra})
}

/// The step's [`StepWrite`]: trained rows, dropped, stale and excluded rows (untrained, with
/// the reason), failed episodes, and the decisions JSON.
fn step_write(p: StepParts<'_>) -> StepWrite {
    let StepParts {
        step,
        global_step,
        policy_version,
        source,
        rows,
        mut advantages,
        dropped_groups,
        terms,
        resample_rounds,
        stale,
        mut curated,
        seeds,
        failed,
        failure_dropped,
        metrics,
    } = p;
    advantages.resize(rows.len().max(advantages.len()), Vec::new());
    let dropped: std::collections::HashSet<u64> = dropped_groups.iter().copied().collect();
    let mut excluded_turns = Vec::new();
    let mut turns: Vec<TurnWrite> = Vec::with_capacity(rows.len());
    for (mut row, adv) in rows.into_iter().zip(advantages) {
        let mut skip = dropped
            .contains(&row.group_id)
            .then(|| "dropped group (the algorithm's signals)".to_string());
        if let Some((mask, reason)) = curated.turns.remove(&(row.trajectory_id, row.turn)) {
            row.response_mask = mask;
            excluded_turns.push(json!([row.trajectory_id, row.turn]));
            skip = Some(reason);
        }
        turns.push(TurnWrite {
            row,
            advantages: (!adv.is_empty()).then_some(adv),
            trained: skip.is_none(),
            skip_reason: skip,
        });
    }
    let stale_trajectories: std::collections::BTreeSet<u64> =
        stale.removed.iter().map(|(r, _)| r.trajectory_id).collect();
    let excluded_trajectories: std::collections::BTreeSet<u64> = curated
        .removed
        .iter()
        .map(|(r, _, _)| r.trajectory_id)
        .collect();
    for (r, round) in stale.removed {
        curated.rounds.insert(r.trajectory_id, round);
        turns.push(TurnWrite {
            row: r,
            advantages: None,
            trained: false,
            skip_reason: Some("stale (older than rollout.max_staleness)".into()),
        });
    }
    for (r, round, reason) in curated.removed {
        curated.rounds.insert(r.trajectory_id, round);
        turns.push(TurnWrite {
            row: r,
            advantages: None,
            trained: false,
            skip_reason: Some(reason),
        });
    }
    for r in failure_dropped {
        turns.push(TurnWrite {
            row: r,
            advantages: None,
            trained: false,
            skip_reason: Some(
                "group dropped: an episode of it failed (rollout.on_episode_failure = \"drop_group\")"
                    .into(),
            ),
        });
    }
    let seeds: HashMap<u64, u64> = seeds.into_iter().collect();
    let mut episodes = EpisodeWrite::group(&source, step, global_step, turns);
    for e in &mut episodes {
        e.round = curated.rounds.get(&e.trajectory_id).copied().unwrap_or(0);
        e.seed = seeds.get(&e.trajectory_id).copied();
    }
    let failed_ids: Vec<u64> = failed.iter().map(|f| f.trajectory_id).collect();
    for f in &failed {
        // A failed episode that played turns (kept as a zero-reward member, or dropped with
        // its group) is one episode with those turns and the failure; one that failed before
        // its first turn has none.
        if let Some(e) = episodes
            .iter_mut()
            .find(|e| e.trajectory_id == f.trajectory_id)
        {
            e.failure = super::pool::failed_episode(&source, step, global_step, f).failure;
            continue;
        }
        let mut e = super::pool::failed_episode(&source, step, global_step, f);
        e.seed = seeds.get(&f.trajectory_id).copied();
        e.round = curated.rounds.get(&f.trajectory_id).copied().unwrap_or(0);
        episodes.push(e);
    }
    let decisions = json!({
        "dropped_groups": dropped_groups,
        "stale_groups": stale.groups,
        "stale_trajectories": stale_trajectories,
        "excluded_trajectories": excluded_trajectories,
        "excluded_turns": excluded_turns,
        "resample_rounds": resample_rounds,
        "extra_rows": terms["extra_rows"],
        "teacher_terms": terms["teacher_terms"],
        "aux_terms": terms["aux_terms"],
        "failed_episodes": failed_ids,
    });
    StepWrite {
        step,
        phase: "rl".into(),
        policy_version,
        metrics: metrics.clone(),
        decisions,
        episodes,
    }
}

/// Consecutive ranges of at most `size` rows covering `0..n`.
pub fn micro_batches(n: usize, size: usize) -> Vec<Range<usize>> {
    let size = size.max(1);
    (0..n).step_by(size).map(|s| s..(s + size).min(n)).collect()
}

/// Splits `items` into `parts` contiguous, nearly equal chunks (fewer when there are fewer
/// items).
fn split_even(items: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let parts = parts.clamp(1, items.len().max(1));
    let base = items.len() / parts;
    let extra = items.len() % parts;
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for p in 0..parts {
        let len = base + usize::from(p < extra);
        out.push(items[start..start + len].to_vec());
        start += len;
    }
    out
}

/// How far the trainer's recomputed log-probs are from the sampled ones, over the masked
/// tokens of the rows `which`: `logprob_mismatch/mean_abs` and `/max_abs` (with the token
/// count, so two rounds merge exactly). Large values mean rollout and trainer disagree
/// (temperature, numerics, or wrong ids) and every importance ratio is off.
fn logprob_mismatch(rows: &[TurnRow], which: &[usize]) -> Vec<(String, f64)> {
    let (mut sum, mut max, mut n) = (0.0f64, 0.0f64, 0usize);
    for &i in which {
        let row = &rows[i];
        for ((&m, &sampled), &now) in row
            .response_mask
            .iter()
            .zip(&row.response_logprobs)
            .zip(&row.old_logprobs)
        {
            if m == 1 {
                let d = f64::from((sampled - now).abs());
                sum += d;
                max = max.max(d);
                n += 1;
            }
        }
    }
    let mean = if n == 0 { 0.0 } else { sum / n as f64 };
    vec![
        ("logprob_mismatch/mean_abs".into(), mean),
        ("logprob_mismatch/max_abs".into(), max),
        ("logprob_mismatch/tokens".into(), n as f64),
    ]
}

/// Merges the mismatch metrics of two scoring passes (token-weighted mean, max of maxes).
fn merge_mismatch(a: Vec<(String, f64)>, b: Vec<(String, f64)>) -> Vec<(String, f64)> {
    let get = |v: &[(String, f64)], k: &str| v.iter().find(|(n, _)| n == k).map(|p| p.1);
    let (Some(na), Some(nb)) = (
        get(&a, "logprob_mismatch/tokens"),
        get(&b, "logprob_mismatch/tokens"),
    ) else {
        return if a.is_empty() { b } else { a };
    };
    let n = na + nb;
    let mean = if n == 0.0 {
        0.0
    } else {
        (get(&a, "logprob_mismatch/mean_abs").unwrap_or(0.0) * na
            + get(&b, "logprob_mismatch/mean_abs").unwrap_or(0.0) * nb)
            / n
    };
    let max = get(&a, "logprob_mismatch/max_abs")
        .unwrap_or(0.0)
        .max(get(&b, "logprob_mismatch/max_abs").unwrap_or(0.0));
    vec![
        ("logprob_mismatch/mean_abs".into(), mean),
        ("logprob_mismatch/max_abs".into(), max),
        ("logprob_mismatch/tokens".into(), n),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_decisions_name_each_terms_rows_by_trajectory_and_turn() {
        use cairn_plugin_sdk::{AuxTerm, TeacherForm, TeacherSource, TeacherTarget, TeacherTerm};
        let row = |trajectory_id, turn| TurnRow {
            trajectory_id,
            turn,
            response_ids: vec![1, 2, 3],
            response_mask: vec![1, 1, 1],
            ..TurnRow::default()
        };
        let rows = vec![row(4, 0), row(4, 1), row(9, 0)];
        let mut extra = row(9, 0);
        extra.train_prompt_ids = Some(vec![5; 7]);
        let signals = Signals {
            teacher: vec![TeacherTerm {
                name: "distill".into(),
                coef: 0.5,
                form: TeacherForm::SampledReverseKl,
                targets: vec![
                    TeacherTarget {
                        row: 1,
                        weights: vec![0.0, 1.0, 1.0],
                        source: TeacherSource::Context {
                            context_ids: vec![1],
                        },
                    },
                    TeacherTarget {
                        row: 3,
                        weights: vec![1.0; 3],
                        source: TeacherSource::Fixed {
                            logprobs: vec![-1.0; 3],
                            top_ids: Vec::new(),
                            top_logprobs: Vec::new(),
                        },
                    },
                ],
            }],
            aux: vec![AuxTerm {
                name: "credit".into(),
                coef: 1.0,
                coefficients: vec![
                    vec![0.0; 3],
                    vec![0.0, 0.2, 0.0],
                    vec![0.0; 3],
                    vec![1.0; 3],
                ],
            }],
            extra_rows: vec![extra],
            ..Signals::default()
        };
        let d = term_decisions(&rows, &signals);
        assert_eq!(
            d["teacher_terms"][0]["targets"],
            json!([
                {"row": [4, 1], "teacher": "context", "tokens": 2},
                {"row": [9, 0], "teacher": "fixed", "tokens": 3},
            ])
        );
        assert_eq!(d["teacher_terms"][0]["coef"], json!(0.5));
        assert_eq!(d["aux_terms"][0]["rows"], json!([[4, 1], [9, 0]]));
        assert_eq!(
            d["extra_rows"],
            json!([{"row": [9, 0], "train_prompt_tokens": 7}])
        );
    }

    #[test]
    fn micro_batches_cover_every_row_once() {
        assert_eq!(micro_batches(5, 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(micro_batches(0, 3), Vec::<Range<usize>>::new());
    }

    #[test]
    fn split_even_balances_parts() {
        assert_eq!(
            split_even(&[1, 2, 3, 4, 5], 2),
            vec![vec![1, 2, 3], vec![4, 5]]
        );
        assert_eq!(split_even(&[1], 4), vec![vec![1]]);
    }

    #[test]
    fn mismatch_of_two_rounds_merges_token_weighted() {
        let a = vec![
            ("logprob_mismatch/mean_abs".to_string(), 0.1),
            ("logprob_mismatch/max_abs".to_string(), 0.3),
            ("logprob_mismatch/tokens".to_string(), 3.0),
        ];
        let b = vec![
            ("logprob_mismatch/mean_abs".to_string(), 0.5),
            ("logprob_mismatch/max_abs".to_string(), 0.5),
            ("logprob_mismatch/tokens".to_string(), 1.0),
        ];
        let m = merge_mismatch(a, b);
        assert!((m[0].1 - 0.2).abs() < 1e-12, "{m:?}");
        assert_eq!(m[1].1, 0.5);
        assert_eq!(m[2].1, 4.0);
    }
}
