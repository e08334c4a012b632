//! The actor pipeline over the null backend: the trainer, the rollout producer and its bounded
//! queue, the optimizer actor and the resample loop, with a toy environment and a recording
//! algorithm.
//!
//! The null backend scores version `v` at `ln 0.5 − 0.01·v` and the reference at `ln 0.25`, so
//! the exact log-probs a row carries say which weights scored it: a swapped `ℓ_old` / `ℓ_ref`,
//! a row trained with another version's `ℓ_old`, or a skipped pass all show.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use actix::System;
use cairn_kernel::actors::{self, optimizer::OptimizerSettings, PipelineParts};
use cairn_kernel::backend::{
    Generation, NullBackend, OptimizerSettings as AdamW, PolicyBackend, SamplingParams, Sequence,
    StepReport, Weights,
};
use cairn_kernel::config::PipelineConfig;
use cairn_kernel::loss::TokenLoss;
use cairn_kernel::rollout::prompt::{PlainPrompt, TextCodec};
use cairn_kernel::run::RunDir;
use cairn_kernel::trainer::Trainer;
use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, Environment, EnvironmentInfo, Episode, GroupRequest, Host,
    Observation, Requirements, Signals, StepOutcome, StepReport as AlgorithmReport, TaskInfo,
    TaskRef,
};
use parking_lot::Mutex;

/// Bytes as ids; 1000 ends the prompt, 1001 ends a response.
struct ByteCodec;

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> cairn_kernel::Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> cairn_kernel::Result<String> {
        Ok(ids
            .iter()
            .filter(|&&i| i < 256)
            .map(|&i| i as u8 as char)
            .collect())
    }
}

/// Two-turn episodes; a slot succeeds when its seed is divisible by 3, so groups have both
/// outcomes.
struct ToyEnv;

struct ToyEpisode {
    task: u64,
    seed: u64,
    turn: u32,
}

impl Environment for ToyEnv {
    fn info(&self) -> EnvironmentInfo {
        EnvironmentInfo {
            train_tasks: 16,
            test_tasks: 4,
            max_turns: 2,
            ..Default::default()
        }
    }
    fn task(&self, task: TaskRef) -> cairn_plugin_sdk::Result<TaskInfo> {
        Ok(TaskInfo {
            id: format!("{}-{}", task.split.as_str(), task.index),
            kind: "toy".into(),
            goal: "say A".into(),
        })
    }
    fn start(
        &self,
        task: TaskRef,
        seed: u64,
        _variant: &ContextVariant,
    ) -> cairn_plugin_sdk::Result<Box<dyn Episode>> {
        Ok(Box::new(ToyEpisode {
            task: task.index,
            seed,
            turn: 0,
        }))
    }
}

impl Episode for ToyEpisode {
    fn observation(&self) -> Observation {
        Observation {
            text: format!("task {} turn {}", self.task, self.turn),
            ..Default::default()
        }
    }
    fn step(&mut self, _action: &str) -> cairn_plugin_sdk::Result<StepOutcome> {
        self.turn += 1;
        let done = self.turn == 2;
        let success = done && self.seed.is_multiple_of(3);
        Ok(StepOutcome {
            observation: self.observation(),
            reward: if success { 1.0 } else { 0.0 },
            done,
            success,
            info_json: "{}".into(),
            ..Default::default()
        })
    }
    fn expert_action(&self) -> Option<String> {
        Some("A".into())
    }
}

/// One row as `signals` saw it: (policy version, ℓ_old[0], ℓ_ref[0] or NaN).
type RowSeen = (u64, f32, f32);

/// What the recording algorithm saw.
#[derive(Debug, Default)]
struct Log {
    /// Per `signals` call, its rows.
    signals: Vec<Vec<RowSeen>>,
    /// Per `observe`: (step, policy version after, trajectories counted).
    observed: Vec<(u64, u64, usize)>,
    /// Trajectories counted by `observe` over the run (a stateful plugin's counter).
    trajectories_seen: usize,
    /// Every hook call in order: `plan <step>`, `signals <step>`, `observe <step>` (one
    /// `plan` per step: its first group).
    hooks: Vec<String>,
}

/// A GRPO-like estimator that records what it is given; with `drop_first_group` it drops the
/// first group of each step's first round (dynamic sampling).
struct Recorder {
    log: Arc<Mutex<Log>>,
    drop_first_group: bool,
}

impl Algorithm for Recorder {
    fn requirements(&self) -> Requirements {
        Requirements {
            dynamic_sampling: self.drop_first_group,
            ..Default::default()
        }
    }

