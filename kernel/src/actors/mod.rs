//! The actors and the one function that wires them.
//!
//! | actor | runs on | does |
//! |---|---|---|
//! | [`policy::PolicyActor`] | `SyncArbiter` (1 thread) | owns the backend: sample, score, train, checkpoint |
//! | [`rollout::RolloutActor`] ×2 | an arbiter of its own each (async; the environment's calls block only it) | the producer plays one RL step per [`flow::Produce`] and forwards it to the reward actor; the other serves evaluations, demonstrations and resample rounds |
//! | [`pull::PullSource`] (with the gateway) | async arbiter | the producer's place: asks the gateway's episode source for each step's groups and forwards them |
//! | [`reward::RewardActor`] | async arbiter | final rewards and shaping; forwards each step to the optimizer |
//! | [`bank::ExperienceBankActor`] | `SyncArbiter` | the experience bank (SQLite): query, put, update, checkpoint |
//! | [`pool::DataPoolActor`] | `SyncArbiter` (1 thread) | the data pool (SQLite): one transaction per RL step, evaluations, curated exclusions, truncation on resume |
//! | [`skills::SkillCreatorActor`] | async arbiter + one reflector `SyncArbiter` thread | answers reflection requests with bank entries |
//! | [`optimizer::OptimizerActor`] | an arbiter of its own (async; the algorithm's hooks block only it) | trains the forwarded steps in order: prepare (staleness, ℓ_old / ℓ_ref), signals and resampling, update, `observe`, record; reports each step to the trainer |
//! | the engine actor of `cairn-gateway` (with `[rollout.engine]`, started through [`engine::StartEngine`]) | async arbiter (its HTTP calls on threads of their own) | the rollout actors' generation on an external engine over HTTP, with the weight sync per policy version |
//!
//! [`host::KernelHost`] is the plugins' [`cairn_plugin_sdk::Host`]: messages to the policy, the
//! bank and the skill creator, made from the rollout and optimizer threads.
//!
//! An RL step flows producer → reward → optimizer, each stage forwarding to the next
//! ([`flow`] has the messages and the rules that keep it bounded and deterministic); the
//! trainer hands out credits and receives step reports. Actors hold `Recipient`s of their
//! peers' messages; only [`start`] and [`Pipeline::attach_gateway`] name concrete actor types.
//! Messages carry plain data (ids, `f32` arrays, rows), never tensors.
//! `SyncArbiter` actors start through [`threads::SyncThreads`], so the host can wait for their
//! threads (the policy's runs libtorch) before the process exits.

pub mod bank;
pub mod engine;
pub mod flow;
pub mod hooks;
pub mod host;
pub mod optimizer;
pub mod policy;
pub mod pool;
pub mod pull;
pub mod reward;
pub mod rollout;
pub mod skills;
pub mod threads;

use std::sync::Arc;

use actix::prelude::*;
use cairn_plugin_sdk::{Algorithm, Environment};
use parking_lot::Mutex;

use crate::backend::PolicyBackend;
use crate::objective::ObjectiveConfig;
use crate::rollout::prompt::{PromptBuilder, TextCodec};

/// Addresses of a running pipeline.
pub struct Pipeline {
    pub policy: Addr<policy::PolicyActor>,
    /// Serves evaluations, demonstrations and the optimizer's resample rounds.
    pub rollout: Addr<rollout::RolloutActor>,
    /// Where the trainer sends [`flow::Produce`]: the rollout producer (which plays each step
    /// and forwards it to the reward actor), or with the gateway its [`pull::PullSource`].
    pub produce: Recipient<flow::Produce>,
    pub reward: Addr<reward::RewardActor>,
    pub bank: Addr<bank::ExperienceBankActor>,
    /// The data pool: the optimizer writes every step, the trainer the evaluations.
    pub pool: Addr<pool::DataPoolActor>,
    pub skills: Addr<skills::SkillCreatorActor>,
    pub optimizer: Addr<optimizer::OptimizerActor>,
    /// With the gateway source: training episodes come from the gateway instead of the
    /// rollout actor, and generation pauses around weight updates. `None` from [`start`];
    /// attach one with [`Pipeline::attach_gateway`].
    pub gateway: Option<pull::GatewayLink>,
    /// The `SyncArbiter` threads above (policy, bank, pool): the host waits on it, after the
    /// actix system is dropped, before the process exits (see [`threads`]).
    pub threads: threads::SyncThreads,
}

impl Pipeline {
    /// Trains on a gateway's episodes instead of the rollout producer's. Call inside the
    /// running actix `System`.
    pub fn attach_gateway(&mut self, link: pull::GatewayLink, tasks_per_step: usize) {
        self.optimizer.do_send(optimizer::AttachGateway {
            collect: link.collect.clone(),
            pause: link.pause.clone(),
            resume: link.resume.clone(),
        });
        self.produce = pull::PullSource {
            source: link.collect.clone(),
            forward: self.reward.clone().recipient(),
            groups: tasks_per_step,
        }
        .start()
        .recipient();
        self.gateway = Some(link);
    }
}

