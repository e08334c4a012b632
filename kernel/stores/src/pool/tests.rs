use cairn_plugin_sdk::{ContextVariant, FinishReason, TurnRow};
use serde_json::json;

use super::*;
use crate::error::Error;

/// A row with every field set to something distinctive (non-round floats, a non-trivial
/// variant — another one on turn 2 —, info and extra, a training-prompt override on odd turns,
/// `ℓ_old` the sampled log-probs on turn 1, as log-prob reuse leaves them).
fn row(trajectory: u64, group: u64, turn: u32, task: &str, reward: f32) -> TurnRow {
    let history: Vec<u32> = (0..(10 + 7 * turn)).collect();
    let mut extra = serde_json::Map::new();
    extra.insert("k".into(), json!([1, "two"]));
    let mut info = serde_json::Map::new();
    info.insert("won".into(), json!(reward > 0.0));
    TurnRow {
        group_id: group,
        trajectory_id: trajectory,
        turn,
        task_id: task.into(),
        policy_version: 3 + u64::from(turn),
        variant: ContextVariant {
            label: "hint".into(),
            inject: if turn == 2 {
                "Use the mug, now.".into()
            } else {
                "Use the mug.".into()
            },
            tools_enabled: false,
            extra: extra.clone(),
        },
        prompt_ids: history,
        response_ids: vec![7, 8, 9 + turn],
        response_logprobs: vec![-0.1234567, -1.0e-7, -17.25],
        response_mask: vec![1, 0, 1],
        finish_reason: if turn == 0 {
            FinishReason::Length
        } else {
            FinishReason::Stop
        },
        turn_reward: 0.1 * turn as f32,
        episode_reward: reward,
        success: reward > 0.0,
        last_turn: turn == 2,
        anchor: (turn == 0).then(|| "kitchen".into()),
        observation: format!("you see a mug ({turn}) — \"quoted\"\n\u{1F600}"),
        feedback: -1,
        tool_calls: 2,
        info,
        extra,
        old_logprobs: if turn == 1 {
            vec![-0.1234567, -1.0e-7, -17.25]
        } else {
            vec![-0.2, -0.3, -0.4000001]
        },
        ref_logprobs: if turn == 0 {
            vec![]
        } else {
            vec![-1.5, -2.5, -3.5]
        },
        train_prompt_ids: (turn == 1).then(|| vec![4, 5, 6]),
    }
}

fn turn(row: TurnRow, trained: bool) -> TurnWrite {
    TurnWrite {
        advantages: Some(vec![0.5, 0.0, -0.333_333_34]),
        trained,
        skip_reason: (!trained).then(|| "dropped group".into()),
        row,
    }
}

/// Step `step`: two groups of two 3-turn trajectories, tasks `a` and `b`.
fn step(step: u64) -> StepWrite {
    let mut turns = Vec::new();
    for g in 0..2u64 {
        for slot in 0..2u64 {
            let group = step * 2 + g;
            let traj = group * 2 + slot;
            let task = if g == 0 { "a" } else { "b" };
            for t in 0..3 {
                turns.push(turn(row(traj, group, t, task, slot as f32), g == 0));
            }
        }
    }
    let mut episodes = EpisodeWrite::group(&Source::Rollout, step, step + 5, turns);
    for e in &mut episodes {
        e.seed = Some(1000 + e.trajectory_id);
    }
    episodes.push(EpisodeWrite {
        source: Source::Rollout,
        step,
        global_step: step + 5,
        round: 0,
        trajectory_id: 900 + step,
        group_id: step * 2,
        task_id: "a".into(),
        seed: None,
        harness_episode: None,
        episode_reward: None,
        success: false,
        failure: Some("timeout: no reply within 1 s".into()),
        turns: Vec::new(),
    });
    StepWrite {
        step,
        phase: "rl".into(),
        policy_version: step + 4,
        metrics: serde_json::from_value(json!({"loss": 0.25, "step_time_s": 1.5})).unwrap(),
        decisions: json!({"dropped_groups": [step * 2 + 1]}),
        episodes,
    }
}

fn pool_with(steps: u64) -> (tempfile::TempDir, Pool) {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = Pool::open(&pool_path(dir.path())).unwrap();
    for s in 0..steps {
        pool.record_step(&step(s)).unwrap();
    }
    (dir, pool)
}