    /// All-plain, logging one `recorder/groups_planned` per group (a planning metric).
    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> cairn_plugin_sdk::Result<Vec<ContextVariant>> {
        host.log_metric("recorder/groups_planned", 1.0);
        let mut log = self.log.lock();
        let line = format!("plan {}", request.step);
        if log.hooks.last() != Some(&line) {
            log.hooks.push(line);
        }
        drop(log);
        Ok(vec![ContextVariant::default(); request.group_size as usize])
    }

    fn signals(&self, batch: &Batch, _host: &dyn Host) -> cairn_plugin_sdk::Result<Signals> {
        let rows = batch
            .rows
            .iter()
            .map(|r| {
                (
                    r.policy_version,
                    r.old_logprobs.first().copied().unwrap_or(f32::NAN),
                    r.ref_logprobs.first().copied().unwrap_or(f32::NAN),
                )
            })
            .collect();
        let mut log = self.log.lock();
        log.signals.push(rows);
        log.hooks.push(format!("signals {}", batch.step));
        drop(log);
        let dropped = if self.drop_first_group {
            let first = batch.rows.iter().map(|r| r.group_id).min();
            first.into_iter().collect()
        } else {
            Vec::new()
        };
        Ok(Signals {
            advantages: batch
                .rows
                .iter()
                .map(|r| vec![r.episode_reward - 0.5; r.response_ids.len()])
                .collect(),
            dropped_groups: dropped,
            ..Default::default()
        })
    }

    fn observe(
        &mut self,
        report: &AlgorithmReport,
        _host: &dyn Host,
    ) -> cairn_plugin_sdk::Result<()> {
        let trajectories: std::collections::HashSet<u64> =
            report.batch.rows.iter().map(|r| r.trajectory_id).collect();
        let mut log = self.log.lock();
        log.trajectories_seen += trajectories.len();
        log.observed
            .push((report.step, report.policy_version, trajectories.len()));
        log.hooks.push(format!("observe {}", report.step));
        Ok(())
    }
}

/// The null backend, counting its scoring passes by weights.
struct Counting {
    inner: NullBackend,
    /// (weights, sequences) per score call.
    calls: Arc<Mutex<Vec<(Weights, usize)>>>,
}

