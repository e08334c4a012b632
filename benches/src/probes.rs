//! Timing wrappers around the policy backend and the plugins, so that one trainer run splits
//! its wall time into model time, plugin time and the rest (the kernel's own overhead).
//!
//! [`TimedBackend`], [`TimedAlgorithm`], [`TimedEnvironment`] and [`TimedEpisode`] implement
//! the same traits as what they wrap and add the time spent inside each call to one shared
//! [`Clock`]. Two `Instant::now()` calls per call are the whole cost (tens of nanoseconds
//! against microseconds for the cheapest plugin call).

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_kernel::backend::{
    Generation, OptimizerSettings, PolicyBackend, SamplingParams, Sequence, StepReport, Weights,
};
use cairn_kernel::loss::TokenLoss;
use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, Environment, EnvironmentInfo, Episode, GroupRequest, Host,
    Observation, Requirements, Signals, StepOutcome, TaskInfo, TaskRef,
};
use parking_lot::Mutex;

/// Accumulated time and call counts, shared by every probe of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Totals {
    /// Inside [`PolicyBackend`] calls (sampling, scoring, training, checkpoints).
    pub backend: Duration,
    pub generate_calls: u64,
    /// Inside `score` and `score_top_k` (part of `backend`): ℓ_old, reference and teacher
    /// passes.
    pub score: Duration,
    pub score_calls: u64,
    /// Inside the algorithm plugin's `signals` (part of `algorithm`), with the host calls it
    /// makes (teacher re-scoring).
    pub signals: Duration,
    /// Inside the algorithm plugin (`plan_group`, `signals`).
    pub algorithm: Duration,
    pub algorithm_calls: u64,
    /// Inside the environment plugin (`task`, `start`, `observation`, `step`).
    pub environment: Duration,
    pub environment_calls: u64,
    /// Rows and response tokens of the last `train_step`.
    pub last_train_rows: usize,
    pub last_train_tokens: usize,
}

/// The shared [`Totals`].
#[derive(Clone, Debug, Default)]
pub struct Clock(Arc<Mutex<Totals>>);

impl Clock {
    pub fn totals(&self) -> Totals {
        self.0.lock().clone()
    }

    fn add(&self, started: Instant, f: impl FnOnce(&mut Totals, Duration)) {
        let elapsed = started.elapsed();
        f(&mut self.0.lock(), elapsed);
    }
}

/// A [`PolicyBackend`] that times every call of the one it wraps.
pub struct TimedBackend<B> {
    pub inner: B,
    pub clock: Clock,
}

impl<B: PolicyBackend> TimedBackend<B> {
    fn time<T>(&mut self, f: impl FnOnce(&mut B) -> T) -> T {
        let t = Instant::now();
        let out = f(&mut self.inner);
        self.clock.add(t, |c, d| c.backend += d);
        out
    }
}

impl<B: PolicyBackend> PolicyBackend for TimedBackend<B> {
    fn policy_version(&self) -> u64 {
        self.inner.policy_version()
    }

    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> cairn_kernel::Result<Vec<Generation>> {
        let t = Instant::now();
        let out = self.inner.generate(prompts, params);
        self.clock.add(t, |c, d| {
            c.backend += d;
            c.generate_calls += 1;
        });
        out
    }

    fn score(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
    ) -> cairn_kernel::Result<Vec<Vec<f32>>> {
        let t = Instant::now();
        let out = self.inner.score(sequences, temperature, weights);
        self.clock.add(t, |c, d| {
            c.backend += d;
            c.score += d;
            c.score_calls += 1;
        });
        out
    }

    fn score_top_k(
        &mut self,
        sequences: &[Sequence],
        temperature: f32,
        weights: Weights,
        top_k: u32,
    ) -> cairn_kernel::Result<Vec<cairn_plugin_sdk::Scored>> {
        let t = Instant::now();
        let out = self
            .inner
            .score_top_k(sequences, temperature, weights, top_k);
        self.clock.add(t, |c, d| {
            c.backend += d;
            c.score += d;
            c.score_calls += 1;
        });
        out
    }

    fn retain_versions(&mut self, n: usize) -> cairn_kernel::Result<()> {
        self.time(|b| b.retain_versions(n))
    }

    fn train_step(
        &mut self,
        sequences: &[Sequence],
        micro_batches: &[Range<usize>],
        temperature: f32,
        loss: &mut dyn TokenLoss,
    ) -> cairn_kernel::Result<StepReport> {
        let t = Instant::now();
        let out = self
            .inner
            .train_step(sequences, micro_batches, temperature, loss);
        let tokens = sequences.iter().map(|s| s.response_ids.len()).sum();
        self.clock.add(t, |c, d| {
            c.backend += d;
            c.last_train_rows = sequences.len();
            c.last_train_tokens = tokens;
        });
        out
    }

    fn snapshot_reference(&mut self) -> cairn_kernel::Result<()> {
        self.time(|b| b.snapshot_reference())
    }

    fn configure_optimizer(&mut self, settings: &OptimizerSettings) -> cairn_kernel::Result<()> {
        self.time(|b| b.configure_optimizer(settings))
    }

