//! Unit tests of the bank: persistence across a kill and a restore, refused files (corrupt,
//! locked, foreign, other schema) left byte-identical, provenance, lineage, atomic updates,
//! BM25 order and filters, trajectory-scoped memory records, the schema-1 migration.

use std::path::Path;
use std::time::Duration;

use cairn_plugin_sdk::bank::{
    BankEntry, BankQuery, EntryKind, EntryStats, EntryStatus, NewEntry, Provenance, StatsUpdate,
};

use super::*;
use crate::error::Error;

fn kernel() -> Provenance {
    Provenance {
        step: 7,
        policy_version: 3,
        source_trajectories: Vec::new(),
        writer: "kernel-test".into(),
    }
}

fn new(text: &str) -> NewEntry {
    NewEntry {
        text: text.into(),
        ..Default::default()
    }
}

fn put_texts(bank: &mut Bank, texts: &[&str]) -> Vec<u64> {
    let entries: Vec<NewEntry> = texts.iter().map(|t| new(t)).collect();
    bank.put(&entries, &kernel()).unwrap()
}

fn all(bank: &Bank) -> Vec<BankEntry> {
    bank.list(&EntryFilter::default()).unwrap()
}

/// The ids `query` returns, best first.
fn ranked(bank: &Bank, query: &BankQuery) -> Vec<u64> {
    bank.query(query)
        .unwrap()
        .iter()
        .map(|r| r.entry.id)
        .collect()
}

