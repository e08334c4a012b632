//! What the plugin checkpoints: the reservoir, the assertion set, the served skills, the
//! running A/B test, the horizon fit, the pending reflection and the counters.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use cairn_plugin_sdk::EntryStatus;

use crate::ab::{AbTest, HorizonFit};
use crate::assertion::Assertion;
use crate::config::ReskillConfig;
use crate::creator::Episode;

/// A skill the plugin serves: an active one, or the one under test.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skill {
    pub text: String,
    /// Regex searched (case-insensitively) in the observation; `None` fires always.
    pub trigger: Option<String>,
    /// The task kind it was written for (a later skill for the kind revises it).
    pub task_kind: String,
    pub status: EntryStatus,
}

/// What became of a proposed assertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A skill for it was asked of the skill creator.
    Requested,
    /// The skill failed verification (length or trigger rate).
    Rejected,
    /// Its skill is under test.
    Testing,
    /// Its skill won its test.
    Accepted,
    /// Its skill lost its test and was retired.
    Reverted,
}

/// An assertion the creator proposed (the plugin's assertion set; each `(kind, assertion)`
/// pair is proposed once).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackedAssertion {
    pub task_kind: String,
    pub assertion: Assertion,
    /// Hold rates among the kind's successes and failures when it was diagnosed.
    pub success_rate: f64,
    pub failure_rate: f64,
    pub step: u64,
    pub verdict: Verdict,
    /// The bank entry written for it, once one arrived.
    pub skill: Option<u64>,
}

/// The most assertions the set remembers; the oldest are forgotten first.
pub const MAX_TRACKED_ASSERTIONS: usize = 512;

/// A reflection asked of the skill creator and not yet answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub ticket: u64,
    pub task_kind: String,
    pub assertion: Assertion,
    /// The active skill the new one would replace.
    pub parent: Option<u64>,
    pub step: u64,
}

/// Cumulative counters since the start of the run (logged every step).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub accepted: u64,
    pub reverted: u64,
    pub rejected_trigger_rate: u64,
    pub rejected_too_long: u64,
    pub rejected_invalid_trigger: u64,
    pub reflections_requested: u64,
    /// Reflections that failed in the skill creator, or that it refused.
    pub reflections_failed: u64,
}

/// Everything the plugin checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReskillState {
    /// The most recent `reservoir_size` episodes, oldest first.
    pub reservoir: VecDeque<Episode>,
    pub assertions: Vec<TrackedAssertion>,
    /// Active skills and the skill under test, by bank id.
    pub skills: BTreeMap<u64, Skill>,
    pub test: Option<AbTest>,
    /// Id of the next test, from 1.
    pub next_test: u64,
    pub fit: HorizonFit,
    /// Not carried across a resume: the kernel does not checkpoint queued reflections.
    pub pending: Option<Pending>,
    /// The step of the last skill request.
    pub last_request_step: Option<u64>,
    pub counters: Counters,
}

impl ReskillState {
    pub fn new(config: &ReskillConfig) -> ReskillState {
        ReskillState {
            reservoir: VecDeque::new(),
            assertions: Vec::new(),
            skills: BTreeMap::new(),
            test: None,
            next_test: 1,
            fit: HorizonFit::new(config.m_grid_max),
            pending: None,
            last_request_step: None,
            counters: Counters::default(),
        }
    }

    /// Ids of the active skills, ascending.
    pub fn active(&self) -> Vec<u64> {
        self.skills
            .iter()
            .filter(|(_, s)| s.status == EntryStatus::Active)
            .map(|(&id, _)| id)
            .collect()
    }
}
