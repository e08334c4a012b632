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
//! It runs on a `SyncArbiter` thread: the plugin's host callbacks and the policy actor's
//! answers block it, never an async arbiter.
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
use cairn_plugin_sdk::{Algorithm, Batch, Signals, StepReport as AlgorithmReport, TurnRow};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::actors::flow::{Arrived, Collected, Proceed, StartRl, StepDone, StepOutcome};
use crate::actors::host::{HostLinks, KernelHost};
use crate::actors::policy::{call, PolicyVersion, Score, TrainStep};
use crate::actors::pool::{ReadExclusions, RecordStep};
use crate::actors::reward::RewardConfig;
use crate::actors::rollout::{collect_round, CollectGroups};
use crate::actors::skills::TakeFinished;
use crate::backend::{Sequence, StepReport, Weights};
use crate::deadline::{plugin_call, Site};
use crate::error::{Error, Result};
use crate::gateway::{PauseSampling, ResumeSampling};
use crate::loss::SftLoss;
use crate::objective::{
    all_rows, apply_kl_to_rewards, train_sequences, trained_rows, KlMode, LossReport,
    ObjectiveConfig, RlLoss,
};
use crate::pool::{EpisodeWrite, Exclusions, Source, StepWrite, TurnWrite};

/// A signals call's answer: the batch back, the plugin's answer, and the metrics it logged.
type SignalsAnswer = (Batch, cairn_plugin_sdk::Result<Signals>, Vec<(String, f64)>);

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

pub struct OptimizerActor {
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub links: HostLinks,
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
    /// The RL phase under way ([`StartRl`]); `None` before it and after a failed step.
    pub phase: Option<RlPhase>,
    /// With the gateway: generation pauses around each weight update.
    pub gateway: Option<(Recipient<PauseSampling>, Recipient<ResumeSampling>)>,
    /// With an external rollout engine: its sync counters go into each step's metrics.
    pub engine: Option<Recipient<crate::engine::ReadEngineStats>>,
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
    type Context = SyncContext<Self>;
}

/// One supervised step of the warm start: imitate every response token.
#[derive(Message)]
#[rtype(result = "Result<(StepReport, SftLoss)>")]
pub struct SupervisedStep {
    pub sequences: Vec<Sequence>,
}

impl Handler<SupervisedStep> for OptimizerActor {
    type Result = Result<(StepReport, SftLoss)>;
    fn handle(&mut self, msg: SupervisedStep, _: &mut Self::Context) -> Self::Result {
        let masks = msg
            .sequences
            .iter()
            .map(|s| vec![1u8; s.response_ids.len()])
            .collect();
        let micro = micro_batches(msg.sequences.len(), self.settings.micro_batch_rows);
        call(
            &self.sft,
            TrainStep {
                sequences: msg.sequences,
                micro_batches: micro,
                temperature: 1.0,
                loss: SftLoss::new(masks),
            },
        )?
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
        self.source = msg.collect;
        self.gateway = Some((msg.pause, msg.resume));
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
    fn handle(&mut self, msg: Arrived, _: &mut Self::Context) {
        let Some(phase) = &mut self.phase else {
            tracing::warn!(step = msg.step, "a step arrived outside the RL phase; dropped");
            return;
        };
        phase.latest = Some(phase.latest.map_or(msg.step, |l| l.max(msg.step)));
        phase.arrived.insert(msg.step, msg.collected);
        self.advance();
    }
}

impl Handler<Proceed> for OptimizerActor {
    type Result = ();
    fn handle(&mut self, msg: Proceed, _: &mut Self::Context) {
        if let Some(phase) = &mut self.phase {
            phase.acked = phase.acked.max(msg.step);
        }
        self.advance();
    }
}

impl OptimizerActor {
    /// Prepares and trains every step the rules allow now ([`super::flow`]).
    fn advance(&mut self) {
        loop {
            let Some(mut phase) = self.phase.take() else {
                return;
            };
            let step = phase.next;
            if step >= phase.end {
                self.phase = Some(phase);
                return;
            }
            if phase.prepared.is_none() {
                let Some(collected) = phase.arrived.remove(&step) else {
                    self.phase = Some(phase);
                    return;
                };
                match collected.and_then(|c| self.prepare(step, c)) {
                    Ok(prepared) => phase.prepared = Some(prepared),
                    Err(e) => {
                        // The phase ends here: nothing after a failed step is trained.
                        let _ = self.resume_sampling();
                        let _ = phase.reports.unbounded_send(StepDone {
                            step,
                            outcome: Err(e),
                        });
                        return;
                    }
                }
            }
            let lead_in = phase.latest.is_some_and(|l| l >= step + phase.lag)
                || step + phase.lag >= phase.end;
            if phase.acked < step || !lead_in {
                self.phase = Some(phase);
                return;
            }
            let prepared = phase.prepared.take().expect("prepared above");
            let outcome = self.train_prepared(
                step,
                phase.global_step,
                &phase.next_group_id,
                prepared,
            );
            let resumed = self.resume_sampling();
            let outcome = outcome.and_then(|o| resumed.map(|()| o));
            let failed = outcome.is_err();
            let _ = phase.reports.unbounded_send(StepDone { step, outcome });
            if failed {
                return;
            }
            phase.next += 1;
            phase.global_step += 1;
            self.phase = Some(phase);
        }
    }