    fn save(&self, dir: &Path) -> cairn_kernel::Result<()> {
        let t = Instant::now();
        let out = self.inner.save(dir);
        self.clock.add(t, |c, d| c.backend += d);
        out
    }

    fn load(&mut self, dir: &Path) -> cairn_kernel::Result<()> {
        self.time(|b| b.load(dir))
    }

    fn export(&self, tokenizer_dir: &Path, dir: &Path) -> cairn_kernel::Result<Vec<String>> {
        self.inner.export(tokenizer_dir, dir)
    }
}

/// An [`Algorithm`] that times the plugin calls of the one it wraps.
pub struct TimedAlgorithm {
    pub inner: Box<dyn Algorithm>,
    pub clock: Clock,
}

impl Algorithm for TimedAlgorithm {
    fn requirements(&self) -> Requirements {
        self.inner.requirements()
    }

    fn plan_group(
        &mut self,
        request: &GroupRequest,
        host: &dyn Host,
    ) -> cairn_plugin_sdk::Result<Vec<ContextVariant>> {
        let t = Instant::now();
        let out = self.inner.plan_group(request, host);
        self.clock.add(t, |c, d| {
            c.algorithm += d;
            c.algorithm_calls += 1;
        });
        out
    }

    /// Host callbacks the plugin makes from here (re-scoring, generation) count as plugin
    /// time too; GRPO makes none.
    fn signals(&self, batch: &Batch, host: &dyn Host) -> cairn_plugin_sdk::Result<Signals> {
        let t = Instant::now();
        let out = self.inner.signals(batch, host);
        self.clock.add(t, |c, d| {
            c.algorithm += d;
            c.signals += d;
            c.algorithm_calls += 1;
        });
        out
    }

    fn next_context(
        &mut self,
        request: &cairn_plugin_sdk::TurnContextRequest,
        host: &dyn Host,
    ) -> cairn_plugin_sdk::Result<cairn_plugin_sdk::TurnContext> {
        let t = Instant::now();
        let out = self.inner.next_context(request, host);
        self.clock.add(t, |c, d| {
            c.algorithm += d;
            c.algorithm_calls += 1;
        });
        out
    }

    fn observe(
        &mut self,
        report: &cairn_plugin_sdk::StepReport,
        host: &dyn Host,
    ) -> cairn_plugin_sdk::Result<()> {
        let t = Instant::now();
        let out = self.inner.observe(report, host);
        self.clock.add(t, |c, d| {
            c.algorithm += d;
            c.algorithm_calls += 1;
        });
        out
    }

    fn save_state(&self) -> cairn_plugin_sdk::Result<String> {
        self.inner.save_state()
    }

    fn load_state(&mut self, state: &str) -> cairn_plugin_sdk::Result<()> {
        self.inner.load_state(state)
    }
}

/// An [`Environment`] whose calls, and whose episodes' calls, are timed.
pub struct TimedEnvironment {
    pub inner: Arc<dyn Environment>,
    pub clock: Clock,
}

fn env_call<T>(clock: &Clock, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    clock.add(t, |c, d| {
        c.environment += d;
        c.environment_calls += 1;
    });
    out
}

impl Environment for TimedEnvironment {
    fn info(&self) -> EnvironmentInfo {
        self.inner.info()
    }

    fn task(&self, task: TaskRef) -> cairn_plugin_sdk::Result<TaskInfo> {
        env_call(&self.clock, || self.inner.task(task))
    }

    fn start(
        &self,
        task: TaskRef,
        seed: u64,
        variant: &ContextVariant,
    ) -> cairn_plugin_sdk::Result<Box<dyn Episode>> {
        let inner = env_call(&self.clock, || self.inner.start(task, seed, variant))?;
        Ok(Box::new(TimedEpisode {
            inner,
            clock: self.clock.clone(),
        }))
    }
}

/// An [`Episode`] whose calls are timed.
pub struct TimedEpisode {
    pub inner: Box<dyn Episode>,
    pub clock: Clock,
}

impl Episode for TimedEpisode {
    fn observation(&self) -> Observation {
        env_call(&self.clock, || self.inner.observation())
    }

    fn step(&mut self, action: &str) -> cairn_plugin_sdk::Result<StepOutcome> {
        let inner = &mut self.inner;
        env_call(&self.clock, || inner.step(action))
    }

    fn expert_action(&self) -> Option<String> {
        env_call(&self.clock, || self.inner.expert_action())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_kernel::backend::NullBackend;

    #[test]
    fn timed_backend_counts_calls_and_rows() {
        let clock = Clock::default();
        let mut b = TimedBackend {
            inner: NullBackend::default(),
            clock: clock.clone(),
        };
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 4,
            stop_ids: vec![],
            seed: 0,
        };
        b.generate(&[vec![1, 2]], &params).unwrap();
        let seqs = vec![Sequence {
            prompt_ids: vec![1],
            response_ids: vec![2, 3],
        }];
        let mut loss = cairn_kernel::loss::SftLoss::new(vec![vec![1, 1]]);
        b.train_step(&seqs, std::slice::from_ref(&(0..1)), 1.0, &mut loss)
            .unwrap();
        let t = clock.totals();
        assert_eq!(
            (t.generate_calls, t.last_train_rows, t.last_train_tokens),
            (1, 1, 2)
        );
    }
}