impl PolicyBackend for Counting {
    fn policy_version(&self) -> u64 {
        self.inner.policy_version()
    }
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> cairn_kernel::Result<Vec<Generation>> {
        self.inner.generate(prompts, params)
    }
    fn score(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> cairn_kernel::Result<Vec<Vec<f32>>> {
        self.calls.lock().push((weights, sequences.len()));
        self.inner.score(sequences, temperature, weights)
    }
    fn retain_versions(&mut self, n: usize) -> cairn_kernel::Result<()> {
        self.inner.retain_versions(n)
    }
    fn train_step(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> cairn_kernel::Result<StepReport> {
        self.inner
            .train_step(sequences, micro_batches, temperature, loss)
    }
    fn snapshot_reference(&mut self) -> cairn_kernel::Result<()> {
        self.inner.snapshot_reference()
    }
    fn configure_optimizer(&mut self, settings: &AdamW) -> cairn_kernel::Result<()> {
        self.inner.configure_optimizer(settings)
    }
    fn save(&self, dir: &Path) -> cairn_kernel::Result<()> {
        self.inner.save(dir)
    }
    fn load(&mut self, dir: &Path) -> cairn_kernel::Result<()> {
        self.inner.load(dir)
    }
    fn export(&self, tokenizer_dir: &Path, dir: &Path) -> cairn_kernel::Result<Vec<String>> {
        self.inner.export(tokenizer_dir, dir)
    }
}

/// A pipeline config for the toy run; `extra` is appended to `[rollout]`.
fn config(dir: &Path, rollout_extra: &str, objective: &str, optimizer_extra: &str) -> String {
    format!(
        r#"
[run]
dir = "{dir}"
seed = 11
steps = 4
checkpoint_every = 0

[environment]
plugin = "toy"

[algorithm]
plugin = "recorder"

[model]
[model.scratch]
hidden_size = 8
intermediate_size = 8
num_hidden_layers = 1
num_attention_heads = 1
num_key_value_heads = 1

[rollout]
tasks_per_step = 3
group_size = 4
temperature = 1.0
max_new_tokens = 4
max_turns = 2
{rollout_extra}

[objective]
{objective}

[optimizer]
lr = 1e-3
{optimizer_extra}

[eval]
tasks = 2
"#,
        dir = dir.display()
    )
}

/// What a toy run left behind.
struct Run {
    log: Log,
    calls: Vec<(Weights, usize)>,
    metrics: Vec<serde_json::Value>,
}

fn run(toml: &str, drop_first_group: bool) -> Run {
    let config = PipelineConfig::parse(toml, "toy.toml").expect("valid config");
    let log = Arc::new(Mutex::new(Log::default()));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let run_dir = RunDir::create(&config.run.dir).expect("run dir");
    let algorithm: Arc<Mutex<Box<dyn Algorithm>>> = Arc::new(Mutex::new(Box::new(Recorder {
        log: log.clone(),
        drop_first_group,
    })));
    let optimizer = OptimizerSettings::from_config(&config, &algorithm.lock().requirements());
    let parts = PipelineParts {
        backend: Box::new(Counting {
            inner: NullBackend {
                response: vec![65, 1001],
                ..Default::default()
            },
            calls: calls.clone(),
        }),
        env: Arc::new(ToyEnv),
        algorithm: algorithm.clone(),
        algorithm_name: "recorder".into(),
        builder: Arc::new(PlainPrompt {
            codec: ByteCodec,
            separator: vec![1000],
            stop_ids: vec![1001],
        }),
        codec: Arc::new(ByteCodec),
        rollout: cairn_kernel::actors::rollout::RolloutSettings::from_config(&config),
        optimizer,
        reward: Default::default(),
        objective: config.objective.clone(),
        pool: cairn_stores::pool::Pool::in_memory().expect("in-memory pool"),
        bank: cairn_stores::bank::Bank::in_memory().expect("in-memory bank"),
        skills: config.skills.clone(),
        skills_api_key: None,
        engine: None,
    };
    let summary = System::new().block_on(async {
        let pipeline = actors::start(parts);
        let mut observer = |_e| {};
        let mut trainer = Trainer {
            config: config.clone(),
            pipeline,
            algorithm,
            run: run_dir.clone(),
            observer: &mut observer,
            export_tokenizer_dir: None,
        };
        trainer.run().await
    });
    summary.expect("the toy run trains");
    let metrics = std::fs::read_to_string(run_dir.metrics_path())
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let log = std::mem::take(&mut *log.lock());
    let calls = calls.lock().clone();
    Run {
        log,
        calls,
        metrics,
    }
}

fn old_lp(version: u64) -> f32 {
    NullBackend::version_logprob(version)
}

#[test]
fn synchronous_steps_train_on_the_previous_update_with_old_and_ref_from_the_right_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let r = run(&config(tmp.path(), "", "kl_coef = 0.01", ""), false);
    // No warm start: RL starts at version 0, one version per step.
    assert_eq!(r.log.signals.len(), 4);
    for (s, rows) in r.log.signals.iter().enumerate() {
        assert_eq!(rows.len(), 3 * 4 * 2, "step {s}: B × G × turns rows");
        for &(version, old, reference) in rows {
            assert_eq!(
                version, s as u64,
                "step {s} is sampled by the weights after step {}",
                s
            );
            assert_eq!(old, old_lp(s as u64), "ℓ_old is the live weights' score");
            assert_eq!(
                reference,
                NullBackend::reference_logprob(),
                "ℓ_ref is the reference's"
            );
        }
    }
    let observed: Vec<(u64, u64)> = r.log.observed.iter().map(|o| (o.0, o.1)).collect();
    assert_eq!(observed, vec![(0, 1), (1, 2), (2, 3), (3, 4)]);
    for m in r.metrics.iter().filter(|m| m["phase"] == "rl") {
        assert_eq!(m["staleness/max"], 0, "{m}");
        assert_eq!(m["staleness/rows_dropped"], 0, "{m}");
    }
}

/// At `max_staleness = 1` step `s` is played by exactly policy version `max(0, s − 1)`, the
/// hooks run in one fixed order (planning step `s + 1` before the signals of step `s`), and a
/// second run with the same seed sees and writes the same numbers.
#[test]
fn async_rollouts_run_exactly_one_version_ahead_in_a_fixed_hook_order() {
    let runs: Vec<Run> = (0..2)
        .map(|_| {
            let tmp = tempfile::tempdir().unwrap();
            run(
                &config(
                    tmp.path(),
                    "max_staleness = 1\nenv_timeout_s = 0",
                    "kl_coef = 0.01",
                    "",
                ),
                false,
            )
        })
        .collect();
    let r = &runs[0];
    assert_eq!(r.log.signals.len(), 4);
    for (s, rows) in r.log.signals.iter().enumerate() {
        for &(version, old, _) in rows {
            assert_eq!(
                version,
                (s as u64).saturating_sub(1),
                "step {s} is played by the weights after step {}",
                s as i64 - 2
            );
            // ℓ_old is recomputed with the live weights whatever version sampled the row.
            assert_eq!(old, old_lp(s as u64));
        }
    }
    assert_eq!(
        r.log.hooks,
        [
            "plan 0",
            "plan 1",
            "signals 0",
            "observe 0",
            "plan 2",
            "signals 1",
            "observe 1",
            "plan 3",
            "signals 2",
            "observe 2",
            "signals 3",
            "observe 3"
        ]
    );
    let rl: Vec<&serde_json::Value> = r.metrics.iter().filter(|m| m["phase"] == "rl").collect();
    for (s, m) in rl.iter().enumerate() {
        let lag = u64::from(s > 0);
        assert_eq!(m["staleness/max"], lag, "{m}");
        assert_eq!(m["staleness/rows_dropped"], 0, "{m}");
    }
    // The second run: the same rows, hooks and numbers (wall-clock metrics aside).
    assert_eq!(runs[1].log.signals, r.log.signals);
    assert_eq!(runs[1].log.hooks, r.log.hooks);
    assert_eq!(runs[1].log.observed, r.log.observed);
    assert_eq!(
        without_wall_clock(&runs[1].metrics),
        without_wall_clock(&r.metrics)
    );
}

/// `metrics` without the wall-clock and throughput values, which differ between runs.
fn without_wall_clock(metrics: &[serde_json::Value]) -> Vec<serde_json::Value> {
    metrics
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(o) = m.as_object_mut() {
                o.retain(|k, _| !(k.ends_with("_time_s") || k.ends_with("_per_s")));
            }
            m
        })
        .collect()
}