fn text_query(text: &str) -> BankQuery {
    BankQuery {
        text: text.into(),
        ..Default::default()
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn an_entry_round_trips_with_every_field() {
    let mut bank = Bank::in_memory().unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("arm".into(), serde_json::json!("b"));
    let entry = NewEntry {
        kind: EntryKind::Skill,
        text: "open the fridge before taking food".into(),
        trigger: Some("fridge".into()),
        task_id: Some("cool-12".into()),
        trajectory_id: Some(40),
        parent: None,
        status: EntryStatus::UnderTest,
        provenance: Provenance {
            step: 11,
            policy_version: 5,
            source_trajectories: vec![40, 41],
            writer: "reskill".into(),
        },
        extra: extra.clone(),
    };
    let ids = bank.put(&[entry], &kernel()).unwrap();
    assert_eq!(ids, [1]);
    let expected = BankEntry {
        id: 1,
        kind: EntryKind::Skill,
        text: "open the fridge before taking food".into(),
        trigger: Some("fridge".into()),
        task_id: Some("cool-12".into()),
        trajectory_id: Some(40),
        version: 1,
        parent: None,
        status: EntryStatus::UnderTest,
        provenance: Provenance {
            step: 11,
            policy_version: 5,
            source_trajectories: vec![40, 41],
            writer: "reskill".into(),
        },
        stats: EntryStats::default(),
        extra,
    };
    assert_eq!(bank.get(1).unwrap(), Some(expected.clone()));
    assert_eq!(bank.get(2).unwrap(), None);
    assert_eq!(all(&bank), [expected]);
}

#[test]
fn provenance_left_empty_takes_the_kernels_values() {
    let mut bank = Bank::in_memory().unwrap();
    let mut own = new("plugin-stamped");
    own.provenance = Provenance {
        step: 2,
        policy_version: 1,
        source_trajectories: vec![9],
        writer: "edge".into(),
    };
    let mut partial = new("writer only");
    partial.provenance.writer = "echo".into();
    bank.put(&[new("bare"), own, partial], &kernel()).unwrap();
    let got: Vec<(u64, u64, Vec<u64>, String)> = all(&bank)
        .into_iter()
        .map(|e| {
            let p = e.provenance;
            (p.step, p.policy_version, p.source_trajectories, p.writer)
        })
        .collect();
    assert_eq!(
        got,
        [
            (7, 3, vec![], "kernel-test".to_string()),
            (2, 1, vec![9], "edge".to_string()),
            (7, 3, vec![], "echo".to_string()),
        ]
    );
}

#[test]
fn a_revision_is_its_parents_version_plus_one() {
    let mut bank = Bank::in_memory().unwrap();
    let root = put_texts(&mut bank, &["v1 of a skill"])[0];
    let mut v2 = new("v2 of a skill");
    v2.parent = Some(root);
    let v2 = bank.put(&[v2], &kernel()).unwrap()[0];
    let mut v3 = new("v3 of a skill");
    v3.parent = Some(v2);
    let v3 = bank.put(&[v3], &kernel()).unwrap()[0];
    let lineage: Vec<(u64, u32, Option<u64>)> = all(&bank)
        .iter()
        .map(|e| (e.id, e.version, e.parent))
        .collect();
    assert_eq!(
        lineage,
        [(root, 1, None), (v2, 2, Some(root)), (v3, 3, Some(v2))]
    );

    // A missing parent, or an empty text, fails the whole put: the good entry before it is
    // not stored either.
    let mut orphan = new("orphan");
    orphan.parent = Some(99);
    let err = bank.put(&[new("fine"), orphan], &kernel()).unwrap_err();
    assert!(
        matches!(&err, Error::BankInvalid { what, detail, .. }
            if what == "entry 1 of the put" && detail == "its parent 99 is not in the bank"),
        "{err}"
    );
    let err = bank.put(&[new("fine"), new("  ")], &kernel()).unwrap_err();
    assert!(
        matches!(&err, Error::BankInvalid { detail, .. } if detail == "its text is empty"),
        "{err}"
    );
    assert_eq!(all(&bank).len(), 3);
}

#[test]
fn an_update_naming_a_missing_entry_changes_nothing() {
    let mut bank = Bank::in_memory().unwrap();
    put_texts(&mut bank, &["a", "b"]);
    let before = all(&bank);
    let err = bank
        .update(&[
            StatsUpdate {
                id: 1,
                add_exposures: 4,
                add_successes: 1,
                status: Some(EntryStatus::Retired),
                ..Default::default()
            },
            StatsUpdate {
                id: 5,
                add_exposures: 1,
                ..Default::default()
            },
        ])
        .unwrap_err();
    assert!(matches!(err, Error::BankNoEntry { id: 5, .. }), "{err}");
    assert!(err
        .to_string()
        .ends_with("no entry 5 in the experience bank; nothing was changed"));
    assert_eq!(all(&bank), before);

    // An invalid statistics block fails the same way.
    let err = bank
        .update(&[
            StatsUpdate {
                id: 2,
                add_exposures: 1,
                ..Default::default()
            },
            StatsUpdate {
                id: 1,
                set: Some(EntryStats {
                    beta_alpha: 0.0,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ])
        .unwrap_err();
    assert!(matches!(err, Error::BankInvalid { .. }), "{err}");
    assert_eq!(all(&bank), before);
}

#[test]
fn updates_add_counters_set_blocks_and_change_status() {
    let mut bank = Bank::in_memory().unwrap();
    put_texts(&mut bank, &["a", "b"]);
    let set = EntryStats {
        exposures: 10,
        successes: 6,
        utility_ema: -0.25,
        beta_alpha: 7.0,
        beta_beta: 5.0,
        negative_streak: 2,
        last_negative_step: Some(40),
    };
    bank.update(&[
        StatsUpdate {
            id: 1,
            add_exposures: 3,
            add_successes: 2,
            ..Default::default()
        },
        StatsUpdate {
            id: 1,
            add_exposures: 1,
            status: Some(EntryStatus::UnderTest),
            ..Default::default()
        },
        StatsUpdate {
            id: 2,
            add_exposures: 100,
            set: Some(set.clone()),
            ..Default::default()
        },
    ])
    .unwrap();
    let a = bank.get(1).unwrap().unwrap();
    assert_eq!(
        (a.stats.exposures, a.stats.successes, a.status),
        (4, 2, EntryStatus::UnderTest)
    );
    let b = bank.get(2).unwrap().unwrap();
    assert_eq!((b.stats, b.status), (set, EntryStatus::Active));

    bank.retire(&[2]).unwrap();
    assert_eq!(bank.get(2).unwrap().unwrap().status, EntryStatus::Retired);
    let err = bank.retire(&[1, 3]).unwrap_err();
    assert!(matches!(err, Error::BankNoEntry { id: 3, .. }), "{err}");
    assert_eq!(bank.get(1).unwrap().unwrap().status, EntryStatus::UnderTest);
}

/// A fixed corpus of ten entries, five of them matching no query term. The expected orders
/// follow from FTS5's BM25 (k1 = 1.2, b = 0.75, idf = ln((N - n + 0.5) / (n + 0.5))) with
/// N = 10 and a mean length of 7.3 tokens: `clean` is in 1 entry (idf 1.85), `mug` and `sink`
/// in 3 each (idf 0.76). The scores, computed independently from that formula, for "clean mug
/// sink": entry 2 (6 tokens, all three terms) 3.6349; entry 3 (17 tokens, `mug` twice, `sink`)
/// 1.2566; entry 4 (3 tokens, `mug`) 1.0041; entry 5 (12 tokens, `sink`) 0.5776. For
/// "cleaning mugs": 2, then 4 (1.0041), then 3 (0.7629): the short entry's one `mug` beats the
/// long entry's two.
#[test]
fn bm25_ranks_a_fixed_corpus() {
    let mut bank = Bank::in_memory().unwrap();
    let ids = put_texts(
        &mut bank,
        &[
            "open the fridge, take the apple",
            "clean the mug in the sink",
            "rinse the mug in the sink, then dry the mug with a towel, then put it away",
            "take a mug",
            "wash the plate in the sink before you put it in the cabinet",
            "heat the potato in the microwave",
            "put the book on the shelf",
            "turn on the desk lamp",
            "look under the bed for the keys",
            "go to the garden",
        ],
    );
    assert_eq!(ids, (1..=10).collect::<Vec<u64>>());
    let found = bank.query(&text_query("clean mug sink")).unwrap();
    let got: Vec<(u64, f64)> = found
        .iter()
        .map(|r| (r.entry.id, (r.score * 1e4).round() / 1e4))
        .collect();
    assert_eq!(got, [(2, 3.6349), (3, 1.2566), (4, 1.0041), (5, 0.5776)]);
    // Stemming: `cleaning` and `mugs` find `clean` and `mug`; punctuation and FTS5 operators
    // in the query are only text (`not`, `near`, `and` are in no entry).
    assert_eq!(
        ranked(&bank, &text_query("Cleaning MUGS: (NOT \"near\") - AND *")),
        [2, 4, 3]
    );
    assert_eq!(ranked(&bank, &text_query("fridge apple")), [1]);
    assert_eq!(ranked(&bank, &text_query("television")), Vec::<u64>::new());
    // k bounds the list.
    let top2 = BankQuery {
        k: 2,
        ..text_query("clean mug sink")
    };
    assert_eq!(ranked(&bank, &top2), [2, 3]);
}

/// Only the first [`MAX_QUERY_TERMS`] distinct terms of a query are matched (a repeated term
/// counts once), so a long observation costs a bounded query.
#[test]
fn a_query_matches_its_first_distinct_terms_only() {
    let mut bank = Bank::in_memory().unwrap();
    put_texts(&mut bank, &["zebra crossing"]);
    let filler = |n: usize| -> String { (0..n).map(|i| format!("w{i} ")).collect() };
    let last_kept = format!("{} w0 zebra", filler(MAX_QUERY_TERMS - 1));
    assert_eq!(ranked(&bank, &text_query(&last_kept)), [1]);
    let first_dropped = format!("{} zebra", filler(MAX_QUERY_TERMS));
    assert_eq!(
        ranked(&bank, &text_query(&first_dropped)),
        Vec::<u64>::new()
    );
}

#[test]
fn a_trigger_match_outranks_the_same_word_in_text() {
    let mut bank = Bank::in_memory().unwrap();
    let mut triggered = new("turn the water off after use");
    triggered.trigger = Some("faucet".into());
    bank.put(
        &[new("turn the faucet off after use"), triggered],
        &kernel(),
    )
    .unwrap();
    assert_eq!(ranked(&bank, &text_query("faucet")), [2, 1]);
}

#[test]
fn queries_filter_by_kind_task_and_status() {
    let mut bank = Bank::in_memory().unwrap();
    let entry = |kind, task: Option<&str>, text: &str| NewEntry {
        kind,
        task_id: task.map(str::to_string),
        ..new(text)
    };
    bank.put(
        &[
            entry(
                EntryKind::Experience,
                None,
                "mug goes in the coffee machine",
            ), // 1
            entry(EntryKind::Skill, None, "a mug skill"), // 2
            entry(EntryKind::Experience, Some("t1"), "mug lesson for t1"), // 3
            entry(EntryKind::Experience, Some("t2"), "mug lesson for t2"), // 4
            NewEntry {
                trajectory_id: Some(70),
                ..entry(EntryKind::MemoryRecord, Some("t1"), "mug memory")
            }, // 5
        ],
        &kernel(),
    )
    .unwrap();
    bank.retire(&[5]).unwrap();
    let check = |query: BankQuery, expected: &[u64]| {
        let mut got = ranked(&bank, &query);
        got.sort_unstable();
        assert_eq!(got, expected, "{query:?}");
    };
    let mug = text_query("mug");
    check(mug.clone(), &[1, 2, 3, 4]);
    check(
        BankQuery {
            kinds: vec![EntryKind::Skill, EntryKind::MemoryRecord],
            ..mug.clone()
        },
        &[2],
    );
    check(
        BankQuery {
            task_id: Some("t1".into()),
            ..mug.clone()
        },
        &[1, 2, 3],
    );
    check(
        BankQuery {
            task_id: Some("t1".into()),
            include_general: false,
            ..mug.clone()
        },
        &[3],
    );
    check(
        BankQuery {
            statuses: vec![EntryStatus::Retired],
            trajectory_id: Some(70),
            ..mug.clone()
        },
        &[5],
    );
    // Without terms: the newest matching entries, score 0.
    let newest = bank
        .query(&BankQuery {
            k: 2,
            kinds: vec![EntryKind::Experience],
            ..Default::default()
        })
        .unwrap();
    let got: Vec<(u64, f64)> = newest.iter().map(|r| (r.entry.id, r.score)).collect();
    assert_eq!(got, [(4, 0.0), (3, 0.0)]);
    // The listing filter.
    let listed: Vec<u64> = bank
        .list(&EntryFilter {
            kinds: vec![EntryKind::Experience],
            statuses: vec![EntryStatus::Active],
            task_id: Some("t1".into()),
            trajectory_id: None,
        })
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, [3]);
    assert_eq!(bank.count(&EntryFilter::default()).unwrap(), 5);
}

#[test]
fn a_restore_after_a_kill_gives_exactly_the_checkpoints_bank() {
    let dir = tempfile::tempdir().unwrap();
    let path = bank_path(dir.path());
    let checkpoint = dir.path().join("checkpoints/step-000010");
    std::fs::create_dir_all(&checkpoint).unwrap();

    let mut bank = Bank::open(&path).unwrap();
    put_texts(&mut bank, &["first lesson", "second lesson"]);
    bank.update(&[StatsUpdate {
        id: 1,
        add_exposures: 2,
        add_successes: 1,
        ..Default::default()
    }])
    .unwrap();
    bank.snapshot_to(&snapshot_path(&checkpoint)).unwrap();
    let at_checkpoint = all(&bank);

    // After the checkpoint: a new entry, changed statistics, a retirement.
    put_texts(&mut bank, &["third lesson"]);
    bank.update(&[StatsUpdate {
        id: 1,
        add_exposures: 5,
        ..Default::default()
    }])
    .unwrap();
    bank.retire(&[2]).unwrap();
    let before_kill = all(&bank);
    // The kill: the connection is never closed, the WAL never checkpointed into the file.
    std::mem::forget(bank);

    // Committed writes survive the kill ...
    let mut bank = Bank::open(&path).unwrap();
    assert_eq!(all(&bank), before_kill);
    // ... and the resume makes the bank exactly the checkpoint's again.
    bank.restore_from(&snapshot_path(&checkpoint)).unwrap();
    assert_eq!(all(&bank), at_checkpoint);
    assert_eq!(ranked(&bank, &text_query("third lesson")), [1, 2]);
    // Ids continue from the checkpoint, as they did in the run that wrote it.
    assert_eq!(put_texts(&mut bank, &["third again"]), [3]);
    let journal: String = bank
        .conn()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
    drop(bank);

    let bank = Bank::open(&path).unwrap();
    let ids: Vec<u64> = all(&bank).iter().map(|e| e.id).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(bank.get(1).unwrap().unwrap().stats.exposures, 2);
}

#[test]
fn a_snapshot_is_one_self_contained_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::open(&bank_path(dir.path())).unwrap();
    put_texts(&mut bank, &["a lesson"]);
    let out = dir.path().join("ckpt");
    std::fs::create_dir_all(&out).unwrap();
    bank.snapshot_to(&snapshot_path(&out)).unwrap();
    // A second snapshot replaces the first.
    put_texts(&mut bank, &["another"]);
    bank.snapshot_to(&snapshot_path(&out)).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["bank.sqlite"]);
    // File format bytes 18 and 19: 1 is a rollback journal (2 would be WAL).
    assert_eq!(read(&snapshot_path(&out))[18..20], [1, 1]);
    let copy = Bank::open_read_only(&snapshot_path(&out)).unwrap();
    assert_eq!(all(&copy), all(&bank));
    // `cairn eval` restores a checkpoint's snapshot into an in-memory bank.
    let mut in_memory = Bank::in_memory().unwrap();
    in_memory.restore_from(&snapshot_path(&out)).unwrap();
    assert_eq!(all(&in_memory), all(&bank));
    assert_eq!(ranked(&in_memory, &text_query("another")), [2]);
}

fn expect_refused(path: &Path, check: impl Fn(&Error) -> bool) {
    let before = read(path);
    let err = Bank::open_with(path, Duration::from_millis(100)).unwrap_err();
    assert!(check(&err), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_eq!(read(path), before, "the refused file was changed");
    let err = Bank::open_read_only(path).unwrap_err();
    assert!(check(&err), "{err}");
    assert_eq!(read(path), before, "the refused file was changed");
}

#[test]
fn a_corrupt_file_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank.sqlite");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    expect_refused(&path, |e| {
        matches!(e, Error::BankCorrupt { detail, .. } if detail.contains("not an SQLite database"))
            && e.to_string().contains("move it aside")
    });
    assert_eq!(read(&path), garbage);

    // A real bank whose pages after the header were overwritten.
    let path = dir.path().join("damaged.sqlite");
    {
        let mut bank = Bank::open(&path).unwrap();
        let texts: Vec<String> = (0..200).map(|i| format!("lesson number {i}")).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        put_texts(&mut bank, &texts);
    }
    let mut bytes = read(&path);
    assert!(bytes.len() > 3 * 4096);
    for b in &mut bytes[4096..3 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    expect_refused(&path, |e| matches!(e, Error::BankCorrupt { .. }));
}

#[test]
fn another_programs_database_or_schema_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.sqlite");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('x');")
            .unwrap();
    }
    let foreign = |e: &Error| {
        matches!(e, Error::BankCorrupt { detail, .. }
            if detail.contains("not a Cairn experience bank"))
    };
    expect_refused(&path, foreign);

    let path = dir.path().join("future.sqlite");
    drop(Bank::open(&path).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
    }
    expect_refused(
        &path,
        |e| matches!(e, Error::BankSchema { found, expected: SCHEMA_VERSION, .. } if found == "99"),
    );
}

