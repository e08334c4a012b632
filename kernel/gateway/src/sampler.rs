//! [`Sampler`]: batches concurrent gateway requests into generation passes on the policy
//! actor (continuous batching), hands each request its tokens as they are sampled, and
//! pauses around weight updates.
//!
//! **Continuous batching.** An idle sampler waits `window` for a burst to gather, then
//! starts one pass with every queued request that shares the first one's temperature, top-p
//! and stop ids (its *key*). While that pass runs, a request of the same key does not wait
//! for it to end: it goes into the pass's inbox, and the backend's decode loop admits it at
//! its next step ([`TokenSink::admit`]), up to `max_prompts` rows in the batch; rows leave
//! the batch as they end. A burst of N requests is therefore one pass, not one per request
//! that arrived during the previous one. A request of another key closes the inbox (the
//! pass takes no one more, so it drains) and starts the next pass.
//!
//! **Seeds.** Every request's rows draw from their own streams: seed `params.seed` when the
//! request fixes it, else `mix(seed, n)` for the sampler's n-th unseeded request; row `k`
//! uses stream `k`. So a seeded request's ids do not depend on which requests it shares a
//! batch with (its log-probs only by the rounding of another batch shape).
//!
//! **Tokens as they are sampled.** Each request brings the sending half of its own event
//! channel ([`events_channel`]): [`SampleEvent::Started`] with the policy version, then one
//! [`SampleEvent::Token`] per sampled id, sent from the policy's thread by the batch's
//! [`TokenSink`] right after the decode step that sampled it. A row ends at a stop id or at
//! its own request's `max_tokens` (the sink stops it there, finish reason `length`: a prefix
//! of a sample is a sample of the shorter request), so each request is answered when its own
//! rows end, not when the batch does. The channel has room for every event the request can
//! get, so the policy never waits on a slow client; a request whose receiver is gone (the
//! client disconnected) is **abandoned**: its rows stop at the next token and the batch ends
//! early once no row is left. [`SamplingStats`] counts sampled tokens, abandoned requests,
//! passes and admitted requests (`GET /health`).
//!
//! **Weight updates.** [`PauseSampling`] closes the inbox and stops launching passes, and
//! resolves once the pass in flight is done (drained); requests arriving meanwhile wait in
//! the queue.
//! [`ResumeSampling`] launches them. Every answer carries the policy version that sampled it:
//! each pass runs on one version, since the policy actor handles one message at a time.
//!
//! **Shutdown.** [`StopSampling`] answers every queued request, and every later one, with a
//! 503 ([`shutting_down`]), lets the pass in flight finish and be answered, then stops the
//! actor and resolves. Afterwards nothing of the gateway's reaches the policy actor, so the
//! host can let its thread (and libtorch) go without a generation running under it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use cairn_plugin_sdk::FinishReason;
use futures::channel::{mpsc, oneshot};
use futures::StreamExt;

use super::api_error::{ApiError, ApiErrorKind};
use cairn_kernel::actors::policy::GenerateStream;
use cairn_kernel::actors::pull::{PauseSampling, ResumeSampling};
use cairn_kernel::backend::{Admission, Generation, SamplingParams, TokenSink};
use cairn_kernel::rollout::mix;

/// What a request hears while it is sampled, in order: `Started`, then its tokens; or
/// `Failed`, after which nothing follows.
#[derive(Clone, Debug, PartialEq)]
pub enum SampleEvent {
    /// Its batch started on the weights of this version.
    Started { policy_version: u64 },
    /// Row `row` of the request (an index into [`Sample::prompts`]) sampled `id`, log-prob
    /// `logprob` nats at the sampling temperature; `finish` is set on the row's last id.
    Token {
        row: usize,
        id: u32,
        logprob: f32,
        finish: Option<FinishReason>,
    },
    /// The request was refused or its batch failed.
    Failed(ApiError),
}

