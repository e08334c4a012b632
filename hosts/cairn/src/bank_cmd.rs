//! `cairn bank list|show|export RUN_DIR`: inspect a run's experience bank
//! (`RUN_DIR/bank.sqlite`), or a checkpoint's copy (`RUN_DIR/checkpoints/step-N`, which holds
//! a `bank.sqlite` too). Read-only: the bank is opened without write access, so this is safe
//! while the run trains. Trajectory-scoped entries (ECHO's memory records) are listed like any
//! other, with their trajectory; `--trajectory ID` shows one trajectory's.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use cairn_plugin_sdk::bank::{BankEntry, EntryKind, EntryStatus};
use cairn_stores::bank::{bank_path, Bank, EntryFilter};
use clap::Subcommand;

use crate::output::{Existing, Output};

/// Characters of an entry's text that `list` shows.
const LIST_TEXT_CHARS: usize = 60;

#[derive(Subcommand)]
pub enum BankCommand {
    /// One line per entry: id, kind, status, version, utility EMA, exposures, (trajectory,)
    /// text start.
    List {
        /// A run directory (or a checkpoint directory).
        run_dir: PathBuf,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Everything about one entry: text, trigger, task, lineage, provenance, statistics.
    Show {
        /// A run directory (or a checkpoint directory).
        run_dir: PathBuf,
        /// The entry's id (from `cairn bank list`).
        id: u64,
    },
    /// The entries as JSON lines, one entry per line (every field), by id.
    Export {
        /// A run directory (or a checkpoint directory).
        run_dir: PathBuf,
        #[command(flatten)]
        filter: FilterArgs,
        /// Write to this file instead of stdout (written whole or not at all): a new file, or
        /// an existing regular file with --force. Never a directory, device, FIFO, socket or
        /// symbolic link, nor the run's bank or pool, nor any SQLite file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// With --out: replace an existing file.
        #[arg(long, requires = "out")]
        force: bool,
    },
}

#[derive(clap::Args)]
pub struct FilterArgs {
    /// Only this kind (repeatable): experience | skill | scaffold | evidence_card |
    /// memory_record.
    #[arg(long = "kind", value_parser = parse_kind)]
    kinds: Vec<EntryKind>,
    /// Only this status (repeatable): active | under_test | retired.
    #[arg(long = "status", value_parser = parse_status)]
    statuses: Vec<EntryStatus>,
    /// Only the entries scoped to this trajectory (its memory records; the trajectory ids of
    /// the data pool, `cairn pool`).
    #[arg(long = "trajectory", value_name = "ID")]
    trajectory: Option<u64>,
    /// Only the entries for this task (general entries excluded).
    #[arg(long = "task", value_name = "TASK")]
    task: Option<String>,
}

impl FilterArgs {
    fn filter(&self) -> EntryFilter {
        EntryFilter {
            kinds: self.kinds.clone(),
            statuses: self.statuses.clone(),
            task_id: self.task.clone(),
            trajectory_id: self.trajectory,
        }
    }
}

const STATUSES: [EntryStatus; 3] = [
    EntryStatus::Active,
    EntryStatus::UnderTest,
    EntryStatus::Retired,
];

fn parse_kind(s: &str) -> Result<EntryKind, String> {
    EntryKind::ALL
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = EntryKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("no entry kind `{s}`; one of: {}", names.join(", "))
        })
}

fn parse_status(s: &str) -> Result<EntryStatus, String> {
    STATUSES
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = STATUSES.iter().map(|k| k.as_str()).collect();
            format!("no entry status `{s}`; one of: {}", names.join(", "))
        })
}

/// Runs a `cairn bank` command; a closed stdout (`cairn bank list RUN | head`) ends it
/// quietly, with status 0.
pub fn run(command: BankCommand) -> Result<()> {
    crate::pool_cmd::quiet_broken_pipe(run_command(command))
}

