//! The environment plugin interface.

use serde::{Deserialize, Serialize};

use crate::batch::ContextVariant;
use crate::error::Result;

/// Which task split a task belongs to. Held-out (`Test`) tasks are never trained on.
#[repr(u8)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, abi_stable::StableAbi,
)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train = 0,
    Test = 1,
}

impl Split {
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }
}

/// A task, addressed by split and index. The pair fully determines the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskRef {
    pub split: Split,
    pub index: u64,
}

/// Static facts about an environment, read once at load.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EnvironmentInfo {
    /// Number of training tasks.
    pub train_tasks: u64,
    /// Number of held-out tasks.
    pub test_tasks: u64,
    /// Turn limit of an episode.
    pub max_turns: u32,
    /// Observations carry anchor-state keys.
    pub anchor_keys: bool,
    /// Steps return per-turn rewards.
    pub step_rewards: bool,
    /// Steps return short-term feedback.
    pub feedback: bool,
    /// The environment offers tools.
    pub tools: bool,
    /// The task kinds the environment generates (e.g. ALFWorld's six types).
    pub task_kinds: Vec<String>,
}

/// Facts about one task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Stable id, unique across both splits.
    pub id: String,
    /// Task kind (one of [`EnvironmentInfo::task_kinds`]).
    pub kind: String,
    /// The goal in natural language.
    pub goal: String,
}

/// What the policy sees at a turn.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The text to show the policy (the environment's own rendering, goal included).
    pub text: String,
    /// Anchor-state key: the raw state without history or decoration.
    pub anchor: Option<String>,
    /// Actions the environment accepts now.
    pub admissible_actions: Vec<String>,
    /// Tools offered at this turn, as OpenAI-style function schemas
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`). The kernel
    /// renders them through the chat template's `tools` argument, and only for slots whose
    /// [`ContextVariant::tools_enabled`] is true; an environment started with tools off should
    /// offer none and refuse tool calls (feedback −1, not executed). Crosses the ABI inside the
    /// observation's JSON, so adding it needed no ABI change; absent in JSON means none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
}

/// The result of one environment step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    pub observation: Observation,
    /// Reward of this step.
    pub reward: f32,
    /// The episode has ended (solved, or failed for good).
    pub done: bool,
    /// The task is solved.
    pub success: bool,
    /// -1: error / invalid action / nothing happened; 0: neutral; +1: informative change.
    pub feedback: i8,
    /// Number of tool calls the action made.
    pub tool_calls: u32,
    /// Anything else, as a JSON object text (`"{}"` when empty).
    pub info_json: String,
}

/// A text environment. Implement it in a plugin crate and export it with
/// [`crate::export_environment!`].
pub trait Environment: Send + Sync + 'static {
    fn info(&self) -> EnvironmentInfo;

    /// Describes a task. Errors on an index out of range.
    fn task(&self, task: TaskRef) -> Result<TaskInfo>;

    /// Starts an episode of `task`. The same `(task, seed)` always gives the same episode.
    fn start(&self, task: TaskRef, seed: u64, variant: &ContextVariant)
        -> Result<Box<dyn Episode>>;
}

/// A running episode.
pub trait Episode: Send + 'static {
    /// The current observation.
    fn observation(&self) -> Observation;

    /// Applies one action, given as the policy's text.
    fn step(&mut self, action: &str) -> Result<StepOutcome>;

    /// The expert planner's next action, for demonstrations. `None` when the environment has no
    /// expert or the episode is over.
    fn expert_action(&self) -> Option<String>;
}
