//! Questions generated from the corpus, their kinds and the train / held-out split.
//!
//! Every question is about one element entry (its *subject*; for the two-hop kinds, the
//! bridge element the first hop must find). **Splits are by element** by default
//! ([`SplitBy::Element`]): an element's atomic number, hashed with a fixed salt, puts one
//! element in [`TEST_SHARE`] into the held-out split, and every question about it goes there;
//! so no held-out question's answer comes from an element any training question is about (a
//! policy cannot pass the held-out split by having memorised training answers: it has to
//! search), and no question text is in both splits. Two entries with one atomic number
//! (element 110 is in the file as `unnildecium` and as `darmstadtium`) fall into the same
//! split. [`SplitBy::Question`] hashes each question instead (one in [`TEST_SHARE`] held out):
//! held-out questions then ask other facts of elements that training questions are about
//! (still no question text in both splits), which keeps the held-out names inside a
//! word-level tokenizer trained on training text.

use std::collections::{BTreeMap, BTreeSet};

use cairn_plugin_sdk::Split;

use crate::corpus::{Corpus, Entry, Verb};

/// One element in this many goes to the held-out split.
pub const TEST_SHARE: u64 = 5;
/// Salt of the split hash ("search-q").
const SPLIT_SALT: u64 = 0x7365_6172_6368_2d71;

/// The question kinds (the environment's task kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `what is the atomic number of iron` → `26`.
    AtomicNumber,
    /// `what is the chemical symbol of iron` → `Fe`.
    Symbol,
    /// `what is the atomic weight of iron` → `55.847`.
    AtomicWeight,
    /// `who discovered hydrogen` → `Henry Cavendish` (the verb as the prose has it:
    /// `discovered`, `isolated`, `identified`, `first produced`).
    Discoverer,
    /// `in what year was hydrogen discovered` → `1776`.
    DiscoveryYear,
    /// Two-hop: `who discovered the element with atomic number 1` → `Henry Cavendish`; only
    /// where one element entry has that number.
    DiscovererByNumber,
    /// Two-hop: `what is the symbol of the element discovered by Henry Cavendish` → `H`; only
    /// where no other element's prose mentions that verb with `by` those names
    /// ([`mentions`]).
    SymbolByDiscoverer,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::AtomicNumber,
        Kind::Symbol,
        Kind::AtomicWeight,
        Kind::Discoverer,
        Kind::DiscoveryYear,
        Kind::DiscovererByNumber,
        Kind::SymbolByDiscoverer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::AtomicNumber => "atomic_number",
            Kind::Symbol => "symbol",
            Kind::AtomicWeight => "atomic_weight",
            Kind::Discoverer => "discoverer",
            Kind::DiscoveryYear => "discovery_year",
            Kind::DiscovererByNumber => "discoverer_by_number",
            Kind::SymbolByDiscoverer => "symbol_by_discoverer",
        }
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Searches a good policy needs: 2 for the two-hop kinds.
    pub fn hops(self) -> u32 {
        match self {
            Kind::DiscovererByNumber => 2,
            _ => 1,
        }
    }
}

/// One generated question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// Stable id, unique across both splits: `search-qa/train/atomic_number/iron`.
    pub id: String,
    pub kind: Kind,
    pub split: Split,
    /// The question text, lower case apart from names: `what is the atomic number of iron`.
    pub text: String,
    /// The gold answer as the corpus writes it.
    pub answer: String,
    /// Headword of the element the answer comes from.
    pub element: String,
    /// The expert's search queries, in order (then it answers).
    pub queries: Vec<String>,
}

/// How questions are assigned to the splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitBy {
    /// By element: every question about a held-out element is held out.
    Element,
    /// By question: each question by a hash of its kind and subject.
    Question,
}

/// The split of the question `kind/subject` under [`SplitBy::Question`].
pub fn split_of_question(kind: Kind, subject: &str) -> Split {
    let key = format!("{}/{subject}", kind.name());
    if mix(SPLIT_SALT ^ fnv1a(&key)).is_multiple_of(TEST_SHARE) {
        Split::Test
    } else {
        Split::Train
    }
}

/// The split of the element with atomic number `n`.
pub fn split_of_element(n: u32) -> Split {
    if mix(SPLIT_SALT ^ u64::from(n)).is_multiple_of(TEST_SHARE) {
        Split::Test
    } else {
        Split::Train
    }
}

