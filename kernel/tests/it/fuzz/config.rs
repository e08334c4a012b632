//! Pipeline configs: the examples, mutated, through `cairn_gateway::parse_config` (the
//! kernel's parse and validation plus the gateway's and the engine's sections: what
//! `cairn train` and `cairn check` run first). An error must name a key the mutation touched.

use cairn_gateway::parse_config;
use proptest::prelude::*;
use serde_json::Value as Json;

use super::{apply_text, bounded, mutate, mutation, names_a_touched_key, run, CASE_LIMIT};

/// The example configs (`cairn config` prints the first).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "household-grpo.toml",
        include_str!("../../../../examples/household-grpo.toml"),
    ),
    (
        "household-knowledge.toml",
        include_str!("../../../../examples/household-knowledge.toml"),
    ),
    (
        "search-qa-eapo.toml",
        include_str!("../../../../examples/search-qa-eapo.toml"),
    ),
    (
        "search-qa-grpo.toml",
        include_str!("../../../../examples/search-qa-grpo.toml"),
    ),
    (
        "smollm2-cpu.toml",
        include_str!("../../../../examples/smollm2-cpu.toml"),
    ),
    (
        "gateway/search_qa.toml",
        include_str!("../../../../examples/gateway/search_qa.toml"),
    ),
    (
        "gateway/smollm2.toml",
        include_str!("../../../../examples/gateway/smollm2.toml"),
    ),
    (
        "gateway/textworld.toml",
        include_str!("../../../../examples/gateway/textworld.toml"),
    ),
];

fn as_json(text: &str) -> Json {
    let table: toml::Table = text.parse().expect("an example parses as TOML");
    serde_json::to_value(table).expect("TOML values are JSON values")
}

/// Plugin config tables are opaque to the kernel (the plugin reads them).
fn in_plugin_config(path: &str) -> bool {
    path.starts_with("environment.config")
        || path.starts_with("algorithm.config")
        || (path.starts_with("algorithm.stack[") && path.contains("].config"))
}

#[test]
fn every_example_parses_after_a_round_trip() {
    // The mutations start from these documents, re-emitted by the TOML serializer.
    for (name, text) in EXAMPLES {
        let emitted = toml::to_string(&as_json(text)).expect("emit");
        if let Err(e) = parse_config(&emitted, name) {
            panic!("{name} does not parse after a round trip: {e}\n{emitted}");
        }
    }
}

/// A mutated config parses, or fails naming a key the mutation touched; a non-finite number
/// outside a plugin's own config table is never accepted.
#[test]
fn mutated_configs_fail_naming_the_key() {
    let inputs = (
        prop::sample::select(EXAMPLES.iter().map(|(name, _)| *name).collect::<Vec<_>>()),
        prop::collection::vec(mutation(true), 1..4),
    );
    run("config", file!(), 1000, inputs, |(name, mutations)| {
        let text = EXAMPLES
            .iter()
            .find(|(n, _)| *n == name)
            .expect("an example")
            .1;
        let mut doc = as_json(text);
        let (touched, raws) = mutate(&mut doc, &mutations);
        let Ok(emitted) = toml::to_string(&doc) else {
            // A tree TOML cannot write (e.g. a table inside a mixed array): not an input.
            return Ok(());
        };
        let emitted = apply_text(emitted, &raws);
        let parsed = {
            let emitted = emitted.clone();
            bounded(name, CASE_LIMIT, move || {
                parse_config(&emitted, "fuzz.toml").map_err(|e| e.to_string())
            })
        };
        match parsed {
            Ok(_) => {
                // (One edit only: a later edit may overwrite or delete the value.)
                let non_finite = touched.len() == 1
                    && touched.iter().any(|t| {
                        matches!(t.raw.as_deref(), Some("inf" | "-inf" | "nan" | "+nan"))
                            && !in_plugin_config(&t.path)
                    });
                prop_assert!(
                    !non_finite,
                    "a non-finite number was accepted: {touched:?}\n{emitted}"
                );
            }
            Err(message) => prop_assert!(
                names_a_touched_key(&message, &touched)
                    // Without `[source]` a gateway config is an environment pipeline: the
                    // error asks for `[environment]`, which is the advice to give.
                    || (touched.iter().any(|t| t.path == "source")
                        && message.contains("[environment]")),
                "the error does not name the key: {message}\ntouched: {touched:?}\n{emitted}"
            ),
        }
        Ok(())
    });
}
