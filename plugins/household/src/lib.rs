//! `cairn-household`: an ALFWorld-style text household, exported as a Cairn environment plugin.
//!
//! # The world
//!
//! Each task is one procedurally generated room (kitchen, bedroom or living room) with 6-9
//! receptacles (`cabinet 2`, `countertop 1`, `fridge 1`, `desk 1`, ...; cabinets, drawers,
//! the fridge and the microwave must be opened) and a few objects lying where they plausibly
//! would (apples on countertops, in the fridge or on the dining table; pens on desks and in
//! drawers), plus distractors. A bedroom or living room may have a `desklamp 1` standing on a
//! desk or side table. The agent starts in the middle of the room, holds at most one object,
//! and acts with short template actions (see [`actions`](crate#actions)).
//!
//! # Task kinds
//!
//! ALFWorld's six, cycled by task index (`task_kinds[index % len]`):
//!
//! | kind | goal text |
//! |------|-----------|
//! | `pick_and_place` | `put a mug in cabinet 2` |
//! | `look_at_obj_in_light` | `examine the book with the desklamp` (hold it, `use desklamp 1`) |
//! | `pick_clean_then_place` | `put a clean plate on countertop 1` (`clean ... with sinkbasin 1`) |
//! | `pick_heat_then_place` | `put a hot apple on diningtable 1` (`heat ... with microwave 1`) |
//! | `pick_cool_then_place` | `put a cold apple on countertop 1` (`cool ... with fridge 1`) |
//! | `pick_two_obj_and_place` | `put two pens in drawer 1` |
//!
//! # Observations
//!
//! Short, lower-case, punctuation as separate words, and *Markov*: the current text alone
//! determines a good next action, because it carries the goal, the location, what is visible
//! there, what is held (with its state), where goal objects were already seen, and the
//! plausible places not yet searched (best first; in the knowledge regime, in a per-task
//! shuffled order):
//!
//! ```text
//! task : put a hot apple on diningtable 1 . you are at fridge 1 . in it you see an egg 2 ,
//! an apple 3 . you hold nothing . unsearched : countertop 2 .
//! ```
//!
//! After an invalid action the text starts with `nothing happens .` and nothing else changes.
//! `Observation::admissible_actions` lists the valid actions.
//!
//! # Actions
//!
//! `go to R`, `open R`, `close R`, `take O from R`, `put O in R` / `put O on R` (containers
//! and basins take `in`, surfaces `on`), `clean O with sinkbasin 1`, `heat O with microwave 1`,
//! `cool O with fridge 1`, `use desklamp 1`, `look`, `inventory`. The episode accepts exactly
//! the admissible strings, after trimming, lower-casing and collapsing whitespace; anything
//! else (including a trailing period) is an invalid move, never an error.
//!
//! # Rewards, feedback, anchors
//!
//! * Reward 1.0 on the step that completes the task (`done`, `success`); otherwise 0, minus
//!   the configured `invalid_penalty` (default 0) on invalid steps. At `max_turns` an unsolved
//!   episode ends with `done` and not `success`.
//! * Feedback: -1 for an invalid action; +1 when the action searched a place the text listed
//!   as `unsearched` (revealing its contents) or advanced the task (took a wanted object, gave
//!   it the required state, placed it, solved the task); 0 otherwise (moving, looking,
//!   searching where the target cannot be, undoing progress).
//! * Anchor key: the physical state without history (location and whether it is closed, the
//!   held object, every target-kind object with its place and state, whether the destination
//!   is open), so identical states in different trajectories of a task group together. In the
//!   knowledge regime a target still where it started reads `@ start`, so the key does not
//!   name its home (within a task this is the same partition of states).
//!
//! # Reproducibility and splits
//!
//! A task is drawn from a SplitMix64 stream keyed by `(split, index, attempt)`; the dynamics
//! are deterministic, so the episode seed changes nothing. A draw is kept only if its
//! signature (layout plus goal) hashes into its split's bucket (1 in 8 signatures belongs to
//! the held-out split) and the expert solves it within `max_expert_steps`; otherwise the next
//! attempt is drawn. So no task can appear in both splits, whatever the config.
//!
//! # Knowledge regime
//!
//! `"knowledge": true` turns the household into a task family where *text knowledge changes
//! success*, for the scaffold algorithms that inject experiences, skills or scaffolds into
//! prompts. Objects then follow a regularity no observation reveals: for each (room, object
//! kind) one fixed *home* receptacle kind, picked by a hash with a constant salt among the
//! kinds plausible for that object in that room (containers three times as likely as
//! surfaces). It is the same in every layout, in both splits and in every run, so an
//! experience such as "in the kitchen the apple was on diningtable 1" transfers to held-out
//! tasks, and a policy can also absorb the homes into its weights over training. A few homes
//! ([`home_of`] gives them all; [`Household::home`] gives a task's):
//!
//! | room | object | home | other plausible kinds |
//! |------|--------|------|-----------------------|
//! | kitchen | apple | diningtable | countertop, fridge, garbagecan |
//! | kitchen | tomato | fridge | countertop, diningtable |
//! | kitchen | fork | drawer | countertop, diningtable, sinkbasin |
//! | kitchen | pan | sinkbasin | stoveburner, cabinet, countertop |
//! | bedroom | pencil | drawer | desk, sidetable, shelf |
//! | livingroom | book | sofa | shelf, sidetable, coffeetable, drawer |
//!
//! What changes, and only with the key: every target starts in an instance of its home kind
//! (never the destination); the room holds every plausible kind of the target and at least
//! three plausible places besides the destination (pillows, which cannot have that many, are
//! never targets); `unsearched :` lists places in an order shuffled per task, so neither the
//! list nor the expert (which searches in listed order) knows the home; and `max_expert_steps`
//! may exceed `max_turns` (up to 60). With a turn limit below what blind search often needs,
//! a policy without the knowledge solves a task only when the home comes early in its search,
//! while one that knows the homes goes there first. With the key off, tasks, observations,
//! anchors and expert actions are exactly those of the household without the key.
//!
//! Suggested config: `{"knowledge": true, "max_turns": 8, "max_expert_steps": 20,
//! "min_receptacles": 12, "max_receptacles": 14, "task_kinds": ["pick_and_place",
//! "look_at_obj_in_light", "pick_clean_then_place", "pick_heat_then_place",
//! "pick_cool_then_place"]}`. On its first 500 training tasks the blind expert solves 247
//! (49%) and the expert that searches the home kind first 448 (90%); on the first 500
//! held-out tasks 238 and 458. The home kind heads the first list in 170 of 600 training tasks
//! (28%). `cargo run -p cairn-household --example knowledge_rates` measures other configs.
//!
//! Main types: [`Household`] (the [`Environment`]), [`HouseholdEpisode`], [`HouseholdConfig`],
//! [`TaskKind`], [`home_of`]. The kernel loads the `cdylib` through the SDK's export; tests use
//! the `rlib`.

