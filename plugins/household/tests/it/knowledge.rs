//! The knowledge regime (`"knowledge": true`): the key, the hidden homes, what the text does
//! and does not give away, and what knowing the homes is worth.

use std::collections::HashSet;

use cairn_household::{home_of, split_of_signature, Household, HouseholdConfig};
use cairn_plugin_sdk::{Environment, Episode, ErrorKind, Split, TaskRef};

use super::config::check_rejected;
use super::{env, expert, play, scripted, test, train};

/// The suggested knowledge-regime config of the crate docs: five single-object kinds, 12-14
/// receptacles, a turn limit of 8 (below what blind search often needs).
const SUGGESTED: &str = r#"{"knowledge": true, "max_turns": 8, "max_expert_steps": 20,
    "min_receptacles": 12, "max_receptacles": 14,
    "task_kinds": ["pick_and_place", "look_at_obj_in_light", "pick_clean_then_place",
                   "pick_heat_then_place", "pick_cool_then_place"]}"#;

fn suggested() -> Household {
    Household::from_config_json(SUGGESTED).expect("the suggested config is valid")
}

/// All six kinds with the default room sizes and a turn limit the blind expert always meets.
fn knowledge() -> Household {
    Household::from_config_json(r#"{"knowledge": true, "max_expert_steps": 20}"#)
        .expect("valid knowledge config")
}

/// The places of an observation's `unsearched :` list, in order.
fn unsearched(text: &str) -> Vec<String> {
    text.split_once("unsearched : ")
        .map(|(_, rest)| {
            rest.trim_end_matches(" .")
                .split(" , ")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `cabinet 2` -> `cabinet`.
fn kind_of(place: &str) -> &str {
    place.rsplit_once(' ').map_or(place, |(kind, _)| kind)
}

/// The oracle with knowledge: the expert, except that whenever the expert would go to a listed
/// unsearched place, it goes to the first listed instance of the home kind instead.
fn knowing(home: &'static str) -> impl FnMut(&dyn Episode, u32) -> String {
    move |episode, _turn| {
        let action = expert(episode, 0);
        let listed = unsearched(&episode.observation().text);
        let searching = action
            .strip_prefix("go to ")
            .is_some_and(|r| listed.iter().any(|p| p == r));
        match listed.iter().find(|p| kind_of(p) == home) {
            Some(place) if searching => format!("go to {place}"),
            _ => action,
        }
    }
}

fn solved(env: &Household, task: TaskRef, policy: impl FnMut(&dyn Episode, u32) -> String) -> bool {
    let (_, records) = play(env, task, 0, policy);
    records.last().is_some_and(|r| r.outcome.success)
}

fn home(env: &Household, task: TaskRef) -> &'static str {
    env.home(task)
        .expect("task in range")
        .expect("knowledge regime")
}

#[test]
fn the_knowledge_key_parses_and_validates() {
    assert!(!HouseholdConfig::default().knowledge);
    let off = Household::from_config_json(r#"{"knowledge": false}"#).unwrap();
    assert_eq!(off.config(), &HouseholdConfig::default());
    assert!(suggested().config().knowledge);
    check_rejected(r#"{"knowledge": "yes"}"#, &["`knowledge`"]);
    check_rejected(r#"{"knowledge": 1}"#, &["`knowledge`"]);
    check_rejected(r#"{"knowledg": true}"#, &["`knowledg`", "knowledge"]);
    // Only the regime lets the expert's cap exceed the turn limit, and still bounds it.
    check_rejected(
        r#"{"max_turns": 8}"#,
        &["`max_expert_steps`", "knowledge = true"],
    );
    let short = Household::from_config_json(r#"{"knowledge": true, "max_turns": 6}"#).unwrap();
    assert_eq!(
        (short.info().max_turns, short.config().max_expert_steps),
        (6, 14)
    );
    check_rejected(
        r#"{"knowledge": true, "max_expert_steps": 61}"#,
        &["`max_expert_steps`", "60"],
    );
    check_rejected(
        r#"{"knowledge": true, "max_expert_steps": 9}"#,
        &["`max_expert_steps`", "10"],
    );
}

/// With the key off, every observation, anchor, admissible list, reward, feedback, info and
/// expert action of these episodes is the one the household produced before the regime
/// existed (the hash was taken from that code).
#[test]
fn knowledge_off_episodes_are_pinned() {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    let mut eat = |text: &str| {
        for b in text.bytes().chain([0]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    };
    let env = Household::from_config_json(r#"{"knowledge": false}"#).unwrap();
    for index in 0..60 {
        for task in [train(index), test(index)] {
            let runs = [
                play(&env, task, 0, expert),
                play(&env, task, 0, scripted(index)),
            ];
            for (first, records) in runs {
                eat(&first);
                for r in records {
                    eat(&r.action);
                    eat(&serde_json::to_string(&r.outcome).unwrap());
                    eat(r.expert.as_deref().unwrap_or("-"));
                }
            }
        }
    }
    assert_eq!(
        h, 639_903_026_768_739_189,
        "hash of 240 knowledge-off episodes"
    );
}

#[test]
fn home_of_answers_the_fixed_table() {
    for (room, object, expected) in [
        ("kitchen", "apple", Some("diningtable")),
        ("kitchen", "tomato", Some("fridge")),
        ("kitchen", "plate", Some("cabinet")),
        ("kitchen", "fork", Some("drawer")),
        ("kitchen", "pan", Some("sinkbasin")),
        ("bedroom", "pencil", Some("drawer")),
        ("bedroom", "book", Some("shelf")),
        ("livingroom", "book", Some("sofa")),
        ("livingroom", "remotecontrol", Some("sidetable")),
        // The object does not belong to the room, or the names are unknown.
        ("kitchen", "pen", None),
        ("bedroom", "remotecontrol", None),
        ("garage", "apple", None),
        ("kitchen", "apples", None),
    ] {
        assert_eq!(home_of(room, object), expected, "{room} {object}");
    }
    assert_eq!(env().home(train(0)).unwrap(), None, "regime off: no homes");
    let err = suggested().home(train(10_000)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Input);
}

/// Two builds of the environment give the same tasks, homes and episodes.
#[test]
fn knowledge_tasks_and_episodes_are_deterministic() {
    let (a, b) = (suggested(), suggested());
    for index in [0, 1, 2, 3, 4, 77, 4_321] {
        for task in [train(index), test(index % 500)] {
            assert_eq!(a.signature(task).unwrap(), b.signature(task).unwrap());
            assert_eq!(play(&a, task, 0, expert), play(&b, task, 5, expert));
            assert_eq!(
                play(&a, task, 0, scripted(index)),
                play(&b, task, 0, scripted(index))
            );
            assert_eq!(a.home(task).unwrap(), b.home(task).unwrap());
        }
    }
}

#[test]
fn knowledge_splits_are_disjoint() {
    let env = suggested();
    let held_out: HashSet<String> = (0..500)
        .map(|i| {
            let signature = env.signature(test(i)).unwrap();
            assert_eq!(split_of_signature(&signature), Split::Test);
            signature
        })
        .collect();
    assert_eq!(held_out.len(), 500);
    for index in 0..3_000 {
        let signature = env.signature(train(index)).unwrap();
        assert_eq!(split_of_signature(&signature), Split::Train);
        assert!(!held_out.contains(&signature), "train {index}: {signature}");
    }
}

/// The first observation lists several plausible places of at least two kinds, the expert
/// starts by going to the first of them (it searches in listed order, not knowing the home),
/// and the home kind heads the list in well under half of the kept tasks.
#[test]
fn the_text_does_not_give_the_home_away() {
    for (env, expected) in [(suggested(), 170), (knowledge(), 166)] {
        let mut home_first = 0;
        for index in 0..600 {
            let task = train(index);
            let episode = env.episode(task).unwrap();
            let observation = episode.observation();
            let listed = unsearched(&observation.text);
            let kinds: HashSet<&str> = listed.iter().map(|p| kind_of(p)).collect();
            assert!(
                listed.len() >= 3 && kinds.len() >= 2,
                "{}",
                observation.text
            );
            assert!(kinds.contains(home(&env, task)), "{}", observation.text);
            assert_eq!(
                episode.expert_action().unwrap(),
                format!("go to {}", listed[0])
            );
            // The anchor does not say where the targets lie until they move.
            let anchor = observation.anchor.unwrap();
            assert!(
                anchor.contains("@ start") && !anchor.contains(&format!("@ {}", home(&env, task))),
                "{anchor}"
            );
            home_first += u32::from(kind_of(&listed[0]) == home(&env, task));
        }
        // Well under half (a blind searcher's first guess is right this often); pinned.
        assert!(home_first < 200, "{home_first} of 600");
        assert_eq!(home_first, expected, "home kind first in the list, of 600");
    }
}

/// Taking a target and putting it down elsewhere names its new place in the anchor.
#[test]
fn the_anchor_names_a_moved_target() {
    let env = knowledge();
    let (_, records) = play(&env, train(0), 0, expert);
    let last = records.last().unwrap();
    assert!(last.outcome.success);
    let anchor = last.outcome.observation.anchor.as_deref().unwrap();
    // `put apple 1 on countertop 1`: the place is everything after the preposition.
    let words: Vec<&str> = last.action.split(' ').collect();
    let place = words[4..].join(" ");
    assert!(
        anchor.contains(&format!("@ {place}")),
        "{anchor} after {}",
        last.action
    );
    assert!(!anchor.contains("@ start"), "{anchor}");
}

/// Every kept task is solvable by the blind expert within `max_expert_steps`, in both splits.
#[test]
fn the_blind_expert_solves_every_knowledge_task_given_time() {
    let env = Household::from_config_json(
        r#"{"knowledge": true, "max_turns": 20, "max_expert_steps": 20, "test_tasks": 300}"#,
    )
    .unwrap();
    for split in [Split::Train, Split::Test] {
        for index in 0..300 {
            let task = TaskRef { split, index };
            let (_, records) = play(&env, task, 0, expert);
            assert!(records.last().unwrap().outcome.success, "{task:?}");
        }
    }
}

/// The point of the regime: within the suggested turn limit, knowing the homes solves far more
/// tasks than searching in listed order, on training and on held-out tasks alike (the homes
/// transfer), and both rates are well above zero.
#[test]
fn knowing_the_homes_solves_clearly_more_tasks() {
    let env = suggested();
    let mut counts = Vec::new();
    for split in [Split::Train, Split::Test] {
        let (mut blind, mut knows) = (0, 0);
        for index in 0..500 {
            let task = TaskRef { split, index };
            blind += u32::from(solved(&env, task, expert));
            knows += u32::from(solved(&env, task, knowing(home(&env, task))));
        }
        assert!(
            blind >= 100 && knows >= blind + 150,
            "{split:?}: {blind} vs {knows}"
        );
        counts.push((blind, knows));
    }
    assert_eq!(
        counts,
        [(247, 448), (238, 458)],
        "(blind, knows) of 500 train, 500 test"
    );
}

/// The shuffled list keeps the observation Markov for the expert: equal texts (in any task,
/// after any policy's moves) get equal expert actions, so a text-only policy can imitate it.
#[test]
fn the_expert_stays_a_function_of_the_text() {
    let env = suggested();
    let mut seen = std::collections::HashMap::new();
    for index in 0..300 {
        for policy_seed in [None, Some(index)] {
            let mut episode = env.episode(train(index)).unwrap();
            let mut policy = policy_seed.map(scripted);
            for turn in 0..8 {
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
                let next = match &mut policy {
                    Some(p) => p(&episode, turn),
                    None => action,
                };
                episode.step(&next).unwrap();
            }
        }
    }
    assert!(seen.len() > 3_000, "{} distinct texts", seen.len());
}
