//! The run directory: metrics, evaluations, checkpoints and the resume point.
//!
//! Layout of `<run>/`:
//! - `config.toml` — the pipeline config the run started with;
//! - `metrics.jsonl` — one JSON object per training step (SFT and RL), see [`StepRecord`];
//! - `eval.jsonl` — one held-out evaluation per line;
//! - `checkpoints/step-NNNNNN/` — backend files, `algorithm.state`, the bank snapshot,
//!   `trainer.json`, and last `MANIFEST.json` (every file's size and CRC-32);
//! - `checkpoints/latest` — the name of the newest complete checkpoint;
//! - `pool.sqlite` — the data pool: every trajectory, turn by turn ([`cairn_stores::pool`]);
//! - `.lock` — the pid of the `cairn train` holding the directory ([`RunDir::lock`]).
//!
//! A checkpoint is written into `checkpoints/tmp-step-NNNNNN/`, its manifest last, then
//! renamed into place, and only then does `latest` move; so a run killed (or out of disk) at
//! any moment resumes from its last whole checkpoint. On resume the checkpoint named by
//! `latest` is verified against its manifest; a damaged one is refused, with the file and why,
//! and the newest earlier checkpoint that verifies is used instead ([`RunDir::resume_point`]).
//! See docs/resume.md.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use crate::files::{injected_write_fault, write_atomic, write_file, FAULT_WRITE_ENV};

/// The file written last into every checkpoint: the size and CRC-32 of every other file.
pub const MANIFEST_FILE: &str = "MANIFEST.json";

/// `MANIFEST.json`: what a complete checkpoint holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version (1).
    pub format: u32,
    /// Every file of the checkpoint but the manifest, sorted by path.
    pub files: Vec<ManifestEntry>,
}

/// One file of a [`Manifest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path relative to the checkpoint directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of the contents, 8 hex digits.
    pub crc32: String,
}

/// Size and CRC-32 of a file, read in 1 MiB chunks.
fn file_digest(path: &Path) -> std::io::Result<(u64, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, format!("{:08x}", hasher.finalize())))
}

/// Every file under `dir` (recursively), relative and `/`-separated, sorted.
fn files_under(dir: &Path) -> std::io::Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let rel = path.strip_prefix(root).unwrap_or(&path);
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// Writes `dir/MANIFEST.json` over every other file in `dir` (call it last).
///
/// # Errors
/// [`Error::Io`] naming the file that could not be read or written.
pub fn write_manifest(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    for rel in files_under(dir).map_err(|e| Error::io(dir, e))? {
        if rel == MANIFEST_FILE || rel.ends_with(".tmp") {
            continue;
        }
        let path = dir.join(&rel);
        let (bytes, crc32) = file_digest(&path).map_err(|e| Error::io(&path, e))?;
        files.push(ManifestEntry {
            path: rel,
            bytes,
            crc32,
        });
    }
    let manifest = Manifest { format: 1, files };
    let text = serde_json::to_string_pretty(&manifest).expect("manifests serialise");
    write_atomic(&dir.join(MANIFEST_FILE), text.as_bytes())
}

/// Checks every file of a checkpoint against its manifest: present, of the listed size, with
/// the listed CRC-32.
///
/// # Errors
/// A sentence naming the first file that does not match and how (missing, size, checksum), or
/// saying the manifest itself is missing or unreadable.
pub fn verify_manifest(dir: &Path) -> std::result::Result<(), String> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e} (the checkpoint was not finished)", path.display()))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| format!("{}: unreadable manifest: {e}", path.display()))?;
    for entry in &manifest.files {
        let file = dir.join(&entry.path);
        let (bytes, crc32) = file_digest(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        if bytes != entry.bytes {
            return Err(format!(
                "{}: {bytes} bytes, the manifest says {} (truncated or overwritten)",
                file.display(),
                entry.bytes
            ));
        }
        if crc32 != entry.crc32 {
            return Err(format!(
                "{}: CRC-32 {crc32}, the manifest says {} (the contents changed since the \
                 checkpoint was written)",
                file.display(),
                entry.crc32
            ));
        }
    }
    Ok(())
}