#[test]
fn a_locked_file_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = bank_path(dir.path());
    {
        let mut bank = Bank::open(&path).unwrap();
        put_texts(&mut bank, &["kept lesson"]);
    }
    let before = read(&path);
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let err = Bank::open_with(&path, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, Error::BankLocked { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "{}: the experience bank is locked by another connection",
            path.display()
        )),
        "{err}"
    );
    assert_eq!(read(&path), before);

    // A bank opened before the lock fails its writes the same way, and stores nothing.
    holder.execute_batch("ROLLBACK").unwrap();
    let mut bank = Bank::open_with(&path, Duration::from_millis(100)).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let err = bank.put(&[new("lost")], &kernel()).unwrap_err();
    assert!(matches!(err, Error::BankLocked { .. }), "{err}");
    holder.execute_batch("ROLLBACK").unwrap();
    let texts: Vec<String> = all(&bank).into_iter().map(|e| e.text).collect();
    assert_eq!(texts, ["kept lesson"]);
}

#[test]
fn a_missing_file_is_not_created_by_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = bank_path(dir.path());
    let err = Bank::open_read_only(&path).unwrap_err();
    assert!(matches!(err, Error::FileNotFound { .. }), "{err}");
    assert!(!path.exists());
    let err = Bank::in_memory().unwrap().restore_from(&path).unwrap_err();
    assert!(matches!(err, Error::FileNotFound { .. }), "{err}");
}

