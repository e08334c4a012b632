//! [`Sampler`]: batches concurrent gateway requests into few generation calls on the policy
//! actor, hands each request its tokens as they are sampled, and pauses around weight
//! updates.
//!
//! The backend samples a batch of prompts in one pass, so requests arriving within
//! `window` of each other (and while a batch is generating) are sampled together: one batch
//! per distinct (temperature, top-p) pair, up to `max_prompts` prompts, with
//! `max_new_tokens` the largest asked. A request that fixes its `seed` is sampled in a batch
//! of its own, so its ids do not depend on its neighbours; the others get a seed derived from
//! the batch counter.
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
//! early once no row is left. Stopping rows never changes the others' samples.
//! [`SamplingStats`] counts sampled tokens and abandoned requests (`GET /health`).
//!
//! **Weight updates.** [`PauseSampling`] stops launching batches and resolves once the
//! batches in flight are done (drained); requests arriving meanwhile wait in the queue.
//! [`ResumeSampling`] launches them. Every answer carries the policy version that sampled it:
//! each batch runs on one version, since the policy actor handles one message at a time.
//!
//! **Shutdown.** [`StopSampling`] answers every queued request, and every later one, with a
//! 503 ([`shutting_down`]), lets the batches in flight finish and be answered, then stops the
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
use crate::actors::policy::GenerateStream;
use crate::backend::{Generation, SamplingParams, TokenSink};
use crate::rollout::mix;

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
    /// Keep `params.seed` and sample alone.
    pub seeded: bool,
    /// Where its events go ([`events_channel`]); dropping the receiver abandons the request.
    pub events: mpsc::Sender<SampleEvent>,
}

/// Counters of the sampler, shared with the gateway's `/health`.
#[derive(Debug, Default)]
pub struct SamplingStats {
    /// Ids sampled for requests (cut to each request's own limit).
    pub tokens: AtomicU64,
    /// Requests whose client went away while they were sampled; their rows were stopped.
    pub abandoned: AtomicU64,
}

impl SamplingStats {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tokens_sampled": self.tokens.load(Ordering::Relaxed),
            "requests_abandoned": self.abandoned.load(Ordering::Relaxed),
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

/// Stop launching batches; resolves when the batches in flight are done.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PauseSampling;

/// Launch the queued requests and go on batching.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResumeSampling;

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
/// request's own limit, and stops the rows of abandoned requests.
struct BatchSink {
    /// Per batch row: (request, row within the request).
    rows: Vec<(usize, usize)>,
    targets: Vec<Target>,
    stats: Arc<SamplingStats>,
}

impl BatchSink {
    fn new(group: &[Sample], stats: Arc<SamplingStats>) -> BatchSink {
        let mut rows = Vec::new();
        let targets = group
            .iter()
            .enumerate()
            .map(|(r, s)| {
                rows.extend((0..s.prompts.len()).map(|k| (r, k)));
                Target {
                    events: s.events.clone(),
                    limit: s.params.max_new_tokens.max(1) as usize,
                    counts: vec![0; s.prompts.len()],
                    wanted: true,
                }
            })
            .collect();
        BatchSink {
            rows,
            targets,
            stats,
        }
    }