/// A request's event channel, with room for all it can receive (`Started`, one token per row
/// and step, `Failed`): sending never waits and never finds it full.
pub fn events_channel(
    rows: usize,
    max_new_tokens: u32,
) -> (mpsc::Sender<SampleEvent>, mpsc::Receiver<SampleEvent>) {
    mpsc::channel(rows * max_new_tokens as usize + 2)
}

/// Sample `prompts`; the tokens come on `events`. Answers `Ok` once queued, or the 503 of a
/// stopping sampler.
#[derive(Message)]
#[rtype(result = "Result<(), ApiError>")]
pub struct Sample {
    /// One entry per response to sample (a prompt asked with `n` choices appears `n` times).
    pub prompts: Vec<Vec<u32>>,
    /// `max_new_tokens` is this request's own limit.
    pub params: SamplingParams,
    /// Keep `params.seed`; otherwise the sampler gives the request a seed of its own.
    pub seeded: bool,
    /// Where its events go ([`events_channel`]); dropping the receiver abandons the request.
    pub events: mpsc::Sender<SampleEvent>,
}

/// Counters of the sampler, shared with the gateway's `/health`.
#[derive(Debug, Default)]
pub struct SamplingStats {
    /// Requests taken for sampling (queued, joined or started).
    pub received: AtomicU64,
    /// Ids sampled for requests (cut to each request's own limit).
    pub tokens: AtomicU64,
    /// Requests whose client went away while they were sampled; their rows were stopped.
    pub abandoned: AtomicU64,
    /// Generation passes started (each a batch that others may join).
    pub batches: AtomicU64,
    /// Requests admitted into a batch by its sink: all but each batch's first (continuous
    /// batching).
    pub joined: AtomicU64,
}

impl SamplingStats {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests_received": self.received.load(Ordering::Relaxed),
            "tokens_sampled": self.tokens.load(Ordering::Relaxed),
            "requests_abandoned": self.abandoned.load(Ordering::Relaxed),
            "batches": self.batches.load(Ordering::Relaxed),
            "requests_joined": self.joined.load(Ordering::Relaxed),
        })
    }
}

/// The responses of one request, built from its events in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Responses {
    /// Set by `Started`.
    pub policy_version: Option<u64>,
    /// One per row, in [`Sample::prompts`] order; complete once `done` says so.
    pub generations: Vec<Generation>,
    done: Vec<bool>,
    open: usize,
}

impl Responses {
    pub fn new(rows: usize) -> Responses {
        Responses {
            policy_version: None,
            generations: vec![Generation::default(); rows],
            done: vec![false; rows],
            open: rows,
        }
    }

    /// Applies one event: the row a token went to, `None` for `Started`, the error of
    /// `Failed` (or of a token that does not fit the request).
    pub fn apply(&mut self, event: SampleEvent) -> Result<Option<usize>, ApiError> {
        match event {
            SampleEvent::Started { policy_version } => {
                self.policy_version = Some(policy_version);
                Ok(None)
            }
            SampleEvent::Failed(e) => Err(e),
            SampleEvent::Token {
                row,
                id,
                logprob,
                finish,
            } => {
                if self.done.get(row) != Some(&false) {
                    return Err(ApiError::internal(format!(
                        "the policy sent a token for row {row}, which is finished or unknown"
                    )));
                }
                let g = &mut self.generations[row];
                g.ids.push(id);
                g.logprobs.push(logprob);
                if let Some(reason) = finish {
                    g.finish_reason = reason;
                    self.done[row] = true;
                    self.open -= 1;
                }
                Ok(Some(row))
            }
        }
    }

    pub fn finished(&self, row: usize) -> bool {
        self.done.get(row).copied().unwrap_or(false)
    }

    /// Every row has ended.
    pub fn complete(&self) -> bool {
        self.open == 0
    }

    /// Reads `events` until every row ended; the 503 when the channel closes first (the
    /// sampler stopped with the request queued).
    pub async fn collect(
        mut self,
        events: &mut mpsc::Receiver<SampleEvent>,
    ) -> Result<Responses, ApiError> {
        while !self.complete() {
            match events.next().await {
                Some(event) => {
                    self.apply(event)?;
                }
                None => return Err(ended_early(self.policy_version.is_some())),
            }
        }
        Ok(self)
    }
}

