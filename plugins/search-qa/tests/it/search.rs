//! BM25 retrieval over the corpus.

use cairn_plugin_sdk::Split;

use super::env;

fn top(query: &str) -> Vec<String> {
    env()
        .index()
        .search(query, 3, 40)
        .unwrap()
        .into_iter()
        .map(|h| h.name)
        .collect()
}

#[test]
fn bm25_finds_the_entry_a_query_names() {
    assert_eq!(top("atomic number of iron")[0], "iron");
    assert_eq!(top("what is the atomic number of iron")[0], "iron");
    assert_eq!(top("atomic number 26")[0], "iron");
    assert_eq!(top("atomic number 1")[0], "hydrogen");
    assert_eq!(top("discovered by Henry Cavendish")[0], "hydrogen");
    assert_eq!(top("wolfram")[0], "wolfram");
    let hits = env().index().search("iron atomic number", 3, 40).unwrap();
    assert_eq!(
        hits[0].passage,
        "iron | Symbol: Fe | Atomic number: 26 | Atomic weight: 55.847 | Silvery malleable and \
         ductile metallic transition element. Has nine isotopes and is the fourth most \
         abundant element in the earth's crust. ..."
    );
    assert!(env().index().search(" ?! ", 3, 40).unwrap().is_empty());
    assert!(env().index().search("zzzzqqq", 3, 40).unwrap().is_empty());
}

#[test]
fn snippets_show_the_matching_part_of_long_entries() {
    let hits = env().index().search("vanadium isolated", 1, 16).unwrap();
    assert_eq!(hits[0].name, "vanadium");
    assert!(
        hits[0].passage.contains("isolated by Henry Enfield Roscoe"),
        "{}",
        hits[0].passage
    );
    // The prose part is at most `passage_words` tokens.
    let snippet = hits[0].passage.rsplit(" | ").next().unwrap();
    let words = snippet.split_whitespace().filter(|w| *w != "...").count();
    assert!(words <= 16, "{snippet}");
}

/// The expert's searches show the gold answer for every question of both splits (so its
/// demonstrations answer from evidence), and the expert solves every task within the default
/// turn limit; the first hop of a two-hop question finds the bridge element first.
#[test]
fn the_experts_searches_find_every_answer() {
    let env = env();
    let norm = cairn_search_qa::reward::normalise;
    for split in [Split::Train, Split::Test] {
        for q in env.questions(split) {
            let mut shown = Vec::new();
            for (hop, query) in q.queries.iter().enumerate() {
                let hits = env.index().search(query, 3, 40).unwrap();
                if hop + 1 < q.queries.len() {
                    assert_eq!(hits[0].name, q.element, "{}: hop {hop} `{query}`", q.text);
                }
                shown.extend(hits.into_iter().map(|h| h.passage));
            }
            let answer = norm(&q.answer);
            assert!(
                shown
                    .iter()
                    .any(|p| format!(" {} ", norm(p)).contains(&format!(" {answer} "))),
                "{}: `{}` is not in {shown:#?}",
                q.text,
                q.answer
            );
        }
    }
}
