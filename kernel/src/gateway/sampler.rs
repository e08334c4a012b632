//! [`Sampler`]: batches concurrent gateway requests into few `Generate` calls on the policy
//! actor, and pauses them around weight updates.
//!
//! The backend samples a batch of prompts in one pass, so requests arriving within
//! `window` of each other (and while a batch is generating) are sampled together: one batch
//! per distinct (temperature, top-p) pair, up to `max_prompts` prompts, with
//! `max_new_tokens` the largest asked and each output cut back to its own request's limit
//! (a prefix of a sample is a sample of the shorter request; its finish reason becomes
//! `length`). A request that fixes its `seed` is sampled in a batch of its own, so its ids
//! do not depend on its neighbours; the others get a seed derived from the batch counter.
//!
//! **Weight updates.** [`PauseSampling`] stops launching batches and resolves once the
//! batches in flight are done (drained); requests arriving meanwhile wait in the queue.
//! [`ResumeSampling`] launches them. Every answer carries the policy version that sampled it:
//! each `Generate` runs on one version, since the policy actor handles one message at a time.
//!
//! **Shutdown.** [`StopSampling`] answers every queued request, and every later one, with a
//! 503 ([`shutting_down`]), lets the batches in flight finish and be answered, then stops the
//! actor and resolves. Afterwards nothing of the gateway's reaches the policy actor, so the
//! host can let its thread (and libtorch) go without a generation running under it.

use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;

use super::api_error::{ApiError, ApiErrorKind};
use crate::actors::policy::Generate;
use crate::backend::{Generation, SamplingParams};
use crate::rollout::mix;

/// Sample `n` responses for each prompt.
#[derive(Message)]
#[rtype(result = "Result<Sampled, ApiError>")]
pub struct Sample {
    /// One entry per response to sample (a prompt asked with `n` choices appears `n` times).
    pub prompts: Vec<Vec<u32>>,
    pub params: SamplingParams,
    /// Keep `params.seed` and sample alone.
    pub seeded: bool,
}

/// Responses in the order of [`Sample::prompts`], and the version that sampled them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampled {
    pub generations: Vec<Generation>,
    pub policy_version: u64,
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
/// once no `Generate` of the sampler's is running.
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

struct Pending {
    request: Sample,
    reply: oneshot::Sender<Result<Sampled, ApiError>>,
}

/// The batching actor; see the module docs. Runs on an async arbiter.
pub struct Sampler {
    policy: Recipient<Generate>,
    window: Duration,
    max_prompts: usize,
    seed: u64,
    queue: Vec<Pending>,
    scheduled: bool,
    paused: bool,
    /// [`StopSampling`] came: refuse everything, stop once `in_flight` is 0.
    stopping: bool,
    in_flight: usize,
    drained: Vec<oneshot::Sender<()>>,
    batches: u64,
}

