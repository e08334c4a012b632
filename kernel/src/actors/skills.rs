//! The skill-creator actor: answers plugins' reflection requests
//! ([`cairn_plugin_sdk::Host::reflect`]) with bank entries, without ever blocking an RL step.
//!
//! [`Reflect`] hands out one ticket per request at once and queues the work on a
//! [`ReflectorWorker`], a `SyncArbiter` thread that owns the configured [`Reflector`] and runs
//! one reflection at a time (an HTTP call or a generation may take seconds). A finished
//! reflection is written to the bank through a `Recipient<PutEntries>`; the trainer collects
//! the written entry ids, the failures and the counters once per step with [`TakeFinished`]
//! and passes them to the plugin in its `StepReport`.
//!
//! At most `skills.queue` reflections are queued or in flight; a `Reflect` that would exceed
//! that is refused whole (`skills/queue_full`). Pending reflections are not checkpointed: a
//! resumed run starts with an empty queue and tickets from 1.
//!
//! Built by [`SkillCreatorActor::new`]; docs/skills.md has the reflectors, the reply format and the metrics.

use std::panic::{catch_unwind, AssertUnwindSafe};

use actix::prelude::*;
use cairn_plugin_sdk::{NewEntry, Provenance, ReflectionRequest, TurnRow};
use parking_lot::Mutex;

use crate::actors::bank::PutEntries;
use crate::error::{Error, Result};
use crate::skills::SkillsConfig;
use crate::skills::{Draft, FailureKind, Job, ReflectionFailure, Reflector};

/// Queue reflections; returns one ticket per request, in order, at once.
#[derive(Message)]
#[rtype(result = "Result<Vec<u64>>")]
pub struct Reflect {
    pub requests: Vec<ReflectionRequest>,
    /// The rows of the requests' trajectories (the kernel attaches them); each request gets
    /// the rows of its own `trajectories`.
    pub rows: Vec<TurnRow>,
    /// Step and policy version at which the reflection was asked for: the entries'
    /// provenance.
    pub step: u64,
    pub policy_version: u64,
    /// The plugin that asked; recorded in each entry's `extra.requested_by`.
    pub writer: String,
}

/// Everything that finished since the previous `TakeFinished`.
#[derive(Message)]
#[rtype(result = "Result<Finished>")]
pub struct TakeFinished;

/// What [`TakeFinished`] returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Finished {
    /// Ids of the bank entries written, in the order they were written.
    pub new_entries: Vec<u64>,
    /// `(ticket, reason)` of the reflections that wrote nothing.
    pub failed: Vec<(u64, String)>,
    /// `skills/*` counters since the previous take, and `skills/pending` now (docs/skills.md).
    pub metrics: Vec<(String, f64)>,
}

/// Counters since the previous [`TakeFinished`].
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    requested: u64,
    written: u64,
    unparseable: u64,
    timeouts: u64,
    errors: u64,
    queue_full: u64,
    reasked: u64,
}

/// See the module docs.
pub struct SkillCreatorActor {
    worker: Recipient<RunReflection>,
    bank: Recipient<PutEntries>,
    /// `skill-creator:<reflector>`.
    writer: String,
    /// `skills.queue`.
    capacity: usize,
    /// Reflections accepted and not yet settled (queued, reflecting or being written).
    pending: usize,
    next_ticket: u64,
    new_entries: Vec<u64>,
    failed: Vec<(u64, String)>,
    counts: Counts,
}

impl Actor for SkillCreatorActor {
    type Context = Context<Self>;
}

