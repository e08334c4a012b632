//! The corpus: the `dict-elements` text format, parsed into entries and discovery facts.
//!
//! # Format
//!
//! The Debian `dict-elements` source text (`data/elements.dict.txt`): entries separated by one
//! or more blank lines, each starting with its headword alone on a line (`iron`). A line after
//! a blank line that is not a single word, or that starts with a space, continues the entry
//! (the dictd header `00-database-*` has such paragraphs). Right after the headword come field
//! lines, `Key: value` with the key one of `Symbol`, `Atomic number`, `Atomic weight` (the
//! file also spells it `Atmic weight` and `Atomic Weight`; keys match without case), then the
//! prose. Prose lines are joined with single spaces; the dict cross-reference braces
//! (`{neutron}`) are dropped.
//!
//! An **element entry** is one with an `Atomic number:` line; it must also have a `Symbol:`
//! line (its value may be empty: the file has two such) and an atomic-weight line. Other
//! entries (alternative names such as `aluminium` or `wolfram`, the competing names of
//! elements 104-108, `neutron`, `deuterium`, `IUPAC`) are searchable passages that no question
//! is about. Headwords starting with `00-database` or `00database` are the dictd header and are
//! left out.
//!
//! The text is UTF-8, or ISO-8859-1 when it is not valid UTF-8 (the Debian file is
//! ISO-8859-1: `Münzenberg`, `Röntgen`).
//!
//! # Discovery facts
//!
//! [`discoveries`] reads "who found it, and when" from the prose, conservatively: a clause that
//! starts a sentence (or follows `, ` / ` and `), optionally `It was` / `<Name> was`, optionally
//! `first` / `originally` / `officially`, then one of the verbs `discovered`, `isolated`,
//! `identified`, `produced`, optionally an adverb in `-ly` and `in YYYY`, then `by` and a list
//! of personal names (capitalised words, initials such as `J.L.` or `J.C.G`, the particles
//! `de`, `del`, `von`, ..., joined by `, ` or ` and `, optionally ending in `and associates`),
//! which must be followed by the end of the clause (`.`, `,`, `;`, ` in`, ` of`, ` at`,
//! ` via`, or ` and` with a lower-case word other than `by`). The year is the `in YYYY` before
//! `by`, else the first `in YYYY` after the names within the clause (up to the next `,` or
//! sentence end, or ` and ` before a lower-case word). Anything else is not read: `Discovered
//! in the solar spectrum in 1868 by Lockyer` (helium), `by the Joint Institute for Nuclear
//! Research` (lower-case `the`), `by Martin .H. Klaproth` (a stray `.`), `by Sir Humphry Davy
//! and by J.L. Gay-Lussac ...` (a list that goes on after ` and by`), `by Peter Armbruster,
//! Gottfried Münzenberg, and their team` (a list that ends in other words).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;

/// The built-in corpus: Debian's `dict-elements` text, byte for byte (ISO-8859-1).
pub const BUILT_IN: &[u8] = include_bytes!("../data/elements.dict.txt");

/// Largest atomic number accepted in a corpus file.
pub const MAX_ATOMIC_NUMBER: u32 = 999;

/// How an element came to be known, as the prose says it (the verb of a [`Discovery`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    Discovered,
    Isolated,
    Identified,
    /// `First produced by` (the synthetic elements).
    Produced,
}

impl Verb {
    pub const ALL: [Verb; 4] = [
        Verb::Discovered,
        Verb::Isolated,
        Verb::Identified,
        Verb::Produced,
    ];

    /// The past participle used in questions: `discovered`, `isolated`, `identified`,
    /// `first produced`.
    pub fn phrase(self) -> &'static str {
        match self {
            Verb::Discovered => "discovered",
            Verb::Isolated => "isolated",
            Verb::Identified => "identified",
            Verb::Produced => "first produced",
        }
    }

    fn from_word(word: &str) -> Option<Verb> {
        match word.to_ascii_lowercase().as_str() {
            "discovered" => Some(Verb::Discovered),
            "isolated" => Some(Verb::Isolated),
            "identified" => Some(Verb::Identified),
            "produced" => Some(Verb::Produced),
            _ => None,
        }
    }
}

/// One discovery fact read from an entry's prose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovery {
    pub verb: Verb,
    /// The names as the prose writes them: `Henry Cavendish`, `Reich and Richter`.
    pub who: String,
    /// The year, when the same clause gives one.
    pub year: Option<u32>,
}