fn all_turns(reader: &PoolReader, filter: &Filter) -> Vec<TurnRecord> {
    reader.turns_matching(filter).unwrap()
}

#[test]
fn every_field_of_every_turn_reads_back_exactly() {
    let (dir, _pool) = pool_with(2);
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let written: Vec<TurnWrite> = (0..2)
        .flat_map(|s| step(s).episodes)
        .flat_map(|e| e.turns)
        .collect();
    let read = all_turns(&reader, &Filter::default());
    assert_eq!(read.len(), written.len());
    for (w, r) in written.iter().zip(&read) {
        assert_eq!(r.row, w.row, "the whole row, prompt rebuilt from its delta");
        assert_eq!(r.advantages, w.advantages);
        assert_eq!((r.trained, &r.skip_reason), (w.trained, &w.skip_reason));
        // Floats are bit-exact.
        for (a, b) in r.row.response_logprobs.iter().zip(&w.row.response_logprobs) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }
    let e = reader.episode(read[0].episode).unwrap().unwrap();
    assert_eq!(
        (
            e.source.as_str(),
            e.step,
            e.global_step,
            e.seed,
            e.variant.as_str()
        ),
        ("rollout", 0, 5, Some(1000), "hint")
    );
    assert_eq!((e.policy_version, e.turns, e.trained), (3, 3, true));
    let (metrics, decisions) = reader.step_record(1).unwrap().unwrap();
    assert_eq!(metrics["loss"], 0.25);
    // How it is stored: each distinct variant once; `ℓ_old` NULL only where it is the sampled
    // log-probs; an episode's texts one zlib-compressed JSON array (what Python's `zlib` and
    // `json` read), none for a failed episode.
    let conn = rusqlite::Connection::open(pool_path(dir.path())).unwrap();
    let one = |q: &str| -> i64 { conn.query_row(q, [], |r| r.get(0)).unwrap() };
    assert_eq!(one("SELECT count(*) FROM variants"), 2);
    assert_eq!(
        one("SELECT count(*) FROM turns WHERE old_logprobs IS NULL"),
        one("SELECT count(*) FROM turns WHERE turn = 1")
    );
    assert_eq!(one("SELECT count(*) FROM texts"), 2 * 4);
    let data: Vec<u8> = conn
        .query_row("SELECT data FROM texts ORDER BY episode LIMIT 1", [], |r| {
            r.get(0)
        })
        .unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&miniz_oxide::inflate::decompress_to_vec_zlib(&data).unwrap())
            .unwrap();
    assert_eq!(json[2]["turn"], 2);
    assert_eq!(json[0]["observation"], written[0].row.observation);
    assert_eq!(json[0]["anchor"], "kitchen");
    assert_eq!(json[1]["info"]["won"], false);
    assert_eq!(decisions["dropped_groups"], json!([3]));
    assert!(reader.step_record(7).unwrap().is_none());
}