    fn pause_sampling(&self) -> Result<()> {
        if let Some((pause, _)) = &self.gateway {
            call(pause, PauseSampling)?;
        }
        Ok(())
    }

    fn resume_sampling(&self) -> Result<()> {
        if let Some((_, resume)) = &self.gateway {
            call(resume, ResumeSampling)?;
        }
        Ok(())
    }

    /// The prepare stage: staleness, exclusions, `ℓ_old` and `ℓ_ref` of the step's batch,
    /// with the weights after the previous step's update.
    fn prepare(&self, step: u64, mut collected: Collected) -> Result<Prepared> {
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
        self.pause_sampling()?;
        let version = call(&self.version, PolicyVersion)?;
        let stale = self.drop_stale(&mut collected.batch, version);
        // Curation: rows the user excluded in the pool are skipped from this step on.
        let exclusions = call(&self.exclusions, ReadExclusions)??;
        let mut curated = Curated::default();
        curated.apply(&mut collected.batch, &exclusions, 0);
        let mismatch = self.fill_logprobs(&mut collected.batch.rows, version)?;
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
    fn train_prepared(
        &mut self,
        step: u64,
        global_step: u64,
        next_group_id: &AtomicU64,
        prepared: Prepared,
    ) -> Result<StepOutcome> {
        let Prepared {
            mut collected,
            version: version_now,
            mut stale,
            exclusions,
            mut curated,
            mismatch: mut metrics,
            started,
        } = prepared;
        let b = self.settings.tasks_per_step;
        let mut values = Map::new();

        // Under the deadline too: with rollouts running ahead, a planning call that hung on the
        // producer's side holds the algorithm.
        let algorithm = self.algorithm.clone();
        let plugin = format!("algorithm `{}`", self.links.writer);
        let site = Site {
            actor: "optimizer",
            plugin: &plugin,
            call: "requirements",
            key: "run.plugin_timeout_s",
        };
        let dynamic = plugin_call(
            self.settings.plugin_timeout,
            &site,
            || format!("RL step {step}; the plugin may be stuck in an earlier call"),
            move || algorithm.lock().requirements().dynamic_sampling,
        )?;
        let mut round = 0u32;
        let (signals, host_metrics) = loop {
            let (batch, signals, host_metrics) =
                self.signals(std::mem::take(&mut collected.batch), step, version_now)?;
            collected.batch = batch;
            let signals = signals.map_err(|error| Error::Signals { step, error })?;
            signals
                .validate_against(&collected.batch)
                .map_err(|error| Error::Signals { step, error })?;
            let groups: std::collections::HashSet<u64> =
                collected.batch.rows.iter().map(|r| r.group_id).collect();
            let kept = groups.len().saturating_sub(signals.dropped_groups.len());
            if !dynamic || kept >= b || round >= self.settings.max_resample_rounds {
                break (signals, host_metrics);
            }
            // Dynamic sampling: collect more groups; only the new rows are scored, and the
            // (pure) signals run again on the grown batch.
            round += 1;
            let want = b - kept;
            // More episodes are sampled meanwhile (the gateway's clients play them).
            self.resume_sampling()?;
            let more = collect_round(
                &self.source,
                &self.reward,
                CollectGroups {
                    step,
                    round,
                    groups: want,
                    first_group_id: next_group_id.fetch_add(want as u64, Ordering::SeqCst),
                },
            );
            self.pause_sampling()?;
            let mut more = more?;
            let more_stale = self.drop_stale(&mut more.batch, version_now);
            stale
                .removed
                .extend(more_stale.removed.into_iter().map(|(r, _)| (r, round)));
            for r in more.batch.rows.iter().chain(&more.failure_dropped) {
                curated.rounds.insert(r.trajectory_id, round);
            }
            curated.apply(&mut more.batch, &exclusions, round);
            let more_metrics = self.fill_logprobs(&mut more.batch.rows, version_now)?;
            metrics = merge_mismatch(metrics, more_metrics);
            collected.extend(more);
        };
        let mut signals = signals;
        self.fill_extra_rows(&mut signals.extra_rows)?;

        for (k, v) in crate::objective::metrics::batch_metrics(&collected.batch, &signals) {
            values.insert(k, json!(v));
        }
        for (k, v) in metrics
            .into_iter()
            .chain(signals.metrics.iter().cloned())
            .chain(host_metrics)
        {
            values.insert(k, json!(v));
        }
        values.insert("episodes/failed".into(), json!(collected.failed.len()));
        for kind in crate::rollout::FailureKind::ALL {
            let n = collected.failed.iter().filter(|f| f.kind == kind).count();
            values.insert(format!("episodes/failed_{kind}"), json!(n));
        }
        values.insert("resample_rounds".into(), json!(round));
        values.insert(
            "tokens_per_s".into(),
            json!(collected.sampled_tokens as f64 / collected.rollout_secs.max(1e-9)),
        );
        values.insert("rollout_time_s".into(), json!(collected.rollout_secs));
        values.insert("reward/unplaceable".into(), json!(collected.unplaceable));
        // Planning and per-turn metrics run once per group or turn: summed by name.
        let mut planned: Vec<(String, f64)> = Vec::new();
        for (k, v) in &collected.metrics {
            match planned.iter_mut().find(|(name, _)| name == k) {
                Some((_, total)) => *total += v,
                None => planned.push((k.clone(), *v)),
            }
        }
        for (k, v) in planned {
            values.insert(k, json!(v));
        }
        stale.insert_into(&mut values);
        if let Some(engine) = &self.engine {
            let stats = call(engine, crate::engine::ReadEngineStats)?;
            values.insert("engine/syncs".into(), json!(stats.syncs));
            values.insert("engine/probe_mismatch".into(), json!(stats.probe_mismatch));
            if let Some(v) = stats.served_version {
                values.insert("engine/served_version".into(), json!(v));
            }
        }
        values.insert("pool/excluded_rows".into(), json!(curated.rows()));
        // Excluded turns stay in the batch for the signals, their mask zeroed: not trained.
        let pool_rows = collected.batch.rows.clone();
        let seeds = std::mem::take(&mut collected.seeds);
        let failed = std::mem::take(&mut collected.failed);
        let failure_dropped = std::mem::take(&mut collected.failure_dropped);

        let t = Instant::now();
        let (steps, losses) = self.optimise(&collected.batch, &signals)?;
        let train_secs = t.elapsed().as_secs_f64();
        if let Some(loss) = losses.last() {
            if let Value::Object(m) = serde_json::to_value(loss).unwrap_or(Value::Null) {
                values.extend(m);
            }
        }
        let trained: usize = steps.iter().map(|s| s.tokens).sum();
        if let Some(s) = steps.last() {
            values.insert("grad_norm".into(), json!(s.grad_norm));
        }
        values.insert(
            "train_tokens_per_s".into(),
            json!(trained as f64 / train_secs.max(1e-9)),
        );
        values.insert("train_time_s".into(), json!(train_secs));
        let policy_version = steps.last().map_or(version_now, |s| s.policy_version);

        // The step is done: the algorithm updates its state once, from every row of the step.
        let finished = call(&self.take_finished, TakeFinished)??;
        for (k, v) in &finished.metrics {
            values.insert(k.clone(), json!(v));
        }
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
        let (links, algorithm) = (self.links.clone(), self.algorithm.clone());
        let plugin = format!("algorithm `{}`", self.links.writer);
        let site = Site {
            actor: "optimizer",
            plugin: &plugin,
            call: "observe",
            key: "run.plugin_timeout_s",
        };
        let (observed, observe_metrics) = plugin_call(
            self.settings.plugin_timeout,
            &site,
            || format!("RL step {step}"),
            move || {
                let host = KernelHost::new(&links, step, policy_version, &report.batch.rows);
                let observed = algorithm.lock().observe(&report, &host);
                (observed, host.into_metrics())
            },
        )?;
        observed?;
        for (k, v) in observe_metrics {
            values.insert(k, json!(v));
        }
        values.insert("step_time_s".into(), json!(started.elapsed().as_secs_f64()));
        let source = if self.gateway.is_some() {
            crate::pool::Source::Gateway
        } else {
            crate::pool::Source::Rollout
        };
        let terms = term_decisions(&pool_rows, &signals);
        let write = step_write(StepParts {
            step,
            global_step,
            policy_version,
            source,
            rows: pool_rows,
            advantages: signals.advantages,
            dropped_groups: &signals.dropped_groups,
            terms,
            resample_rounds: round,
            stale,
            curated,
            seeds,
            failed,
            failure_dropped,
            metrics: &values,
        });
        // Off the step's path: the pool actor writes it while the next step runs, and keeps a
        // failure for the trainer's next `Flush`.
        self.record.do_send(RecordStep(write));
        Ok(StepOutcome {
            values,
            policy_version,
        })
    }

    /// The algorithm's signals on `batch` under the plugin deadline (see [`SignalsAnswer`]).
    fn signals(&self, batch: Batch, step: u64, version: u64) -> Result<SignalsAnswer> {
        let (links, algorithm) = (self.links.clone(), self.algorithm.clone());
        let plugin = format!("algorithm `{}`", self.links.writer);
        let site = Site {
            actor: "optimizer",
            plugin: &plugin,
            call: "signals",
            key: "run.plugin_timeout_s",
        };
        let rows = batch.rows.len();
        plugin_call(
            self.settings.plugin_timeout,
            &site,
            || format!("RL step {step}, {rows} rows"),
            move || {
                let host = KernelHost::new(&links, step, version, &batch.rows);
                let signals = algorithm.lock().signals(&batch, &host);
                let metrics = host.into_metrics();
                (batch, signals, metrics)
            },
        )
    }

    /// Drops every trajectory with a row more than `max_staleness` versions behind `now`.
    fn drop_stale(&self, batch: &mut Batch, now: u64) -> Staleness {
        let k = self.settings.max_staleness;
        let mut out = Staleness::default();
        let stale_trajectories: std::collections::HashSet<u64> = batch
            .rows
            .iter()
            .filter(|r| now.saturating_sub(r.policy_version) > k)
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
            let groups: std::collections::BTreeSet<u64> =
                removed.iter().map(|r| r.group_id).collect();
            out.rows_dropped = removed.len();
            out.removed = removed.into_iter().map(|r| (r, 0)).collect();
            out.trajectories_dropped = stale_trajectories.len();
            let live: std::collections::HashSet<u64> =
                batch.rows.iter().map(|r| r.group_id).collect();
            out.groups = groups.into_iter().filter(|g| !live.contains(g)).collect();
            tracing::warn!(
                rows = out.rows_dropped,
                trajectories = out.trajectories_dropped,
                bound = k,
                "dropped rows staler than rollout.max_staleness"
            );
        }
        out
    }

