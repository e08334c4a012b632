//! The training driver: runs the main job's phases over a started [`Pipeline`].
//!
//! 1. **Resume** from the run directory's last checkpoint, if any.
//! 2. **Warm start** (optional): expert demonstrations on training tasks, supervised epochs,
//!    then a held-out evaluation (`after_warm_start`).
//! 3. **RL**: each step flows producer → reward → optimizer ([`crate::actors::flow`]), with
//!    rollouts at most `rollout.max_staleness` policy versions ahead. The driver carries no
//!    rows: it hands out the credits ([`Produce`], [`Proceed`]) and writes what each step
//!    reports: `metrics.jsonl`, checkpoints, evaluations.
//! 4. A final held-out evaluation (`after_rl`).
//!
//! Held-out (test-split) tasks are only ever played by evaluations, never trained on. The host
//! follows progress through [`Event`]s.

use std::sync::Arc;
use std::time::Instant;

use cairn_plugin_sdk::Algorithm;
use parking_lot::Mutex;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Map, Value};

use crate::actors::bank::{CheckpointBank, ResetBank, RestoreBank};
use crate::actors::flow::{Proceed, Produce, StartRl, StepDone};
use crate::actors::optimizer::SupervisedStep;
use crate::actors::policy::{
    ConfigureOptimizer, ExportModel, LoadCheckpoint, RetainVersions, SaveCheckpoint,
    SnapshotReference,
};
use crate::actors::rollout::{CollectDemonstrations, EvalReport, Evaluate};
use crate::actors::Pipeline;
use crate::backend::{OptimizerSettings, Sequence};
use crate::config::PipelineConfig;
use crate::error::{Error, Result};
use crate::rollout::mix;
use crate::run::{Phase, RunDir, StepRecord, TrainerState};

/// Progress reports for the host (progress bars, logs).
#[derive(Clone, Debug)]
pub enum Event {
    /// A phase with `total` units of work started.
    PhaseStarted {
        name: String,
        total: u64,
    },
    /// `done` units of the current phase are finished.
    Progress {
        done: u64,
        message: String,
    },
    PhaseFinished,
    /// A training step finished (also written to `metrics.jsonl`).
    Step(StepRecord),
    /// A held-out evaluation finished (also written to `eval.jsonl`).
    Eval {
        label: String,
        report: EvalReport,
    },
    /// Something worth a line in the log.
    Note(String),
}

/// The metrics an RL step's progress message shows, by their `metrics.jsonl` names
/// ([`crate::objective::metrics::batch_metrics`]), with the label and the digits of each.
const STEP_MESSAGE_METRICS: [(&str, &str, usize); 2] = [
    ("reward/episode_mean", "reward", 3),
    ("success_rate", "success", 2),
];

/// The progress message of an RL step: a pure function of the step's metrics (the values of
/// its `metrics.jsonl` line), so what the bar prints is what the file holds. A metric the step
/// lacks prints as `-`, not as a number.
pub fn step_message(values: &Map<String, Value>) -> String {
    STEP_MESSAGE_METRICS
        .iter()
        .map(
            |&(name, label, digits)| match values.get(name).and_then(Value::as_f64) {
                Some(x) => format!("{label} {x:.digits$}"),
                None => format!("{label} -"),
            },
        )
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a finished run reports.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Every evaluation of the run, in order (resumed runs include earlier ones).
    pub evals: Vec<(String, EvalReport)>,
    pub rl_steps: u64,
    pub resumed_from: Option<std::path::PathBuf>,
}

/// Why a stop was asked for ([`request_stop`]); `None` while the run may go on.
static STOP: std::sync::Mutex<Option<&'static str>> = std::sync::Mutex::new(None);