mod actions;
mod catalog;
mod config;
mod expert;
mod knowledge;
mod rng;
mod state;
mod world;

use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, Observation, PluginError, Result, Split,
    StepOutcome, TaskInfo, TaskRef,
};

pub use catalog::TaskKind;
pub use config::HouseholdConfig;
pub use knowledge::home_of;

use rng::{fnv1a, mix};
use state::State;
use world::{Knobs, Task};

/// One signature in this many belongs to the held-out split.
const TEST_SHARE: u64 = 8;
/// Per-split salts of the task streams.
const TRAIN_SALT: u64 = 0x6361_6972_6e2d_7472; // "cairn-tr"
const TEST_SALT: u64 = 0x6361_6972_6e2d_7465; // "cairn-te"
/// Draws per task before giving up (the expected number is below 10).
const MAX_ATTEMPTS: u32 = 10_000;

/// The split a task signature belongs to: a fixed hash decides, so a task (layout and goal)
/// can only ever be generated for one split.
pub fn split_of_signature(signature: &str) -> Split {
    if mix(fnv1a(signature)).is_multiple_of(TEST_SHARE) {
        Split::Test
    } else {
        Split::Train
    }
}

fn stream_seed(split: Split, index: u64, attempt: u32) -> u64 {
    let salt = match split {
        Split::Train => TRAIN_SALT,
        Split::Test => TEST_SALT,
    };
    mix(mix(mix(salt) ^ index) ^ u64::from(attempt))
}