    /// Fills `old_logprobs` (and `ref_logprobs` when needed) of `rows`, and applies the KL
    /// penalty to their rewards with `kl_mode = reward`. Returns the log-prob mismatch metrics
    /// of the recomputed rows.
    fn fill_logprobs(&self, rows: &mut [TurnRow], version_now: u64) -> Result<Vec<(String, f64)>> {
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
            let scored = self.score_rows(rows, &recompute, Weights::Current)?;
            let mut checked = Vec::with_capacity(recompute.len());
            for (&i, lp) in recompute.iter().zip(scored) {
                rows[i].old_logprobs = lp;
                checked.push(i);
            }
            metrics = logprob_mismatch(rows, &checked);
        }
        if self.needs_reference() {
            let all: Vec<usize> = (0..rows.len()).collect();
            let scored = self.score_rows(rows, &all, Weights::Reference)?;
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
    fn fill_extra_rows(&self, rows: &mut [TurnRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let all: Vec<usize> = (0..rows.len()).collect();
        let old = self.score_rows(rows, &all, Weights::Current)?;
        for (row, lp) in rows.iter_mut().zip(old) {
            row.old_logprobs = lp;
        }
        Ok(())
    }

    fn needs_reference(&self) -> bool {
        self.objective.uses_reference() || self.settings.plugin_reads_reference
    }

    fn score_rows(
        &self,
        rows: &[TurnRow],
        which: &[usize],
        weights: Weights,
    ) -> Result<Vec<Vec<f32>>> {
        let refs: Vec<&TurnRow> = rows.iter().collect();
        let sequences = train_sequences(&refs, which)?;
        call(
            &self.score,
            Score {
                sequences,
                temperature: self.settings.temperature,
                weights,
            },
        )?
    }

    /// The optimizer step(s) of a batch: one per mini-batch of the trained rows.
    fn optimise(
        &self,
        batch: &Batch,
        signals: &Signals,
    ) -> Result<(Vec<StepReport>, Vec<LossReport>)> {
        let rows = all_rows(batch, signals);
        let keep = trained_rows(batch, signals);
        let mut steps = Vec::new();
        let mut losses = Vec::new();
        if keep.is_empty() {
            return Ok((steps, losses));
        }
        let result = (|| {
            for mini in split_even(&keep, self.settings.updates_per_batch) {
                let loss = RlLoss::from_rows(&self.objective, &rows, signals, &mini)?;
                let sequences = train_sequences(&rows, &mini)?;
                let micro_batches = micro_batches(sequences.len(), self.settings.micro_batch_rows);
                let (report, loss) = call(
                    &self.train,
                    TrainStep {
                        sequences,
                        micro_batches,
                        temperature: self.settings.temperature,
                        loss,
                    },
                )??;
                loss.check_complete()?;
                steps.push(report);
                losses.push(loss.report());
            }
            Ok(())
        })();
        result.map(|()| (steps, losses))
    }
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
            e.failure = EpisodeWrite::failed(&source, step, global_step, f).failure;
            continue;
        }
        let mut e = EpisodeWrite::failed(&source, step, global_step, f);
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

impl Staleness {
    fn insert_into(&self, values: &mut Map<String, Value>) {
        values.insert("staleness/mean".into(), json!(self.mean));
        values.insert("staleness/max".into(), json!(self.max));
        values.insert("staleness/rows_dropped".into(), json!(self.rows_dropped));
        values.insert(
            "staleness/trajectories_dropped".into(),
            json!(self.trajectories_dropped),
        );
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