/// One entry of the corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// 1-based position among the file's entries (dictd header entries not counted).
    pub number: usize,
    /// 1-based line of the headword in the file.
    pub line: usize,
    /// The headword (`iron`).
    pub name: String,
    /// The `Symbol:` value: `None` without the line, `Some("")` for an empty one.
    pub symbol: Option<String>,
    pub atomic_number: Option<u32>,
    /// The atomic-weight value as written (`55.847`, `(98)`, `???`).
    pub atomic_weight: Option<String>,
    /// The prose, lines joined by single spaces, braces dropped.
    pub prose: String,
    /// Discovery facts of the prose, in text order (see the module docs).
    pub discoveries: Vec<Discovery>,
}

impl Entry {
    /// An element entry: one with an `Atomic number:` line.
    pub fn is_element(&self) -> bool {
        self.atomic_number.is_some()
    }

    /// The non-empty symbol, if any.
    pub fn symbol(&self) -> Option<&str> {
        self.symbol.as_deref().filter(|s| !s.is_empty())
    }

    /// The field lines as a passage header: `Symbol: Fe | Atomic number: 26 | Atomic weight:
    /// 55.847` (only the fields the entry has; an empty symbol is left out).
    pub fn header(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.symbol() {
            parts.push(format!("Symbol: {s}"));
        }
        if let Some(n) = self.atomic_number {
            parts.push(format!("Atomic number: {n}"));
        }
        if let Some(w) = &self.atomic_weight {
            parts.push(format!("Atomic weight: {w}"));
        }
        parts.join(" | ")
    }

    /// The atomic weight as a question answer: the number without the parentheses of a mass
    /// number (`(98)` → `98`); `None` for `???` or an uncertain `(272)?`.
    pub fn weight_answer(&self) -> Option<String> {
        let w = self.atomic_weight.as_deref()?.trim();
        let inner = w
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or(w);
        let mut parts = inner.splitn(2, '.');
        let whole = parts.next().unwrap_or_default();
        let frac = parts.next();
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits(whole) && frac.is_none_or(digits)).then(|| inner.to_string())
    }
}

/// A parsed corpus.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// Where it came from: `built-in` or the file's path, for messages.
    pub source: String,
    pub entries: Vec<Entry>,
}

/// Why a corpus text was refused: the message names the entry and line.
pub type CorpusError = String;

impl Corpus {
    /// The built-in corpus (Debian's `dict-elements`).
    pub fn built_in() -> Corpus {
        Corpus::parse(BUILT_IN, "built-in").expect("the built-in corpus parses")
    }

    /// Reads and parses a corpus file. Errors: the file cannot be read, or
    /// [`Corpus::parse`]'s.
    pub fn load(path: &str) -> Result<Corpus, CorpusError> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
        Corpus::parse(&bytes, path).map_err(|e| format!("`{path}` is not a usable corpus: {e}"))
    }

    /// Parses a corpus text (see the module docs for the format). Errors: a NUL byte (not a
    /// text file); text before the first headword; a field line inside the prose (a headword
    /// line is missing); a field given twice; an element entry with an `Atomic number:` that
    /// is not a whole number from 1 to 999, or without a `Symbol:` or atomic-weight line; two
    /// entries with the same headword; no element entry at all.
    pub fn parse(bytes: &[u8], source: &str) -> Result<Corpus, CorpusError> {
        if bytes.contains(&0) {
            return Err("it holds NUL bytes: not a text file".into());
        }
        let text = match std::str::from_utf8(bytes) {
            Ok(s) => s.to_string(),
            // ISO-8859-1: every byte is the code point of the same value.
            Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
        };
        let raw = split_entries(&text)?;
        let mut entries = Vec::new();
        let mut names = BTreeSet::new();
        for (headword, line, body) in raw {
            if headword.starts_with("00-database") || headword.starts_with("00database") {
                continue;
            }
            let number = entries.len() + 1;
            let entry = parse_entry(number, &headword, line, &body)?;
            if !names.insert(entry.name.to_lowercase()) {
                return Err(format!(
                    "entry {number} (`{}`, line {line}) repeats a headword; each name may head \
                     one entry",
                    entry.name
                ));
            }
            entries.push(entry);
        }
        if !entries.iter().any(Entry::is_element) {
            return Err(
                "no entry has an `Atomic number:` line (expected the dict-elements text format: \
                 a headword line, then `Symbol:`, `Atomic number:` and `Atomic weight:` lines, \
                 then prose; see docs/search-qa.md)"
                    .into(),
            );
        }
        Ok(Corpus {
            source: source.to_string(),
            entries,
        })
    }

    /// The element entries, in file order.
    pub fn elements(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.is_element())
    }
}

