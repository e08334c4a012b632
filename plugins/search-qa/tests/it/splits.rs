//! The train / held-out split: by element, disjoint, fixed.

use std::collections::BTreeSet;

use cairn_plugin_sdk::{Environment, Split};
use cairn_search_qa::questions::{self, split_of_element};
use cairn_search_qa::{Corpus, Kind};

use super::{env, env_with, test, train};

#[test]
fn splits_are_disjoint_by_element_and_by_text() {
    let env = env();
    let corpus = env.corpus();
    let number_of = |name: &str| {
        corpus
            .elements()
            .find(|e| e.name == name)
            .and_then(|e| e.atomic_number)
            .unwrap()
    };
    let side = |split| -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<u32>) {
        let qs = env.questions(split);
        (
            qs.iter().map(|q| q.text.clone()).collect(),
            qs.iter().map(|q| q.id.clone()).collect(),
            qs.iter().map(|q| number_of(&q.element)).collect(),
        )
    };
    let (train_texts, train_ids, train_elements) = side(Split::Train);
    let (test_texts, test_ids, test_elements) = side(Split::Test);
    assert_eq!((train_texts.len(), test_texts.len()), (524, 132));
    assert_eq!(
        (train_ids.len(), test_ids.len()),
        (524, 132),
        "ids are unique"
    );
    assert!(train_texts.is_disjoint(&test_texts));
    assert!(train_ids.is_disjoint(&test_ids));
    // No held-out question is about an element any training question is about.
    assert!(train_elements.is_disjoint(&test_elements));
    assert_eq!(
        test_elements.iter().copied().collect::<Vec<_>>(),
        [
            5, 11, 16, 20, 21, 23, 31, 32, 38, 40, 47, 61, 73, 75, 87, 91, 92, 99, 100, 106, 108,
            110, 113, 114, 115
        ]
    );
    for n in test_elements {
        assert_eq!(split_of_element(n), Split::Test);
    }
    assert!(questions::duplicate_texts(&questions::generate(
        corpus,
        cairn_search_qa::SplitBy::Element
    ))
    .is_empty());
    let info = env.info();
    assert_eq!((info.train_tasks, info.test_tasks), (524, 132));
    assert_eq!(info.task_kinds.len(), 7);
}

#[test]
fn task_order_takes_kinds_in_turn_and_is_fixed() {
    let env = env();
    let kinds: Vec<String> = (0..14).map(|i| env.task(train(i)).unwrap().kind).collect();
    let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(kinds[..7], names[..]);
    assert_eq!(kinds[7..], names[..]);
    let t = env.task(train(0)).unwrap();
    assert!(
        t.id.starts_with("search-qa/train/atomic_number/"),
        "{}",
        t.id
    );
    // A restricted config keeps each kind's own order, and caps count from the front.
    let one = env_with(r#"{"kinds": ["symbol"], "train_tasks": 5, "test_tasks": 2}"#);
    let firsts: Vec<String> = env
        .questions(Split::Train)
        .iter()
        .filter(|q| q.kind == Kind::Symbol)
        .take(5)
        .map(|q| q.id.clone())
        .collect();
    let mine: Vec<String> = one
        .questions(Split::Train)
        .iter()
        .map(|q| q.id.clone())
        .collect();
    assert_eq!(mine, firsts);
    assert_eq!((one.info().train_tasks, one.info().test_tasks), (5, 2));
    assert_eq!(one.info().task_kinds, ["symbol"]);
    let err = one.task(train(5)).unwrap_err().to_string();
    assert!(
        err.contains("search-qa has 5 train tasks, no task 5"),
        "{err}"
    );
    assert!(one.task(test(1)).is_ok());
    // The same corpus parsed twice gives the same questions.
    assert_eq!(
        questions::generate(&Corpus::built_in(), cairn_search_qa::SplitBy::Element),
        questions::generate(env.corpus(), cairn_search_qa::SplitBy::Element)
    );
}

#[test]
fn a_split_by_question_is_disjoint_by_text_and_shares_elements() {
    let env = env_with(r#"{"split_by": "question"}"#);
    let texts = |split| -> BTreeSet<String> {
        env.questions(split)
            .iter()
            .map(|q| q.text.clone())
            .collect()
    };
    let elements = |split| -> BTreeSet<String> {
        env.questions(split)
            .iter()
            .map(|q| q.element.clone())
            .collect()
    };
    let (train_texts, test_texts) = (texts(Split::Train), texts(Split::Test));
    assert_eq!(train_texts.len() + test_texts.len(), 656);
    assert!(train_texts.is_disjoint(&test_texts));
    assert_eq!((train_texts.len(), test_texts.len()), (532, 124));
    // Held-out questions ask about elements that training questions are about too.
    let shared = elements(Split::Train)
        .intersection(&elements(Split::Test))
        .count();
    assert!(shared > 60, "{shared}");
    // The same question has the same split whatever the kinds.
    let one = env_with(r#"{"split_by": "question", "kinds": ["symbol"]}"#);
    let symbols: Vec<&str> = env
        .questions(Split::Test)
        .iter()
        .filter(|q| q.kind == Kind::Symbol)
        .map(|q| q.id.as_str())
        .collect();
    let mine: Vec<&str> = one
        .questions(Split::Test)
        .iter()
        .map(|q| q.id.as_str())
        .collect();
    assert_eq!(mine, symbols);
}
