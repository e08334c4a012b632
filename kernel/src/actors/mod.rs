//! The actors and the one function that wires them.
//!
//! | actor | runs on | does |
//! |---|---|---|
//! | [`policy::PolicyActor`] | `SyncArbiter` (1 thread) | owns the backend: sample, score, train, checkpoint |
//! | [`rollout::RolloutActor`] | `SyncArbiter` | plans groups, plays episodes, evaluates, collects demonstrations |
//! | [`reward::RewardActor`] | async arbiter | final rewards and shaping |
//! | [`bank::ExperienceBankActor`] | async arbiter | records batches, keeps recent trajectories |
//! | [`skills::SkillCreatorActor`] | async arbiter | writes skill entries from trajectories |
//! | [`optimizer::OptimizerActor`] | `SyncArbiter` | old/ref log-probs, plugin signals, objective, update |
//!
//! Actors hold `Recipient`s of their peers' messages; only [`start`] names concrete actor
//! types. Messages carry plain data (ids, `f32` arrays, rows), never tensors.

pub mod bank;
pub mod optimizer;
pub mod policy;
pub mod reward;
pub mod rollout;
pub mod skills;

use std::collections::VecDeque;
use std::path::PathBuf;
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
    pub rollout: Addr<rollout::RolloutActor>,
    pub reward: Addr<reward::RewardActor>,
    pub bank: Addr<bank::ExperienceBankActor>,
    pub skills: Addr<skills::SkillCreatorActor>,
    pub optimizer: Addr<optimizer::OptimizerActor>,
    /// With the gateway source: training episodes come from the gateway instead of the
    /// rollout actor, and generation pauses around weight updates. `None` from [`start`].
    pub gateway: Option<crate::gateway::GatewayLink>,
}

/// Everything [`start`] needs.
pub struct PipelineParts {
    pub backend: Box<dyn PolicyBackend>,
    pub env: Arc<dyn Environment>,
    pub algorithm: Arc<Mutex<Box<dyn Algorithm>>>,
    pub builder: Arc<dyn PromptBuilder>,
    pub codec: Arc<dyn TextCodec>,
    pub rollout: rollout::RolloutSettings,
    pub reward: reward::RewardConfig,
    pub objective: ObjectiveConfig,
    pub micro_batch_rows: usize,
    pub updates_per_batch: usize,
    pub record_dir: Option<PathBuf>,
    pub bank_capacity: usize,
}

/// Starts every actor. Must be called inside a running actix `System`.
pub fn start(parts: PipelineParts) -> Pipeline {
    let info = parts.env.info();
    let backend = Mutex::new(Some(parts.backend));
    let policy = SyncArbiter::start(1, move || {
        policy::PolicyActor::new(
            backend
                .lock()
                .take()
                .expect("the policy actor is built once"),
        )
    });

    let rollout_actor = {
        let env = parts.env.clone();
        let builder = parts.builder.clone();
        let algorithm = parts.algorithm.clone();
        let generate = policy.clone().recipient();
        let settings = parts.rollout.clone();
        SyncArbiter::start(1, move || rollout::RolloutActor {
            env: env.clone(),
            builder: builder.clone(),
            algorithm: algorithm.clone(),
            policy: generate.clone(),
            settings: settings.clone(),
            train_tasks: info.train_tasks,
            test_tasks: info.test_tasks,
            env_max_turns: info.max_turns,
        })
    };

    let optimizer_actor = {
        let algorithm = parts.algorithm.clone();
        let score = policy.clone().recipient();
        let generate = policy.clone().recipient();
        let train = policy.clone().recipient();
        let codec = parts.codec.clone();
        let objective = parts.objective.clone();
        let (micro, updates, temperature) = (
            parts.micro_batch_rows,
            parts.updates_per_batch,
            parts.rollout.temperature,
        );
        SyncArbiter::start(1, move || optimizer::OptimizerActor {
            algorithm: algorithm.clone(),
            score: score.clone(),
            generate: generate.clone(),
            train: train.clone(),
            codec: codec.clone(),
            objective: objective.clone(),
            micro_batch_rows: micro,
            updates_per_batch: updates,
            temperature,
        })
    };

    Pipeline {
        policy,
        rollout: rollout_actor,
        reward: reward::RewardActor {
            config: parts.reward,
        }
        .start(),
        bank: bank::ExperienceBankActor {
            record_dir: parts.record_dir,
            capacity: parts.bank_capacity,
            recent: VecDeque::new(),
        }
        .start(),
        skills: skills::SkillCreatorActor::default().start(),
        optimizer: optimizer_actor,
        gateway: None,
    }
}
