//! The run directory: metrics, evaluations, checkpoints and the resume point.
//!
//! Layout of `<run>/`:
//! - `config.toml` — the pipeline config the run started with;
//! - `metrics.jsonl` — one JSON object per training step (SFT and RL), see [`StepRecord`];
//! - `eval.jsonl` — one held-out evaluation per line;
//! - `checkpoints/step-NNNNNN/` — backend files, `algorithm.state`, `trainer.json`;
//! - `checkpoints/latest` — the name of the newest complete checkpoint;
//! - `trajectories/` — recorded batches (when `run.record_trajectories`).
//!
//! Every file is written to a temporary name and renamed into place, and `latest` moves only
//! after a checkpoint is complete, so a run killed at any moment resumes from its last whole
//! checkpoint and loses at most the step in flight.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically (temporary file + rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}tmp",
        path.extension()
            .map(|e| format!("{}.", e.to_string_lossy()))
            .unwrap_or_default()
    ));
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
    f.sync_all().map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Which part of the job a step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Supervised warm start on expert demonstrations.
    WarmStart,
    /// Reinforcement learning.
    Rl,
    /// Finished.
    Done,
}

/// The trainer's own state, saved in every checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub phase: Phase,
    /// Completed SFT epochs.
    pub warm_start_epochs: u64,
    /// Completed RL steps.
    pub rl_steps: u64,
    /// Next group id to assign (ids are unique across the run).
    pub next_group_id: u64,
    /// Global step counter of `metrics.jsonl` (SFT and RL steps).
    pub global_step: u64,
    /// Identity of the run, drawn when it starts fresh and stamped on its experience bank, so
    /// a resume refuses a bank snapshot copied from another run. Empty in checkpoints from
    /// before run ids (then nothing is checked).
    #[serde(default)]
    pub run_id: String,
}

impl Default for TrainerState {
    fn default() -> Self {
        TrainerState {
            phase: Phase::WarmStart,
            warm_start_epochs: 0,
            rl_steps: 0,
            next_group_id: 0,
            global_step: 0,
            run_id: String::new(),
        }
    }
}

/// A new run id: the start time in nanoseconds and the process id, in hex. Unique per start on
/// one machine; it never enters the numbers a run computes.
pub fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

/// One line of `metrics.jsonl`. Fields that do not apply to a phase are absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Global step (SFT and RL steps share one axis).
    pub step: u64,
    pub phase: String,
    /// RL step index (absent for SFT).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rl_step: Option<u64>,
    /// Policy version after this step.
    pub policy_version: u64,
    /// Named scalars: reward, success rate, loss, KL, clip fraction, response length,
    /// tokens/s, ... (see `metrics` docs in the README).
    #[serde(flatten)]
    pub values: serde_json::Map<String, serde_json::Value>,
}

/// Appends `key: old → new` for every leaf where `old` and `new` differ (objects recursed).
fn diff_keys(key: &str, old: &serde_json::Value, new: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                let (x, y) = (
                    a.get(name).unwrap_or(&Value::Null),
                    b.get(name).unwrap_or(&Value::Null),
                );
                diff_keys(&format!("{key}.{name}"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(format!("{key}: {a} → {b}")),
        _ => {}
    }
}

/// A run directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub root: PathBuf,
}

/// Holds a run directory's lock ([`RunDir::lock`]) while alive.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