/// The error of a request whose events stopped before its rows ended.
pub fn ended_early(started: bool) -> ApiError {
    if started {
        ApiError::internal("the policy stopped sampling before the response was complete")
    } else {
        shutting_down()
    }
}

/// Refuse the queued and all later requests, wait for the batches in flight, stop. Resolves
/// once no generation of the sampler's is running.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopSampling;

/// The 503 of a request that comes (or waits) while the gateway shuts down.
pub fn shutting_down() -> ApiError {
    ApiError::new(
        ApiErrorKind::Unavailable,
        "the gateway is shutting down (the training run finished its last step, or the server \
         is stopping), so this request was not sampled; send it to a running `cairn serve` or \
         `cairn train`",
    )
    .with_code("shutting_down")
}

/// What requests must share to be sampled in one batch: temperature, top-p, stop ids.
type BatchKey = (u32, u32, Vec<u32>);

fn batch_key(params: &SamplingParams) -> BatchKey {
    (
        params.temperature.to_bits(),
        params.top_p.to_bits(),
        params.stop_ids.clone(),
    )
}

/// Requests handed to the batch in flight; its sink takes them between decode steps.
struct Inbox {
    /// False once the pass takes no later arrival (it is ending, the sampler pauses or stops,
    /// or a request of another key waits). The sink still admits what is `waiting` until the
    /// sampler takes it back ([`Sampler::close_inbox`]).
    open: bool,
    key: BatchKey,
    /// Rows per batch at most.
    max_rows: usize,
    /// The first batch's other requests, admitted before its prefill even when closed.
    first: Vec<Sample>,
    waiting: Vec<Sample>,
    /// Every admitted request's sender, to report a batch that fails.
    admitted: Vec<mpsc::Sender<SampleEvent>>,
}

type SharedInbox = Arc<parking_lot::Mutex<Inbox>>;

/// One request of a batch, as the sink on the policy's thread sees it.
struct Target {
    events: mpsc::Sender<SampleEvent>,
    limit: usize,
    /// Ids sent per row.
    counts: Vec<usize>,
    /// False once the receiver is gone.
    wanted: bool,
}

/// The [`TokenSink`] of one batch: routes each row's ids to its request, ends rows at their
/// request's own limit, stops the rows of abandoned requests, and admits the requests that
/// arrive while it runs (continuous batching).
struct BatchSink {
    /// Per batch row: (request, row within the request).
    rows: Vec<(usize, usize)>,
    targets: Vec<Target>,
    inbox: SharedInbox,
    policy_version: u64,
    stats: Arc<SamplingStats>,
}

impl BatchSink {
    /// The sink of a batch started with `first`'s rows; the others come through `inbox`.
    fn new(first: &Sample, inbox: SharedInbox, stats: Arc<SamplingStats>) -> BatchSink {
        let mut sink = BatchSink {
            rows: Vec::new(),
            targets: Vec::new(),
            inbox,
            policy_version: 0,
            stats,
        };
        sink.add(first);
        sink
    }

    fn add(&mut self, s: &Sample) {
        let r = self.targets.len();
        self.rows.extend((0..s.prompts.len()).map(|k| (r, k)));
        self.targets.push(Target {
            events: s.events.clone(),
            limit: s.params.max_new_tokens.max(1) as usize,
            counts: vec![0; s.prompts.len()],
            wanted: true,
        });
    }