/// The household environment. Cheap to clone; tasks are generated on demand.
#[derive(Clone, Debug)]
pub struct Household {
    config: HouseholdConfig,
    kinds: Vec<TaskKind>,
    knobs: Knobs,
}

impl Household {
    /// Builds the environment from a validated config.
    pub fn new(config: HouseholdConfig) -> Result<Household> {
        config.validate()?;
        Ok(Household {
            kinds: config.kinds(),
            knobs: config.knobs(),
            config,
        })
    }

    /// The plugin's create function: parses and validates the JSON config.
    pub fn from_config_json(text: &str) -> Result<Household> {
        Household::new(HouseholdConfig::from_json(text)?)
    }

    pub fn config(&self) -> &HouseholdConfig {
        &self.config
    }

    /// The kind of `task`.
    pub fn kind(&self, task: TaskRef) -> Result<TaskKind> {
        self.check(task)?;
        Ok(self.kinds[(task.index % self.kinds.len() as u64) as usize])
    }

    /// The home receptacle kind of the task's target (`"fridge"`), where every target object of
    /// the task starts, under `"knowledge": true`; `None` with the regime off. This is the
    /// answer a policy must not be given: tests use it to script a policy that knows the homes.
    /// Errors: the task index is out of range.
    pub fn home(&self, task: TaskRef) -> Result<Option<&'static str>> {
        if !self.config.knowledge {
            self.check(task)?;
            return Ok(None);
        }
        let generated = self.generate(task)?;
        let target = &catalog::OBJECTS[generated.goal.target];
        Ok(knowledge::home_kind(generated.layout.room, target).map(catalog::RecKind::name))
    }

    /// A canonical text of the task's layout and goal: equal signatures mean the same task.
    pub fn signature(&self, task: TaskRef) -> Result<String> {
        Ok(self.generate(task)?.signature())
    }

    /// Starts an episode, as the concrete type.
    pub fn episode(&self, task: TaskRef) -> Result<HouseholdEpisode> {
        let generated = self.generate(task)?;
        let mut state = State::new(&generated);
        state.observe();
        Ok(HouseholdEpisode {
            state,
            turn: 0,
            max_turns: self.config.max_turns,
            invalid_penalty: self.config.invalid_penalty,
            last_invalid: false,
            done: false,
        })
    }

    fn check(&self, task: TaskRef) -> Result<()> {
        let count = match task.split {
            Split::Train => self.config.train_tasks,
            Split::Test => self.config.test_tasks,
        };
        if task.index >= count {
            return Err(PluginError::input(format!(
                "household has {count} {} tasks, no task {}",
                task.split.as_str(),
                task.index
            )));
        }
        Ok(())
    }

    fn generate(&self, task: TaskRef) -> Result<Task> {
        let kind = self.kind(task)?;
        for attempt in 0..MAX_ATTEMPTS {
            let mut rng = rng::SplitMix64::new(stream_seed(task.split, task.index, attempt));
            let candidate = world::generate(kind, &self.knobs, &mut rng);
            if split_of_signature(&candidate.signature()) != task.split {
                continue;
            }
            if expert::solution_length(State::new(&candidate), self.config.max_expert_steps)
                .is_some()
            {
                return Ok(candidate);
            }
        }
        Err(PluginError::internal(format!(
            "no {} task {} of kind {} within {MAX_ATTEMPTS} draws; raise max_expert_steps",
            task.split.as_str(),
            task.index,
            kind.name()
        )))
    }
}