#[test]
fn kl_off_skips_the_reference_pass_and_reuse_skips_the_old_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let r = run(&config(&tmp.path().join("a"), "", "", ""), false);
    assert!(
        !r.calls.iter().any(|(w, _)| *w == Weights::Reference),
        "{:?}",
        r.calls
    );
    assert!(r
        .log
        .signals
        .iter()
        .all(|rows| rows.iter().all(|r| r.2.is_nan())));
    let scored: usize = r.calls.iter().map(|c| c.1).sum();
    // Evaluations and the RL steps: every RL row is scored once for ℓ_old.
    assert_eq!(scored, 4 * 24);

    let r = run(
        &config(
            &tmp.path().join("b"),
            "",
            "",
            "reuse_rollout_logprobs = true",
        ),
        false,
    );
    assert!(r.calls.is_empty(), "{:?}", r.calls);
    for (s, rows) in r.log.signals.iter().enumerate() {
        // The sampled log-probs of the live weights, which are what the pass would give.
        assert!(rows.iter().all(|&(_, old, _)| old == old_lp(s as u64)));
    }
    assert!(r
        .metrics
        .iter()
        .filter(|m| m["phase"] == "rl")
        .all(|m| m.get("logprob_mismatch/mean_abs").is_none()));
}

#[test]
fn dynamic_sampling_scores_new_rows_once_and_observe_counts_each_trajectory_once() {
    let tmp = tempfile::tempdir().unwrap();
    let r = run(&config(tmp.path(), "", "", ""), true);
    // Each step: round 0 (3 groups), one dropped, round 1 adds one group; signals runs twice,
    // observe once.
    assert_eq!(r.log.signals.len(), 8);
    assert_eq!(r.log.observed.len(), 4);
    for m in r.metrics.iter().filter(|m| m["phase"] == "rl") {
        assert_eq!(m["resample_rounds"], 1, "{m}");
        // Metrics logged while planning reach the step, summed over both rounds' groups.
        assert_eq!(m["recorder/groups_planned"], 4.0, "{m}");
    }
    // Every trajectory of the step (4 groups × 4 slots) is counted exactly once.
    assert!(
        r.log.observed.iter().all(|o| o.2 == 16),
        "{:?}",
        r.log.observed
    );
    assert_eq!(r.log.trajectories_seen, 4 * 16);
    // ℓ_old: round 0's 24 rows, then only round 1's 8 new rows.
    let rl_calls: Vec<usize> = r.calls.iter().map(|c| c.1).collect();
    assert_eq!(rl_calls, [24, 8].repeat(4));
}