/// Splits the text into `(headword, line, body lines)`, body lines with their line numbers.
#[allow(clippy::type_complexity)]
fn split_entries(text: &str) -> Result<Vec<(String, usize, Vec<(usize, String)>)>, CorpusError> {
    let mut out: Vec<(String, usize, Vec<(usize, String)>)> = Vec::new();
    let mut after_blank = true;
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = i + 1;
        let line = raw.trim_end();
        if line.trim().is_empty() {
            after_blank = true;
            continue;
        }
        let headword = after_blank
            && !line.starts_char_is_space()
            && !line.contains(char::is_whitespace)
            && !line.contains(':');
        after_blank = false;
        if headword {
            out.push((line.to_string(), line_no, Vec::new()));
        } else if let Some(last) = out.last_mut() {
            last.2.push((line_no, line.to_string()));
        } else {
            return Err(format!(
                "line {line_no} (`{}`) comes before any headword; an entry starts with its \
                 name alone on a line",
                clip(line)
            ));
        }
    }
    Ok(out)
}

trait StartsWithSpace {
    fn starts_char_is_space(&self) -> bool;
}

impl StartsWithSpace for str {
    fn starts_char_is_space(&self) -> bool {
        self.starts_with(char::is_whitespace)
    }
}

/// The first 40 characters of a line, for messages.
fn clip(line: &str) -> String {
    let mut s: String = line.chars().take(40).collect();
    if line.chars().count() > 40 {
        s.push_str("...");
    }
    s
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Symbol,
    Number,
    Weight,
}

/// A field line: its field and value.
fn field_line(line: &str) -> Option<(Field, &str)> {
    let (key, value) = line.split_once(':')?;
    let field = match key.trim().to_ascii_lowercase().as_str() {
        "symbol" => Field::Symbol,
        "atomic number" => Field::Number,
        "atomic weight" | "atmic weight" => Field::Weight,
        _ => return None,
    };
    Some((field, value.trim()))
}

fn parse_entry(
    number: usize,
    name: &str,
    line: usize,
    body: &[(usize, String)],
) -> Result<Entry, CorpusError> {
    let at = |l: usize| format!("entry {number} (`{name}`, line {l})");
    let mut symbol = None;
    let mut atomic_number = None;
    let mut atomic_weight = None;
    let mut prose_lines: Vec<&str> = Vec::new();
    for (l, text) in body {
        match field_line(text) {
            Some((field, value)) if prose_lines.is_empty() => {
                let slot = match field {
                    Field::Symbol => &mut symbol,
                    Field::Number => &mut atomic_number,
                    Field::Weight => &mut atomic_weight,
                };
                if slot.is_some() {
                    return Err(format!("{}: `{}` is given twice", at(*l), clip(text)));
                }
                *slot = Some(value.to_string());
            }
            Some(_) => {
                return Err(format!(
                    "{}: the field line `{}` comes after the prose; is the headword line of a \
                     new entry missing before it?",
                    at(*l),
                    clip(text)
                ))
            }
            None => prose_lines.push(text.trim()),
        }
    }
    let atomic_number = match atomic_number {
        None => None,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (1..=MAX_ATOMIC_NUMBER).contains(&n) => Some(n),
            _ => {
                return Err(format!(
                    "{}: `Atomic number: {v}` is not a whole number from 1 to {MAX_ATOMIC_NUMBER}",
                    at(line)
                ))
            }
        },
    };
    if atomic_number.is_some() {
        if symbol.is_none() {
            return Err(format!(
                "{} has an `Atomic number:` line but no `Symbol:` line",
                at(line)
            ));
        }
        if atomic_weight.is_none() {
            return Err(format!(
                "{} has an `Atomic number:` line but no `Atomic weight:` line",
                at(line)
            ));
        }
    }
    let prose = prose_lines
        .join(" ")
        .replace(['{', '}'], "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let discoveries = discoveries(name, &prose);
    Ok(Entry {
        number,
        line,
        name: name.to_string(),
        symbol,
        atomic_number,
        atomic_weight,
        prose,
        discoveries,
    })
}