#[test]
fn export_writes_one_json_entry_per_line() {
    let mut bank = Bank::in_memory().unwrap();
    put_texts(&mut bank, &["a", "b", "c"]);
    bank.retire(&[2]).unwrap();
    let mut out = Vec::new();
    let filter = EntryFilter {
        statuses: vec![EntryStatus::Active],
        ..Default::default()
    };
    let n = bank.export(&filter, &mut out, Path::new("-")).unwrap();
    assert_eq!(n, 2);
    let text = String::from_utf8(out).unwrap();
    let back: Vec<BankEntry> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back, bank.list(&filter).unwrap());
    assert_eq!(back.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 3]);
}

#[test]
fn a_reset_bank_is_a_new_bank() {
    let mut bank = Bank::in_memory().unwrap();
    put_texts(&mut bank, &["old mug lesson", "old sink lesson"]);
    bank.reset().unwrap();
    assert_eq!(all(&bank), []);
    assert_eq!(ranked(&bank, &text_query("mug")), Vec::<u64>::new());
    assert_eq!(put_texts(&mut bank, &["new mug lesson"]), [1]);
    assert_eq!(ranked(&bank, &text_query("mug")), [1]);
}

/// A memory record of trajectory `trajectory`, turn `turn`, task `task`.
fn record(trajectory: u64, turn: u32, task: &str, text: &str) -> NewEntry {
    let mut extra = serde_json::Map::new();
    extra.insert("idx".into(), serde_json::json!(turn));
    NewEntry {
        kind: EntryKind::MemoryRecord,
        task_id: Some(task.into()),
        trajectory_id: Some(trajectory),
        provenance: Provenance {
            source_trajectories: vec![trajectory],
            ..Default::default()
        },
        extra,
        ..new(text)
    }
}

