//! An external rollout engine: the rollout actors' generation goes to vLLM, SGLang or
//! `cairn serve` over HTTP instead of the policy actor, and the engine gets the trainer's
//! weights at each policy version (docs/engine.md).
//!
//! [`EngineActor`] answers the same [`Generate`] message as the policy actor, so the rollout
//! actors, every plugin, the objective and the data pool see rows exactly like those of
//! Cairn's own backend: the ids and log-probs are the engine's, verbatim
//! ([`client`]), and `policy_version` is the version the engine served them with.
//!
//! **Weight sync.** Before a generation, the actor compares the trainer's policy version with
//! the one the engine serves, and syncs an older engine first, so every turn is sampled by
//! the live weights. At any `rollout.max_staleness` that is what the step's flow asks for: a
//! step is played by exactly the version the flow names, and the policy does not change while
//! a step plays ([`cairn_kernel::actors::flow`]), so one sync at the step's first generation serves
//! the whole step, and the lag between playing and training is the pipeline's alone (an
//! engine that sampled on with older weights meanwhile would add to it, and those rows would
//! be too stale to train). A sync writes the weights in HF format ([`ExportForEngine`], on the policy actor's thread) into
//! `weights_dir`, has each engine load them ([`EngineClient::load_weights`]), and checks them.
//!
//! **The probe.** After every sync each engine samples a few ids after a fixed probe prompt,
//! and the trainer scores them with the weights of the synced version at the rollout
//! temperature. The mean |difference| of the log-probs must stay under
//! `rollout.engine.probe_tolerance`: a sync that silently did nothing (verl #7495, slime
//! #2280) fails here, and so does an engine whose log-probs mean something else (raw
//! log-probs before the temperature, trl #4159) at the first sync, with an error that names
//! the setting to fix. The probe's mismatch is in `engine/probe_mismatch`. A failed sync (an
//! engine that refuses the weights, or fails the probe) stops the run.
//!
//! **Threads.** [`EngineActor`] is an async actor that never blocks its arbiter: it awaits the
//! policy actor's answers (version, export, probe scores), and each blocking engine call
//! (HTTP, removing old weights) runs on a thread of its own while it awaits the answer
//! ([`off_thread`]). A generation (with the sync it may start) holds the actor's mailbox
//! until it is answered ([`AtomicResponse`]), so generations and syncs run one at a time, in
//! arrival order.

pub mod client;
pub mod config;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;

pub use client::{Completion, EngineClient, ServedModel};
pub use config::{EngineConfig, EngineKind, LaunchConfig};

pub use cairn_kernel::actors::engine::{EngineLink, EngineStats, ReadEngineStats, StartEngine};
use cairn_kernel::actors::policy::{Generate, Generated, PolicyActor, PolicyVersion, Score};
use cairn_kernel::backend::{SamplingParams, Sequence, Weights};
use cairn_kernel::error::{Error, Result};

/// Tokens the probe samples.
const PROBE_TOKENS: u32 = 8;
/// Weight directories kept in `weights_dir` (older ones are removed after a sync).
const KEPT_WEIGHT_DIRS: usize = 2;

/// Export the live weights in HF format into `dir`, with the version they are.
#[derive(Message)]
#[rtype(result = "Result<u64>")]
pub struct ExportForEngine {
    pub tokenizer_dir: PathBuf,
    pub dir: PathBuf,
}

impl Handler<ExportForEngine> for PolicyActor {
    type Result = Result<u64>;
    fn handle(&mut self, msg: ExportForEngine, _: &mut Self::Context) -> Self::Result {
        self.export_versioned(&msg.tokenizer_dir, &msg.dir)
    }
}

/// What the engine actor needs besides the client.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// `rollout.temperature` and `rollout.top_p`: the probe samples and is scored at them.
    pub temperature: f32,
    pub top_p: f32,
    pub probe_tolerance: f64,
    /// Where the weights go (`rollout.engine.weights_dir`).
    pub weights_dir: PathBuf,
    /// The tokenizer files shipped with the weights.
    pub tokenizer_dir: PathBuf,
    /// The probe prompt's ids.
    pub probe_prompt: Vec<u32>,
    /// The run's seed (the probe's sampling seed derives from it).
    pub seed: u64,
}

/// The policy actor's services the engine needs.
#[derive(Clone)]
pub struct PolicyLinks {
    pub version: Recipient<PolicyVersion>,
    pub export: Recipient<ExportForEngine>,
    pub score: Recipient<Score>,
}

/// Sentinel of "the engine serves no known version yet".
const UNSYNCED: u64 = u64::MAX;

/// Shared by the actor and its engine-call threads.
struct Core {
    client: EngineClient,
    settings: EngineSettings,
    policy: PolicyLinks,
    /// The version every engine serves ([`UNSYNCED`] before the first sync).
    served: AtomicU64,
    /// Mean |Δ log-prob| of the last probe, nats per token (as f64 bits).
    last_probe: AtomicU64,
    syncs: AtomicU64,
}

/// Answers [`Generate`] through the engine. An async actor (module docs: it never blocks).
pub struct EngineActor {
    core: Arc<Core>,
}