/// Asks a running [`Trainer`] to stop at the next step boundary (the host calls it on SIGINT
/// or SIGTERM). The step in flight finishes; in RL the trainer then writes a checkpoint of
/// that step (unless it just did) and returns [`Error::Interrupted`]; in the warm start it
/// returns at once, and the resume starts again from the last epoch's checkpoint. A step that
/// is still waiting for a gateway's harness episodes is not in flight: the wait ends, and the
/// run stops after the last finished step. `reason` ("interrupted (SIGINT)") opens the error
/// message.
pub fn request_stop(reason: &'static str) {
    *STOP
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason);
}

/// The reason of a stop [`request_stop`] asked for, if any.
pub fn stop_requested() -> Option<&'static str> {
    *STOP
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The driver. Build it after [`crate::actors::start`].
pub struct Trainer<'o> {
    pub config: PipelineConfig,
    pub pipeline: Pipeline,
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub run: RunDir,
    pub observer: &'o mut dyn FnMut(Event),
    /// The tokenizer files to ship with the final model: at the end of RL the policy is
    /// exported to `<run>/model/` in Hugging Face format (`None`: no export).
    pub export_tokenizer_dir: Option<std::path::PathBuf>,
}

async fn ask<A, M>(addr: &actix::Addr<A>, msg: M) -> Result<M::Result>
where
    A: actix::Actor + actix::Handler<M>,
    A::Context: actix::dev::ToEnvelope<A, M>,
    M: actix::Message + Send + 'static,
    M::Result: Send,
{
    addr.send(msg).await.map_err(Error::from)
}

