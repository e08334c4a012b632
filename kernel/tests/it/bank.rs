//! The experience bank across a real process kill: a child process (this test binary, re-run
//! on one test) writes, checkpoints, writes more, and is killed with SIGKILL while it holds
//! the bank open. The parent then finds every committed write, and a restore from the
//! checkpoint gives exactly the checkpoint's entries and statistics.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_plugin_sdk::bank::{BankEntry, NewEntry, Provenance, StatsUpdate};
use cairn_stores::bank::{bank_path, snapshot_path, Bank, EntryFilter};

/// Set in the child's environment: the run directory it writes.
const CHILD_RUN: &str = "CAIRN_BANK_KILL_CHILD_RUN";

fn entries(texts: &[&str]) -> Vec<NewEntry> {
    texts
        .iter()
        .map(|t| NewEntry {
            text: t.to_string(),
            ..Default::default()
        })
        .collect()
}

fn listing(bank: &Bank) -> Vec<BankEntry> {
    bank.list(&EntryFilter::default()).unwrap()
}

/// The child's work; it never returns (the parent kills it).
fn child(run: &Path) -> ! {
    let mut bank = Bank::open(&bank_path(run)).unwrap();
    let at = Provenance {
        step: 3,
        policy_version: 3,
        source_trajectories: vec![],
        writer: "child".into(),
    };
    bank.put(&entries(&["first lesson", "second lesson"]), &at)
        .unwrap();
    bank.update(&[StatsUpdate {
        id: 2,
        add_exposures: 4,
        add_successes: 1,
        ..Default::default()
    }])
    .unwrap();
    let checkpoint = run.join("checkpoints/step-000003");
    std::fs::create_dir_all(&checkpoint).unwrap();
    bank.snapshot_to(&snapshot_path(&checkpoint)).unwrap();
    let expected = serde_json::to_string(&listing(&bank)).unwrap();
    std::fs::write(run.join("at-checkpoint.json"), expected).unwrap();

    bank.put(&entries(&["third lesson"]), &at).unwrap();
    bank.retire(&[1]).unwrap();
    let expected = serde_json::to_string(&listing(&bank)).unwrap();
    // Written whole, then renamed: the parent kills as soon as the name exists, and a file
    // still being written would read as empty (it did, once, in a loaded CI run).
    std::fs::write(run.join("at-kill.json.part"), expected).unwrap();
    std::fs::rename(run.join("at-kill.json.part"), run.join("at-kill.json")).unwrap();
    // Idle until the parent's SIGKILL: dying mid-run is the behaviour under test.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_killed_writer_loses_nothing_and_a_restore_gives_the_checkpoint() {
    if let Some(run) = std::env::var_os(CHILD_RUN) {
        child(Path::new(&run));
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path();
    let mut process = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "bank::a_killed_writer_loses_nothing_and_a_restore_gives_the_checkpoint",
            "--test-threads",
            "1",
        ])
        .env(CHILD_RUN, run)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !run.join("at-kill.json").exists() {
        assert!(
            Instant::now() < deadline,
            "the child never got to its last write"
        );
        assert!(
            process.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    process.kill().unwrap(); // SIGKILL: no destructor, no SQLite close, the WAL left as is
    process.wait().unwrap();

    let read = |name: &str| -> Vec<BankEntry> {
        serde_json::from_str(&std::fs::read_to_string(run.join(name)).unwrap()).unwrap()
    };
    let mut bank = Bank::open(&bank_path(run)).unwrap();
    assert_eq!(listing(&bank), read("at-kill.json"));
    bank.restore_from(&snapshot_path(&run.join("checkpoints/step-000003")))
        .unwrap();
    let at_checkpoint = read("at-checkpoint.json");
    assert_eq!(listing(&bank), at_checkpoint);
    let summary: Vec<(u64, &str, u64)> = at_checkpoint
        .iter()
        .map(|e| (e.id, e.text.as_str(), e.stats.exposures))
        .collect();
    assert_eq!(summary, [(1, "first lesson", 0), (2, "second lesson", 4)]);
}