impl EngineActor {
    pub fn new(client: EngineClient, settings: EngineSettings, policy: PolicyLinks) -> Self {
        EngineActor {
            core: Arc::new(Core {
                client,
                settings,
                policy,
                served: AtomicU64::new(UNSYNCED),
                last_probe: AtomicU64::new(0f64.to_bits()),
                syncs: AtomicU64::new(0),
            }),
        }
    }
}

impl EngineActor {
    /// What the kernel's pipeline calls to start the engine's actor once the policy actor
    /// runs (`PipelineParts::engine`).
    pub fn starter(client: EngineClient, settings: EngineSettings) -> StartEngine {
        Box::new(move |policy: Addr<PolicyActor>| {
            let engine = EngineActor::new(
                client,
                settings,
                PolicyLinks {
                    version: policy.clone().recipient(),
                    export: policy.clone().recipient(),
                    score: policy.recipient(),
                },
            )
            .start();
            EngineLink {
                generate: engine.clone().recipient(),
                stats: engine.recipient(),
            }
        })
    }
}

impl Actor for EngineActor {
    type Context = Context<Self>;
}

impl Handler<Generate> for EngineActor {
    type Result = AtomicResponse<Self, Result<Generated>>;
    fn handle(&mut self, msg: Generate, _: &mut Self::Context) -> Self::Result {
        let core = self.core.clone();
        let answer = async move {
            core.ensure_synced().await?;
            let served = core.served.load(Ordering::SeqCst);
            let out =
                off_thread(&core, move |c| c.client.generate(&msg.prompts, &msg.params)).await??;
            Ok(Generated {
                policy_version: out.policy_version.unwrap_or(served),
                generations: out.generations,
            })
        };
        AtomicResponse::new(Box::pin(answer.into_actor(self)))
    }
}

/// Runs a blocking engine call (HTTP, files) on a thread of its own and awaits its answer, so
/// the actor's arbiter goes on meanwhile (the actors beside it: it is the system arbiter).
/// A thread costs tens of microseconds; an engine call takes milliseconds at least.
async fn off_thread<T, F>(core: &Arc<Core>, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Core) -> T + Send + 'static,
{
    let core = core.clone();
    let (reply, answer) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name("cairn-engine-call".into())
        .spawn(move || {
            let _ = reply.send(f(&core));
        })
        .map_err(|e| {
            Error::Other(format!(
                "could not start a thread for a rollout engine call: {e}"
            ))
        })?;
    answer
        .await
        .map_err(|_| Error::Other("a rollout engine call panicked (see the log above)".into()))
}

impl Handler<ReadEngineStats> for EngineActor {
    type Result = MessageResult<ReadEngineStats>;
    fn handle(&mut self, _: ReadEngineStats, _: &mut Self::Context) -> Self::Result {
        let c = &self.core;
        let served = c.served.load(Ordering::SeqCst);
        MessageResult(EngineStats {
            syncs: c.syncs.load(Ordering::SeqCst),
            probe_mismatch: f64::from_bits(c.last_probe.load(Ordering::SeqCst)),
            served_version: (served != UNSYNCED).then_some(served),
        })
    }
}

impl Core {
    /// Syncs the engines when they serve an older version than the trainer's (module docs).
    async fn ensure_synced(self: &Arc<Self>) -> Result<()> {
        let trainer = self.policy.version.send(PolicyVersion).await?;
        let served = self.served.load(Ordering::SeqCst);
        if served != UNSYNCED && served >= trainer {
            return Ok(());
        }
        self.sync(trainer).await.map_err(sync_failed)
    }

    /// Exports the live weights, has every engine load them, probes each (module docs).
    /// `trainer` is the version the trainer reported, for the directory's name; the export
    /// says which version it wrote.
    async fn sync(self: &Arc<Self>, trainer: u64) -> Result<()> {
        let first = self.served.load(Ordering::SeqCst) == UNSYNCED;
        let s = &self.settings;
        let dir = match self.client.kind() {
            // vLLM reloads from the directory it was started on: `weights_dir` itself.
            EngineKind::Vllm => s.weights_dir.clone(),
            _ => s.weights_dir.join(format!("v{trainer:06}")),
        };
        let version = self
            .policy
            .export
            .send(ExportForEngine {
                tokenizer_dir: s.tokenizer_dir.clone(),
                dir: dir.clone(),
            })
            .await??;
        // An engine that is gone is taken out of the run; the others must all take the
        // weights (and pass the probe), or the sync fails.
        // That holds while it loads and while it is probed: an engine killed between the two
        // is gone as surely as one killed before.
        for url in self.client.urls() {
            let (at, from) = (url.clone(), dir.clone());
            // The load's error, and whether the engine still answers `/health` after it.
            let loaded = off_thread(self, move |c| {
                c.client
                    .load_weights(&at, &from, version)
                    .map_err(|e| (c.client.healthy(&at), e))
            })
            .await?;
            match loaded {
                Ok(()) => self.probe(&url, version, first, &dir).await?,
                Err((false, e)) => self.client.mark_down(&url, &e.to_string()),
                Err((true, e)) => return Err(e),
            }
        }
        self.client.check_live()?;
        self.served.store(version, Ordering::SeqCst);
        self.syncs.fetch_add(1, Ordering::SeqCst);
        tracing::info!(version, "engine weights synced");
        if self.client.kind() != EngineKind::Vllm {
            let (weights_dir, keep) = (s.weights_dir.clone(), dir.clone());
            off_thread(self, move |_| prune_weight_dirs(&weights_dir, &keep)).await?;
        }
        Ok(())
    }