#[test]
fn memory_records_reach_only_queries_of_their_trajectory() {
    let mut bank = Bank::in_memory().unwrap();
    // Ids 1, 2: records of trajectory 10; 3: of trajectory 11; 4: unscoped; 5: an experience
    // scoped to trajectory 10.
    bank.put(
        &[
            record(10, 0, "iron", "[0] search[iron] => iron atomic number 26"),
            record(
                10,
                1,
                "iron",
                "[1] search[iron discoverer] => iron since antiquity",
            ),
            record(11, 0, "iron", "[0] search[iron] => iron is a metal"),
            new("iron lessons are general"),
            NewEntry {
                trajectory_id: Some(10),
                ..new("an iron experience of trajectory 10")
            },
        ],
        &kernel(),
    )
    .unwrap();
    let ids = |bank: &Bank, query: BankQuery| {
        let mut got = ranked(bank, &query);
        got.sort_unstable();
        got
    };
    let iron = text_query("iron");
    let records = |trajectory| BankQuery {
        kinds: vec![EntryKind::MemoryRecord],
        trajectory_id: trajectory,
        k: 100,
        ..Default::default()
    };
    // No trajectory named: unscoped entries only, whatever else the query says.
    assert_eq!(ids(&bank, iron.clone()), [4]);
    assert_eq!(ids(&bank, records(None)), Vec::<u64>::new());
    for statuses in [
        vec![],
        vec![
            EntryStatus::Active,
            EntryStatus::UnderTest,
            EntryStatus::Retired,
        ],
    ] {
        let q = BankQuery {
            statuses,
            task_id: Some("iron".into()),
            include_general: true,
            k: 100,
            ..Default::default()
        };
        assert_eq!(
            ids(&bank, q),
            [4],
            "a task query sees no trajectory's records"
        );
    }
    // A trajectory named: its own entries only (ranked, or newest first without terms).
    assert_eq!(
        ids(
            &bank,
            BankQuery {
                trajectory_id: Some(10),
                ..iron.clone()
            }
        ),
        [1, 2, 5]
    );
    assert_eq!(ids(&bank, records(Some(10))), [1, 2]);
    assert_eq!(ids(&bank, records(Some(11))), [3]);
    assert_eq!(ids(&bank, records(Some(12))), Vec::<u64>::new());
    assert_eq!(ids(&bank, records(Some(u64::MAX))), Vec::<u64>::new());
    let newest: Vec<u64> = bank
        .query(&records(Some(10)))
        .unwrap()
        .iter()
        .map(|r| r.entry.id)
        .collect();
    assert_eq!(newest, [2, 1]);
    assert_eq!(bank.get(2).unwrap().unwrap().trajectory_id, Some(10));
    assert_eq!(bank.get(4).unwrap().unwrap().trajectory_id, None);
    // Retired records stay scoped.
    bank.retire(&[1]).unwrap();
    let retired = |trajectory| BankQuery {
        statuses: vec![EntryStatus::Retired],
        ..records(trajectory)
    };
    assert_eq!(ids(&bank, retired(None)), Vec::<u64>::new());
    assert_eq!(ids(&bank, retired(Some(10))), [1]);
    // The operator's listing sees everything, and filters by trajectory.
    let listed = |filter: EntryFilter| -> Vec<u64> {
        bank.list(&filter).unwrap().iter().map(|e| e.id).collect()
    };
    assert_eq!(listed(EntryFilter::default()), [1, 2, 3, 4, 5]);
    let of = |t| EntryFilter {
        trajectory_id: Some(t),
        ..Default::default()
    };
    assert_eq!(listed(of(10)), [1, 2, 5]);
    assert_eq!(
        listed(EntryFilter {
            kinds: vec![EntryKind::MemoryRecord],
            ..of(10)
        }),
        [1, 2]
    );
    assert_eq!(bank.count(&of(11)).unwrap(), 1);
    assert_eq!(listed(of(u64::MAX)), Vec::<u64>::new());
}

