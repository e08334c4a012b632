//! Episode dynamics: determinism, invalid actions, rewards, the turn limit, task ranges.

use std::collections::HashMap;

use cairn_household::Household;
use cairn_plugin_sdk::{ContextVariant, Environment, ErrorKind, Split};

use super::{env, expert, play, scripted, test, train};

#[test]
fn same_task_and_seed_replay_identically() {
    for index in [0, 1, 2, 3, 4, 5, 97, 4_321] {
        for task in [train(index), test(index % 500)] {
            for seed in [0, 7] {
                let a = play(&env(), task, seed, expert);
                let b = play(&env(), task, seed, expert);
                assert_eq!(a, b, "expert on {task:?}");
                let a = play(&env(), task, seed, scripted(seed + index));
                let b = play(&env(), task, seed, scripted(seed + index));
                assert_eq!(a, b, "scripted policy on {task:?}");
            }
        }
    }
}

#[test]
fn the_seed_does_not_change_an_episode() {
    // The dynamics are deterministic; only (split, index) matters.
    for index in 0..12 {
        assert_eq!(
            play(&env(), train(index), 0, scripted(3)),
            play(&env(), train(index), 99, scripted(3))
        );
    }
}

/// Pins the generator: a change to the tables, the PRNG or the draw order changes these and
/// must be a deliberate, versioned decision (it reshuffles every task).
#[test]
fn generated_tasks_are_pinned() {
    let env = env();
    assert_eq!(
        env.signature(train(0)).unwrap(),
        "livingroom | cabinet 1 : | cabinet 2 : | coffeetable 1 : book 1 | garbagecan 1 : | \
         sidetable 1 : | sofa 1 : newspaper 4 pillow 2 | tvstand 1 : | goal pick_and_place : \
         put a newspaper on sidetable 1"
    );
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for split in [Split::Train, Split::Test] {
        for index in 0..60 {
            let signature = env
                .signature(cairn_plugin_sdk::TaskRef { split, index })
                .unwrap();
            for b in signature.bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
            }
        }
    }
    assert_eq!(
        h, 18_196_717_931_455_944_774,
        "hash of the first 60 train and test signatures"
    );
}

#[test]
fn invalid_text_says_nothing_happens_and_changes_nothing() {
    let env = Household::from_config_json(r#"{"invalid_penalty": 0.25}"#).unwrap();
    let mut episode = env.start(train(3), 0, &ContextVariant::default()).unwrap();
    episode.step(&episode.expert_action().unwrap()).unwrap();
    let before = episode.observation();
    for junk in [
        "",
        "   ",
        "fly",
        "go to cabinet 99",
        "take",
        "look .",
        "go to  ",
        "ёжик \u{0} \u{202e}",
        &"x".repeat(10_000),
    ] {
        let out = episode.step(junk).unwrap();
        assert_eq!(out.feedback, -1, "{junk:?}");
        assert_eq!(out.reward, -0.25);
        assert!(!out.done && !out.success);
        assert_eq!(
            out.observation.text,
            format!("nothing happens . {}", before.text)
        );
        assert_eq!(out.observation.anchor, before.anchor);
        assert_eq!(
            out.observation.admissible_actions,
            before.admissible_actions
        );
        let info: serde_json::Value = serde_json::from_str(&out.info_json).unwrap();
        assert_eq!(info["valid"], false);
    }
    // A valid action clears the prefix.
    let out = episode.step("look").unwrap();
    assert_eq!((out.feedback, out.reward), (0, 0.0));
    assert_eq!(out.observation.text, before.text);
}

#[test]
fn success_pays_one_on_the_last_step_only() {
    for index in 0..60 {
        let (_, records) = play(&env(), train(index), 0, expert);
        let (last, rest) = records.split_last().unwrap();
        assert!(last.outcome.done && last.outcome.success && last.outcome.reward == 1.0);
        assert_eq!(last.outcome.feedback, 1);
        assert!(last.expert.is_none() && last.outcome.observation.admissible_actions.is_empty());
        for r in rest {
            assert!(
                !r.outcome.done && !r.outcome.success && r.outcome.reward == 0.0,
                "{r:?}"
            );
            assert!(
                r.outcome.feedback >= 0,
                "the expert never makes an invalid move: {r:?}"
            );
            assert!(r
                .outcome
                .observation
                .admissible_actions
                .contains(r.expert.as_ref().unwrap()));
        }
    }
}

#[test]
fn episodes_end_unsolved_at_max_turns_and_then_refuse_steps() {
    let env = env();
    let mut episode = env.start(train(8), 0, &ContextVariant::default()).unwrap();
    for turn in 1..=20 {
        let out = episode.step("inventory").unwrap();
        assert_eq!(out.done, turn == 20, "turn {turn}");
        assert!(!out.success && out.reward == 0.0 && out.feedback == 0);
    }
    let err = episode.step("look").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Input);
    assert!(err.message.contains("over"), "{err}");
    assert_eq!(episode.expert_action(), None);
}

#[test]
fn task_indices_out_of_range_are_errors() {
    let env = Household::from_config_json(r#"{"train_tasks": 10, "test_tasks": 3}"#).unwrap();
    assert!(env.task(train(9)).is_ok() && env.task(test(2)).is_ok());
    for task in [train(10), test(3), train(u64::MAX), test(u64::MAX)] {
        let err = env.task(task).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Input, "{err}");
        assert!(err.message.contains(&task.index.to_string()), "{err}");
        let err = env
            .start(task, 0, &ContextVariant::default())
            .err()
            .expect("out of range");
        assert_eq!(err.kind, ErrorKind::Input);
    }
}