    fn abandon(target: &mut Target, stats: &SamplingStats) {
        if std::mem::replace(&mut target.wanted, false) {
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl TokenSink for BatchSink {
    fn begin(&mut self, policy_version: u64) {
        self.policy_version = policy_version;
        for t in &mut self.targets {
            if t.events
                .try_send(SampleEvent::Started { policy_version })
                .is_err()
            {
                Self::abandon(t, &self.stats);
            }
        }
    }

    fn token(&mut self, row: usize, id: u32, logprob: f32, finish: Option<FinishReason>) -> bool {
        let Some(&(r, k)) = self.rows.get(row) else {
            return false;
        };
        let t = &mut self.targets[r];
        if !t.wanted || t.counts[k] >= t.limit {
            return false;
        }
        t.counts[k] += 1;
        let finish = finish.or((t.counts[k] == t.limit).then_some(FinishReason::Length));
        self.stats.tokens.fetch_add(1, Ordering::Relaxed);
        let event = SampleEvent::Token {
            row: k,
            id,
            logprob,
            finish,
        };
        if t.events.try_send(event).is_err() {
            // The receiver is gone: the client disconnected (the channel is never full).
            Self::abandon(t, &self.stats);
            return false;
        }
        finish.is_none()
    }

    fn admit(&mut self, live_rows: usize) -> Vec<Admission> {
        let shared = self.inbox.clone();
        let mut inbox = shared.lock();
        let mut rows = live_rows;
        let mut joining = Vec::new();
        let mut taken = std::mem::take(&mut inbox.first);
        let mut size: usize = rows + taken.iter().map(|s| s.prompts.len()).sum::<usize>();
        while !inbox.waiting.is_empty() {
            let more = inbox.waiting[0].prompts.len();
            // A request larger than a batch still goes, alone.
            if size > 0 && size + more > inbox.max_rows {
                break;
            }
            size += more;
            taken.push(inbox.waiting.remove(0));
        }
        for mut s in taken {
            if s.events.is_closed() {
                continue; // the client went away before sampling started
            }
            let started = SampleEvent::Started {
                policy_version: self.policy_version,
            };
            if s.events.try_send(started).is_err() {
                continue;
            }
            rows += s.prompts.len();
            self.add(&s);
            inbox.admitted.push(s.events.clone());
            self.stats.joined.fetch_add(1, Ordering::Relaxed);
            joining.push(Admission {
                prompts: s.prompts,
                max_new_tokens: s.params.max_new_tokens,
                seed: s.params.seed,
            });
        }
        if rows == 0 {
            // The batch ends: later requests start the next one.
            inbox.open = false;
        }
        joining
    }

    fn refuse(&mut self, first_row: usize, message: String) {
        let Some(&(r, _)) = self.rows.get(first_row) else {
            return;
        };
        let t = &mut self.targets[r];
        t.wanted = false;
        let _ = t
            .events
            .try_send(SampleEvent::Failed(ApiError::invalid("prompt", message)));
    }
}

/// The batching actor; see the module docs. Runs on an async arbiter.
pub struct Sampler {
    policy: Recipient<GenerateStream>,
    window: Duration,
    max_prompts: usize,
    seed: u64,
    queue: Vec<Sample>,
    scheduled: bool,
    paused: bool,
    /// [`StopSampling`] came: refuse everything, stop once no batch is in flight.
    stopping: bool,
    /// The inbox of the batch in flight.
    running: Option<SharedInbox>,
    drained: Vec<oneshot::Sender<()>>,
    /// Unseeded requests so far: the n-th gets seed `mix(seed, n)`.
    unseeded: u64,
    stats: Arc<SamplingStats>,
}

impl Sampler {
    /// `window`: how long the first request of an idle sampler waits for others;
    /// `max_prompts`: rows per batch at most; `seed`: where unseeded requests' seeds derive
    /// from.
    pub fn new(
        policy: Recipient<GenerateStream>,
        window: Duration,
        max_prompts: usize,
        seed: u64,
    ) -> Sampler {
        Sampler {
            policy,
            window,
            max_prompts: max_prompts.max(1),
            seed,
            queue: Vec::new(),
            scheduled: false,
            paused: false,
            stopping: false,
            running: None,
            drained: Vec::new(),
            unseeded: 0,
            stats: Arc::default(),
        }
    }

    /// Its counters (take them before `start`).
    pub fn stats(&self) -> Arc<SamplingStats> {
        self.stats.clone()
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.paused
            || self.stopping
            || self.scheduled
            || self.queue.is_empty()
            || self.running.is_some()
        {
            return;
        }
        self.scheduled = true;
        ctx.run_later(self.window, |act, ctx| {
            act.scheduled = false;
            act.flush(ctx);
        });
    }

    /// Closes the running batch's inbox; what it still held goes back to the queue's front.
    fn close_inbox(&mut self) {
        if let Some(inbox) = &self.running {
            let mut inbox = inbox.lock();
            inbox.open = false;
            let mut back = std::mem::take(&mut inbox.first);
            back.append(&mut inbox.waiting);
            back.append(&mut self.queue);
            self.queue = back;
        }
    }

    /// Starts a batch with the first queued request and every queued one that shares its
    /// key; the others wait for the next batch.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.paused || self.stopping || self.running.is_some() {
            return;
        }
        self.queue.retain(|p| !p.events.is_closed());
        if self.queue.is_empty() {
            return;
        }
        let first = self.queue.remove(0);
        let key = batch_key(&first.params);
        let (joining, rest): (Vec<Sample>, Vec<Sample>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|p| batch_key(&p.params) == key);
        self.queue = rest;
        let inbox = Arc::new(parking_lot::Mutex::new(Inbox {
            // Fairness: while requests of another key wait, none joins after the first rows.
            open: self.queue.is_empty(),
            key,
            max_rows: self.max_prompts,
            first: joining,
            waiting: Vec::new(),
            admitted: Vec::new(),
        }));
        self.launch(first, inbox, ctx);
    }

    fn launch(&mut self, first: Sample, inbox: SharedInbox, ctx: &mut Context<Self>) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let sink = Box::new(BatchSink::new(&first, inbox.clone(), self.stats.clone()));
        tracing::debug!(prompts = first.prompts.len(), "sampling batch");
        self.running = Some(inbox.clone());
        // Kept to report a failed batch; dropped (closing the channels) once it is answered.
        let sender = first.events;
        let send = self.policy.send(GenerateStream {
            prompts: first.prompts,
            params: first.params,
            sink,
        });
        ctx.spawn(send.into_actor(self).map(move |answer, act, ctx| {
            act.close_inbox();
            act.running = None;
            let failure = match answer {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(ApiError::from(e)),
                Err(e) => Some(
                    ApiError::new(
                        ApiErrorKind::Unavailable,
                        format!(
                            "the policy actor is gone ({e}): the gateway is shutting down; send \
                             the request to a running `cairn serve` or `cairn train`"
                        ),
                    )
                    .with_code("shutting_down"),
                ),
            };
            let mut senders = std::mem::take(&mut inbox.lock().admitted);
            senders.push(sender);
            if let Some(e) = failure {
                for s in &mut senders {
                    let _ = s.try_send(SampleEvent::Failed(e.clone()));
                }
            }
            drop(senders);
            for w in act.drained.drain(..) {
                let _ = w.send(());
            }
            if act.stopping {
                act.refuse_queued();
                ctx.stop();
            } else {
                act.flush(ctx);
            }
        }));
    }