impl Trainer<'_> {
    fn emit(&mut self, event: Event) {
        (self.observer)(event)
    }

    /// Runs the whole job.
    pub async fn run(&mut self) -> Result<Summary> {
        let mut summary = Summary::default();
        let mut state = TrainerState::default();
        self.run.clear_staging()?;
        let point = if self.config.run.resume {
            self.run.resume_point()?
        } else {
            None
        };
        match point {
            Some(point) => {
                // Printed once, by the observer (not also as a log line).
                for warning in &point.warnings {
                    self.emit(Event::Note(format!("warning: {warning}")));
                }
                let dir = point.dir;
                state = RunDir::load_state(&dir)?;
                // A finished run asked for more steps goes back to RL.
                if state.phase == Phase::Done && state.rl_steps < self.config.run.steps {
                    state.phase = Phase::Rl;
                }
                let version = ask(
                    &self.pipeline.policy,
                    LoadCheckpoint {
                        dir: dir.join("policy"),
                    },
                )
                .await??;
                // A checkpoint with a run id (every one since run ids) was written with its
                // bank snapshot and algorithm state: a missing one is damage, not an old
                // format, and resuming without it would silently drop the bank or the
                // plugins' state.
                if !state.run_id.is_empty() {
                    for (file, what) in [
                        (cairn_stores::bank::snapshot_path(&dir), "bank snapshot"),
                        (dir.join("algorithm.state"), "algorithm state"),
                    ] {
                        if !file.is_file() {
                            return Err(Error::Other(format!(
                                "{}: the checkpoint's {what} is missing (every checkpoint of \
                                 this run wrote one); put the file back, resume from an \
                                 earlier checkpoint (point checkpoints/latest at it), or start \
                                 over with --no-resume",
                                file.display()
                            )));
                        }
                    }
                }
                // The bank as it was at the checkpoint; a checkpoint from before the bank
                // existed had none, so the bank starts empty.
                if cairn_stores::bank::snapshot_path(&dir).is_file() {
                    ask(
                        &self.pipeline.bank,
                        RestoreBank {
                            dir: dir.clone(),
                            run_id: run_id(&state),
                        },
                    )
                    .await??;
                } else {
                    ask(
                        &self.pipeline.bank,
                        ResetBank {
                            run_id: run_id(&state),
                        },
                    )
                    .await??;
                }
                let algo_state = dir.join("algorithm.state");
                if algo_state.is_file() {
                    let text = std::fs::read_to_string(&algo_state)
                        .map_err(|e| Error::io(&algo_state, e))?;
                    self.algorithm
                        .lock()
                        .load_state(&text)
                        .map_err(|e| Error::Other(format!("{}: {e}", algo_state.display())))?;
                }
                // Exactly the lines the checkpoint covers: a step or an evaluation after it
                // (even one of the same step) is redone by the resumed run.
                for (path, lines) in [
                    (self.run.metrics_path(), state.metrics_lines),
                    (self.run.eval_path(), state.eval_lines),
                ] {
                    match lines {
                        Some(n) => {
                            let kept = RunDir::truncate_lines(&path, n)?;
                            if kept < n {
                                self.emit(Event::Note(format!(
                                    "warning: {} has {kept} lines, the checkpoint covers {n}: \
                                     lines were lost since it was written",
                                    path.display()
                                )));
                            }
                        }
                        None => RunDir::truncate_jsonl(&path, state.global_step)?,
                    }
                }
                // The data pool likewise: rows written after the checkpoint go (the resumed
                // run writes them again).
                let exclusions = ask(
                    &self.pipeline.pool,
                    crate::actors::pool::TruncatePool {
                        rl_steps: state.rl_steps,
                        global_step: state.global_step,
                        evals: state.eval_lines,
                    },
                )
                .await??;
                self.note_exclusions(&exclusions);
                summary.evals = read_evals(&self.run)?;
                // A config changed since the checkpoint: said once, and `config.toml` becomes
                // the config that trains from here (the old one is kept beside it).
                if let Some(warning) = self.run.record_config(&self.config, state.global_step)? {
                    self.emit(Event::Note(format!("warning: {warning}")));
                }
                self.emit(Event::Note(format!(
                    "resumed from {} (step {}, policy version {version})",
                    dir.display(),
                    state.global_step
                )));
                if state.phase == Phase::Done {
                    self.emit(Event::Note(format!(
                        "the run is already finished ({}/{} RL steps): nothing to train; raise \
                         run.steps (or --steps) to continue it, or pass --no-resume to start over",
                        state.rl_steps, self.config.run.steps
                    )));
                }
                summary.resumed_from = Some(dir);
            }
            None => {
                for path in [
                    self.run.metrics_path(),
                    self.run.eval_path(),
                    self.run.root.join("checkpoints/latest"),
                ] {
                    if path.exists() {
                        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                    }
                }
                // Checkpoints of an earlier attempt would mix with this run's (and outrank
                // them when pruning).
                for dir in self.run.checkpoints()? {
                    std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
                }
                crate::run::write_atomic(
                    &self.run.root.join("config.toml"),
                    self.config.text.as_bytes(),
                )?;
                // A fresh start: entries an earlier attempt wrote into the run's bank go, and
                // the bank is stamped with the new run's id.
                state.run_id = crate::run::new_run_id();
                ask(
                    &self.pipeline.bank,
                    ResetBank {
                        run_id: run_id(&state),
                    },
                )
                .await??;
                let exclusions = ask(&self.pipeline.pool, crate::actors::pool::ResetPool).await??;
                self.note_exclusions(&exclusions);
            }
        }

        if state.phase == Phase::WarmStart {
            self.warm_start(&mut state, &mut summary).await?;
            ask(&self.pipeline.policy, SnapshotReference).await??;
            ask(
                &self.pipeline.policy,
                ConfigureOptimizer(self.config.optimizer.settings()),
            )
            .await??;
            state.phase = Phase::Rl;
            self.checkpoint(&state).await?;
            if let Some(reason) = stop_requested() {
                return Err(self.interrupted(reason, &state));
            }
        }
        if state.phase == Phase::Rl {
            self.reinforce(&mut state, &mut summary).await?;
            let report = self.evaluate("after_rl", &state).await?;
            summary.evals.push(("after_rl".into(), report));
            if let Some(tokenizer_dir) = self.export_tokenizer_dir.clone() {
                let dir = self.run.root.join("model");
                ask(
                    &self.pipeline.policy,
                    ExportModel {
                        tokenizer_dir,
                        dir: dir.clone(),
                    },
                )
                .await??;
                self.emit(Event::Note(format!(
                    "exported the policy in Hugging Face format to {}",
                    dir.display()
                )));
            }
            state.phase = Phase::Done;
            self.checkpoint(&state).await?;
        }
        summary.rl_steps = state.rl_steps;
        Ok(summary)
    }

    async fn warm_start(&mut self, state: &mut TrainerState, summary: &mut Summary) -> Result<()> {
        let Some(ws) = self.config.warm_start.clone() else {
            let report = self.evaluate("initial", state).await?;
            summary.evals.push(("initial".into(), report));
            return Ok(());
        };
        let seed = self.config.run.seed;
        let (demos, failed) = ask(
            &self.pipeline.rollout,
            CollectDemonstrations {
                episodes: ws.demonstrations,
                seed: mix(seed, 0xD3),
                hinted_share: ws.hinted_share,
                keep_unsolved: ws.keep_unsolved,
            },
        )
        .await??;
        self.emit(Event::Note(format!(
            "warm start: {} expert turns from {} demonstrations ({failed} unsolved by the expert, {})",
            demos.len(),
            ws.demonstrations,
            if ws.keep_unsolved { "kept" } else { "skipped" }
        )));
        if demos.is_empty() {
            return Err(Error::Other(
                "warm start: the expert produced no demonstration".into(),
            ));
        }
        if state.warm_start_epochs == 0 {
            let settings = OptimizerSettings {
                lr: ws.lr,
                ..self.config.optimizer.settings()
            };
            ask(&self.pipeline.policy, ConfigureOptimizer(settings)).await??;
        }
        let per_epoch = demos.len().div_ceil(ws.batch_rows) as u64;
        self.emit(Event::PhaseStarted {
            name: "warm start".into(),
            total: per_epoch * ws.epochs as u64,
        });
        for epoch in state.warm_start_epochs..ws.epochs as u64 {
            let mut order: Vec<usize> = (0..demos.len()).collect();
            order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(mix(
                seed,
                0x5F7 + epoch,
            )));
            for (i, chunk) in order.chunks(ws.batch_rows).enumerate() {
                if let Some(reason) = stop_requested() {
                    return Err(self.interrupted(reason, state));
                }
                let started = Instant::now();
                let sequences: Vec<Sequence> = chunk
                    .iter()
                    .map(|&d| Sequence {
                        prompt_ids: demos[d].prompt_ids.clone(),
                        response_ids: demos[d].response_ids.clone(),
                    })
                    .collect();
                let (report, loss) =
                    ask(&self.pipeline.optimizer, SupervisedStep { sequences }).await??;
                state.global_step += 1;
                let mut values = Map::new();
                values.insert("epoch".into(), json!(epoch));
                values.insert("sft_loss".into(), json!(loss.mean_nll()));
                values.insert("grad_norm".into(), json!(report.grad_norm));
                values.insert("train_tokens".into(), json!(report.tokens));
                values.insert("step_time_s".into(), json!(started.elapsed().as_secs_f64()));
                let record = StepRecord {
                    step: state.global_step,
                    phase: "warm_start".into(),
                    rl_step: None,
                    policy_version: report.policy_version,
                    values,
                };
                RunDir::append_jsonl(&self.run.metrics_path(), &record)?;
                self.emit(Event::Step(record));
                self.emit(Event::Progress {
                    done: epoch * per_epoch + i as u64 + 1,
                    message: format!("epoch {} sft loss {:.3}", epoch + 1, loss.mean_nll()),
                });
            }
            state.warm_start_epochs = epoch + 1;
            // The last epoch's state is checkpointed once the warm start ends (the RL phase's
            // first checkpoint, after the `after_warm_start` evaluation and the reference
            // snapshot); a kill in between redoes that epoch from the one before.
            if epoch + 1 < ws.epochs as u64 {
                self.checkpoint(state).await?;
            }
        }
        self.emit(Event::PhaseFinished);
        let report = self.evaluate("after_warm_start", state).await?;
        summary.evals.push(("after_warm_start".into(), report));
        Ok(())
    }

    async fn reinforce(&mut self, state: &mut TrainerState, summary: &mut Summary) -> Result<()> {
        let steps = self.config.run.steps;
        self.emit(Event::PhaseStarted {
            name: "rl".into(),
            total: steps,
        });
        self.emit(Event::Progress {
            done: state.rl_steps,
            message: String::new(),
        });
        if state.rl_steps >= steps {
            self.emit(Event::PhaseFinished);
            return Ok(());
        }
        // Rollouts may run `lag` RL steps ahead: `max_staleness` policy versions, at
        // `updates_per_batch` versions per step.
        let k = self.config.rollout.max_staleness;
        let lag = k / self.config.optimizer.updates_per_batch.max(1) as u64;
        ask(&self.pipeline.policy, RetainVersions(k as usize + 1)).await??;
        let next_group_id = Arc::new(std::sync::atomic::AtomicU64::new(state.next_group_id));
        let (reports_tx, mut reports) = futures::channel::mpsc::unbounded();
        ask(
            &self.pipeline.optimizer,
            StartRl {
                first: state.rl_steps,
                end: steps,
                lag,
                global_step: state.global_step + 1,
                next_group_id: next_group_id.clone(),
                reports: reports_tx,
            },
        )
        .await?;
        // The producer's first credits: steps `first ..= first + lag`.
        for step in state.rl_steps..(state.rl_steps + lag + 1).min(steps) {
            self.pipeline.produce.do_send(Produce {
                step,
                next_group_id: next_group_id.clone(),
            });
        }
        while state.rl_steps < steps {
            let Some(StepDone { step, outcome }) = futures::StreamExt::next(&mut reports).await
            else {
                return Err(Error::Other(format!(
                    "the optimizer actor stopped before RL step {}; see its error above",
                    state.rl_steps
                )));
            };
            if step != state.rl_steps {
                return Err(Error::Other(format!(
                    "the optimizer reported RL step {step} while step {} was due",
                    state.rl_steps
                )));
            }
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(e @ Error::Signals { .. }) => {
                    return Err(self.stop_after_signals(state, e).await)
                }
                // The stop came while the step waited for harness episodes: nothing of it
                // ran, so the last finished step is the one checkpointed.
                Err(Error::Interrupted { .. }) if stop_requested().is_some() => {
                    let reason = stop_requested().unwrap_or("interrupted");
                    let current = self.run.checkpoint_dir(state.global_step);
                    if !matches!(self.run.latest_checkpoint(), Ok(Some(d)) if d == current) {
                        self.checkpoint(state).await?;
                    }
                    return Err(self.interrupted(reason, state));
                }
                Err(e) => return Err(e),
            };
            state.next_group_id = next_group_id.load(std::sync::atomic::Ordering::SeqCst);
            state.rl_steps += 1;
            state.global_step += 1;
            let record = StepRecord {
                step: state.global_step,
                phase: "rl".into(),
                rl_step: Some(state.rl_steps),
                policy_version: outcome.policy_version,
                values: outcome.values,
            };
            RunDir::append_jsonl(&self.run.metrics_path(), &record)?;
            let message = step_message(&record.values);
            self.emit(Event::Step(record));
            self.emit(Event::Progress {
                done: state.rl_steps,
                message,
            });
            // The evaluation of a step runs before its checkpoint, so the checkpoint covers
            // it: a run killed in between evaluates that step again on resume, and a run
            // killed after the checkpoint does not.
            let eval_every = self.config.eval.every;
            if eval_every > 0 && state.rl_steps.is_multiple_of(eval_every) && state.rl_steps < steps
            {
                let label = format!("rl_step_{}", state.rl_steps);
                let report = self.evaluate(&label, state).await?;
                summary.evals.push((label, report));
            }
            let every = self.config.run.checkpoint_every;
            if every > 0 && state.rl_steps.is_multiple_of(every) && state.rl_steps < steps {
                self.checkpoint(state).await?;
            }
            // A signal: this step is done (and evaluated); checkpoint it before the producer
            // may start the next one, then stop.
            if let Some(reason) = stop_requested() {
                let just_written =
                    every > 0 && state.rl_steps.is_multiple_of(every) && state.rl_steps < steps;
                if !just_written {
                    self.checkpoint(state).await?;
                }
                return Err(self.interrupted(reason, state));
            }
            // Only now the next credits: at k = 0 the next rollout sees this step's update,
            // checkpoint and evaluation, as in synchronous training.
            let produce = state.rl_steps + lag;
            if produce < steps {
                self.pipeline.produce.do_send(Produce {
                    step: produce,
                    next_group_id: next_group_id.clone(),
                });
            }
            self.pipeline.optimizer.do_send(Proceed {
                step: state.rl_steps,
            });
        }
        ask(&self.pipeline.pool, crate::actors::pool::Flush).await??;
        self.emit(Event::PhaseFinished);
        Ok(())
    }

    /// The algorithm's signals failed at RL step `state.rl_steps`: the update did not run, so
    /// the weights and `state` are the last good step's. Writes a checkpoint of it (unless the
    /// latest checkpoint is of it already) and returns the error to stop with, naming that
    /// checkpoint.
    async fn stop_after_signals(&mut self, state: &TrainerState, error: Error) -> Error {
        let dir = self.run.checkpoint_dir(state.global_step);
        let current = matches!(self.run.latest_checkpoint(), Ok(Some(d)) if d == dir);
        if !current {
            if let Err(e) = self.checkpoint(state).await {
                return Error::Other(format!(
                    "{error}; writing a checkpoint of the last good step also failed: {e}"
                ));
            }
        }
        Error::Other(format!(
            "{error}. The run stopped; checkpoint {} holds the last good step (RL step {}): fix \
             the plugin or its config and run the same command to resume from there",
            dir.display(),
            state.rl_steps
        ))
    }

    /// Says which curated exclusions of the data pool this run's training will skip.
    fn note_exclusions(&mut self, exclusions: &cairn_stores::pool::Exclusions) {
        if exclusions.is_empty() {
            return;
        }
        let list: Vec<String> = exclusions.0.iter().map(|x| x.describe()).collect();
        self.emit(Event::Note(format!(
            "the data pool holds {} exclusion(s); training skips matching rows: {} (cairn pool \
             include removes one)",
            list.len(),
            list.join("; ")
        )));
    }

    /// Plays the held-out tasks and records the result.
    async fn evaluate(&mut self, label: &str, state: &TrainerState) -> Result<EvalReport> {
        if self.pipeline.gateway.is_some() {
            // The harness owns the tasks: held-out evaluation is its job (docs/gateway.md).
            return Ok(EvalReport::default());
        }
        let e = self.config.eval.clone();
        self.emit(Event::Note(format!(
            "evaluating {} held-out tasks ({label})",
            e.tasks
        )));
        let report = ask(
            &self.pipeline.rollout,
            Evaluate {
                tasks: e.tasks,
                temperature: e.temperature,
                seed: mix(self.config.run.seed, 0xE7A1),
                record: true,
            },
        )
        .await??;
        let mut report = report;
        // Into the data pool (source `eval:<label>`, numbered by the RL steps done), before
        // the eval.jsonl line, so a checkpoint's line count also counts the pool's evaluations.
        let source = cairn_stores::pool::Source::Eval(label.to_string());
        let turns = std::mem::take(&mut report.rows)
            .into_iter()
            .map(|row| cairn_stores::pool::TurnWrite {
                row,
                advantages: None,
                trained: false,
                skip_reason: Some("evaluation".into()),
            })
            .collect();
        let seeds: std::collections::HashMap<u64, u64> =
            std::mem::take(&mut report.seeds).into_iter().collect();
        let mut episodes = cairn_stores::pool::EpisodeWrite::group(
            &source,
            state.rl_steps,
            state.global_step,
            turns,
        );
        for f in std::mem::take(&mut report.failed_episodes) {
            episodes.push(crate::actors::pool::failed_episode(
                &source,
                state.rl_steps,
                state.global_step,
                &f,
            ));
        }
        for e in &mut episodes {
            e.seed = seeds.get(&e.trajectory_id).copied();
        }
        ask(
            &self.pipeline.pool,
            crate::actors::pool::RecordEvaluation(episodes),
        )
        .await??;
        let mut line = serde_json::to_value(&report).expect("eval report serialises");
        if let Value::Object(m) = &mut line {
            m.insert("step".into(), json!(state.global_step));
            m.insert("label".into(), json!(label));
        }
        RunDir::append_jsonl(&self.run.eval_path(), &line)?;
        self.emit(Event::Eval {
            label: label.to_string(),
            report: report.clone(),
        });
        Ok(report)
    }

    /// The error a stop request ends the run with: where it stopped and how to go on.
    fn interrupted(&self, reason: &str, state: &TrainerState) -> Error {
        let latest = std::fs::read_to_string(self.run.root.join("checkpoints").join("latest"))
            .map(|n| n.trim().to_string())
            .unwrap_or_default();
        let at = if latest.is_empty() {
            "no checkpoint yet, so the run starts over".to_string()
        } else {
            format!("its last checkpoint is checkpoints/{latest}")
        };
        Error::Interrupted {
            message: format!(
                "{reason}: stopped at step {} (RL step {}) with nothing half-written; {at}; run \
                 the same command to resume the run in {}",
                state.global_step,
                state.rl_steps,
                self.run.root.display()
            ),
        }
    }

    /// Writes a complete checkpoint and moves `checkpoints/latest` to it; keeps the last two
    /// and the end of the warm start.
    ///
    /// The files go into `checkpoints/tmp-step-NNNNNN/` (policy, bank snapshot, algorithm
    /// state, `trainer.json` with the line counts of `metrics.jsonl` and `eval.jsonl` it
    /// covers), then [`RunDir::commit_checkpoint`] writes the manifest and renames the
    /// directory into place. A failure at any point (a full disk) leaves `latest` on the
    /// previous checkpoint.
    async fn checkpoint(&mut self, state: &TrainerState) -> Result<()> {
        // Every step the checkpoint covers is in the data pool first.
        ask(&self.pipeline.pool, crate::actors::pool::Flush).await??;
        let dir = self.run.staging_dir(state.global_step);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        ask(
            &self.pipeline.policy,
            SaveCheckpoint {
                dir: dir.join("policy"),
            },
        )
        .await??;
        ask(&self.pipeline.bank, CheckpointBank { dir: dir.clone() }).await??;
        let algo = self.algorithm.lock().save_state()?;
        crate::run::write_atomic(&dir.join("algorithm.state"), algo.as_bytes())?;
        let state = TrainerState {
            metrics_lines: Some(RunDir::count_lines(&self.run.metrics_path())?),
            eval_lines: Some(RunDir::count_lines(&self.run.eval_path())?),
            manifest: true,
            ..state.clone()
        };
        self.run.save_state(&dir, &state)?;
        let dir = self.run.commit_checkpoint(&dir, state.global_step)?;
        prune_checkpoints(&self.run, &dir, 2)?;
        Ok(())
    }
}