#[test]
fn a_memory_record_without_a_trajectory_is_refused_and_nothing_is_stored() {
    let mut bank = Bank::in_memory().unwrap();
    let unscoped = NewEntry {
        trajectory_id: None,
        ..record(3, 0, "iron", "[0] unscoped")
    };
    let err = bank
        .put(&[record(3, 1, "iron", "[1] fine"), unscoped], &kernel())
        .unwrap_err();
    assert!(
        matches!(&err, Error::BankInvalid { what, detail, .. }
            if what == "entry 1 of the put" && detail.contains("`trajectory_id`")),
        "{err}"
    );
    assert_eq!(all(&bank), []);
    // Any other kind may be scoped or not.
    let ids = bank
        .put(
            &[NewEntry {
                trajectory_id: Some(3),
                ..new("a scoped skill")
            }],
            &kernel(),
        )
        .unwrap();
    assert_eq!(ids, [1]);
}

/// Writes a schema-version-1 bank at `path` (the tables as version 1 had them): an
/// experience, then memory records with one, no and two source trajectories.
fn write_version_1(path: &Path) {
    drop(Bank::open(path).unwrap());
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "DROP INDEX entries_trajectory;
         ALTER TABLE entries DROP COLUMN trajectory_id;
         UPDATE meta SET value = '1' WHERE key = 'schema_version';",
    )
    .unwrap();
    for (kind, text, sources) in [
        ("experience", "iron is magnetic", "[]"),
        ("memory_record", "[0] search[iron] => 26", "[5]"),
        ("memory_record", "[0] orphan record", "[]"),
        ("memory_record", "[0] shared record", "[6,7]"),
    ] {
        conn.execute(
            "INSERT INTO entries (kind, text, version, status, step, policy_version, \
             source_trajectories, writer, exposures, successes, utility_ema, beta_alpha, \
             beta_beta, negative_streak, extra) \
             VALUES (?1, ?2, 1, 'active', 4, 4, ?3, 'old', 0, 0, 0.0, 1.0, 1.0, 0, '{}')",
            (kind, text, sources),
        )
        .unwrap();
    }
    let v: String = conn
        .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, "delete");
}