    fn refuse_queued(&mut self) -> usize {
        let refused = self.queue.len();
        for mut p in self.queue.drain(..) {
            let _ = p.events.try_send(SampleEvent::Failed(shutting_down()));
        }
        refused
    }
}

impl Actor for Sampler {
    type Context = Context<Self>;
}

impl Handler<Sample> for Sampler {
    type Result = Result<(), ApiError>;

    fn handle(&mut self, mut request: Sample, ctx: &mut Context<Self>) -> Self::Result {
        if self.stopping {
            return Err(shutting_down());
        }
        if request.prompts.is_empty() {
            return Err(ApiError::invalid("prompt", "there is no prompt to sample"));
        }
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        if !request.seeded {
            request.params.seed = mix(self.seed, self.unseeded);
            self.unseeded += 1;
        }
        if let Some(inbox) = &self.running {
            let mut inbox = inbox.lock();
            if inbox.open && !self.paused && inbox.key == batch_key(&request.params) {
                // Joins the batch in flight at its next decode step.
                inbox.waiting.push(request);
                return Ok(());
            }
            // Another key: the pass takes no later arrival, so this request does not wait long.
            inbox.open = false;
        }
        self.queue.push(request);
        self.schedule(ctx);
        Ok(())
    }
}

impl Handler<PauseSampling> for Sampler {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: PauseSampling, _: &mut Context<Self>) -> Self::Result {
        self.paused = true;
        self.close_inbox();
        let (tx, rx) = oneshot::channel();
        if self.running.is_none() {
            let _ = tx.send(());
        } else {
            self.drained.push(tx);
        }
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<ResumeSampling> for Sampler {
    type Result = ();

    fn handle(&mut self, _: ResumeSampling, ctx: &mut Context<Self>) {
        self.paused = false;
        self.flush(ctx);
    }
}

impl Handler<StopSampling> for Sampler {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: StopSampling, ctx: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        self.close_inbox();
        let refused = self.refuse_queued();
        tracing::debug!(
            refused,
            in_flight = self.running.is_some(),
            "sampler stopping"
        );
        let (tx, rx) = oneshot::channel();
        if self.running.is_none() {
            let _ = tx.send(());
            ctx.stop();
        } else {
            self.drained.push(tx);
        }
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_kernel::actors::policy::PolicyActor;
    use cairn_kernel::backend::NullBackend;

