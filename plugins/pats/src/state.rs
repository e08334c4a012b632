//! What Pats keeps across steps (and in every checkpoint): per task the scaffold under
//! evaluation and its window of card counts, or why the task's scaffold was removed; the
//! reflections it waits for; and counters.
//!
//! Scaffold texts and the cards themselves live in the experience bank, which the kernel
//! checkpoints; the state holds only what the evaluation and the bookkeeping need.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::arms::ScaffoldRef;
use crate::card::CardCounts;

/// Why a task's scaffold was removed. Removal is final for the run: the task plays plain from
/// then on, and no new scaffold is created for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Removal {
    /// The plain arm's success rate reached `tau_solve`.
    Graduated,
    /// The gain stayed within `±delta` over a full window.
    NoEffect,
}

/// A removal: why, and at which step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Removed {
    pub reason: Removal,
    pub scaffold: ScaffoldRef,
    pub step: u64,
}

/// The evaluation record of one task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskTrack {
    /// The scaffold the cards below are about (`None` before the first card).
    pub scaffold: Option<ScaffoldRef>,
    /// Counts of its last `window` cards, oldest first. A new scaffold starts an empty window.
    pub cards: Vec<CardCounts>,
    /// Set once the task's scaffold was removed.
    pub removed: Option<Removed>,
    /// Scaffolds a revision replaced (retired): cards still arriving for them are not judged.
    pub replaced: Vec<ScaffoldRef>,
}

/// What a reflection request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A first scaffold for a task that has none.
    Create,
    /// A revision of a scaffold that lowered the success rate; it replaces that scaffold.
    Revise { replaces: ScaffoldRef },
}

/// A reflection the skill creator has not answered yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    /// The skill creator's ticket (matched against `StepReport::failed_reflections`).
    pub ticket: u64,
    pub task_id: String,
    /// The step the request was sent at.
    pub step: u64,
    pub purpose: Purpose,
}

/// Events of one step, logged as `pats/<name>` metrics and summed into
/// [`PatsState::totals`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Counters {
    /// Evidence cards written.
    pub cards: u64,
    pub kept: u64,
    pub removed_graduated: u64,
    pub removed_no_effect: u64,
    /// Revision requests sent.
    pub revised: u64,
    /// Evaluations inside the band before the window is full.
    pub undecided: u64,
    /// Creation requests sent.
    pub new_requested: u64,
    /// Scaffolds from the skill creator made active.
    pub accepted: u64,
    /// Scaffolds from the skill creator refused for their length (retired).
    pub too_long: u64,
    /// Reflections that failed, were refused, or were lost at a resume.
    pub reflections_failed: u64,
}

impl Counters {
    /// `(metric name, value)` for each counter.
    pub fn metrics(&self) -> [(&'static str, f64); 10] {
        [
            ("pats/cards", self.cards as f64),
            ("pats/kept", self.kept as f64),
            ("pats/removed_graduated", self.removed_graduated as f64),
            ("pats/removed_no_effect", self.removed_no_effect as f64),
            ("pats/revised", self.revised as f64),
            ("pats/undecided", self.undecided as f64),
            ("pats/new_requested", self.new_requested as f64),
            ("pats/accepted", self.accepted as f64),
            ("pats/too_long", self.too_long as f64),
            ("pats/reflections_failed", self.reflections_failed as f64),
        ]
    }

    pub fn add(&mut self, other: &Counters) {
        self.cards += other.cards;
        self.kept += other.kept;
        self.removed_graduated += other.removed_graduated;
        self.removed_no_effect += other.removed_no_effect;
        self.revised += other.revised;
        self.undecided += other.undecided;
        self.new_requested += other.new_requested;
        self.accepted += other.accepted;
        self.too_long += other.too_long;
        self.reflections_failed += other.reflections_failed;
    }
}

/// The plugin's checkpointed state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PatsState {
    /// Steps observed.
    pub steps: u64,
    /// Per task id.
    pub tasks: BTreeMap<String, TaskTrack>,
    /// Unanswered reflections, by Pats' own request id (`extra.pats_request` on the
    /// request and on the entry the skill creator writes).
    pub pending: BTreeMap<u64, Pending>,
    /// The next request id.
    pub next_request: u64,
    /// Every step's counters, summed.
    pub totals: Counters,
}

impl PatsState {
    /// Whether a reflection for `task` is in flight.
    pub fn is_pending(&self, task: &str) -> bool {
        self.pending.values().any(|p| p.task_id == task)
    }

    /// Whether `task`'s scaffold was removed.
    pub fn is_removed(&self, task: &str) -> bool {
        self.tasks.get(task).is_some_and(|t| t.removed.is_some())
    }
}