fn meta_version(path: &Path) -> String {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn a_version_1_bank_is_read_as_it_is_and_migrated_when_opened_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite");
    write_version_1(&path);
    let before = read(&path);

    // Read-only (`cairn bank` on an old run): readable, every entry unscoped, file untouched.
    {
        let old = Bank::open_read_only(&path).unwrap();
        assert_eq!(old.schema_version(), 1);
        let entries = all(&old);
        assert_eq!(entries.len(), 4);
        assert!(entries.iter().all(|e| e.trajectory_id.is_none()));
        assert_eq!(ranked(&old, &text_query("iron")), [1, 2]);
        let scoped = BankQuery {
            trajectory_id: Some(5),
            ..text_query("iron")
        };
        assert_eq!(ranked(&old, &scoped), Vec::<u64>::new());
        let filter = EntryFilter {
            trajectory_id: Some(5),
            ..Default::default()
        };
        assert_eq!(old.count(&filter).unwrap(), 0);
    }
    assert_eq!(read(&path), before);

    // A restore of a version-1 snapshot into a live bank migrates the live copy only.
    let mut live = Bank::in_memory().unwrap();
    live.restore_from(&path).unwrap();
    assert_eq!(live.schema_version(), SCHEMA_VERSION);
    assert_eq!(read(&path), before);

    // Opened for writing: migrated in place.
    let mut bank = Bank::open(&path).unwrap();
    assert_eq!(bank.schema_version(), SCHEMA_VERSION);
    assert_eq!(meta_version(&path), SCHEMA_VERSION.to_string());
    let got: Vec<(u64, Option<u64>, EntryStatus)> = all(&bank)
        .iter()
        .map(|e| (e.id, e.trajectory_id, e.status))
        .collect();
    let expected = [
        (1, None, EntryStatus::Active),
        (2, Some(5), EntryStatus::Active),
        (3, None, EntryStatus::Retired),
        (4, None, EntryStatus::Retired),
    ];
    assert_eq!(got, expected);
    assert_eq!(all(&live), all(&bank));
    // The old entries keep everything else.
    let two = bank.get(2).unwrap().unwrap();
    assert_eq!(
        (
            two.text.as_str(),
            two.provenance.writer.as_str(),
            two.provenance.step
        ),
        ("[0] search[iron] => 26", "old", 4)
    );
    // Queries follow the scope rule; the index still ranks.
    assert_eq!(ranked(&bank, &text_query("iron")), [1]);
    let of_5 = BankQuery {
        trajectory_id: Some(5),
        ..text_query("iron")
    };
    assert_eq!(ranked(&bank, &of_5), [2]);
    // New writes use the new column; a second open changes nothing.
    let ids = bank
        .put(&[record(8, 0, "iron", "[0] iron new")], &kernel())
        .unwrap();
    assert_eq!(ids, [5]);
    drop(bank);
    let bank = Bank::open(&path).unwrap();
    assert_eq!(bank.get(5).unwrap().unwrap().trajectory_id, Some(8));
    assert_eq!(all(&bank).len(), 5);
}
