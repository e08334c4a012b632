//! Unit tests of the bank: persistence across a kill and a restore, refused files (corrupt,
//! locked, foreign, other schema) left byte-identical, provenance, lineage, atomic updates,
//! BM25 order and filters.

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
            entry(EntryKind::MemoryRecord, Some("t1"), "mug memory"), // 5
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
        |e| matches!(e, Error::BankSchema { found, expected: 1, .. } if found == "99"),
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