/// A personal name: capitalised words (`McMillan`, `Gay-Lussac`, `Münzenberg`) or initials
/// (`J.L.`, `D.`, `J.C.G`), with lower-case particles only between two of them.
const NAME: &str = r"(?:\p{Lu}\p{Ll}+(?:\p{Lu}\p{Ll}+)*(?:-\p{Lu}\p{Ll}+)*|\p{Lu}(?:\.\p{Lu})*\.?)(?:\s+(?:(?:de|del|von|van|da|di|du|la|le)\s+)*(?:\p{Lu}\p{Ll}+(?:\p{Lu}\p{Ll}+)*(?:-\p{Lu}\p{Ll}+)*|\p{Lu}(?:\.\p{Lu})*\.?))*";

fn clause_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let persons = format!(r"{NAME}(?:(?:,\s+|\s+and\s+){NAME})*(?:\s+and\s+associates)?");
        Regex::new(&format!(
            r"(?:^|[.;]\s+|,\s+|\s+and\s+)(?:(?P<subject>\p{{Lu}}\p{{Ll}}+)\s+was\s+)?(?:(?:[Ff]irst|[Oo]riginally|[Oo]fficially)\s+)?(?P<verb>[Dd]iscovered|[Ii]solated|[Ii]dentified|[Pp]roduced)(?:\s+\p{{Ll}}+ly)?(?:\s+in\s+(?P<y1>\d{{4}}))?\s+by\s+(?P<who>{persons})"
        ))
        .expect("the clause pattern compiles")
    })
}

fn year_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\bin\s+(\d{4})\b").expect("the year pattern compiles"))
}

/// The discovery facts of an entry's prose (see the module docs), in text order; at most one
/// per verb (the first).
pub fn discoveries(name: &str, prose: &str) -> Vec<Discovery> {
    let mut out: Vec<Discovery> = Vec::new();
    let mut start = 0;
    while let Some(m) = clause_regex().captures_at(prose, start) {
        let whole = m.get(0).expect("group 0");
        // Matches may overlap at a clause start: resume just after this match's start.
        start = whole.start() + 1;
        if let Some(subject) = m.name("subject") {
            let s = subject.as_str();
            if s != "It" && !s.eq_ignore_ascii_case(name) {
                continue;
            }
        }
        let verb = Verb::from_word(&m["verb"]).expect("the pattern only matches verbs");
        let who_match = m.name("who").expect("group who");
        let who = who_match.as_str().to_string();
        let rest = &prose[who_match.end()..];
        if !ends_clause(rest) {
            continue;
        }
        let year = match m.name("y1") {
            Some(y) => y.as_str().parse().ok(),
            None => {
                let clause = clause_of(rest);
                year_regex()
                    .captures(clause)
                    .and_then(|c| c[1].parse().ok())
            }
        };
        if out.iter().any(|d| d.verb == verb) {
            continue;
        }
        out.push(Discovery { verb, who, year });
    }
    out
}

/// The names are followed by the end of their clause: `.`, `,`, `;`, the end of the text,
/// ` in`, ` of`, ` at`, ` via`, or ` and` with a lower-case word other than `by`; not `, and`
/// (a list that goes on with other words).
fn ends_clause(rest: &str) -> bool {
    if rest.is_empty() {
        return true;
    }
    if let Some(after) = rest.strip_prefix(',') {
        return !after.trim_start().starts_with("and ");
    }
    if rest.starts_with('.') || rest.starts_with(';') {
        return true;
    }
    let Some(after) = rest.strip_prefix(' ') else {
        return false;
    };
    let word: String = after.chars().take_while(|c| c.is_alphabetic()).collect();
    match word.as_str() {
        "in" | "of" | "at" | "via" => true,
        "and" => {
            let next: String = after[3..]
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphabetic())
                .collect();
            next != "by" && next.chars().next().is_some_and(char::is_lowercase)
        }
        _ => false,
    }
}