#[test]
fn task_ids_are_unique_across_splits() {
    let env = env();
    let mut ids = std::collections::HashSet::new();
    for index in 0..200 {
        assert!(ids.insert(env.task(train(index)).unwrap().id));
        assert!(ids.insert(env.task(test(index)).unwrap().id));
    }
}

/// The observation is Markov for the expert: whenever two states (in any task, reached by any
/// policy) render the same text, the expert takes the same action. So a policy that sees only
/// the current text can imitate it exactly.
#[test]
fn the_expert_is_a_function_of_the_observation_text() {
    let env = env();
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut checked = 0;
    for index in 0..600 {
        for policy_seed in [None, Some(index), Some(index + 1_000)] {
            let task = if index % 3 == 0 {
                test(index % 500)
            } else {
                train(index)
            };
            let mut episode = env.start(task, 0, &ContextVariant::default()).unwrap();
            let mut policy = policy_seed.map(scripted);
            for turn in 0..20 {
                let Some(action) = episode.expert_action() else {
                    break;
                };
                let text = episode.observation().text;
                let text = text
                    .strip_prefix("nothing happens . ")
                    .unwrap_or(&text)
                    .to_string();
                let previous = seen.entry(text.clone()).or_insert_with(|| action.clone());
                assert_eq!(previous, &action, "two expert actions for `{text}`");
                checked += 1;
                let next = match &mut policy {
                    Some(p) => p(episode.as_ref(), turn),
                    None => action,
                };
                episode.step(&next).unwrap();
            }
        }
    }
    assert!(
        seen.len() > 10_000,
        "{} distinct texts in {checked} checks",
        seen.len()
    );
}

#[test]
fn anchors_ignore_history_but_see_state_changes() {
    let env = env();
    let mut episode = env.start(train(4), 0, &ContextVariant::default()).unwrap();
    let start = episode.observation().anchor.unwrap();
    let first = episode.expert_action().unwrap();
    let out = episode.step(&first).unwrap();
    assert_ne!(out.observation.anchor.as_deref(), Some(start.as_str()));
    // Walking away and back ends in the same anchor even though the searched set grew.
    let here = out.observation.anchor.clone();
    let away = out
        .observation
        .admissible_actions
        .iter()
        .find(|a| a.starts_with("go to"))
        .unwrap()
        .clone();
    let back = first.clone();
    episode.step(&away).unwrap();
    let again = episode.step(&back).unwrap();
    assert_eq!(again.observation.anchor, here);
    assert!(!again.observation.anchor.unwrap().contains("searched"));
}

#[test]
fn feedback_marks_useful_searches_and_progress() {
    // train/4: "put a cold potato in cabinet 1", potato 4 in the fridge.
    let (first, records) = play(&env(), train(4), 0, expert);
    assert!(
        first.contains("unsearched : countertop 1 , fridge 1 ."),
        "{first}"
    );
    let steps: Vec<(&str, i8)> = records
        .iter()
        .map(|r| (r.action.as_str(), r.outcome.feedback))
        .collect();
    assert_eq!(
        steps,
        [
            ("go to countertop 1", 1), // a listed surface: searched on arrival
            ("go to fridge 1", 0),     // closed: nothing revealed yet
            ("open fridge 1", 1),
            ("take potato 4 from fridge 1", 1),
            ("cool potato 4 with fridge 1", 1),
            ("go to cabinet 1", 0),
            ("open cabinet 1", 0), // the destination is not a search
            ("put potato 4 in cabinet 1", 1),
        ]
    );
    // Detours and undos are neutral.
    let mut episode = env()
        .start(train(4), 0, &ContextVariant::default())
        .unwrap();
    for (action, feedback) in [
        ("go to countertop 1", 1),
        ("go to fridge 1", 0),
        ("go to countertop 1", 0),
        ("look", 0),
        ("go to fridge 1", 0),
        ("open fridge 1", 1),
        ("close fridge 1", 0),
        ("open fridge 1", 0),
        ("take potato 4 from fridge 1", 1),
        ("put potato 4 in fridge 1", 0),
        ("take potato 4 from fridge 1", 1),
        ("cool potato 4 with fridge 1", 1),
        ("cool potato 4 with fridge 1", 0),
        ("use desklamp 1", -1),
    ] {
        assert_eq!(episode.step(action).unwrap().feedback, feedback, "{action}");
    }
}

/// The tokenizer is trained on this text, so its closed vocabulary must stay small: every word
/// of goals, observations and admissible actions, under the expert and a scripted policy.
#[test]
fn the_vocabulary_is_small_and_closed() {
    let env = env();
    let mut words = std::collections::BTreeSet::new();
    for index in 0..300 {
        for policy in [None, Some(index)] {
            let task = if index % 4 == 0 {
                test(index % 500)
            } else {
                train(index)
            };
            let mut episode = env.start(task, 0, &ContextVariant::default()).unwrap();
            let mut policy = policy.map(scripted);
            words.extend(
                env.task(task)
                    .unwrap()
                    .goal
                    .split_whitespace()
                    .map(String::from),
            );
            for turn in 0..20 {
                let observation = episode.observation();
                words.extend(observation.text.split_whitespace().map(String::from));
                for action in &observation.admissible_actions {
                    words.extend(action.split_whitespace().map(String::from));
                }
                let Some(expert) = episode.expert_action() else {
                    break;
                };
                let action = policy
                    .as_mut()
                    .map_or(expert, |p| p(episode.as_ref(), turn));
                episode.step(&action).unwrap();
            }
        }
    }
    assert!(
        (100..200).contains(&words.len()),
        "{} words: {words:?}",
        words.len()
    );
    for word in &words {
        let simple = word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        assert!(
            simple || [".", ",", ":"].contains(&word.as_str()),
            "odd word `{word}`"
        );
    }
}