impl Environment for Household {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: self.config.train_tasks,
            test_tasks: self.config.test_tasks,
            max_turns: self.config.max_turns,
            anchor_keys: true,
            step_rewards: true,
            feedback: true,
            tools: false,
            task_kinds: self.kinds.iter().map(|k| k.name().to_string()).collect(),
        }
    }

    fn task(&self, task: TaskRef) -> Result<TaskInfo> {
        let generated = self.generate(task)?;
        Ok(TaskInfo {
            id: format!("household/{}/{}", task.split.as_str(), task.index),
            kind: generated.goal.kind.name().to_string(),
            goal: generated.goal.text(&generated.layout),
        })
    }

    /// The household's dynamics are deterministic, so `seed` does not change the episode; the
    /// variant's injected text is the kernel's to show (tools do not exist here).
    fn start(
        &self,
        task: TaskRef,
        _seed: u64,
        _variant: &ContextVariant,
    ) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.episode(task)?))
    }
}

/// A running household episode.
#[derive(Clone, Debug)]
pub struct HouseholdEpisode {
    state: State,
    /// Steps taken so far.
    turn: u32,
    max_turns: u32,
    invalid_penalty: f32,
    /// The last action was invalid: the text starts with `nothing happens .`.
    last_invalid: bool,
    done: bool,
}

impl HouseholdEpisode {
    /// Steps taken so far.
    pub fn turn(&self) -> u32 {
        self.turn
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The goal in words.
    pub fn goal(&self) -> String {
        self.state.goal.text(&self.state.layout)
    }
}

impl Episode for HouseholdEpisode {
    fn observation(&self) -> Observation {
        let text = self.state.render();
        let text = if self.last_invalid {
            format!("nothing happens . {text}")
        } else {
            text
        };
        let admissible_actions = if self.done {
            Vec::new()
        } else {
            actions::admissible(&self.state)
                .iter()
                .map(|a| a.text(&self.state))
                .collect()
        };
        Observation {
            text,
            anchor: Some(self.state.anchor()),
            admissible_actions,
            tools: Vec::new(),
        }
    }

    fn step(&mut self, action: &str) -> Result<StepOutcome> {
        if self.done {
            return Err(PluginError::input(format!(
                "household episode is over after {} turns; start a new one",
                self.turn
            )));
        }
        self.turn += 1;
        // Places the text lists as worth searching; searching one of them is informative.
        let listed = if self.state.searching() {
            self.state.unsearched()
        } else {
            Vec::new()
        };
        let progress_before = self.state.progress();
        let parsed = actions::parse(&self.state, action);
        if let Some(a) = parsed {
            actions::apply(&mut self.state, a);
            self.state.observe();
        }
        let valid = parsed.is_some();
        let success = self.state.solved();
        let searched_listed = listed.iter().any(|&r| self.state.searched[r]);
        let progress = self.state.progress();
        let feedback = if !valid {
            -1
        } else if success || searched_listed || progress > progress_before {
            1
        } else {
            0
        };
        let reward = if success {
            1.0
        } else if valid {
            0.0
        } else {
            -self.invalid_penalty
        };
        self.last_invalid = !valid;
        self.done = success || self.turn >= self.max_turns;
        let info = serde_json::json!({
            "turn": self.turn,
            "valid": valid,
            "progress": progress,
            "truncated": self.done && !success,
        });
        Ok(StepOutcome {
            observation: self.observation(),
            reward,
            done: self.done,
            success,
            feedback,
            tool_calls: 0,
            info_json: info.to_string(),
        })
    }

    fn expert_action(&self) -> Option<String> {
        (!self.done).then(|| expert::next_action(&self.state).text(&self.state))
    }
}

cairn_plugin_sdk::export_environment! {
    name: "household",
    description: "ALFWorld-style text household: six task kinds, expert planner, anchors, feedback",
    create: Household::from_config_json,
}