impl RunDir {
    /// Creates the directory (and parents) if needed.
    pub fn create(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root.join("checkpoints")).map_err(|e| Error::io(root, e))?;
        Ok(RunDir {
            root: root.to_path_buf(),
        })
    }

    /// Takes the run directory for this process: an exclusive advisory lock on `<run>/.lock`,
    /// held until the returned guard drops (or the process dies: the OS releases it). A second
    /// `cairn train` on the same directory would interleave metrics and checkpoints, so it is
    /// refused with the holder's pid.
    pub fn lock(&self) -> Result<RunLock> {
        use std::io::Write;
        let path = self.root.join(".lock");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(Error::RunLocked {
                    dir: self.root.clone(),
                    holder: holder.trim().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
        file.set_len(0).map_err(|e| Error::io(&path, e))?;
        write!(file, "{}", std::process::id()).map_err(|e| Error::io(&path, e))?;
        Ok(RunLock { _file: file })
    }

    pub fn metrics_path(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    pub fn eval_path(&self) -> PathBuf {
        self.root.join("eval.jsonl")
    }

    pub fn checkpoint_dir(&self, global_step: u64) -> PathBuf {
        self.root
            .join("checkpoints")
            .join(format!("step-{global_step:06}"))
    }

    /// Before resuming: refuses a config whose model (`model.path` or `[model.scratch]`)
    /// differs from the one this run's checkpoints were written with (`<run>/config.toml`),
    /// listing the keys that differ. Other changes (more steps, another device) are allowed.
    /// A run without a checkpoint, or whose saved config does not parse, is not checked.
    ///
    /// # Errors
    /// [`Error::Config`] naming the config file and saying to pass `--no-resume` or another
    /// `--run-dir`.
    pub fn check_resumable(&self, config: &crate::config::PipelineConfig) -> Result<()> {
        if self.latest_checkpoint()?.is_none() {
            return Ok(());
        }
        let path = self.root.join("config.toml");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(());
        };
        let saved = toml::from_str::<toml::Table>(&text)
            .ok()
            .and_then(|t| t.get("model").cloned())
            .and_then(|m| m.try_into::<crate::config::ModelConfig>().ok());
        // The algorithm stack: its state in the checkpoint is keyed by position and name, and a
        // resume with another stack would drop or misread it.
        let saved_stack = toml::from_str::<toml::Table>(&text)
            .ok()
            .and_then(|t| t.get("algorithm").cloned())
            .and_then(|a| a.try_into::<crate::config::AlgorithmSection>().ok())
            .map(|a| a.label());
        if let Some(saved_stack) = saved_stack {
            let now = config.algorithm.label();
            if saved_stack != now {
                return Err(Error::Config {
                    file: config.source.clone(),
                    message: format!(
                        "key `algorithm`: run directory {} was trained with the algorithm stack \
                         `{saved_stack}`, this config has `{now}`; its checkpointed plugin \
                         state belongs to that stack. Resume with the same `[algorithm]` and \
                         `[[algorithm.stack]]`, pass --no-resume to start that run over, or \
                         --run-dir to start a new run elsewhere",
                        self.root.display()
                    ),
                });
            }
        }
        let Some(saved) = saved else {
            return Ok(());
        };
        let identity = |m: &crate::config::ModelConfig| serde_json::json!({ "path": m.path, "scratch": m.scratch });
        let mut differ = Vec::new();
        diff_keys(
            "model",
            &identity(&saved),
            &identity(&config.model),
            &mut differ,
        );
        if differ.is_empty() {
            return Ok(());
        }
        Err(Error::Config {
            file: config.source.clone(),
            message: format!(
                "key `model`: run directory {} holds checkpoints of another model ({}), which \
                 cannot load into this one; pass --no-resume to start that run over, or \
                 --run-dir to start a new run elsewhere",
                self.root.display(),
                differ.join(", ")
            ),
        })
    }

    /// The newest complete checkpoint, if any.
    pub fn latest_checkpoint(&self) -> Result<Option<PathBuf>> {
        let latest = self.root.join("checkpoints").join("latest");
        match std::fs::read_to_string(&latest) {
            Ok(name) => {
                let dir = self.root.join("checkpoints").join(name.trim());
                if dir.join("trainer.json").is_file() {
                    Ok(Some(dir))
                } else {
                    Err(Error::Checkpoint {
                        path: dir,
                        reason: "named by checkpoints/latest but incomplete (no trainer.json); \
                                 delete checkpoints/latest to start over"
                            .into(),
                    })
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&latest, e)),
        }
    }

    /// Marks `dir` (a finished checkpoint) as the resume point.
    pub fn mark_latest(&self, dir: &Path) -> Result<()> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        write_atomic(
            &self.root.join("checkpoints").join("latest"),
            name.as_bytes(),
        )
    }

    /// Writes the trainer state into a checkpoint directory.
    pub fn save_state(&self, dir: &Path, state: &TrainerState) -> Result<()> {
        let text = serde_json::to_string_pretty(state).expect("trainer state serialises");
        write_atomic(&dir.join("trainer.json"), text.as_bytes())
    }

    /// Reads the trainer state of a checkpoint directory.
    pub fn load_state(dir: &Path) -> Result<TrainerState> {
        let path = dir.join("trainer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
            path,
            reason: e.to_string(),
        })
    }

    /// Appends one JSON line to `path`.
    pub fn append_jsonl<T: Serialize>(path: &Path, value: &T) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let line = serde_json::to_string(value).expect("records serialise");
        writeln!(f, "{line}").map_err(|e| Error::io(path, e))
    }

    /// On resume: drops lines of a JSONL file whose `step` is beyond `keep_through`, so the
    /// metrics of a step that was in flight when the run died are not duplicated.
    pub fn truncate_jsonl(path: &Path, keep_through: u64) -> Result<()> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(path, e)),
        };
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                    .is_some_and(|s| s <= keep_through)
            })
            .collect();
        let mut out = kept.join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        write_atomic(path, out.as_bytes())
    }

    /// Reads every record of `metrics.jsonl`.
    pub fn read_metrics(&self) -> Result<Vec<StepRecord>> {
        let path = self.metrics_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&path, e)),
        };
        text.lines()
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| Error::Other(format!("{}:{}: {e}", path.display(), i + 1)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_resume_from_latest_complete_one() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::create(tmp.path()).unwrap();
        assert_eq!(run.latest_checkpoint().unwrap(), None);
        let dir = run.checkpoint_dir(3);
        std::fs::create_dir_all(&dir).unwrap();
        let state = TrainerState {
            rl_steps: 2,
            global_step: 3,
            ..Default::default()
        };
        run.save_state(&dir, &state).unwrap();
        run.mark_latest(&dir).unwrap();
        let found = run.latest_checkpoint().unwrap().unwrap();
        assert_eq!(RunDir::load_state(&found).unwrap(), state);
    }

    #[test]
    fn resuming_with_another_model_is_refused_with_the_keys_that_differ() {
        use crate::config::{tests::MINIMAL, PipelineConfig};
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::create(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("config.toml"), MINIMAL).unwrap();
        let other = MINIMAL.replace("hidden_size = 32", "hidden_size = 64");
        let other = PipelineConfig::parse(&other, "new.toml").unwrap();
        // No checkpoint yet: nothing to protect.
        run.check_resumable(&other).unwrap();

        let dir = run.checkpoint_dir(1);
        std::fs::create_dir_all(&dir).unwrap();
        run.save_state(&dir, &TrainerState::default()).unwrap();
        run.mark_latest(&dir).unwrap();
        let e = run.check_resumable(&other).unwrap_err().to_string();
        assert!(
            e.contains("new.toml")
                && e.contains("model.scratch.hidden_size: 32 → 64")
                && e.contains("--no-resume"),
            "{e}"
        );
        // More steps and another device are fine.
        let same = MINIMAL
            .replace("steps = 2", "steps = 9")
            .replace("[model]\n", "[model]\ndevice = \"auto\"\n");
        let same = PipelineConfig::parse(&same, "same.toml").unwrap();
        run.check_resumable(&same).unwrap();
    }

    #[test]
    fn truncation_keeps_steps_up_to_the_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.jsonl");
        for s in 1..=5u64 {
            RunDir::append_jsonl(&path, &serde_json::json!({"step": s})).unwrap();
        }
        RunDir::truncate_jsonl(&path, 3).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
    }
}