/// The checkpoint to resume from ([`RunDir::resume_point`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ResumePoint {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// One sentence per checkpoint refused on the way (file and why) and per checkpoint
    /// directory removed because it was newer than `dir`; empty when `latest` verified.
    pub warnings: Vec<String>,
}

/// `(global step, clash suffix)` of a checkpoint directory name `step-NNNNNN[-K]`.
fn checkpoint_key(dir: &Path) -> Option<(u64, u64)> {
    let name = dir.file_name()?.to_str()?;
    let rest = name.strip_prefix("step-")?;
    let (step, n) = match rest.split_once('-') {
        Some((s, n)) => (s, n.parse().ok()?),
        None => (rest, 0),
    };
    Some((step.parse().ok()?, n))
}

/// Whether `name` is a checkpoint directory's name: `step-NNNNNN` or `step-NNNNNN-K`, digits
/// only (so no path separator, no `..`).
pub fn is_checkpoint_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match name.strip_prefix("step-") {
        Some(rest) => match rest.split_once('-') {
            Some((step, k)) => digits(step) && digits(k),
            None => digits(rest),
        },
        None => false,
    }
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
    /// Lines of `metrics.jsonl` when the checkpoint was written: a resume keeps exactly these
    /// (`None` in checkpoints from before line counts: lines up to `global_step` are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_lines: Option<u64>,
    /// Lines of `eval.jsonl` when the checkpoint was written (as `metrics_lines`). An
    /// evaluation that ran after a checkpoint of the same step is not covered by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_lines: Option<u64>,
    /// The checkpoint ends with a `MANIFEST.json` ([`MANIFEST_FILE`]), so one without it is
    /// unfinished. `false` in checkpoints from before manifests (they are not verified).
    #[serde(default)]
    pub manifest: bool,
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
            metrics_lines: None,
            eval_lines: None,
            manifest: false,
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

/// Appends `key: old → new` for every leaf where `old` and `new` differ (objects recursed; a
/// table present on one side only is compared key by key with nothing).
fn diff_keys(key: &str, old: &serde_json::Value, new: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::{Map, Value};
    let none = Map::new();
    let (a, b) = match (old, new) {
        (Value::Object(a), Value::Object(b)) => (a, b),
        (Value::Object(a), Value::Null) => (a, &none),
        (Value::Null, Value::Object(b)) => (&none, b),
        (a, b) => {
            if a != b {
                out.push(format!("{key}: {a} → {b}"));
            }
            return;
        }
    };
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (x, y) = (
            a.get(name).unwrap_or(&Value::Null),
            b.get(name).unwrap_or(&Value::Null),
        );
        let name = if key.is_empty() {
            name.clone()
        } else {
            format!("{key}.{name}")
        };
        diff_keys(&name, x, y, out);
    }
}

/// Every `key: old → new` between a run's saved config (`text`, read from `path`) and
/// `config`, comparing the values the configs mean (defaults filled in); the TOML tables
/// themselves when the saved one no longer parses as a config.
fn config_diff(text: &str, path: &Path, config: &crate::config::PipelineConfig) -> Vec<String> {
    let source = path.display().to_string();
    let (old, new) = match crate::config::PipelineConfig::parse(text, &source) {
        Ok(saved) => (serde_json::to_value(&saved), serde_json::to_value(config)),
        Err(_) => {
            let table = |t: &str| {
                toml::from_str::<toml::Table>(t).map_or(serde_json::Value::Null, |t| {
                    serde_json::to_value(t).unwrap_or(serde_json::Value::Null)
                })
            };
            (Ok(table(text)), Ok(table(&config.text)))
        }
    };
    let (Ok(old), Ok(new)) = (old, new) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    diff_keys("", &old, &new, &mut out);
    out
}

/// The dotted key of a [`diff_keys`] line (`key: old → new`).
fn diff_key(line: &str) -> &str {
    line.split_once(": ").map_or(line, |(k, _)| k)
}

/// A change that a resume refuses: `run.seed` or a key of `[eval]`.
fn held_out_key(line: &str) -> bool {
    let key = diff_key(line);
    key == "run.seed" || key == "eval" || key.starts_with("eval.")
}

