//! The runs a dashboard shows and what it reads from each: [`discover`] finds run directories
//! under the dashboard's root, [`read_jsonl`] (the reader `cairn plot` uses too, in
//! `jsonl.rs`) reads `metrics.jsonl` and `eval.jsonl` while a trainer may be appending to
//! them, [`series`] turns the lines into curves.
//!
//! Everything here only reads: files are opened for reading, never locked, never created.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use serde_json::{Map, Value as Json};

/// `metrics.jsonl`: one line per training step.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// `eval.jsonl`: one line per held-out evaluation.
pub const EVAL_FILE: &str = "eval.jsonl";
/// The config a run was started with.
pub const CONFIG_FILE: &str = "config.toml";

/// A run directory the dashboard shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its path relative to the root, `/`-separated (the root's own name when the root is a
    /// run); the `run` query value of the dashboard's URLs.
    pub name: String,
    pub dir: PathBuf,
}

/// Whether `dir` is a run directory: it has a `metrics.jsonl` or a `config.toml`.
pub fn is_run(dir: &Path) -> bool {
    dir.join(METRICS_FILE).is_file() || dir.join(CONFIG_FILE).is_file()
}

/// Whether `dir` and everything directly in it (the files the dashboard reads: metrics,
/// evaluations, the config, the data pool, the bank, the tokenizer) resolve inside `root`
/// (canonical). A run directory that is a symlink to elsewhere, or that holds one, would
/// let the dashboard read files outside the directory it was given, so it is left out.
/// Dangling links resolve nowhere and are not read either.
fn stays_inside(root: &Path, dir: &Path) -> bool {
    let inside = |p: &Path| p.canonicalize().is_ok_and(|real| real.starts_with(root));
    if !inside(dir) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).all(|e| {
        let path = e.path();
        path.canonicalize().is_err() || inside(&path)
    })
}

/// The runs under `root`: `root` itself when it is a run, else its run subdirectories and
/// theirs (two levels, e.g. `runs/scaffolds/grpo-seed1`), sorted by name. A run directory
/// that resolves outside `root`, or holds an entry that does (a symlink), is not listed, and
/// so not served.
///
/// Errors: `root` is not a directory (the message names it).
pub fn discover(root: &Path) -> Result<Vec<Run>> {
    if !root.is_dir() {
        bail!(
            "{}: no such directory; give a run directory (`run.dir` of a config, e.g. \
             runs/household-grpo) or a directory of run directories (e.g. runs)",
            root.display()
        );
    }
    let real_root = root.canonicalize()?;
    let is_run = |dir: &Path| is_run(dir) && stays_inside(&real_root, dir);
    if is_run(root) {
        let name = root
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "run".into());
        return Ok(vec![Run {
            name,
            dir: root.to_path_buf(),
        }]);
    }
    let mut runs = Vec::new();
    for child in subdirs(root) {
        let child_name = file_name(&child);
        if is_run(&child) {
            runs.push(Run {
                name: child_name,
                dir: child,
            });
            continue;
        }
        for grandchild in subdirs(&child) {
            if is_run(&grandchild) {
                runs.push(Run {
                    name: format!("{child_name}/{}", file_name(&grandchild)),
                    dir: grandchild,
                });
            }
        }
    }
    runs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(runs)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Subdirectories of `dir` (unreadable entries are skipped).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The lines of `metrics.jsonl` or `eval.jsonl`; a last line cut off mid-write is left out
/// silently (it is usually being written).
pub use crate::jsonl::read as read_jsonl;

/// The x of a line: its `step`, else its 1-based position.
fn x_of(row: &Map<String, Json>, index: usize) -> f64 {
    row.get("step")
        .and_then(Json::as_f64)
        .unwrap_or((index + 1) as f64)
}

/// The numeric keys of `rows` in first-seen order (the curves one can draw).
pub fn numeric_keys(rows: &[Map<String, Json>]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for row in rows {
        for (k, v) in row {
            if v.is_number() && k != "step" && !keys.iter().any(|x| x == k) {
                keys.push(k.clone());
            }
        }
    }
    keys
}