    /// The probe check of one engine after the sync to `version`. An engine that no longer
    /// answers (the request fails and so does `/health`) is taken out of the run instead.
    async fn probe(
        self: &Arc<Self>,
        url: &str,
        version: u64,
        first: bool,
        dir: &std::path::Path,
    ) -> Result<()> {
        let s = &self.settings;
        let params = SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            max_new_tokens: PROBE_TOKENS,
            stop_ids: Vec::new(),
            seed: cairn_kernel::rollout::mix(s.seed, version),
        };
        let at = url.to_owned();
        let probed = off_thread(self, move |c| {
            c.client
                .probe(&at, &c.settings.probe_prompt, &params)
                .map_err(|e| (c.client.healthy(&at), e))
        })
        .await?;
        let out = match probed {
            Ok(out) => out,
            // Gone since it took the weights: out of the run, the sync goes on without it.
            Err((false, e)) => {
                self.client.mark_down(url, &e.to_string());
                return Ok(());
            }
            Err((true, e)) => return Err(e),
        };
        let g = &out.generations[0];
        if let Some(reported) = out.policy_version {
            if reported != version {
                return Err(Error::Engine {
                    url: url.to_owned(),
                    message: format!(
                        "after loading the weights of policy version {version} it reports \
                         policy version {reported}: the sync did nothing"
                    ),
                });
            }
        }
        let trainer = self
            .policy
            .score
            .send(Score {
                sequences: vec![Sequence {
                    prompt_ids: s.probe_prompt.clone(),
                    response_ids: g.ids.clone(),
                }],
                temperature: s.temperature,
                weights: Weights::Version(version),
            })
            .await??;
        let mismatch = mean_abs_diff(&g.logprobs, &trainer[0]);
        self.last_probe.store(mismatch.to_bits(), Ordering::SeqCst);
        if mismatch <= s.probe_tolerance {
            return Ok(());
        }
        let found = format!(
            "on the probe prompt the engine's log-probs differ from the trainer's (policy \
             version {version}, temperature {}) by {mismatch:.4} nats per token, over \
             `rollout.engine.probe_tolerance` = {}",
            s.temperature, s.probe_tolerance
        );
        let message = if first {
            let fix = match self.client.kind() {
                EngineKind::Vllm => {
                    "start vLLM with `--logprobs-mode processed_logprobs` (by default it reports \
                     log-probs before the temperature: trl #4159), the same dtype as \
                     `model.dtype`, and on the weights directory Cairn wrote"
                }
                _ => {
                    "the engine must report log softmax(logits / T) of each sampled id, before \
                     top-p, at the request's temperature (trl #4159), and serve the weights \
                     Cairn sent it; a lower-precision engine needs a larger tolerance"
                }
            };
            format!("{found}: {fix}")
        } else {
            format!(
                "{found}: the engine did not take the new weights in {} (a sync that silently \
                 did nothing: verl #7495, slime #2280)",
                dir.display()
            )
        };
        Err(Error::Engine {
            url: url.to_owned(),
            message,
        })
    }
}

/// A failed weight sync stops the run (unlike a failed generation, which fails a turn's
/// episodes): training on with an engine that serves other weights would train on rows of
/// the wrong policy.
fn sync_failed(e: Error) -> Error {
    match e {
        Error::Engine { url, message } => Error::Other(format!(
            "the weight sync to the rollout engine failed, so the run stops (its rows would not \
             be the policy's): rollout engine {url}: {message}"
        )),
        other => other,
    }
}

/// Mean |a − b| over the common length, as f64 (0 for empty inputs).
pub fn mean_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs())).sum();
    sum / n as f64
}

/// Removes the `v*` weight directories of `weights_dir` but the newest few (`keep` among
/// them).
fn prune_weight_dirs(weights_dir: &std::path::Path, keep: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(weights_dir) else {
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('v'))
        })
        .collect();
    dirs.sort();
    let excess = dirs.len().saturating_sub(KEPT_WEIGHT_DIRS);
    for d in dirs.into_iter().take(excess) {
        if d != keep {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

/// A probe prompt of `len` ids spread over the vocabulary (deterministic; any ids do, the
/// probe compares log-probs, not text).
pub fn probe_prompt(vocab_size: usize, len: usize) -> Vec<u32> {
    let v = vocab_size.max(2) as u64;
    (0..len as u64)
        .map(|i| (1 + (i * 2_654_435_761 + 97) % (v - 1)) as u32)
        .collect()
}

#[cfg(test)]
mod tests;