/// A change a resume takes silently: how long, where, whether to resume, on which device.
fn ignored_key(line: &str) -> bool {
    let key = diff_key(line);
    ["run.steps", "run.dir", "run.resume", "model.device"]
        .iter()
        .any(|k| key == *k || key.starts_with(&format!("{k}.")))
}

/// The error for a `checkpoints/latest` that is a directory, saying what to do.
fn latest_is_a_directory(latest: PathBuf) -> Error {
    Error::Checkpoint {
        path: latest,
        reason: "is a directory, but it must be a file holding the name of the checkpoint to \
                 resume from; move it away, then write the name of one of the `step-NNNNNN` \
                 directories beside it into `checkpoints/latest` to resume from that one, or \
                 pass --no-resume to start the run over"
            .into(),
    }
}

/// A run directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub root: PathBuf,
}

/// Holds a run directory's lock ([`RunDir::lock`]) while alive; dropping it empties the
/// `.lock` file, so a pid left in it means its holder died without letting go.
#[derive(Debug)]
pub struct RunLock {
    file: std::fs::File,
    /// The pid a killed run left in `.lock` (a stale lock, taken over); `None` when the file
    /// was new or empty.
    pub stale_holder: Option<String>,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

impl RunDir {
    /// Creates the directory (and parents) if needed.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] when `checkpoints` is not a directory or `checkpoints/latest` is
    /// not a file (each says what to do); [`Error::Io`] when the directory cannot be created.
    pub fn create(root: &Path) -> Result<Self> {
        let checkpoints = root.join("checkpoints");
        if checkpoints.exists() && !checkpoints.is_dir() {
            return Err(Error::Checkpoint {
                path: checkpoints,
                reason: "is a file, but the run directory keeps its checkpoints in a directory \
                         of that name; move the file away (nothing of the run is in it), or \
                         pass --run-dir to use another run directory"
                    .into(),
            });
        }
        let latest = checkpoints.join("latest");
        if latest.is_dir() {
            return Err(latest_is_a_directory(latest));
        }
        std::fs::create_dir_all(&checkpoints).map_err(|e| Error::io(root, e))?;
        Ok(RunDir {
            root: root.to_path_buf(),
        })
    }