    fn abandon(target: &mut Target, stats: &SamplingStats) {
        if std::mem::replace(&mut target.wanted, false) {
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl TokenSink for BatchSink {
    fn begin(&mut self, policy_version: u64) {
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
    /// [`StopSampling`] came: refuse everything, stop once `in_flight` is 0.
    stopping: bool,
    in_flight: usize,
    drained: Vec<oneshot::Sender<()>>,
    batches: u64,
    stats: Arc<SamplingStats>,
}

impl Sampler {
    /// `window`: how long the first request of a batch waits for others; `max_prompts`:
    /// prompts per batch at most; `seed`: where unseeded batches' seeds derive from.
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
            in_flight: 0,
            drained: Vec::new(),
            batches: 0,
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
            || self.in_flight > 0
        {
            return;
        }
        self.scheduled = true;
        ctx.run_later(self.window, |act, ctx| {
            act.scheduled = false;
            act.flush(ctx);
        });
    }

    /// Launches every queued request, grouped into batches.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.paused || self.stopping || self.in_flight > 0 {
            return;
        }
        let mut groups: Vec<Vec<Sample>> = Vec::new();
        for p in std::mem::take(&mut self.queue) {
            if p.events.is_closed() {
                continue; // the client went away before sampling started
            }
            let key = (p.params.temperature, p.params.top_p);
            let size = p.prompts.len();
            let fits = |g: &Vec<Sample>| {
                let first = &g[0];
                !first.seeded
                    && (first.params.temperature, first.params.top_p) == key
                    && g.iter().map(|q| q.prompts.len()).sum::<usize>() + size <= self.max_prompts
            };
            match groups.iter_mut().find(|g| !p.seeded && fits(g)) {
                Some(g) => g.push(p),
                None => groups.push(vec![p]),
            }
        }
        for group in groups {
            self.launch(group, ctx);
        }
    }

    fn launch(&mut self, group: Vec<Sample>, ctx: &mut Context<Self>) {
        let first = &group[0];
        let mut params = first.params.clone();
        if !first.seeded {
            params.seed = mix(self.seed, self.batches);
        }
        self.batches += 1;
        params.max_new_tokens = group
            .iter()
            .map(|p| p.params.max_new_tokens)
            .max()
            .unwrap_or(1);
        let prompts: Vec<Vec<u32>> = group
            .iter()
            .flat_map(|p| p.prompts.iter().cloned())
            .collect();
        tracing::debug!(
            prompts = prompts.len(),
            requests = group.len(),
            "sampling batch"
        );
        let sink = Box::new(BatchSink::new(&group, self.stats.clone()));
        // Kept to report a failed batch; dropped (closing the channels) once it is answered.
        let mut senders: Vec<mpsc::Sender<SampleEvent>> =
            group.into_iter().map(|p| p.events).collect();
        self.in_flight += 1;
        let send = self.policy.send(GenerateStream {
            prompts,
            params,
            sink,
        });
        ctx.spawn(send.into_actor(self).map(move |answer, act, ctx| {
            act.in_flight -= 1;
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
            if let Some(e) = failure {
                for s in &mut senders {
                    let _ = s.try_send(SampleEvent::Failed(e.clone()));
                }
            }
            drop(senders);
            if act.in_flight == 0 {
                for w in act.drained.drain(..) {
                    let _ = w.send(());
                }
                if act.stopping {
                    ctx.stop();
                } else {
                    act.flush(ctx);
                }
            }
        }));
    }
}

impl Actor for Sampler {
    type Context = Context<Self>;
}

impl Handler<Sample> for Sampler {
    type Result = Result<(), ApiError>;

    fn handle(&mut self, request: Sample, ctx: &mut Context<Self>) -> Self::Result {
        if self.stopping {
            return Err(shutting_down());
        }
        if request.prompts.is_empty() {
            return Err(ApiError::invalid("prompt", "there is no prompt to sample"));
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
        let (tx, rx) = oneshot::channel();
        if self.in_flight == 0 {
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
        let refused = self.queue.len();
        for mut p in self.queue.drain(..) {
            let _ = p.events.try_send(SampleEvent::Failed(shutting_down()));
        }
        tracing::debug!(refused, in_flight = self.in_flight, "sampler stopping");
        let (tx, rx) = oneshot::channel();
        if self.in_flight == 0 {
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
    use crate::actors::policy::PolicyActor;
    use crate::backend::NullBackend;

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
        let group = vec![
            Sample {
                prompts: vec![vec![1]],
                params: params(10),
                seeded: false,
                events: a_tx,
            },
            Sample {
                prompts: vec![vec![2], vec![3]],
                params: params(2),
                seeded: false,
                events: b_tx,
            },
        ];
        let stats = Arc::new(SamplingStats::default());
        let mut sink = BatchSink::new(&group, stats.clone());
        drop(group);
        sink.begin(9);
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

    /// A policy whose generation takes `nap`: batches stay in flight long enough to watch.
    struct SlowPolicy {
        nap: Duration,
    }

    impl Actor for SlowPolicy {
        type Context = SyncContext<Self>;
    }

    impl Handler<GenerateStream> for SlowPolicy {
        type Result = crate::Result<crate::actors::policy::Generated>;
        fn handle(&mut self, mut msg: GenerateStream, _: &mut SyncContext<Self>) -> Self::Result {
            std::thread::sleep(self.nap);
            msg.sink.begin(2);
            for row in 0..msg.prompts.len() {
                msg.sink.token(row, 9, -1.0, Some(FinishReason::Length));
            }
            Ok(crate::actors::policy::Generated {
                generations: Vec::new(),
                policy_version: 2,
            })
        }
    }

    /// Stopping answers the batch in flight, refuses the queued request and every later one
    /// with a 503 `shutting_down`, and resolves only once the batch in flight is done.
    #[test]
    fn stop_answers_the_batch_in_flight_and_refuses_the_rest() {
        actix::System::new().block_on(async {
            let policy = SyncArbiter::start(1, || SlowPolicy {
                nap: Duration::from_millis(300),
            });
            let sampler = Sampler::new(policy.recipient(), Duration::from_millis(1), 8, 1).start();
            let request = || sample(&sampler, vec![vec![1]], params(1), true);
            let in_flight = request();
            actix::clock::sleep(Duration::from_millis(100)).await;
            let queued = request();
            actix::clock::sleep(Duration::from_millis(20)).await;
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