/// The run id to check the bank against (`None` for checkpoints from before run ids).
fn run_id(state: &TrainerState) -> Option<String> {
    (!state.run_id.is_empty()).then(|| state.run_id.clone())
}

fn read_evals(run: &RunDir) -> Result<Vec<(String, EvalReport)>> {
    let path = run.eval_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        let label = v
            .get("label")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let report: EvalReport = serde_json::from_value(v)
            .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        out.push((label, report));
    }
    Ok(out)
}

/// Deletes all but the newest `keep` checkpoints (never `current`).
fn prune_checkpoints(run: &RunDir, current: &std::path::Path, keep: usize) -> Result<()> {
    let dirs = run.checkpoints()?;
    let n = dirs.len();
    for d in dirs.into_iter().take(n.saturating_sub(keep)) {
        if d != current && !is_warm_start_end(&d) {
            std::fs::remove_dir_all(&d).map_err(|e| Error::io(&d, e))?;
        }
    }
    Ok(())
}

/// The checkpoint written when the warm start ended (RL phase, no RL step yet) is kept for
/// good, so the warm-started policy can be evaluated next to the final one.
fn is_warm_start_end(dir: &std::path::Path) -> bool {
    RunDir::load_state(dir).is_ok_and(|s| s.phase == Phase::Rl && s.rl_steps == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first RL line of a committed run's `metrics.jsonl`.
    fn golden_rl_line() -> Map<String, Value> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../hosts/cairn/tests/fixtures/sync-golden/metrics.generic-avx2.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("\"phase\":\"rl\""))
            .expect("the golden run has RL steps");
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn the_step_message_shows_the_metrics_line() {
        let line = golden_rl_line();
        let reward = line["reward/episode_mean"].as_f64().unwrap();
        let success = line["success_rate"].as_f64().unwrap();
        assert_eq!(
            step_message(&line),
            format!("reward {reward:.3} success {success:.2}")
        );
        assert_eq!(step_message(&line), "reward -0.413 success 0.00");
        // A metric the line lacks is a dash, never NaN.
        assert_eq!(step_message(&Map::new()), "reward - success -");
    }

    #[test]
    fn the_step_message_names_metrics_the_step_computes() {
        // The names come from what `batch_metrics` writes, so renaming a metric there fails
        // here instead of printing a dash on every step.
        let row = |trajectory_id: u64, reward: f32, success: bool| cairn_plugin_sdk::TurnRow {
            trajectory_id,
            group_id: 1,
            episode_reward: reward,
            success,
            response_mask: vec![1],
            ..Default::default()
        };
        let batch = cairn_plugin_sdk::Batch {
            step: 0,
            rows: vec![row(1, 1.0, true), row(2, 0.0, false)],
        };
        let values: Map<String, Value> =
            crate::objective::metrics::batch_metrics(&batch, &cairn_plugin_sdk::Signals::default())
                .into_iter()
                .map(|(k, v)| (k, json!(v)))
                .collect();
        assert_eq!(step_message(&values), "reward 0.500 success 0.50");
    }

    #[test]
    fn pruning_keeps_the_newest_two_and_the_end_of_the_warm_start() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::create(tmp.path()).unwrap();
        let states = [
            (10, Phase::WarmStart, 0),
            (20, Phase::Rl, 0),
            (30, Phase::Rl, 5),
            (40, Phase::Rl, 10),
            (50, Phase::Rl, 15),
        ];
        for (step, phase, rl_steps) in states {
            let dir = run.checkpoint_dir(step);
            std::fs::create_dir_all(&dir).unwrap();
            let state = TrainerState {
                phase,
                rl_steps,
                global_step: step,
                ..Default::default()
            };
            run.save_state(&dir, &state).unwrap();
        }
        prune_checkpoints(&run, &run.checkpoint_dir(50), 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(run.root.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["step-000020", "step-000040", "step-000050"]);
    }
}
