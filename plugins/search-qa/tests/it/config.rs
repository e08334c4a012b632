//! Config keys and corpus files: every bad value is a config error naming the key, and a
//! missing or corrupt corpus names the path and what is wrong.

use cairn_plugin_sdk::{Environment, ErrorKind};
use cairn_search_qa::{Corpus, SearchQa};

fn error(json: &str) -> String {
    let e = SearchQa::from_config_json(json)
        .err()
        .unwrap_or_else(|| panic!("{json} loaded"));
    assert_eq!(e.kind, ErrorKind::Config, "{e}");
    e.message
}

#[test]
fn config_keys_are_checked_by_name() {
    for (json, expect) in [
        (r#"{"max_turn": 3}"#, "unknown field `max_turn`"),
        (
            r#"{"max_turns": 0}"#,
            "`max_turns`: is 0, must be from 1 to 64",
        ),
        (r#"{"top_k": 11}"#, "`top_k`: is 11, must be from 1 to 10"),
        (
            r#"{"passage_words": 401}"#,
            "`passage_words`: is 401, must be from 4 to 400",
        ),
        (
            r#"{"context_budget": 10}"#,
            "`context_budget`: is 10, must be 0 (no limit) or from 48",
        ),
        (
            r#"{"reward": "bleu"}"#,
            "key `reward`: unknown variant `bleu`, expected `exact_match` or `f1`",
        ),
        (r#"{"kinds": []}"#, "`kinds`: must name at least one"),
        (
            r#"{"kinds": ["colour"]}"#,
            "unknown kind `colour`, expected one of atomic_number,",
        ),
        (
            r#"{"kinds": ["symbol", "symbol"]}"#,
            "`symbol` is listed twice",
        ),
        (r#"{"train_tasks": 0}"#, "`train_tasks`: must be at least 1"),
        (
            r#"{"test_tasks": 5000}"#,
            "`test_tasks`: is 5000, but the kinds give 132 held-out",
        ),
        (r#"{"top_k": "3"}"#, "key `top_k`: invalid type"),
        (r#"{"history": "no"}"#, "key `history`: invalid type"),
        ("[1]", "must be a JSON object"),
        ("{", "not valid JSON"),
        (r#"{"corpus": " "}"#, "`corpus`: is empty"),
        (
            r#"{"split_by": "random"}"#,
            "key `split_by`: unknown variant `random`, expected `element` or `question`",
        ),
    ] {
        let message = error(json);
        assert!(message.contains(expect), "{json}: {message}");
    }
    assert_eq!(SearchQa::from_config_json("").unwrap().info().max_turns, 6);
    assert_eq!(
        SearchQa::from_config_json("null")
            .unwrap()
            .info()
            .train_tasks,
        524
    );
}

fn write(dir: &std::path::Path, name: &str, text: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_missing_or_corrupt_corpus_is_a_config_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.txt");
    let message = error(&format!(r#"{{"corpus": "{}"}}"#, missing.display()));
    assert!(
        message.contains("search-qa config key `corpus`: cannot read `")
            && message.contains("nope.txt`: No such file"),
        "{message}"
    );
    let good = "hydrogen\nSymbol: H\nAtomic number: 1\nAtomic weight: 1.0079\nGas. Discovered by \
                Henry Cavendish in 1776.\n\nhelium\nSymbol: He\nAtomic number: 2\nAtomic weight: \
                4.0026\nInert.\n";
    for (name, text, expect) in [
        (
            "empty.txt",
            "".to_string(),
            "no entry has an `Atomic number:` line",
        ),
        (
            "json.txt",
            "{\"a\": 1}\n".to_string(),
            "line 1 (`{\"a\": 1}`) comes before any headword",
        ),
        (
            "bad-number.txt",
            good.replace("Atomic number: 2", "Atomic number: two"),
            "entry 2 (`helium`, line 7): `Atomic number: two` is not a whole number from 1 to 999",
        ),
        (
            "no-symbol.txt",
            good.replace("Symbol: He\n", ""),
            "entry 2 (`helium`, line 7) has an `Atomic number:` line but no `Symbol:` line",
        ),
        (
            "no-weight.txt",
            good.replace("Atomic weight: 4.0026\n", ""),
            "entry 2 (`helium`, line 7) has an `Atomic number:` line but no `Atomic weight:` line",
        ),
        // A lost headword line: helium's fields run into hydrogen's prose.
        (
            "no-headword.txt",
            good.replace("\n\nhelium\n", "\n"),
            "entry 1 (`hydrogen`, line 6): the field line `Symbol: He` comes after the prose",
        ),
        (
            "twice.txt",
            good.replace(
                "Atomic weight: 4.0026",
                "Atomic weight: 4\nAtomic weight: 5",
            ),
            "entry 2 (`helium`, line 11): `Atomic weight: 5` is given twice",
        ),
        (
            "repeat.txt",
            good.replace("helium", "hydrogen"),
            "entry 2 (`hydrogen`, line 7) repeats a headword",
        ),
    ] {
        let path = write(dir.path(), name, text.as_bytes());
        let message = error(&format!(r#"{{"corpus": "{path}"}}"#));
        assert!(
            message.starts_with(&format!(
                "search-qa config key `corpus`: `{path}` is not a usable corpus: "
            )),
            "{name}: {message}"
        );
        assert!(message.contains(expect), "{name}: {message}");
    }
    let path = write(dir.path(), "binary.txt", &[0x7f, b'E', b'L', b'F', 0, 1]);
    assert!(error(&format!(r#"{{"corpus": "{path}"}}"#)).contains("NUL bytes: not a text file"));
    // The small good file loads: 2 elements, hydrogen held in training (its number's split).
    let path = write(dir.path(), "good.txt", good.as_bytes());
    let err = error(&format!(r#"{{"corpus": "{path}"}}"#));
    assert!(err.contains("give no held-out question"), "{err}");
    let corpus = Corpus::load(&path).unwrap();
    assert_eq!(corpus.entries.len(), 2);
    assert_eq!(corpus.entries[0].discoveries.len(), 1);
}

#[test]
fn a_corpus_file_in_the_same_format_replaces_the_built_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("copy.txt");
    std::fs::write(&path, cairn_search_qa::corpus::BUILT_IN).unwrap();
    let env =
        SearchQa::from_config_json(&format!(r#"{{"corpus": "{}"}}"#, path.display())).unwrap();
    assert_eq!(env.corpus().source, path.to_str().unwrap());
    assert_eq!(env.info(), super::env().info());
    // The same text as UTF-8 parses the same (the built-in file is ISO-8859-1).
    let utf8: String = cairn_search_qa::corpus::BUILT_IN
        .iter()
        .map(|&b| char::from(b))
        .collect();
    let a = Corpus::parse(utf8.as_bytes(), "utf8").unwrap();
    let b = Corpus::built_in();
    assert_eq!(a.entries, b.entries);
    assert!(b
        .entries
        .iter()
        .any(|e| e.prose.contains("Gottfried Münzenberg")));
}

#[test]
fn the_built_in_corpus_has_the_documented_shape() {
    let c = Corpus::built_in();
    assert_eq!(c.entries.len(), 137);
    assert_eq!(c.elements().count(), 119);
    let numbers: std::collections::BTreeSet<u32> =
        c.elements().filter_map(|e| e.atomic_number).collect();
    assert_eq!(numbers.len(), 118);
    assert_eq!((numbers.first(), numbers.last()), (Some(&1), Some(&118)));
    let facts: usize = c.elements().map(|e| e.discoveries.len()).sum();
    assert_eq!(facts, 80);
    let iron = c.entries.iter().find(|e| e.name == "iron").unwrap();
    assert_eq!((iron.number, iron.line), (27, 287));
    assert_eq!(
        iron.header(),
        "Symbol: Fe | Atomic number: 26 | Atomic weight: 55.847"
    );
    let non_elements: Vec<&str> = c
        .entries
        .iter()
        .filter(|e| !e.is_element())
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        non_elements,
        [
            "aluminium",
            "wolfram",
            "cuprum",
            "columbium",
            "unnilunium",
            "unnilbium",
            "kurchatovium",
            "dubnium",
            "rutherfordium",
            "hahnium",
            "joliotium",
            "seaborgium",
            "nielsbohrium",
            "bohrium",
            "hassium",
            "neutron",
            "deuterium",
            "IUPAC"
        ]
    );
}