/// The rest of a clause: up to the first `,` or `;`, the end of a sentence (`. ` not after a
/// lone capital, which would be an initial) or ` and ` before a lower-case word.
fn clause_of(rest: &str) -> &str {
    let bytes = rest.as_bytes();
    let mut end = rest.len();
    for (i, &b) in bytes.iter().enumerate() {
        let stop = match b {
            b',' | b';' => true,
            b'.' => {
                let initial = i >= 1
                    && bytes[i - 1].is_ascii_uppercase()
                    && (i < 2 || !bytes[i - 2].is_ascii_alphabetic());
                !initial && bytes.get(i + 1).is_none_or(|c| c.is_ascii_whitespace())
            }
            _ => false,
        };
        if stop {
            end = i;
            break;
        }
        if rest[i..].starts_with(" and ") {
            let next = rest[i + 5..].chars().next();
            if next.is_some_and(char::is_lowercase) {
                end = i;
                break;
            }
        }
    }
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(name: &str, prose: &str) -> Vec<(Verb, String, Option<u32>)> {
        discoveries(name, prose)
            .into_iter()
            .map(|d| (d.verb, d.who, d.year))
            .collect()
    }

    #[test]
    fn discovery_clauses_are_read_conservatively() {
        use Verb::*;
        assert_eq!(
            facts(
                "hydrogen",
                "Chemically reacts. Discovered by Henry Cavendish in 1776."
            ),
            [(Discovered, "Henry Cavendish".into(), Some(1776))]
        );
        assert_eq!(
            facts(
                "niobium",
                "Discovered by Charles Hatchett in 1801 and isolated by Blomstrand in 1864."
            ),
            [
                (Discovered, "Charles Hatchett".into(), Some(1801)),
                (Isolated, "Blomstrand".into(), Some(1864))
            ]
        );
        assert_eq!(
            facts(
                "beryllium",
                "It was isolated independently by F. Wohler and A.A. Bussy in 1828."
            ),
            [(Isolated, "F. Wohler and A.A. Bussy".into(), Some(1828))]
        );
        assert_eq!(
            facts(
                "holmium",
                "Discovered by Per Theodor Cleve and J.L. Soret in Switzerland in 1879. The name"
            ),
            [(
                Discovered,
                "Per Theodor Cleve and J.L. Soret".into(),
                Some(1879)
            )]
        );
        assert_eq!(
            facts(
                "neon",
                "Neon was discovered in 1898 by Sir William Ramsey and M.W. Travers."
            ),
            [(
                Discovered,
                "Sir William Ramsey and M.W. Travers".into(),
                Some(1898)
            )]
        );
        assert_eq!(
            facts(
                "thallium",
                "Discovered by Sir William Crookes via spectroscopy."
            ),
            [(Discovered, "Sir William Crookes".into(), None)]
        );
        assert_eq!(
            facts(
                "americium",
                "Discovered by Glenn T. Seaborg and associates in 1945, it was obtained"
            ),
            [(
                Discovered,
                "Glenn T. Seaborg and associates".into(),
                Some(1945)
            )]
        );
        // Not read: another subject, a lower-case or stray-dotted name, a list that goes on.
        assert!(facts("x", "Rf-260 was discovered by the Joint Institute in 1964.").is_empty());
        assert!(facts("cerium", "Discovered by Martin .H. Klaproth in 1803.").is_empty());
        assert!(facts(
            "boron",
            "It was discovered in 1808 by Sir Humphry Davy and by J.L. Gay-Lussac."
        )
        .is_empty());
        assert!(facts(
            "roentgenium",
            "Roentgenium was officially discovered by Peter Armbruster, Gottfried Münzenberg, \
             and their team"
        )
        .is_empty());
        assert!(facts("x", "Discovered in 1970 by Berkeley researchers.").is_empty());
        assert!(facts(
            "helium",
            "Discovered in the solar spectrum in 1868 by Lockyer."
        )
        .is_empty());
        assert!(facts("xenon", "Neon was discovered by Ramsey in 1898.").is_empty());
    }

    #[test]
    fn weights_become_answers_only_when_certain() {
        let mut e = Corpus::built_in().entries[0].clone();
        for (w, answer) in [
            ("1.0079", Some("1.0079")),
            ("(98)", Some("98")),
            ("281", Some("281")),
            ("(272)?", None),
            ("???", None),
            ("1.", None),
        ] {
            e.atomic_weight = Some(w.into());
            assert_eq!(e.weight_answer().as_deref(), answer, "{w}");
        }
    }
}