    /// Takes the run directory for this process: an exclusive advisory lock on `<run>/.lock`,
    /// held until the returned guard drops (or the process dies: the OS releases it). A second
    /// `cairn train` on the same directory would interleave metrics and checkpoints, so it is
    /// refused with the holder's pid.
    ///
    /// A `.lock` that still holds a pid although nobody holds the lock was left by a run that
    /// was killed: it is taken over, and [`RunLock::stale_holder`] names that pid.
    ///
    /// # Errors
    /// [`Error::RunLocked`] with the holder's pid when another process holds the directory;
    /// [`Error::Io`] when `.lock` cannot be opened or written.
    pub fn lock(&self) -> Result<RunLock> {
        use std::io::{Read, Seek};
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
        let mut previous = String::new();
        let _ = file.read_to_string(&mut previous);
        let previous = previous.trim().to_string();
        let stale_holder = (!previous.is_empty() && previous != std::process::id().to_string())
            .then_some(previous);
        file.set_len(0).map_err(|e| Error::io(&path, e))?;
        file.rewind().map_err(|e| Error::io(&path, e))?;
        write!(file, "{}", std::process::id()).map_err(|e| Error::io(&path, e))?;
        file.sync_all().map_err(|e| Error::io(&path, e))?;
        Ok(RunLock { file, stale_holder })
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

    /// Before resuming: refuses a config whose model (`model.path` or `[model.scratch]`) or
    /// algorithm stack differs from the one this run's checkpoints were written with
    /// (`<run>/config.toml`), or whose `run.seed` or `[eval]` does (the held-out numbers
    /// would stop being comparable), listing the keys that differ. Other changes are allowed
    /// ([`RunDir::record_config`] warns about them and records the config used). A run
    /// without a checkpoint, or without a readable `config.toml`, is not checked.
    ///
    /// # Errors
    /// [`Error::Config`] naming the config file and saying to pass `--no-resume` or another
    /// `--run-dir`.
    pub fn check_resumable(&self, config: &crate::config::PipelineConfig) -> Result<()> {
        if !self.root.join("checkpoints").join("latest").is_file() {
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
        // Held-out comparability: the seed draws the evaluation's tasks and sampling with
        // everything else, and `[eval]` says what an evaluation is; `eval.jsonl` already holds
        // numbers measured the old way.
        let held_out: Vec<String> = config_diff(&text, &path, config)
            .into_iter()
            .filter(|d| held_out_key(d))
            .collect();
        if !held_out.is_empty() {
            return Err(Error::Config {
                file: config.source.clone(),
                message: format!(
                    "run directory {} was trained with other held-out settings ({}): its \
                     evaluations (eval.jsonl) and the resumed run's would not be comparable. \
                     Resume with the run's `run.seed` and `[eval]` (its config.toml), pass \
                     --no-resume to start that run over, or --run-dir to start a new run \
                     elsewhere",
                    self.root.display(),
                    held_out.join(", ")
                ),
            });
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

    /// On resume, once the checkpoint of `global_step` is loaded: when `config` differs from
    /// `<run>/config.toml` in a key other than `run.steps`, `run.dir`, `run.resume` and
    /// `model.device` ([`RunDir::check_resumable`] has refused the changes that cannot
    /// resume), keeps the old file as `config.before-step-N.toml` (N = `global_step`; `-K`
    /// added when taken), writes `config` as `config.toml`, and returns the warning to print:
    /// every `key: old → new`, and that the resumed run is no longer the uninterrupted run.
    /// `None` (nothing written) when nothing that matters changed.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file that could not be renamed or written.
    pub fn record_config(
        &self,
        config: &crate::config::PipelineConfig,
        global_step: u64,
    ) -> Result<Option<String>> {
        let path = self.root.join("config.toml");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let changed: Vec<String> = config_diff(&text, &path, config)
            .into_iter()
            .filter(|d| !ignored_key(d))
            .collect();
        if changed.is_empty() {
            return Ok(None);
        }
        let mut before = self
            .root
            .join(format!("config.before-step-{global_step:06}.toml"));
        let mut k = 1;
        while before.exists() {
            before = self
                .root
                .join(format!("config.before-step-{global_step:06}-{k}.toml"));
            k += 1;
        }
        std::fs::rename(&path, &before).map_err(|e| Error::io(&before, e))?;
        write_atomic(&path, config.text.as_bytes())?;
        Ok(Some(format!(
            "{} differs from the config run directory {} trained with until step \
             {global_step}: {}. The resumed run is no longer the uninterrupted run (the steps up \
             to the checkpoint used the old values); {} now holds this config and the previous \
             one is kept as {}",
            config.source,
            self.root.display(),
            changed.join(", "),
            path.display(),
            before.display()
        )))
    }

    /// Where a checkpoint of `global_step` is written before it is complete
    /// (`checkpoints/tmp-step-NNNNNN`); [`RunDir::commit_checkpoint`] moves it into place.
    pub fn staging_dir(&self, global_step: u64) -> PathBuf {
        self.root
            .join("checkpoints")
            .join(format!("tmp-step-{global_step:06}"))
    }

    /// Removes unfinished checkpoints (`checkpoints/tmp-*`, left by a run that died while
    /// writing one).
    pub fn clear_staging(&self) -> Result<()> {
        let root = self.root.join("checkpoints");
        let entries = match std::fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(&root, e)),
        };
        for entry in entries.filter_map(std::result::Result::ok) {
            let path = entry.path();
            if path.is_dir() && entry.file_name().to_string_lossy().starts_with("tmp-") {
                std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
        Ok(())
    }

    /// Finishes a checkpoint written into `staging`: writes its manifest (the last file),
    /// renames it to `checkpoints/step-NNNNNN` (`step-NNNNNN-K` when that name is taken, as
    /// when two checkpoints fall on one step) and moves `latest` to it. Returns its path.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file or directory that could not be written; `latest` then
    /// still names the previous checkpoint.
    pub fn commit_checkpoint(&self, staging: &Path, global_step: u64) -> Result<PathBuf> {
        write_manifest(staging)?;
        let mut dir = self.checkpoint_dir(global_step);
        let mut k = 0;
        while dir.exists() {
            k += 1;
            dir = self
                .root
                .join("checkpoints")
                .join(format!("step-{global_step:06}-{k}"));
        }
        std::fs::rename(staging, &dir).map_err(|e| Error::io(&dir, e))?;
        let parent = self.root.join("checkpoints");
        if let Ok(d) = std::fs::File::open(&parent) {
            let _ = d.sync_all();
        }
        self.mark_latest(&dir)?;
        Ok(dir)
    }

    /// The checkpoint directories (`step-NNNNNN[-K]`), oldest first.
    pub fn checkpoints(&self) -> Result<Vec<PathBuf>> {
        let root = self.root.join("checkpoints");
        let entries = match std::fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&root, e)),
        };
        let mut dirs: Vec<((u64, u64), PathBuf)> = entries
            .filter_map(std::result::Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .filter_map(|p| checkpoint_key(&p).map(|k| (k, p)))
            .collect();
        dirs.sort();
        Ok(dirs.into_iter().map(|(_, p)| p).collect())
    }

    /// Whether a checkpoint directory is whole: `trainer.json` readable and, for checkpoints
    /// with a manifest, every file matching it.
    ///
    /// # Errors
    /// A sentence naming the file and what is wrong with it.
    pub fn verify_checkpoint(dir: &Path) -> std::result::Result<TrainerState, String> {
        if !dir.is_dir() {
            return Err(format!("{}: no such checkpoint directory", dir.display()));
        }
        let state = Self::load_state(dir).map_err(|e| format!("{e}"))?;
        if state.manifest || dir.join(MANIFEST_FILE).exists() {
            verify_manifest(dir)?;
        }
        Ok(state)
    }

    /// A free `checkpoints/refused-NAME[-k]` path for a refused checkpoint.
    fn refused_path(&self, name: &str) -> PathBuf {
        let root = self.root.join("checkpoints");
        let mut path = root.join(format!("refused-{name}"));
        let mut k = 1;
        while path.exists() {
            path = root.join(format!("refused-{name}-{k}"));
            k += 1;
        }
        path
    }

    /// The checkpoint to resume from: the one `checkpoints/latest` names if it verifies
    /// ([`RunDir::verify_checkpoint`]), else the newest earlier one that does, with a warning
    /// per refused checkpoint. Refused checkpoints newer than the one chosen are moved aside to
    /// `checkpoints/refused-NAME` (never deleted: they may hold files worth saving); complete
    /// ones a killed run finished but never marked belong to no resumable timeline and
    /// are removed, each with a warning. `None` when there is no `latest` (a fresh start).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] when no checkpoint verifies: it lists each one and why, and says
    /// to pass `--no-resume` (start over) or repair a file.
    pub fn resume_point(&self) -> Result<Option<ResumePoint>> {
        let latest = self.root.join("checkpoints").join("latest");
        let name = match std::fs::read(&latest) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(_) if latest.is_dir() => return Err(latest_is_a_directory(latest)),
            Err(e) => return Err(Error::io(&latest, e)),
        };
        let mut warnings = Vec::new();
        // `latest` names a checkpoint beside it; anything else (a path, `..`, garbage) is
        // never followed: every checkpoint is then a candidate, newest first.
        let named = is_checkpoint_name(&name).then(|| self.root.join("checkpoints").join(&name));
        if named.is_none() {
            warnings.push(format!(
                "checkpoints/latest holds `{}`, which is not a checkpoint name (step-NNNNNN or \
                 step-NNNNNN-K); resuming from the newest checkpoint that verifies",
                name.escape_debug()
            ));
        }
        let named_key = named
            .as_deref()
            .and_then(checkpoint_key)
            .unwrap_or((u64::MAX, u64::MAX));
        let mut candidates: Vec<PathBuf> = named.iter().cloned().collect();
        candidates.extend(
            self.checkpoints()?
                .into_iter()
                .rev()
                .filter(|d| checkpoint_key(d).is_some_and(|k| k < named_key)),
        );
        let mut chosen = None;
        let mut refused = Vec::new();
        for dir in candidates {
            match Self::verify_checkpoint(&dir) {
                Ok(_) => {
                    chosen = Some(dir);
                    break;
                }
                Err(why) => {
                    warnings.push(format!(
                        "checkpoint {} refused: {why}",
                        dir.file_name().unwrap_or_default().to_string_lossy()
                    ));
                    refused.push(dir);
                }
            }
        }
        let Some(dir) = chosen else {
            return Err(Error::Checkpoint {
                path: self.root.join("checkpoints"),
                reason: format!(
                    "no checkpoint of this run verifies, so it cannot resume ({}); restore the \
                     damaged file from a copy, or pass --no-resume to start the run over",
                    warnings.join("; ")
                ),
            });
        };
        if named.is_some() && named.as_ref() != Some(&dir) {
            warnings.push(format!(
                "resuming from the earlier checkpoint {} instead of {name}",
                dir.file_name().unwrap_or_default().to_string_lossy()
            ));
        }
        let chosen_key = checkpoint_key(&dir).unwrap_or((u64::MAX, u64::MAX));
        for newer in self.checkpoints()? {
            if checkpoint_key(&newer).is_none_or(|k| k <= chosen_key) {
                continue;
            }
            let name = newer
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if refused.contains(&newer) {
                // A damaged checkpoint may still hold files worth saving (the weights of a
                // checkpoint whose bank snapshot went missing): it is moved aside, never
                // deleted.
                let aside = self.refused_path(&name);
                std::fs::rename(&newer, &aside).map_err(|e| Error::io(&newer, e))?;
                warnings.push(format!(
                    "moved the refused checkpoint {name} to {}; delete it once nothing in it \
                     is needed",
                    aside.display()
                ));
            } else {
                std::fs::remove_dir_all(&newer).map_err(|e| Error::io(&newer, e))?;
                warnings.push(format!(
                    "removed checkpoint {name}: newer than the resume point, so the resumed run \
                     writes its own"
                ));
            }
        }
        if named.as_ref() != Some(&dir) {
            self.mark_latest(&dir)?;
        }
        Ok(Some(ResumePoint { dir, warnings }))
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

    /// Complete lines (newline-terminated) of a file; 0 when it does not exist.
    pub fn count_lines(path: &Path) -> Result<u64> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(bytes.iter().filter(|&&b| b == b'\n').count() as u64),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// On resume: keeps the first `keep` complete lines of a file (those a checkpoint
    /// covers) and drops the rest, including a line a killed run left half-written. Returns
    /// how many lines were kept (fewer than `keep` when the file has lost lines).
    pub fn truncate_lines(path: &Path, keep: u64) -> Result<u64> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io(path, e)),
        };
        let mut end = 0;
        let mut kept = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if kept == keep {
                break;
            }
            if b == b'\n' {
                kept += 1;
                end = i + 1;
            }
        }
        if end < bytes.len() {
            write_atomic(path, &bytes[..end])?;
        }
        Ok(kept)
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