/// The curve of `key`: `(x, value)` for every line where `key` is a finite number, x being the
/// line's `step`.
pub fn series(rows: &[Map<String, Json>], key: &str) -> Vec<(f64, f64)> {
    rows.iter()
        .enumerate()
        .filter_map(|(i, row)| {
            let v = row.get(key)?.as_f64()?;
            v.is_finite().then(|| (x_of(row, i), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_written_last_line_is_left_out_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(METRICS_FILE);
        std::fs::write(
            &path,
            "{\"step\":1,\"loss\":0.5}\nnot json\n{\"step\":3,\"lo",
        )
        .unwrap();
        let lines = read_jsonl(&path);
        assert_eq!(lines.rows.len(), 1);
        assert_eq!(lines.problems.len(), 1);
        assert!(lines.problems[0].contains("line 2"), "{:?}", lines.problems);
        // Once the line is complete it counts, and a complete bad last line is named.
        std::fs::write(
            &path,
            "{\"step\":1,\"loss\":0.5}\n{\"step\":3,\"loss\":null}\n[1]\n",
        )
        .unwrap();
        let lines = read_jsonl(&path);
        assert_eq!(lines.rows.len(), 2);
        assert!(lines.problems[0].contains("line 3"), "{:?}", lines.problems);
        assert_eq!(series(&lines.rows, "loss"), [(1.0, 0.5)]);
        assert!(read_jsonl(&dir.path().join("missing")).rows.is_empty());
    }

    #[test]
    fn series_use_the_step_and_skip_missing_values() {
        let rows: Vec<Map<String, Json>> = [
            r#"{"step":5,"a":1.0,"b":"x"}"#,
            r#"{"a":2}"#,
            r#"{"step":9,"a":null,"c":3}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        assert_eq!(series(&rows, "a"), [(5.0, 1.0), (2.0, 2.0)]);
        assert_eq!(numeric_keys(&rows), ["a", "c"]);
    }

    #[test]
    fn discovery_finds_one_run_or_nested_runs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a").join(CONFIG_FILE), "").unwrap();
        std::fs::create_dir_all(root.join("group/b")).unwrap();
        std::fs::write(root.join("group/b").join(METRICS_FILE), "").unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        let names: Vec<String> = discover(root)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["a", "group/b"]);
        let one = discover(&root.join("a")).unwrap();
        assert_eq!((one.len(), one[0].name.as_str()), (1, "a"));
        let err = discover(&root.join("nope")).unwrap_err().to_string();
        assert!(err.contains("nope: no such directory"), "{err}");
    }

    /// A run directory made under `parent` (with a `config.toml`).
    fn run_dir(parent: &Path, name: &str) -> PathBuf {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(CONFIG_FILE), "").unwrap();
        std::fs::write(dir.join(METRICS_FILE), "{\"step\":1}\n").unwrap();
        dir
    }

    #[cfg(unix)]
    #[test]
    fn runs_that_resolve_outside_the_root_are_not_listed() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        let secret = run_dir(outside.path(), "secret");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        run_dir(root, "a");
        // A run directory that is a link to one outside the root, directly and one level down.
        symlink(&secret, root.join("linked")).unwrap();
        std::fs::create_dir_all(root.join("group")).unwrap();
        symlink(&secret, root.join("group/linked")).unwrap();
        // A group directory that is a link outside.
        symlink(outside.path(), root.join("elsewhere")).unwrap();
        // A run inside whose metrics file is a link outside.
        let leaky = run_dir(root, "leaky");
        std::fs::remove_file(leaky.join(METRICS_FILE)).unwrap();
        symlink(secret.join(METRICS_FILE), leaky.join(METRICS_FILE)).unwrap();
        // A link that stays inside the root is fine, and so is a dangling one.
        symlink(root.join("a"), root.join("alias")).unwrap();
        let dangling = run_dir(root, "dangling");
        symlink(outside.path().join("gone"), dangling.join("tokenizer")).unwrap();
        let names: Vec<String> = discover(root)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["a", "alias", "dangling"]);
        // The root itself may be a link: what counts is where it resolves.
        let link_root = outside.path().join("root-link");
        symlink(root, &link_root).unwrap();
        assert_eq!(discover(&link_root).unwrap().len(), 3);
        // A root that is itself a run with a leaking file is not served either.
        assert!(discover(&leaky).unwrap().is_empty());
    }
}