impl Sampler {
    /// `window`: how long the first request of a batch waits for others; `max_prompts`:
    /// prompts per `Generate` at most; `seed`: where unseeded batches' seeds derive from.
    pub fn new(
        policy: Recipient<Generate>,
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
        }
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
        let mut groups: Vec<Vec<Pending>> = Vec::new();
        for p in std::mem::take(&mut self.queue) {
            if p.reply.is_canceled() {
                continue; // the client went away before sampling started
            }
            let key = (p.request.params.temperature, p.request.params.top_p);
            let size = p.request.prompts.len();
            let fits = |g: &Vec<Pending>| {
                let first = &g[0].request;
                !first.seeded
                    && (first.params.temperature, first.params.top_p) == key
                    && g.iter().map(|q| q.request.prompts.len()).sum::<usize>() + size
                        <= self.max_prompts
            };
            match groups.iter_mut().find(|g| !p.request.seeded && fits(g)) {
                Some(g) => g.push(p),
                None => groups.push(vec![p]),
            }
        }
        for group in groups {
            self.launch(group, ctx);
        }
    }

    fn launch(&mut self, group: Vec<Pending>, ctx: &mut Context<Self>) {
        let first = &group[0].request;
        let mut params = first.params.clone();
        if !first.seeded {
            params.seed = mix(self.seed, self.batches);
        }
        self.batches += 1;
        params.max_new_tokens = group
            .iter()
            .map(|p| p.request.params.max_new_tokens)
            .max()
            .unwrap_or(1);
        let prompts: Vec<Vec<u32>> = group
            .iter()
            .flat_map(|p| p.request.prompts.iter().cloned())
            .collect();
        tracing::debug!(
            prompts = prompts.len(),
            requests = group.len(),
            "sampling batch"
        );
        self.in_flight += 1;
        let send = self.policy.send(Generate { prompts, params });
        ctx.spawn(send.into_actor(self).map(move |answer, act, ctx| {
            act.in_flight -= 1;
            distribute(answer, group);
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

/// Hands each request its slice of the batch, cut to its own `max_new_tokens`.
fn distribute(
    answer: Result<crate::Result<crate::actors::policy::Generated>, MailboxError>,
    group: Vec<Pending>,
) {
    let generated = match answer {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => {
            let e = ApiError::from(e);
            for p in group {
                let _ = p.reply.send(Err(e.clone()));
            }
            return;
        }
        Err(e) => {
            for p in group {
                let _ = p.reply.send(Err(ApiError::new(
                    ApiErrorKind::Unavailable,
                    format!(
                        "the policy actor is gone ({e}): the gateway is shutting down; send \
                         the request to a running `cairn serve` or `cairn train`"
                    ),
                )
                .with_code("shutting_down")));
            }
            return;
        }
    };
    let mut generations = generated.generations.into_iter();
    for p in group {
        let limit = p.request.params.max_new_tokens as usize;
        let mine: Vec<Generation> = generations
            .by_ref()
            .take(p.request.prompts.len())
            .map(|mut g| {
                if g.ids.len() > limit {
                    g.ids.truncate(limit);
                    g.logprobs.truncate(limit);
                    g.finish_reason = cairn_plugin_sdk::FinishReason::Length;
                }
                g
            })
            .collect();
        let answer = if mine.len() == p.request.prompts.len() {
            Ok(Sampled {
                generations: mine,
                policy_version: generated.policy_version,
            })
        } else {
            Err(ApiError::internal(
                "the policy returned fewer responses than prompts",
            ))
        };
        let _ = p.reply.send(answer);
    }
}

impl Actor for Sampler {
    type Context = Context<Self>;
}

impl Handler<Sample> for Sampler {
    type Result = ResponseFuture<Result<Sampled, ApiError>>;

    fn handle(&mut self, request: Sample, ctx: &mut Context<Self>) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        if self.stopping {
            return Box::pin(async { Err(shutting_down()) });
        }
        if request.prompts.is_empty() {
            return Box::pin(async { Ok(Sampled::default()) });
        }
        self.queue.push(Pending { request, reply });
        self.schedule(ctx);
        // A dropped reply means the actor stopped with the request still queued.
        Box::pin(async move { answer.await.unwrap_or_else(|_| Err(shutting_down())) })
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
        for p in self.queue.drain(..) {
            let _ = p.reply.send(Err(shutting_down()));
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
            let sampler = Sampler::new(policy.recipient(), Duration::from_millis(5), 8, 1).start();
            let a = sampler.send(Sample {
                prompts: vec![vec![1], vec![1]],
                params: params(3),
                seeded: false,
            });
            let b = sampler.send(Sample {
                prompts: vec![vec![2]],
                params: params(1),
                seeded: false,
            });
            let (a, b) = futures::join!(a, b);
            let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
            assert_eq!(a.generations.len(), 2);
            assert_eq!(a.generations[0].ids, vec![5, 6, 7]);
            assert_eq!(b.generations[0].ids, vec![5]);
            assert_eq!(b.policy_version, 4);

            sampler.send(PauseSampling).await.unwrap();
            let held = sampler.send(Sample {
                prompts: vec![vec![3]],
                params: params(2),
                seeded: true,
            });
            let waited = actix::clock::timeout(Duration::from_millis(50), held).await;
            assert!(waited.is_err(), "a paused sampler holds requests");
            sampler.send(ResumeSampling).await.unwrap();
            let again = sampler
                .send(Sample {
                    prompts: vec![vec![3]],
                    params: params(2),
                    seeded: true,
                })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(again.generations[0].ids, vec![5, 6]);
        });
    }

    /// A policy whose `Generate` takes `nap`: batches stay in flight long enough to watch.
    struct SlowPolicy {
        nap: Duration,
    }

    impl Actor for SlowPolicy {
        type Context = SyncContext<Self>;
    }

    impl Handler<Generate> for SlowPolicy {
        type Result = crate::Result<crate::actors::policy::Generated>;
        fn handle(&mut self, msg: Generate, _: &mut SyncContext<Self>) -> Self::Result {
            std::thread::sleep(self.nap);
            Ok(crate::actors::policy::Generated {
                generations: msg
                    .prompts
                    .iter()
                    .map(|_| Generation {
                        ids: vec![9],
                        logprobs: vec![-1.0],
                        finish_reason: cairn_plugin_sdk::FinishReason::Length,
                    })
                    .collect(),
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
            let request = || Sample {
                prompts: vec![vec![1]],
                params: params(1),
                seeded: true,
            };
            let in_flight = sampler.send(request());
            actix::clock::sleep(Duration::from_millis(100)).await;
            let queued = sampler.send(request());
            actix::clock::sleep(Duration::from_millis(20)).await;
            let started = std::time::Instant::now();
            let stop = sampler.send(StopSampling);
            let refused = sampler.send(request());
            let (in_flight, queued, stop, refused) =
                futures::join!(in_flight, queued, stop, refused);
            stop.unwrap();
            assert!(
                started.elapsed() >= Duration::from_millis(100),
                "stop waited for the batch in flight"
            );
            let answered = in_flight.unwrap().unwrap();
            assert_eq!(answered.generations[0].ids, vec![9]);
            for refused in [queued.unwrap(), refused.unwrap()] {
                let e = refused.unwrap_err();
                assert_eq!(
                    (e.status(), e.code.as_deref()),
                    (503, Some("shutting_down"))
                );
                assert!(e.message.contains("shutting down"), "{}", e.message);
            }
            // The sampler has stopped: a later request never reaches the policy.
            assert!(sampler.send(request()).await.is_err());
        });
    }
}
