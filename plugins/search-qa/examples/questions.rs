//! Prints what the built-in corpus gives: the element entries with their discovery facts, and
//! the number of questions per kind and split (docs/search-qa.md quotes it).
//!
//! ```text
//! cargo run -p cairn-search-qa --example questions [-- --facts] [-- --list]
//! ```

use cairn_plugin_sdk::Split;
use cairn_search_qa::{questions, Corpus, Kind};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let corpus = Corpus::built_in();
    let elements = corpus.elements().count();
    println!(
        "{} entries, {elements} element entries, {} discovery facts",
        corpus.entries.len(),
        corpus
            .elements()
            .map(|e| e.discoveries.len())
            .sum::<usize>()
    );
    if args.iter().any(|a| a == "--facts") {
        for e in corpus.elements() {
            for d in &e.discoveries {
                println!(
                    "  {:>3} {:<14} {:<15} {:<45} {}",
                    e.atomic_number.unwrap_or(0),
                    e.name,
                    d.verb.phrase(),
                    d.who,
                    d.year.map(|y| y.to_string()).unwrap_or_default()
                );
            }
        }
    }
    let all = questions::generate(&corpus, cairn_search_qa::SplitBy::Element);
    let held_out: std::collections::BTreeSet<u32> = corpus
        .elements()
        .filter_map(|e| e.atomic_number)
        .filter(|&n| questions::split_of_element(n) == Split::Test)
        .collect();
    println!("held-out elements ({}): {held_out:?}", held_out.len());
    println!("{:<22} {:>6} {:>6}", "kind", "train", "test");
    for kind in Kind::ALL {
        let count = |s| {
            all.iter()
                .filter(|q| q.kind == kind && q.split == s)
                .count()
        };
        println!(
            "{:<22} {:>6} {:>6}",
            kind.name(),
            count(Split::Train),
            count(Split::Test)
        );
    }
    let count = |s| all.iter().filter(|q| q.split == s).count();
    println!(
        "{:<22} {:>6} {:>6}",
        "all",
        count(Split::Train),
        count(Split::Test)
    );
    if args.iter().any(|a| a == "--list") {
        for q in &all {
            println!("{} | {} | {}", q.id, q.text, q.answer);
        }
    }
}