    fn params(max_new_tokens: u32) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens,
            stop_ids: vec![],
            seed: 0,
        }
    }

    /// Sends a request at once (in call order) and collects its responses.
    fn sample(
        sampler: &Addr<Sampler>,
        prompts: Vec<Vec<u32>>,
        params: SamplingParams,
        seeded: bool,
    ) -> impl std::future::Future<Output = Result<Responses, ApiError>> {
        let rows = prompts.len();
        let (events, mut received) = events_channel(rows, params.max_new_tokens);
        let sent = sampler.send(Sample {
            prompts,
            params,
            seeded,
            events,
        });
        async move {
            sent.await.expect("the sampler runs")?;
            Responses::new(rows).collect(&mut received).await
        }
    }

    /// Polls `done` every millisecond; fails the test naming `what` after 10 s.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "waited 10 s for {what}"
            );
            actix::clock::sleep(Duration::from_millis(1)).await;
        }
    }

    fn ids(r: &Responses) -> Vec<Vec<u32>> {
        r.generations.iter().map(|g| g.ids.clone()).collect()
    }

    #[test]
    fn batches_cut_outputs_to_each_request_and_pause_holds_requests() {
        actix::System::new().block_on(async {
            let policy = SyncArbiter::start(1, || {
                PolicyActor::new(Box::new(NullBackend {
                    version: 4,
                    response: vec![5, 6, 7],
                    ..Default::default()
                }))
            });
            let sampler = Sampler::new(policy.recipient(), Duration::from_millis(5), 8, 1);
            let stats = sampler.stats();
            let sampler = sampler.start();
            let a = sample(&sampler, vec![vec![1], vec![1]], params(3), false);
            let b = sample(&sampler, vec![vec![2]], params(1), false);
            let (a, b) = futures::join!(a, b);
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(ids(&a), vec![vec![5, 6, 7]; 2]);
            assert_eq!(a.generations[0].finish_reason, FinishReason::Length);
            assert_eq!(ids(&b), vec![vec![5]]);
            assert_eq!(b.generations[0].finish_reason, FinishReason::Length);
            assert_eq!(b.policy_version, Some(4));
            assert_eq!(stats.tokens.load(Ordering::Relaxed), 7);

            sampler.send(PauseSampling).await.unwrap();
            let held = sample(&sampler, vec![vec![3]], params(2), true);
            let waited = actix::clock::timeout(Duration::from_millis(50), held).await;
            assert!(waited.is_err(), "a paused sampler holds requests");
            sampler.send(ResumeSampling).await.unwrap();
            let again = sample(&sampler, vec![vec![3]], params(2), true)
                .await
                .unwrap();
            assert_eq!(ids(&again), vec![vec![5, 6]]);
        });
    }

    /// The sink on the policy's thread: each request gets its own rows' ids, a row ends at
    /// its request's limit, and a request whose receiver is dropped is abandoned (its rows
    /// stop, counted once) while the other request's rows go on.
    #[test]
    fn the_sink_routes_ids_cuts_rows_and_stops_abandoned_requests() {
        let (a_tx, mut a_rx) = events_channel(1, 10);
        let (b_tx, mut b_rx) = events_channel(2, 2);
        let a = Sample {
            prompts: vec![vec![1]],
            params: params(10),
            seeded: false,
            events: a_tx,
        };
        let mut b = Sample {
            prompts: vec![vec![2], vec![3]],
            params: params(2),
            seeded: true,
            events: b_tx,
        };
        b.params.seed = 31;
        let inbox = Arc::new(parking_lot::Mutex::new(Inbox {
            open: true,
            key: batch_key(&a.params),
            max_rows: 8,
            first: vec![b],
            waiting: Vec::new(),
            admitted: Vec::new(),
        }));
        let stats = Arc::new(SamplingStats::default());
        let mut sink = BatchSink::new(&a, inbox.clone(), stats.clone());
        drop(a);
        sink.begin(9);
        // b is admitted before the prefill, as rows 1 and 2, with its own limit and seed.
        assert_eq!(
            sink.admit(1),
            vec![Admission {
                prompts: vec![vec![2], vec![3]],
                max_new_tokens: 2,
                seed: 31,
            }]
        );
        assert_eq!(inbox.lock().admitted.len(), 1);
        inbox.lock().admitted.clear();
        // Step 1: every row is wanted.
        assert_eq!(
            [0, 1, 2].map(|row| sink.token(row, 40 + row as u32, -0.5, None)),
            [true; 3]
        );
        // Step 2: request b's rows reach their limit of 2.
        assert!(sink.token(0, 50, -0.5, None));
        assert!(!sink.token(1, 51, -0.5, None));
        assert!(!sink.token(2, 52, -0.5, None));
        let mut b = Responses::new(2);
        while let Ok(event) = b_rx.try_recv() {
            b.apply(event).unwrap();
        }
        assert!(b.complete());
        assert_eq!(ids(&b), vec![vec![41, 51], vec![42, 52]]);
        assert_eq!(b.generations[1].finish_reason, FinishReason::Length);
        assert_eq!(b.policy_version, Some(9));
        // Request a's client goes away after reading two events: its row stops at once.
        let mut a = Responses::new(1);
        for _ in 0..2 {
            a.apply(a_rx.try_recv().unwrap()).unwrap();
        }
        drop(a_rx);
        assert!(!sink.token(0, 60, -0.5, None));
        assert!(!sink.token(0, 61, -0.5, None));
        assert_eq!(stats.abandoned.load(Ordering::Relaxed), 1);
        assert_eq!(stats.tokens.load(Ordering::Relaxed), 7);
        assert_eq!(ids(&a), vec![vec![40]]);
    }

    /// A policy whose generation takes `nap` per step: the slow pass is what the tests join
    /// and stop while it runs.
    struct SlowPolicy {
        nap: Duration,
    }

    impl Actor for SlowPolicy {
        type Context = SyncContext<Self>;
    }

    impl Handler<GenerateStream> for SlowPolicy {
        type Result = cairn_kernel::Result<cairn_kernel::actors::policy::Generated>;
        /// Every row gets id 9 after `nap`; admissions are sampled the same way after it.
        fn handle(&mut self, mut msg: GenerateStream, _: &mut SyncContext<Self>) -> Self::Result {
            msg.sink.begin(2);
            let mut rows = 0..msg.prompts.len();
            loop {
                std::thread::sleep(self.nap);
                for row in rows.clone() {
                    msg.sink.token(row, 9, -1.0, Some(FinishReason::Length));
                }
                let joining: usize = msg.sink.admit(0).iter().map(|a| a.prompts.len()).sum();
                if joining == 0 {
                    break;
                }
                rows = rows.end..rows.end + joining;
            }
            Ok(cairn_kernel::actors::policy::Generated {
                generations: Vec::new(),
                policy_version: 2,
            })
        }
    }

    /// Continuous batching: requests of the pass's key that arrive while it runs join it
    /// (one pass for the burst), a request of another key closes it to later arrivals and
    /// gets the next pass, and an unseeded request's seed is its own.
    #[test]
    fn a_burst_joins_the_pass_in_flight_and_another_key_waits_for_the_next() {
        actix::System::new().block_on(async {
            let policy = SyncArbiter::start(1, || SlowPolicy {
                nap: Duration::from_millis(200),
            });
            let sampler = Sampler::new(policy.recipient(), Duration::from_millis(1), 8, 1);
            let stats = sampler.stats();
            let sampler = sampler.start();
            let first = sample(&sampler, vec![vec![1]], params(1), false);
            let burst = async {
                until("pass 1 to start", || {
                    stats.batches.load(Ordering::Relaxed) == 1
                })
                .await;
                // Sent in call order, well within pass 1's first step (200 ms).
                let b = sample(&sampler, vec![vec![2], vec![3]], params(1), false);
                let c = sample(&sampler, vec![vec![4]], params(1), true);
                let greedy = SamplingParams {
                    temperature: 0.0,
                    ..params(1)
                };
                let d = sample(&sampler, vec![vec![5]], greedy, false);
                // After d, which closed pass 1 to later arrivals (the mailbox keeps send order).
                let late = sample(&sampler, vec![vec![6]], params(1), false);
                futures::join!(b, c, d, late)
            };
            let (first, (b, c, d, late)) = futures::join!(first, burst);
            for r in [&first, &b, &c, &d, &late] {
                let r = r.as_ref().unwrap();
                assert!(r.generations.iter().all(|g| g.ids == [9]));
                assert_eq!(r.policy_version, Some(2));
            }
            // Pass 1: the first request, then b and c at its next step. d (greedy) closes it
            // to later arrivals, so the late request waits too; d gets pass 2 and the late
            // one, of pass 1's key again, pass 3.
            assert_eq!(stats.joined.load(Ordering::Relaxed), 2);
            assert_eq!(stats.batches.load(Ordering::Relaxed), 3);
            assert_eq!(stats.tokens.load(Ordering::Relaxed), 6);
        });
    }

    /// Stopping answers the batch in flight, refuses the queued request and every later one
    /// with a 503 `shutting_down`, and resolves only once the batch in flight is done.
    #[test]
    fn stop_answers_the_batch_in_flight_and_refuses_the_rest() {
        actix::System::new().block_on(async {
            let policy = SyncArbiter::start(1, || SlowPolicy {
                nap: Duration::from_millis(300),
            });
            let sampler = Sampler::new(policy.recipient(), Duration::from_millis(1), 8, 1);
            let stats = sampler.stats();
            let sampler = sampler.start();
            let request = || sample(&sampler, vec![vec![1]], params(1), true);
            let in_flight = request();
            until("the first request's pass to start", || {
                stats.batches.load(Ordering::Relaxed) == 1
            })
            .await;
            // Waits for the pass's next step (300 ms); the stop is handled after it arrives.
            let queued = request();
            let started = std::time::Instant::now();
            let stop = sampler.send(StopSampling);
            let refused = request();
            let (in_flight, queued, stop, refused) =
                futures::join!(in_flight, queued, stop, refused);
            stop.unwrap();
            assert!(
                started.elapsed() >= Duration::from_millis(100),
                "stop waited for the batch in flight"
            );
            let answered = in_flight.unwrap();
            assert_eq!(ids(&answered), vec![vec![9]]);
            for refused in [queued, refused] {
                let e = refused.unwrap_err();
                assert_eq!(
                    (e.status(), e.code.as_deref()),
                    (503, Some("shutting_down"))
                );
                assert!(e.message.contains("shutting down"), "{}", e.message);
            }
            // The sampler has stopped: a later request never reaches the policy.
            let (events, _received) = events_channel(1, 1);
            let late = sampler
                .send(Sample {
                    prompts: vec![vec![1]],
                    params: params(1),
                    seeded: true,
                    events,
                })
                .await;
            assert!(late.is_err());
        });
    }
}