fn run_command(command: BankCommand) -> Result<()> {
    match command {
        BankCommand::List { run_dir, filter } => {
            let entries = open(&run_dir)?.list(&filter.filter())?;
            std::io::stdout()
                .lock()
                .write_all(render_list(&entries).as_bytes())?;
            Ok(())
        }
        BankCommand::Show { run_dir, id } => {
            let bank = open(&run_dir)?;
            let Some(entry) = bank.get(id)? else {
                bail!(
                    "{}: no entry {id} in the experience bank; `cairn bank list {}` shows the ids",
                    bank.path().display(),
                    run_dir.display()
                );
            };
            std::io::stdout()
                .lock()
                .write_all(render_entry(&entry).as_bytes())?;
            Ok(())
        }
        BankCommand::Export {
            run_dir,
            filter,
            out,
            force,
        } => {
            let bank = open(&run_dir)?;
            match out {
                Some(path) => {
                    let mut stores = crate::output::run_stores(&run_dir);
                    stores.push(bank.path().to_path_buf());
                    let mut n = 0;
                    Output {
                        flag: "--out",
                        path: &path,
                        stores: &stores,
                        existing: Existing::replace_if(force),
                    }
                    .write(|w| {
                        n = bank.export(&filter.filter(), w, &path)?;
                        Ok(())
                    })?;
                    eprintln!("{n} entries written to {}", path.display());
                }
                None => {
                    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
                    bank.export(&filter.filter(), &mut w, Path::new("<stdout>"))?;
                }
            }
            Ok(())
        }
    }
}

/// The bank of a run (or checkpoint) directory, read-only; a directory without one is an
/// error that says so.
fn open(run_dir: &Path) -> Result<Bank> {
    if !run_dir.is_dir() {
        bail!(
            "{}: no such directory; give a run directory (`run.dir` of the config, e.g. \
             runs/household-grpo) or one of its checkpoints",
            run_dir.display()
        );
    }
    let path = bank_path(run_dir);
    if !path.exists() {
        bail!(
            "no experience bank in {}: {} does not exist; a run writes it when `cairn train` \
             starts (runs made before the bank existed have none), and each checkpoint holds \
             a copy",
            run_dir.display(),
            path.display()
        );
    }
    Ok(Bank::open_read_only(&path)?)
}

/// `text` on one line, at most `chars` characters, `…` when cut.
fn one_line(text: &str, chars: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= chars {
        flat
    } else {
        let mut cut: String = flat.chars().take(chars - 1).collect();
        cut.push('…');
        cut
    }
}

/// The listing; a `trajectory` column (`-` for an unscoped entry) appears when any listed
/// entry is scoped to a trajectory.
fn render_list(entries: &[BankEntry]) -> String {
    let scoped = entries.iter().any(|e| e.trajectory_id.is_some());
    let mut out = format!(
        "{:>6}  {:<13}  {:<10}  {:>3}  {:>8}  {:>9}  ",
        "id", "kind", "status", "ver", "utility", "exposures"
    );
    if scoped {
        out.push_str(&format!("{:>10}  ", "trajectory"));
    }
    out.push_str("text\n");
    for e in entries {
        out.push_str(&format!(
            "{:>6}  {:<13}  {:<10}  {:>3}  {:>8.3}  {:>9}  ",
            e.id,
            e.kind.as_str(),
            e.status.as_str(),
            e.version,
            e.stats.utility_ema,
            e.stats.exposures,
        ));
        if scoped {
            let t = e
                .trajectory_id
                .map_or_else(|| "-".into(), |t| t.to_string());
            out.push_str(&format!("{t:>10}  "));
        }
        out.push_str(&one_line(&e.text, LIST_TEXT_CHARS));
        out.push('\n');
    }
    out
}