#[test]
fn failed_episodes_are_recorded_with_their_reason_and_no_turns() {
    let (dir, _pool) = pool_with(1);
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let failed = reader
        .episodes(&Filter {
            failed: Some(true),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(failed.len(), 1);
    let f = &failed[0];
    assert_eq!(f.failure.as_deref(), Some("timeout: no reply within 1 s"));
    assert_eq!((f.turns, f.episode_reward, f.trained), (0, None, false));
    assert!(reader.turns(f.id).unwrap().is_empty());
}

#[test]
fn queries_filter_by_step_task_reward_success_version_variant_and_source() {
    let (dir, mut pool) = pool_with(3);
    let eval_turns = vec![TurnWrite {
        row: row(0, 0, 0, "held-out", 1.0),
        ..TurnWrite::default()
    }];
    pool.record_episodes(&EpisodeWrite::group(
        &Source::Eval("after_rl".into()),
        3,
        9,
        eval_turns,
    ))
    .unwrap();
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let count = |f: Filter| reader.episodes(&f).unwrap().len();
    assert_eq!(count(Filter::default()), 3 * 5 + 1);
    let steps = |min, max| Filter {
        step_min: Some(min),
        step_max: Some(max),
        ..Filter::default()
    };
    assert_eq!(count(steps(1, 2)), 2 * 5);
    assert_eq!(
        count(Filter {
            task: Some("b".into()),
            ..Filter::default()
        }),
        3 * 2
    );
    assert_eq!(
        count(Filter {
            reward_min: Some(0.5),
            reward_max: Some(1.0),
            ..Filter::default()
        }),
        3 * 2 + 1
    );
    assert_eq!(
        count(Filter {
            success: Some(false),
            ..Filter::default()
        }),
        3 * 3,
        "failed episodes are not successes"
    );
    // An episode's version is its oldest turn's (3 here); a failed one has none (0).
    let versions = |min, max| Filter {
        version_min: Some(min),
        version_max: Some(max),
        ..Filter::default()
    };
    assert_eq!(count(versions(3, 3)), 3 * 4 + 1);
    assert_eq!(count(versions(0, 0)), 3);
    assert_eq!(count(versions(4, 9)), 0);
    assert_eq!(
        count(Filter {
            variant: Some("hint".into()),
            ..Filter::default()
        }),
        3 * 4 + 1
    );
    for (source, n) in [
        ("train", 15),
        ("rollout", 15),
        ("eval", 1),
        ("eval:after_rl", 1),
    ] {
        assert_eq!(
            count(Filter {
                source: Some(source.into()),
                ..Filter::default()
            }),
            n,
            "{source}"
        );
    }
    assert_eq!(
        count(Filter {
            limit: Some(2),
            ..Filter::default()
        }),
        2
    );
    let summaries = reader
        .step_summaries(&Filter {
            source: Some("train".into()),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(summaries.len(), 3);
    let s = &summaries[1];
    assert_eq!(
        (s.step, s.episodes, s.rows, s.failed, s.trained),
        (1, 5, 12, 1, 2)
    );
    assert_eq!(s.mean_reward, Some(0.5));
    assert!((s.success_rate - 2.0 / 5.0).abs() < 1e-12);
    assert_eq!(s.policy_version, Some(5));
}

#[test]
fn exclusions_mark_episodes_and_match_rows_until_included_again() {
    let (dir, mut pool) = pool_with(1);
    assert!(pool
        .exclude(&ExclusionTarget::Task("b".into()), "bad labels")
        .unwrap());
    assert!(!pool
        .exclude(&ExclusionTarget::Task("b".into()), "worse labels")
        .unwrap());
    pool.exclude(&ExclusionTarget::Episode(0), "typo").unwrap();
    pool.exclude(
        &ExclusionTarget::Turn {
            trajectory: 1,
            turn: 1,
        },
        "leak",
    )
    .unwrap();
    assert!(matches!(
        pool.exclude(&ExclusionTarget::Episode(1), " "),
        Err(Error::Pool { .. })
    ));
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let excluded = reader
        .episodes(&Filter {
            excluded: Some(true),
            ..Filter::default()
        })
        .unwrap();
    let ids: Vec<u64> = excluded.iter().map(|e| e.trajectory_id).collect();
    assert_eq!(ids, [0, 2, 3], "trajectory 0 and both of task b");
    assert_eq!(
        excluded[1].excluded.as_deref(),
        Some("task b: worse labels")
    );
    let x = reader.exclusions().unwrap();
    let r0 = row(0, 0, 0, "a", 0.0);
    let r1 = row(1, 0, 1, "a", 0.0);
    let r1_first = row(1, 0, 0, "a", 0.0);
    assert_eq!(
        x.trajectory_reason(&r0).as_deref(),
        Some("excluded (episode 0): typo")
    );
    assert_eq!(x.trajectory_reason(&r1), None);
    assert_eq!(
        x.turn_reason(&r1).as_deref(),
        Some("excluded (turn 1:1): leak")
    );
    assert_eq!(x.turn_reason(&r1_first), None);
    let mut gateway = row(9, 9, 0, "g", 0.0);
    gateway.info.insert("episode_id".into(), json!("h-1"));
    pool.exclude(&ExclusionTarget::Harness("h-1".into()), "spam")
        .unwrap();
    assert!(pool
        .exclusions()
        .unwrap()
        .trajectory_reason(&gateway)
        .is_some());
    assert!(pool.include(&ExclusionTarget::Task("b".into())).unwrap());
    assert!(!pool.include(&ExclusionTarget::Task("b".into())).unwrap());
    assert_eq!(pool.exclusions().unwrap().0.len(), 3);
}

#[test]
fn truncation_keeps_exactly_what_the_checkpoint_covers() {
    let (dir, mut pool) = pool_with(4);
    let eval = |label: &str, step, global| {
        EpisodeWrite::group(
            &Source::Eval(label.into()),
            step,
            global,
            vec![TurnWrite {
                row: row(0, 0, 0, "t", 1.0),
                ..TurnWrite::default()
            }],
        )
    };
    pool.record_episodes(&eval("initial", 0, 0)).unwrap();
    pool.record_episodes(&eval("rl_step_2", 2, 7)).unwrap();
    pool.record_episodes(&eval("rl_step_4", 4, 9)).unwrap();
    pool.exclude(&ExclusionTarget::Task("a".into()), "kept")
        .unwrap();
    // The checkpoint after RL step 2 (global step 7), before that step's evaluation ran.
    pool.truncate_after(2, 7, Some(1)).unwrap();
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let sources: Vec<(String, u64)> = reader
        .episodes(&Filter::default())
        .unwrap()
        .into_iter()
        .map(|e| (e.source, e.step))
        .collect();
    let mut expect: Vec<(String, u64)> = Vec::new();
    for s in 0..2 {
        expect.extend(std::iter::repeat_n(("rollout".to_string(), s), 5));
    }
    expect.push(("eval:initial".into(), 0));
    assert_eq!(sources, expect);
    assert!(reader.step_record(2).unwrap().is_none());
    assert_eq!(reader.exclusions().unwrap().0.len(), 1, "exclusions stay");
    // The older rule (no eval count): evaluations up to the checkpoint's global step.
    drop(reader);
    pool.record_step(&step(2)).unwrap();
    pool.record_episodes(&eval("rl_step_2", 2, 7)).unwrap();
    pool.truncate_after(3, 7, None).unwrap();
    let reader = PoolReader::open_run(dir.path()).unwrap();
    assert_eq!(
        reader
            .episodes(&Filter {
                source: Some("eval".into()),
                ..Filter::default()
            })
            .unwrap()
            .len(),
        2
    );
    // Writing a step again replaces it; a reset empties everything but the exclusions.
    pool.record_step(&step(2)).unwrap();
    assert_eq!(reader.counts().unwrap().0, 3 * 5 + 2);
    pool.reset().unwrap();
    assert_eq!(reader.counts().unwrap(), (0, 0));
    assert_eq!(reader.exclusions().unwrap().0.len(), 1);
}

#[test]
fn a_pool_of_another_version_or_another_program_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = pool_path(dir.path());
    drop(Pool::open(&path).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE meta SET value = '99' WHERE key = 'pool_schema_version'",
            [],
        )
        .unwrap();
    }
    let err = Pool::open(&path).unwrap_err();
    assert!(
        matches!(&err, Error::PoolSchema { found, expected: SCHEMA_VERSION, .. } if found == "99"),
        "{err}"
    );
    assert!(err.to_string().contains("schema version 99"), "{err}");
    assert!(matches!(
        PoolReader::open(&path),
        Err(Error::PoolSchema { .. })
    ));

    let other = dir.path().join("other.sqlite");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x);")
        .unwrap();
    assert!(matches!(Pool::open(&other), Err(Error::Pool { .. })));
    let text = dir.path().join("text.sqlite");
    std::fs::write(&text, "not a database at all").unwrap();
    assert!(matches!(Pool::open(&text), Err(Error::Pool { .. })));
    assert_eq!(std::fs::read(&text).unwrap(), b"not a database at all");
    let missing = tempfile::tempdir().unwrap();
    assert!(matches!(
        PoolReader::open_run(missing.path()),
        Err(Error::NoPool { .. })
    ));
}

/// Curation opens only a pool: an empty `pool.sqlite` (or an empty database) is refused as
/// the reader refuses it and left as it is, not given the schema.
#[test]
fn open_existing_refuses_an_empty_file_or_database_and_leaves_it() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join(POOL_FILE);
    std::fs::write(&empty, "").unwrap();
    let err = Pool::open_existing(&empty).unwrap_err();
    assert!(
        matches!(&err, Error::Pool { detail, .. } if detail.contains("an empty file")),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
    let blank = dir.path().join("blank.sqlite");
    drop(rusqlite::Connection::open(&blank).unwrap());
    assert!(Pool::open_existing(&blank).is_err());
    assert!(matches!(
        Pool::open_existing(&dir.path().join("missing.sqlite")),
        Err(Error::NoPool { .. })
    ));
    // A real pool opens.
    let path = dir.path().join("real.sqlite");
    drop(Pool::open(&path).unwrap());
    Pool::open_existing(&path).unwrap();
}

#[test]
fn a_reader_sees_each_committed_step_while_the_writer_goes_on() {
    let (dir, mut pool) = pool_with(1);
    let reader = PoolReader::open_run(dir.path()).unwrap();
    assert_eq!(reader.counts().unwrap().0, 5);
    pool.record_step(&step(1)).unwrap();
    assert_eq!(reader.counts().unwrap().0, 10);
}

#[test]
fn reward_bounds_compare_in_f32_precision_as_rewards_are_stored() {
    let (dir, mut pool) = pool_with(0);
    // 0.9f32 is 0.8999999761581421 as f64: a bound of 0.9 (f64) must still match it.
    let turns = vec![turn(row(7, 3, 0, "a", 0.9), true)];
    pool.record_episodes(&EpisodeWrite::group(&Source::Rollout, 0, 0, turns))
        .unwrap();
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let count = |min: Option<f64>, max: Option<f64>| {
        reader
            .episodes(&Filter {
                reward_min: min,
                reward_max: max,
                ..Filter::default()
            })
            .unwrap()
            .len()
    };
    assert_eq!(count(Some(0.9), None), 1);
    assert_eq!(count(None, Some(0.9)), 1);
    assert_eq!(count(Some(0.9), Some(0.9)), 1);
    assert_eq!(count(Some(0.91), None), 0);
}

#[test]
fn exclusion_matches_count_training_rows_only_for_episodes_and_turns() {
    let (dir, mut pool) = pool_with(1);
    // An evaluation reusing trajectory id 0 (tasks differ).
    pool.record_episodes(&EpisodeWrite::group(
        &Source::Eval("after_rl".into()),
        1,
        6,
        vec![TurnWrite {
            row: row(0, 0, 0, "held-out", 1.0),
            ..TurnWrite::default()
        }],
    ))
    .unwrap();
    let reader = PoolReader::open_run(dir.path()).unwrap();
    let m = |t: ExclusionTarget| reader.exclusion_matches(&t).unwrap();
    assert_eq!(m(ExclusionTarget::Episode(0)), (1, 3));
    assert_eq!(m(ExclusionTarget::Episode(999_999)), (0, 0));
    assert_eq!(
        m(ExclusionTarget::Turn {
            trajectory: 0,
            turn: 2
        }),
        (1, 1)
    );
    assert_eq!(
        m(ExclusionTarget::Turn {
            trajectory: 2,
            turn: 99
        }),
        (0, 0)
    );
    assert_eq!(m(ExclusionTarget::Task("b".into())), (2, 6));
    assert_eq!(m(ExclusionTarget::Task("held-out".into())), (1, 1));
    assert_eq!(m(ExclusionTarget::Task("no/such/task".into())), (0, 0));
    assert_eq!(m(ExclusionTarget::Harness("h-1".into())), (0, 0));
}

#[test]
fn a_missing_path_or_a_file_is_not_a_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    assert!(matches!(
        PoolReader::open_run(&missing),
        Err(Error::NotARunDir {
            what: "no such directory",
            ..
        })
    ));
    let file = dir.path().join("config.toml");
    std::fs::write(&file, "").unwrap();
    let err = PoolReader::open_run(&file).unwrap_err();
    assert!(matches!(
        err,
        Error::NotARunDir {
            what: "not a directory",
            ..
        }
    ));
    assert!(err.to_string().contains(&*file.to_string_lossy()), "{err}");
    assert!(!err.to_string().contains("cairn train"), "{err}");
}