    /// A run directory whose `config.toml` is `MINIMAL` and whose `latest` names a checkpoint
    /// of global step 5.
    fn run_with_config(tmp: &Path) -> RunDir {
        use crate::config::tests::MINIMAL;
        let run = RunDir::create(tmp).unwrap();
        std::fs::write(tmp.join("config.toml"), MINIMAL).unwrap();
        let dir = run.checkpoint_dir(5);
        std::fs::create_dir_all(&dir).unwrap();
        run.save_state(&dir, &TrainerState::default()).unwrap();
        run.mark_latest(&dir).unwrap();
        run
    }

    #[test]
    fn resuming_with_another_seed_or_eval_is_refused_with_the_keys_and_the_fix() {
        use crate::config::{tests::MINIMAL, PipelineConfig};
        let tmp = tempfile::tempdir().unwrap();
        let run = run_with_config(tmp.path());
        let cases = [
            (MINIMAL.replace("seed = 1", "seed = 2"), "run.seed: 1 → 2"),
            (
                MINIMAL.replace("tasks = 4\n", "tasks = 4\ntemperature = 0.5\n"),
                "eval.temperature: 0.0 → 0.5",
            ),
        ];
        for (text, named) in cases {
            let config = PipelineConfig::parse(&text, "new.toml").unwrap();
            let e = run.check_resumable(&config).unwrap_err().to_string();
            assert!(
                e.contains("new.toml")
                    && e.contains(named)
                    && e.contains("not be comparable")
                    && e.contains("--no-resume")
                    && e.contains("--run-dir"),
                "{e}"
            );
        }
        // Nothing was written.
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("config.toml")).unwrap(),
            MINIMAL
        );
    }

    #[test]
    fn a_changed_config_is_warned_about_once_and_recorded_with_the_old_one_kept() {
        use crate::config::{tests::MINIMAL, PipelineConfig};
        let tmp = tempfile::tempdir().unwrap();
        let run = run_with_config(tmp.path());
        // Steps, directory and device are not changes of the run: nothing is said or written.
        let same = MINIMAL
            .replace("steps = 2", "steps = 9")
            .replace("dir = \"runs/t\"", "dir = \"runs/u\"")
            .replace("[model]\n", "[model]\ndevice = \"auto\"\n");
        let same = PipelineConfig::parse(&same, "same.toml").unwrap();
        run.check_resumable(&same).unwrap();
        assert_eq!(run.record_config(&same, 5).unwrap(), None);
        assert!(!tmp.path().join("config.before-step-000005.toml").exists());

        let text = MINIMAL
            .replace("group_size = 4", "group_size = 2")
            .replace("lr = 1e-3", "lr = 2e-3");
        let changed = PipelineConfig::parse(&text, "new.toml").unwrap();
        run.check_resumable(&changed).unwrap();
        let warning = run.record_config(&changed, 5).unwrap().unwrap();
        assert!(
            warning.contains("rollout.group_size: 4 → 2")
                && warning.contains("optimizer.lr: 0.001 → 0.002")
                && warning.contains("no longer the uninterrupted run")
                && warning.contains("config.before-step-000005.toml")
                && !warning.contains("run.steps"),
            "{warning}"
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("config.toml")).unwrap(),
            text
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("config.before-step-000005.toml")).unwrap(),
            MINIMAL
        );
        // The recorded config is now the run's: resuming with it again changes nothing.
        assert_eq!(run.record_config(&changed, 5).unwrap(), None);
        // Changed back: the earlier record is kept, the next one gets its own name.
        let back = PipelineConfig::parse(MINIMAL, "old.toml").unwrap();
        assert!(run.record_config(&back, 5).unwrap().is_some());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("config.before-step-000005-1.toml")).unwrap(),
            text
        );
    }

    #[test]
    fn garbage_in_latest_is_named_and_never_followed_and_a_latest_directory_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::create(tmp.path()).unwrap();
        commit(&run, 1);
        let second = commit(&run, 2);
        // A directory outside the checkpoints that `latest` points into.
        std::fs::create_dir_all(tmp.path().join("etc")).unwrap();
        let latest = tmp.path().join("checkpoints/latest");
        std::fs::write(&latest, "garbage../../etc").unwrap();
        let point = run.resume_point().unwrap().unwrap();
        assert_eq!(point.dir, second);
        let text = point.warnings.join("\n");
        assert!(
            text.contains(
                "checkpoints/latest holds `garbage../../etc`, which is not a checkpoint name"
            ) && !text.contains("refused"),
            "{text}"
        );
        assert_eq!(std::fs::read_to_string(&latest).unwrap(), "step-000002");
        assert!(tmp.path().join("etc").is_dir());
        assert!(is_checkpoint_name("step-000001") && is_checkpoint_name("step-000001-2"));
        for bad in [
            "",
            "step-",
            "step-1-",
            "step-1/x",
            "step-../1",
            "tmp-step-000001",
            "latest",
        ] {
            assert!(!is_checkpoint_name(bad), "{bad}");
        }

        std::fs::remove_file(&latest).unwrap();
        std::fs::create_dir(&latest).unwrap();
        for e in [
            run.resume_point().unwrap_err().to_string(),
            RunDir::create(tmp.path()).unwrap_err().to_string(),
        ] {
            assert!(
                e.contains("checkpoints/latest")
                    && e.contains("is a directory")
                    && e.contains("--no-resume"),
                "{e}"
            );
        }

        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("checkpoints"), "not a directory").unwrap();
        let e = RunDir::create(&other).unwrap_err().to_string();
        assert!(
            e.contains("other/checkpoints") && e.contains("is a file") && e.contains("--run-dir"),
            "{e}"
        );
    }

    /// A checkpoint with one file, committed.
    fn commit(run: &RunDir, step: u64) -> PathBuf {
        let staging = run.staging_dir(step);
        std::fs::create_dir_all(staging.join("policy")).unwrap();
        std::fs::write(staging.join("policy/model.safetensors"), vec![7u8; 64]).unwrap();
        let state = TrainerState {
            global_step: step,
            manifest: true,
            ..Default::default()
        };
        run.save_state(&staging, &state).unwrap();
        run.commit_checkpoint(&staging, step).unwrap()
    }

    #[test]
    fn a_damaged_latest_checkpoint_falls_back_to_the_newest_one_that_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::create(tmp.path()).unwrap();
        let first = commit(&run, 1);
        let second = commit(&run, 2);
        // Two checkpoints of one step do not overwrite each other.
        let third = commit(&run, 2);
        assert_eq!(third.file_name().unwrap(), "step-000002-1");
        let point = run.resume_point().unwrap().unwrap();
        assert_eq!(
            (point.dir.clone(), point.warnings.len()),
            (third.clone(), 0)
        );

        std::fs::write(third.join("policy/model.safetensors"), vec![7u8; 10]).unwrap();
        let mut bytes = std::fs::read(second.join("policy/model.safetensors")).unwrap();
        bytes[0] ^= 1;
        std::fs::write(second.join("policy/model.safetensors"), bytes).unwrap();
        let point = run.resume_point().unwrap().unwrap();
        assert_eq!(point.dir, first);
        let text = point.warnings.join("\n");
        assert!(
            text.contains("step-000002-1 refused")
                && text.contains("10 bytes, the manifest says 64")
                && text.contains("step-000002 refused")
                && text.contains("CRC-32"),
            "{text}"
        );
        // `latest` moved back, and the refused ones are out of the timeline but kept aside,
        // with their files.
        assert_eq!(run.resume_point().unwrap().unwrap().dir, first);
        assert_eq!(run.checkpoints().unwrap(), std::slice::from_ref(&first));
        let aside = run.root.join("checkpoints/refused-step-000002-1");
        assert_eq!(
            std::fs::read(aside.join("policy/model.safetensors")).unwrap(),
            vec![7u8; 10]
        );
        assert!(run.root.join("checkpoints/refused-step-000002").is_dir());
        assert!(
            text.contains("moved the refused checkpoint step-000002-1 to"),
            "{text}"
        );

        std::fs::remove_file(first.join(MANIFEST_FILE)).unwrap();
        let e = run.resume_point().unwrap_err().to_string();
        assert!(
            e.contains("no checkpoint of this run verifies") && e.contains("--no-resume"),
            "{e}"
        );
    }

    #[test]
    fn line_truncation_keeps_what_the_checkpoint_covers_and_drops_a_half_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.jsonl");
        std::fs::write(&path, "{\"step\":1}\n{\"step\":1}\n{\"step\":2}\n{\"st").unwrap();
        assert_eq!(RunDir::count_lines(&path).unwrap(), 3);
        assert_eq!(RunDir::truncate_lines(&path, 2).unwrap(), 2);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":1}\n{\"step\":1}\n"
        );
        assert_eq!(RunDir::truncate_lines(&path, 5).unwrap(), 2);
    }

    #[test]
    fn a_pid_left_in_the_lock_file_is_a_stale_lock_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::create(tmp.path()).unwrap();
        std::fs::write(tmp.path().join(".lock"), "999999999").unwrap();
        let lock = run.lock().unwrap();
        assert_eq!(lock.stale_holder.as_deref(), Some("999999999"));
        drop(lock);
        assert_eq!(run.lock().unwrap().stale_holder, None);
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