/// Everything [`start`] needs.
pub struct PipelineParts {
    pub backend: Box<dyn PolicyBackend>,
    pub env: Arc<dyn Environment>,
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    /// The algorithm stack's names (estimator first), written on bank entries.
    pub algorithm_name: String,
    pub builder: Arc<dyn PromptBuilder>,
    pub codec: Arc<dyn TextCodec>,
    pub rollout: rollout::RolloutSettings,
    pub optimizer: optimizer::OptimizerSettings,
    pub reward: reward::RewardConfig,
    pub objective: ObjectiveConfig,
    /// The run's data pool (`Pool::open(&pool::pool_path(run))`, or `Pool::in_memory()`
    /// where nothing persists); the pool actor owns it.
    pub pool: cairn_stores::pool::Pool,
    /// The run's experience bank (`Bank::open(&bank::bank_path(run))`, or `Bank::in_memory()`
    /// where nothing persists); the bank actor owns it.
    pub bank: cairn_stores::bank::Bank,
    /// The skill creator's reflector.
    pub skills: crate::skills::SkillsConfig,
    /// The `endpoint` reflector's API key ([`crate::config::PipelineConfig::skills_api_key`]).
    pub skills_api_key: Option<String>,
    /// An external rollout engine, connected and checked (`[rollout.engine]`): the rollout
    /// actors generate through it instead of the policy actor.
    pub engine: Option<engine::StartEngine>,
}

/// Starts every actor and wires them: producer → reward → optimizer ([`flow`]), with the
/// policy actor serving generation, scoring and training, and the host services
/// ([`host::HostLinks`]) reaching the bank and the skill creator. Must be called inside a
/// running actix `System`.
pub fn start(parts: PipelineParts) -> Pipeline {
    let info = parts.env.info();
    let backend = Mutex::new(Some(parts.backend));
    let threads = threads::SyncThreads::default();
    let policy = threads.start(move || {
        policy::PolicyActor::new(
            backend
                .lock()
                .take()
                .expect("the policy actor is built once"),
        )
    });
    let bank = {
        let bank = Mutex::new(Some(parts.bank));
        threads.start(move || {
            let bank = bank.lock().take().expect("the bank actor is built once");
            bank::ExperienceBankActor::new(bank)
        })
    };
    let pool = {
        let store = Mutex::new(Some(parts.pool));
        threads.start(move || {
            let store = store.lock().take().expect("the pool actor is built once");
            pool::DataPoolActor::new(store)
        })
    };
    let reflector = crate::skills::reflector(
        &parts.skills,
        crate::skills::ReflectorPeers {
            generate: policy.clone().recipient(),
            builder: parts.builder.clone(),
            codec: parts.codec.clone(),
            api_key: parts.skills_api_key.clone(),
        },
    );
    let skills =
        skills::SkillCreatorActor::new(&parts.skills, bank.clone().recipient(), reflector).start();
    let links = host::HostLinks {
        score: policy.clone().recipient(),
        score_top_k: policy.clone().recipient(),
        generate: policy.clone().recipient(),
        version: policy.clone().recipient(),
        bank_query: bank.clone().recipient(),
        bank_put: bank.clone().recipient(),
        bank_update: bank.clone().recipient(),
        reflect: skills.clone().recipient(),
        codec: parts.codec.clone(),
        builder: parts.builder.clone(),
        temperature: parts.rollout.temperature,
        writer: parts.algorithm_name.clone(),
    };
    let turn_context = parts.algorithm.lock().requirements().turn_context;
    // The rollout actors' generation: the policy actor, or the external engine.
    // Async, and it never blocks (its HTTP calls run on threads of their own): beside the
    // reward and skill actors.
    let engine = parts.engine.map(|start| start(policy.clone()));
    let rollout_generate: Recipient<policy::Generate> = match &engine {
        Some(e) => e.generate.clone(),
        None => policy.clone().recipient(),
    };

    let rollout_actor = |forward: Option<Recipient<flow::Played>>| {
        let env = parts.env.clone();
        let builder = parts.builder.clone();
        let algorithm = parts.algorithm.clone();
        let generate = rollout_generate.clone();
        let settings = parts.rollout.clone();
        let links = links.clone();
        // On an arbiter of its own: the environment's calls block its thread.
        let arbiter = Arbiter::new().handle();
        rollout::RolloutActor::start_in_arbiter(&arbiter.clone(), move |_| rollout::RolloutActor {
            env,
            builder,
            algorithm,
            policy: generate,
            links,
            turn_context,
            forward,
            settings,
            train_tasks: info.train_tasks,
            test_tasks: info.test_tasks,
            env_max_turns: info.max_turns,
            arbiter: Some(arbiter),
        })
    };
    let rollout = rollout_actor(None);

    // On an arbiter of its own: the algorithm's hooks run synchronously on its thread.
    let optimizer = {
        let stages = optimizer::Stages {
            hooks: hooks::Hooks {
                algorithm: parts.algorithm.clone(),
                links: links.clone(),
                timeout: parts.optimizer.plugin_timeout,
                actor: "optimizer",
            },
            score: policy.clone().recipient(),
            version: policy.clone().recipient(),
            train: policy.clone().recipient(),
            sft: policy.clone().recipient(),
            source: rollout.clone().recipient(),
            reward: parts.reward.clone(),
            record: pool.clone().recipient(),
            exclusions: pool.clone().recipient(),
            take_finished: skills.clone().recipient(),
            objective: parts.objective.clone(),
            settings: parts.optimizer.clone(),
            gateway: None,
            engine: engine.map(|e| e.stats),
        };
        let arbiter = Arbiter::new().handle();
        optimizer::OptimizerActor::start_in_arbiter(&arbiter.clone(), move |_| {
            optimizer::OptimizerActor {
                stages,
                phase: None,
                busy: false,
                arbiter: Some(arbiter),
            }
        })
    };
    let reward = reward::RewardActor {
        config: parts.reward,
        forward: optimizer.clone().recipient(),
    }
    .start();
    let producer = rollout_actor(Some(reward.clone().recipient()));

    Pipeline {
        policy,
        rollout,
        produce: producer.recipient(),
        reward,
        bank,
        pool,
        skills,
        optimizer,
        gateway: None,
        threads,
    }
}