fn render_entry(e: &BankEntry) -> String {
    let p = &e.provenance;
    let s = &e.stats;
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<20}{value}\n"));
    line("id", e.id.to_string());
    line("kind", e.kind.as_str().into());
    line("status", e.status.as_str().into());
    line(
        "version",
        match e.parent {
            Some(parent) => format!("{} (revises {parent})", e.version),
            None => e.version.to_string(),
        },
    );
    line(
        "task",
        e.task_id.clone().unwrap_or_else(|| "(general)".into()),
    );
    if let Some(t) = e.trajectory_id {
        line(
            "trajectory",
            format!("{t} (scoped: only its own queries see it)"),
        );
    }
    line(
        "trigger",
        e.trigger.clone().unwrap_or_else(|| "(none)".into()),
    );
    line("written by", p.writer.clone());
    line(
        "at",
        format!("step {}, policy version {}", p.step, p.policy_version),
    );
    line(
        "from trajectories",
        if p.source_trajectories.is_empty() {
            "(none)".into()
        } else {
            let ids: Vec<String> = p.source_trajectories.iter().map(u64::to_string).collect();
            ids.join(", ")
        },
    );
    line(
        "exposures",
        format!("{} ({} successes)", s.exposures, s.successes),
    );
    line("utility EMA", format!("{}", s.utility_ema));
    line(
        "Beta posterior",
        format!("α {}, β {}", s.beta_alpha, s.beta_beta),
    );
    line(
        "negative streak",
        match s.last_negative_step {
            Some(step) => format!("{} (last at step {step})", s.negative_streak),
            None => s.negative_streak.to_string(),
        },
    );
    if !e.extra.is_empty() {
        line(
            "extra",
            serde_json::Value::Object(e.extra.clone()).to_string(),
        );
    }
    out.push_str("text\n");
    for l in e.text.lines() {
        out.push_str(&format!("  {l}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use cairn_plugin_sdk::bank::{EntryStats, NewEntry, Provenance, StatsUpdate};
    use cairn_stores::bank::Bank;

    use super::*;

    fn sample() -> Vec<BankEntry> {
        let mut bank = Bank::in_memory().unwrap();
        let long = "Put the clean mug in the coffee machine, then start it: the \
                    machine only runs with a mug inside.";
        let first = NewEntry {
            text: long.into(),
            ..Default::default()
        };
        let revision = NewEntry {
            kind: EntryKind::Skill,
            text: "open the fridge\nthen take the apple".into(),
            trigger: Some("fridge".into()),
            task_id: Some("cool-3".into()),
            trajectory_id: None,
            parent: Some(1),
            status: EntryStatus::UnderTest,
            provenance: Provenance {
                source_trajectories: vec![12, 13],
                ..Default::default()
            },
            extra: serde_json::from_str(r#"{"arm": "b"}"#).unwrap(),
        };
        let defaults = Provenance {
            step: 40,
            policy_version: 41,
            source_trajectories: vec![],
            writer: "edge".into(),
        };
        bank.put(&[first, revision], &defaults).unwrap();
        bank.update(&[StatsUpdate {
            id: 2,
            set: Some(EntryStats {
                exposures: 8,
                successes: 5,
                utility_ema: 0.125,
                beta_alpha: 6.0,
                beta_beta: 4.0,
                negative_streak: 1,
                last_negative_step: Some(38),
            }),
            ..Default::default()
        }])
        .unwrap();
        bank.list(&EntryFilter::default()).unwrap()
    }

    #[test]
    fn list_shows_one_line_per_entry() {
        let lines: Vec<String> = render_list(&sample()).lines().map(String::from).collect();
        assert_eq!(
            lines,
            [
                "    id  kind           status      ver   utility  exposures  text",
                "     1  experience     active        1     0.000          0  \
                 Put the clean mug in the coffee machine, then start it: the…",
                "     2  skill          under_test    2     0.125          8  \
                 open the fridge then take the apple",
            ]
        );
    }

    #[test]
    fn show_prints_provenance_and_statistics() {
        assert_eq!(
            render_entry(&sample()[1]),
            "id                  2\n\
             kind                skill\n\
             status              under_test\n\
             version             2 (revises 1)\n\
             task                cool-3\n\
             trigger             fridge\n\
             written by          edge\n\
             at                  step 40, policy version 41\n\
             from trajectories   12, 13\n\
             exposures           8 (5 successes)\n\
             utility EMA         0.125\n\
             Beta posterior      α 6, β 4\n\
             negative streak     1 (last at step 38)\n\
             extra               {\"arm\":\"b\"}\n\
             text\n\
             \x20 open the fridge\n\
             \x20 then take the apple\n"
        );
    }

    /// Two memory records of trajectory 17 and one of trajectory 18, after an experience.
    fn with_records() -> Bank {
        let mut bank = Bank::in_memory().unwrap();
        let record = |trajectory: u64, idx: u32, text: &str| {
            let mut extra = serde_json::Map::new();
            extra.insert("idx".into(), idx.into());
            NewEntry {
                kind: EntryKind::MemoryRecord,
                text: text.into(),
                task_id: Some("iron-1".into()),
                trajectory_id: Some(trajectory),
                extra,
                ..Default::default()
            }
        };
        bank.put(
            &[
                NewEntry {
                    text: "search before answering".into(),
                    ..Default::default()
                },
                record(17, 0, "[0] search[iron] => Iron: atomic number 26"),
                record(17, 1, "[1] search[iron discovery] => known since antiquity"),
                record(18, 0, "[0] search[gold] => Gold: atomic number 79"),
            ],
            &Provenance {
                step: 3,
                policy_version: 3,
                source_trajectories: vec![],
                writer: "grpo+echo".into(),
            },
        )
        .unwrap();
        bank
    }

    #[test]
    fn memory_records_list_with_their_trajectory_and_filter_by_it() {
        let bank = with_records();
        let all = bank.list(&EntryFilter::default()).unwrap();
        let lines: Vec<String> = render_list(&all).lines().map(String::from).collect();
        assert_eq!(
            lines,
            [
                "    id  kind           status      ver   utility  exposures  trajectory  text",
                "     1  experience     active        1     0.000          0           -  \
                 search before answering",
                "     2  memory_record  active        1     0.000          0          17  \
                 [0] search[iron] => Iron: atomic number 26",
                "     3  memory_record  active        1     0.000          0          17  \
                 [1] search[iron discovery] => known since antiquity",
                "     4  memory_record  active        1     0.000          0          18  \
                 [0] search[gold] => Gold: atomic number 79",
            ]
        );
        let args = FilterArgs {
            kinds: vec![EntryKind::MemoryRecord],
            statuses: vec![],
            trajectory: Some(17),
            task: Some("iron-1".into()),
        };
        let ids: Vec<u64> = bank
            .list(&args.filter())
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, [2, 3]);
        let shown = render_entry(&bank.get(4).unwrap().unwrap());
        assert!(shown.contains("\ntrajectory          18 (scoped: only its own queries see it)\n"));
        assert!(
            shown.contains("\nextra               {\"idx\":0}\n"),
            "{shown}"
        );
    }

    #[test]
    fn filters_parse_the_sdk_names() {
        assert_eq!(parse_kind("evidence_card"), Ok(EntryKind::EvidenceCard));
        assert_eq!(
            parse_kind("skills"),
            Err(
                "no entry kind `skills`; one of: experience, skill, scaffold, evidence_card, \
                 memory_record"
                    .into()
            )
        );
        assert_eq!(parse_status("under_test"), Ok(EntryStatus::UnderTest));
        assert!(parse_status("paused").is_err());
    }

    #[test]
    fn a_directory_without_a_bank_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let err = open(dir.path()).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "no experience bank in {}: {} does not exist",
                dir.path().display(),
                dir.path().join("bank.sqlite").display()
            )),
            "{err}"
        );
        let err = open(&dir.path().join("nope")).unwrap_err().to_string();
        assert!(err.ends_with("or one of its checkpoints"), "{err}");
        assert!(!dir.path().join("bank.sqlite").exists());
    }
}