impl SkillCreatorActor {
    /// A skill creator writing to `bank` with `reflector` (see
    /// [`crate::skills::reflector`]). Call inside a running actix `System`: it starts the
    /// reflector's thread.
    ///
    /// That thread is a plain `SyncArbiter`, not one of the pipeline's
    /// [`SyncThreads`](crate::actors::threads::SyncThreads) the host waits for at exit: it
    /// owns no libtorch state (the `policy` reflector only messages the policy actor), and
    /// waiting for it could mean waiting out an endpoint's timeout.
    pub fn new(
        config: &SkillsConfig,
        bank: Recipient<PutEntries>,
        reflector: Box<dyn Reflector>,
    ) -> Self {
        let writer = format!("skill-creator:{}", reflector.name());
        let reflector = Mutex::new(Some(reflector));
        let worker = SyncArbiter::start(1, move || ReflectorWorker {
            reflector: reflector
                .lock()
                .take()
                .expect("the reflector thread is built once"),
        });
        SkillCreatorActor {
            worker: worker.recipient(),
            bank,
            writer,
            capacity: config.queue,
            pending: 0,
            next_ticket: 1,
            new_entries: Vec::new(),
            failed: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// Records the end of one reflection.
    fn settle(
        &mut self,
        ticket: u64,
        outcome: std::result::Result<(Vec<u64>, u32), ReflectionFailure>,
    ) {
        self.pending = self.pending.saturating_sub(1);
        match outcome {
            Ok((ids, reasked)) => {
                tracing::debug!(ticket, entries = ids.len(), reasked, "reflection written");
                self.counts.written += ids.len() as u64;
                self.counts.reasked += u64::from(reasked);
                self.new_entries.extend(ids);
            }
            Err(failure) => self.fail(ticket, failure),
        }
    }

    fn fail(&mut self, ticket: u64, failure: ReflectionFailure) {
        tracing::warn!(ticket, reason = %failure, "reflection dropped");
        self.counts.reasked += u64::from(failure.reasked);
        match failure.kind {
            FailureKind::Unparseable => self.counts.unparseable += 1,
            FailureKind::Timeout => self.counts.timeouts += 1,
            FailureKind::Error => self.counts.errors += 1,
        }
        self.failed.push((ticket, failure.reason));
    }
}

impl Handler<Reflect> for SkillCreatorActor {
    type Result = Result<Vec<u64>>;

    fn handle(&mut self, msg: Reflect, ctx: &mut Self::Context) -> Self::Result {
        let asked = msg.requests.len();
        if self.pending + asked > self.capacity {
            self.counts.queue_full += asked as u64;
            tracing::warn!(
                pending = self.pending,
                asked,
                capacity = self.capacity,
                "reflection queue full; requests refused"
            );
            return Err(Error::ReflectionQueueFull {
                pending: self.pending,
                asked,
                capacity: self.capacity,
            });
        }
        self.counts.requested += asked as u64;
        let mut tickets = Vec::with_capacity(asked);
        for request in msg.requests {
            let ticket = self.next_ticket;
            self.next_ticket += 1;
            tickets.push(ticket);
            let job = Job::new(ticket, request, &msg.rows);
            let missing = job.missing_trajectories();
            if !missing.is_empty() {
                self.fail(
                    ticket,
                    ReflectionFailure::error(format!(
                        "trajectories {missing:?} came without rows (the kernel attaches the \
                         rows of the current step's batch only)"
                    )),
                );
                continue;
            }
            self.pending += 1;
            let origin = Origin {
                step: msg.step,
                policy_version: msg.policy_version,
                requested_by: msg.writer.clone(),
                writer: self.writer.clone(),
            };
            let request = job.request.clone();
            let worker = self.worker.clone();
            let bank = self.bank.clone();
            let work = async move {
                let draft = match worker.send(RunReflection(job)).await {
                    Ok(draft) => draft?,
                    Err(e) => {
                        return Err(ReflectionFailure::error(format!("reflector thread: {e}")))
                    }
                };
                let reasked = draft.reasked;
                let put = PutEntries {
                    entries: vec![new_entry(request, draft, &origin, ticket)],
                    step: origin.step,
                    policy_version: origin.policy_version,
                    writer: origin.writer,
                };
                let failed = |reason: String| ReflectionFailure {
                    reasked,
                    ..ReflectionFailure::error(reason)
                };
                match bank.send(put).await {
                    Ok(Ok(ids)) => Ok((ids, reasked)),
                    Ok(Err(e)) => Err(failed(format!("writing the entry to the bank: {e}"))),
                    Err(e) => Err(failed(format!("bank actor: {e}"))),
                }
            };
            ctx.spawn(
                work.into_actor(self)
                    .map(move |outcome, act, _| act.settle(ticket, outcome)),
            );
        }
        Ok(tickets)
    }
}

impl Handler<TakeFinished> for SkillCreatorActor {
    type Result = Result<Finished>;

    fn handle(&mut self, _: TakeFinished, _: &mut Self::Context) -> Self::Result {
        let c = std::mem::take(&mut self.counts);
        let metrics = [
            ("skills/requested", c.requested),
            ("skills/written", c.written),
            ("skills/unparseable", c.unparseable),
            ("skills/timeouts", c.timeouts),
            ("skills/errors", c.errors),
            ("skills/queue_full", c.queue_full),
            ("skills/reasked", c.reasked),
            ("skills/pending", self.pending as u64),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v as f64))
        .collect();
        Ok(Finished {
            new_entries: std::mem::take(&mut self.new_entries),
            failed: std::mem::take(&mut self.failed),
            metrics,
        })
    }
}

/// Where an accepted reflection's entry comes from.
struct Origin {
    step: u64,
    policy_version: u64,
    requested_by: String,
    writer: String,
}

/// The entry a finished reflection writes: kind, status, parent, task and extra from the
/// request; text and trigger from the reflector; provenance from the `Reflect` message.
/// `extra` gains `reflection_ticket` and `requested_by`, and for a JSON reply format the
/// accepted object as `reply` and the attempts it took as `reply_attempts`, unless the request
/// set those keys.
fn new_entry(request: ReflectionRequest, draft: Draft, origin: &Origin, ticket: u64) -> NewEntry {
    let mut extra = request.extra;
    if let Some(reply) = draft.reply {
        extra
            .entry("reply")
            .or_insert(serde_json::Value::Object(reply));
        extra
            .entry("reply_attempts")
            .or_insert_with(|| serde_json::json!(draft.reasked + 1));
    }
    extra
        .entry("reflection_ticket")
        .or_insert_with(|| serde_json::json!(ticket));
    extra
        .entry("requested_by")
        .or_insert_with(|| serde_json::json!(origin.requested_by));
    NewEntry {
        kind: request.kind,
        text: draft.text,
        trigger: draft.trigger,
        task_id: request.task_id,
        // Skill-creator entries are never scoped to one trajectory.
        trajectory_id: None,
        parent: request.parent,
        status: request.status,
        provenance: Provenance {
            step: origin.step,
            policy_version: origin.policy_version,
            source_trajectories: request.trajectories,
            writer: origin.writer.clone(),
        },
        extra,
    }
}

/// Owns the reflector on its own thread (started by [`SkillCreatorActor::new`]).
pub struct ReflectorWorker {
    reflector: Box<dyn Reflector>,
}

impl Actor for ReflectorWorker {
    type Context = SyncContext<Self>;
}

/// Run one reflection (blocking this thread).
#[derive(Message)]
#[rtype(result = "std::result::Result<Draft, ReflectionFailure>")]
pub struct RunReflection(pub Job);

impl Handler<RunReflection> for ReflectorWorker {
    type Result = std::result::Result<Draft, ReflectionFailure>;

    fn handle(&mut self, msg: RunReflection, _: &mut Self::Context) -> Self::Result {
        let reflector = &mut *self.reflector;
        // A panicking reflector becomes a failed reflection, not a dead thread.
        catch_unwind(AssertUnwindSafe(|| reflector.reflect(&msg.0))).unwrap_or_else(|payload| {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(ReflectionFailure::error(format!(
                "the {} reflector panicked: {message}",
                reflector.name()
            )))
        })
    }
}
