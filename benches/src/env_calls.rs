//! `cairn-bench env-calls`: what running each environment call on a deadline worker
//! (`rollout.env_timeout_s`, kernel/src/deadline.rs) costs per turn, against the same episodes
//! played on the calling thread (`env_timeout_s = 0`).
//!
//! The environment is an in-process no-op (every step returns at once) and generation returns a
//! fixed response, so the measured time is the episode loop's own: the difference between the
//! two modes is the worker's hand-offs alone. A real turn adds the environment's work and a
//! batched generation of milliseconds or more, which the hand-offs do not change.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use cairn_kernel::backend::{Generation, SamplingParams};
use cairn_kernel::rollout::prompt::{PlainPrompt, TextCodec};
use cairn_kernel::rollout::{play, EpisodeSpec, PlayParams};
use cairn_plugin_sdk::{
    ContextVariant, Environment, EnvironmentInfo, Episode, FinishReason, Observation, Split,
    StepOutcome, TaskInfo, TaskRef,
};
use serde_json::json;

#[derive(clap::Args)]
pub struct EnvCallsArgs {
    /// Episodes played together (B × G).
    #[arg(long, default_value_t = 64)]
    episodes: usize,
    /// Turns per episode.
    #[arg(long, default_value_t = 16)]
    turns: u32,
    /// Rounds per mode (the median is reported).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
}

struct Bytes;

impl TextCodec for Bytes {
    fn encode(&self, text: &str) -> cairn_kernel::error::Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> cairn_kernel::error::Result<String> {
        Ok(ids.iter().filter_map(|&i| char::from_u32(i)).collect())
    }
}

struct Null {
    turns: u32,
}

struct NullEpisode {
    turn: u32,
    turns: u32,
}

impl Environment for Null {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: 1,
            test_tasks: 1,
            max_turns: self.turns,
            ..Default::default()
        }
    }
    fn task(&self, _: TaskRef) -> cairn_plugin_sdk::Result<TaskInfo> {
        Ok(TaskInfo::default())
    }
    fn start(
        &self,
        _: TaskRef,
        _: u64,
        _: &ContextVariant,
    ) -> cairn_plugin_sdk::Result<Box<dyn Episode>> {
        Ok(Box::new(NullEpisode {
            turn: 0,
            turns: self.turns,
        }))
    }
}

impl Episode for NullEpisode {
    fn observation(&self) -> Observation {
        Observation {
            text: "a room".into(),
            ..Default::default()
        }
    }
    fn step(&mut self, _: &str) -> cairn_plugin_sdk::Result<StepOutcome> {
        self.turn += 1;
        Ok(StepOutcome {
            observation: self.observation(),
            done: self.turn >= self.turns,
            info_json: "{}".into(),
            ..Default::default()
        })
    }
    fn expert_action(&self) -> Option<String> {
        None
    }
}

fn round(args: &EnvCallsArgs, timeout: Option<Duration>) -> Result<f64> {
    let env: Arc<dyn Environment> = Arc::new(Null { turns: args.turns });
    let builder = PlainPrompt {
        codec: Bytes,
        separator: vec![1],
        stop_ids: vec![2],
    };
    let specs: Vec<EpisodeSpec> = (0..args.episodes as u64)
        .map(|i| EpisodeSpec {
            group_id: i / 8,
            trajectory_id: i,
            task: TaskRef {
                split: Split::Train,
                index: 0,
            },
            task_id: "t".into(),
            seed: i,
            variant: ContextVariant::default(),
        })
        .collect();
    let params = PlayParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 4,
            stop_ids: vec![2],
            seed: 0,
        },
        max_turns: args.turns,
        step: 0,
        context_window: None,
        env_timeout: timeout,
        env_name: "null".into(),
    };
    let one = Generation {
        ids: vec![u32::from(b'g'), u32::from(b'o'), 2],
        logprobs: vec![-0.1; 3],
        finish_reason: FinishReason::Stop,
    };
    let mut generate =
        |prompts: &[Vec<u32>], _: &SamplingParams| Ok((vec![one.clone(); prompts.len()], 0));
    let started = Instant::now();
    let out = play(&env, &builder, &specs, &params, &mut generate, None)?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        out.failed.is_empty() && out.rows.len() == args.episodes * args.turns as usize,
        "the null episodes did not all play through"
    );
    Ok(secs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &EnvCallsArgs) -> Result<()> {
    let deadline = Some(Duration::from_secs(60));
    // One warm-up round each (thread start, allocator).
    round(args, None)?;
    round(args, deadline)?;
    let mut inline = Vec::new();
    let mut worker = Vec::new();
    for _ in 0..args.rounds {
        inline.push(round(args, None)?);
        worker.push(round(args, deadline)?);
    }
    let (inline, worker) = (median(inline), median(worker));
    let turns = args.turns as f64;
    // One `start` per episode and one `step` per episode-turn go through the worker.
    let calls = args.episodes as f64 * (turns + 1.0);
    println!(
        "{}",
        json!({
            "bench": "env-calls",
            "episodes": args.episodes,
            "turns": args.turns,
            "rounds": args.rounds,
            "inline_s": inline,
            "worker_s": worker,
            "overhead_per_call_us": (worker - inline) / calls * 1e6,
            "overhead_per_turn_ms": (worker - inline) / turns * 1e3,
        })
    );
    Ok(())
}