/// SplitMix64's finaliser: a fixed, well-mixed hash of a `u64`.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a text.
pub fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A lower-case id part: letters and digits kept, runs of anything else as one `-`.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.to_lowercase().chars() {
        if c.is_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The prose says `by {who}` (not followed by a letter) with the verb's word (`discovered`,
/// ..., `produced`) in the 60 bytes before it: looser than the discovery pattern, so a
/// two-hop question by discoverer is asked only when no other element's prose could be read
/// as the same fact (boron's `discovered in 1808 by Sir Humphry Davy and by J.L. Gay-Lussac`
/// rules out "the element discovered by Sir Humphry Davy", although the pattern reads only
/// potassium's sentence).
pub fn mentions(prose: &str, verb: Verb, who: &str) -> bool {
    let needle = format!("by {who}");
    let word = verb.phrase().rsplit(' ').next().unwrap_or_default();
    prose.match_indices(&needle).any(|(i, _)| {
        let after = prose[i + needle.len()..].chars().next();
        let mut start = i.saturating_sub(60);
        while !prose.is_char_boundary(start) {
            start -= 1;
        }
        after.is_none_or(|c| !c.is_alphabetic()) && prose[start..i].to_lowercase().contains(word)
    })
}

/// Every question the corpus gives, of every kind, in a canonical order (by element, then
/// kind, then verb), each in its split under `split_by`.
pub fn generate(corpus: &Corpus, split_by: SplitBy) -> Vec<Question> {
    let elements: Vec<&Entry> = corpus.elements().collect();
    let mut by_number: BTreeMap<u32, usize> = BTreeMap::new();
    for e in &elements {
        *by_number
            .entry(e.atomic_number.expect("an element"))
            .or_default() += 1;
    }
    let mut out = Vec::new();
    for e in &elements {
        let n = e.atomic_number.expect("an element");
        let element_split = split_of_element(n);
        let name = &e.name;
        let mut push = |kind: Kind, subject: String, text: String, answer: String, queries| {
            let split = match split_by {
                SplitBy::Element => element_split,
                SplitBy::Question => split_of_question(kind, &subject),
            };
            out.push(Question {
                id: format!("search-qa/{}/{}/{subject}", split.as_str(), kind.name()),
                kind,
                split,
                text,
                answer,
                element: name.clone(),
                queries,
            });
        };
        push(
            Kind::AtomicNumber,
            slug(name),
            format!("what is the atomic number of {name}"),
            n.to_string(),
            vec![format!("{name} atomic number")],
        );
        if let Some(symbol) = e.symbol() {
            push(
                Kind::Symbol,
                slug(name),
                format!("what is the chemical symbol of {name}"),
                symbol.to_string(),
                vec![format!("{name} symbol")],
            );
        }
        if let Some(weight) = e.weight_answer() {
            push(
                Kind::AtomicWeight,
                slug(name),
                format!("what is the atomic weight of {name}"),
                weight,
                vec![format!("{name} atomic weight")],
            );
        }
        for d in &e.discoveries {
            let verb = d.verb.phrase();
            let subject = format!("{}-{}", slug(name), slug(verb));
            push(
                Kind::Discoverer,
                subject.clone(),
                format!("who {verb} {name}"),
                d.who.clone(),
                vec![format!("{name} {verb}")],
            );
            if let Some(year) = d.year {
                push(
                    Kind::DiscoveryYear,
                    subject,
                    format!("in what year was {name} {verb}"),
                    year.to_string(),
                    vec![format!("{name} {verb}")],
                );
            }
            if by_number[&n] == 1 {
                push(
                    Kind::DiscovererByNumber,
                    format!("{n}-{}", slug(verb)),
                    format!("who {verb} the element with atomic number {n}"),
                    d.who.clone(),
                    vec![format!("atomic number {n}"), format!("{name} {verb}")],
                );
            }
            let unique = elements
                .iter()
                .filter(|other| mentions(&other.prose, d.verb, &d.who))
                .count()
                == 1;
            if let (true, Some(symbol)) = (unique, e.symbol()) {
                push(
                    Kind::SymbolByDiscoverer,
                    format!("{}-{}", slug(verb), slug(&d.who)),
                    format!("what is the symbol of the element {verb} by {}", d.who),
                    symbol.to_string(),
                    vec![format!("{verb} by {}", d.who)],
                );
            }
        }
    }
    out
}

/// The questions of one split restricted to `kinds`, in task order: kinds taken in turn
/// (`kinds[0]`, `kinds[1]`, ...; a kind with no questions left is skipped), each kind's
/// questions in a fixed pseudo-random order (by a hash of the id). So the first tasks of a
/// split mix every kind, and the order never depends on the config beyond `kinds`.
pub fn ordered(all: &[Question], split: Split, kinds: &[Kind]) -> Vec<Question> {
    let mut lists: Vec<Vec<&Question>> = kinds
        .iter()
        .map(|&k| {
            let mut v: Vec<&Question> = all
                .iter()
                .filter(|q| q.split == split && q.kind == k)
                .collect();
            v.sort_by_key(|q| (mix(fnv1a(&q.id)), q.id.clone()));
            v
        })
        .collect();
    for list in &mut lists {
        list.reverse();
    }
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for list in &mut lists {
            if let Some(q) = list.pop() {
                out.push(q.clone());
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    out
}

/// Question texts that occur twice (none, by construction; tests check it).
pub fn duplicate_texts(all: &[Question]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut dup = BTreeSet::new();
    for q in all {
        if !seen.insert(q.text.clone()) {
            dup.insert(q.text.clone());
        }
    }
    dup
}
