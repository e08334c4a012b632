//! The `search` tool: BM25 over the corpus entries with SQLite's FTS5 (through the
//! workspace's `rusqlite`, SQLite compiled in; the experience bank uses the same engine).
//!
//! **Index.** One in-memory FTS5 table, one row per corpus entry (element entries and the
//! others), columns `name` (the headword), `header` (the field lines: `Symbol: Fe | Atomic
//! number: 26 | Atomic weight: 55.847`) and `prose`, tokenised `porter unicode61` (Unicode
//! word boundaries, diacritics folded, Porter stemming, so `discovered` finds `Discovered`).
//!
//! **Query.** The query text is data, not FTS5 syntax: it is cut into terms (maximal runs of
//! letters and digits, lower-cased, at most [`MAX_QUERY_TERMS`]), and the `MATCH` expression is
//! the whole query as one quoted phrase `OR` each term quoted (`"atomic number 26" OR "atomic"
//! OR "number" OR "26"`): an entry that has the words in that order outranks one that has them
//! scattered, and an entry with none is not returned. Ranking is FTS5's `bm25()` (k1 = 1.2,
//! b = 0.75) with column weights name 4, header 1, prose 1 (a query that names an element
//! finds that element's entry first); ties go to the earlier entry, so results are
//! deterministic.
//!
//! **Passage.** Each hit is `name | header | excerpt`. The excerpt is chosen from the prose
//! by sentences: FTS5's `highlight()` marks the tokens the query matched (stemmed, as the
//! ranking saw them), the prose is split into sentences (at `. ` after a lower-case letter, a
//! digit or `)`, so initials such as `J.L.` do not split), and the sentence with the most
//! distinct matched terms (terms that are the entry's own name do not count: the passage
//! starts with it; the earliest on a tie; the first sentence when nothing matched) is
//! taken, then the other matching sentences by score, each if it fits, then the remaining
//! sentences from the start of the prose up to the first that does not fit, all within
//! `passage_words` whitespace-separated words. Sentences keep their text order, `...` marks
//! left-out text; a best sentence longer than the limit is cut at the limit. So a fact stated
//! in one sentence (`Discovered by Jons J. Berzelius in 1829.`) is shown whole or not at all.

use std::sync::Mutex;

use cairn_plugin_sdk::bank;
use rusqlite::Connection;

use crate::corpus::Corpus;

/// Distinct query terms used at most.
pub const MAX_QUERY_TERMS: usize = 32;
/// Largest `passage_words`.
pub const MAX_PASSAGE_WORDS: u32 = 400;

/// The markers `highlight()` puts around matched tokens.
const OPEN: char = '\u{1}';
const CLOSE: char = '\u{2}';

/// One search result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Index of the entry in [`Corpus::entries`].
    pub entry: usize,
    /// The entry's headword.
    pub name: String,
    /// `name | header | excerpt`.
    pub passage: String,
}

/// The BM25 index over a corpus. `Sync`: the connection is behind a mutex, so episodes on
/// several threads share one index.
pub struct Index {
    conn: Mutex<Connection>,
    names: Vec<String>,
    headers: Vec<String>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Index({} entries)", self.names.len())
    }
}

/// The distinct terms of a query text, in order: maximal runs of alphanumeric characters,
/// lower-cased, at most [`MAX_QUERY_TERMS`] (the SDK's [`bank::query_terms`], which the
/// kernel's experience bank cuts its queries with too).
pub fn query_terms(text: &str) -> Vec<String> {
    bank::query_terms(text, MAX_QUERY_TERMS)
}

/// The FTS5 `MATCH` expression: the phrase of all terms (when more than one) `OR` each term.
pub fn match_expression(terms: &[String]) -> String {
    let each = bank::fts5_any(terms);
    if terms.len() > 1 {
        format!("{} OR {each}", bank::fts5_any(&[terms.join(" ")]))
    } else {
        each
    }
}

impl Index {
    /// Builds the in-memory index. Errors: SQLite's, as text (an FTS5-less SQLite build).
    pub fn build(corpus: &Corpus) -> Result<Index, String> {
        let conn = Connection::open_in_memory().map_err(|e| format!("SQLite: {e}"))?;
        conn.execute_batch(
            "CREATE VIRTUAL TABLE entries USING fts5(name, header, prose, \
             tokenize = 'porter unicode61');",
        )
        .map_err(|e| format!("SQLite FTS5 table: {e}"))?;
        let mut names = Vec::new();
        let mut headers = Vec::new();
        {
            let mut insert = conn
                .prepare("INSERT INTO entries (rowid, name, header, prose) VALUES (?1, ?2, ?3, ?4)")
                .map_err(|e| format!("SQLite: {e}"))?;
            for (i, e) in corpus.entries.iter().enumerate() {
                let header = e.header();
                insert
                    .execute(rusqlite::params![i as i64, e.name, header, e.prose])
                    .map_err(|e| format!("SQLite insert: {e}"))?;
                names.push(e.name.clone());
                headers.push(header);
            }
        }
        Ok(Index {
            conn: Mutex::new(conn),
            names,
            headers,
        })
    }

    /// Number of indexed entries.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The top `k` entries for `query`, best first, each with a passage whose excerpt has at
    /// most `passage_words` words (see the module docs). A query without terms returns
    /// nothing. Errors: SQLite's, as text.
    pub fn search(&self, query: &str, k: usize, passage_words: u32) -> Result<Vec<Hit>, String> {
        let terms = query_terms(query);
        if terms.is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        let words = passage_words.clamp(1, MAX_PASSAGE_WORDS) as usize;
        let sql = "SELECT rowid, highlight(entries, 2, char(1), char(2)) FROM entries \
                   WHERE entries MATCH ?1 ORDER BY bm25(entries, 4.0, 1.0, 1.0), rowid LIMIT ?2";
        let conn = self
            .conn
            .lock()
            .map_err(|_| "the search index lock is poisoned".to_string())?;
        let mut stmt = conn
            .prepare_cached(sql)
            .map_err(|e| format!("SQLite: {e}"))?;
        let rows = stmt
            .query_map(
                rusqlite::params![match_expression(&terms), k as i64],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
            )
            .map_err(|e| format!("SQLite search: {e}"))?;
        let mut hits = Vec::new();
        for row in rows {
            let (id, marked) = row.map_err(|e| format!("SQLite search: {e}"))?;
            let snippet = excerpt(&marked, words, &self.names[entry_index(id)?]);
            let entry = entry_index(id)?;
            let name = self.names[entry].clone();
            let mut parts = vec![name.clone()];
            if !self.headers[entry].is_empty() {
                parts.push(self.headers[entry].clone());
            }
            if !snippet.is_empty() {
                parts.push(snippet);
            }
            hits.push(Hit {
                entry,
                name,
                passage: parts.join(" | "),
            });
        }
        Ok(hits)
    }
}

fn entry_index(rowid: i64) -> Result<usize, String> {
    usize::try_from(rowid).map_err(|_| format!("bad rowid {rowid}"))
}

/// The prose's sentences: split after `.` followed by a space, when the character before the
/// `.` is a lower-case letter, a digit or `)` (so `J.L. Soret` stays whole). Markers of
/// matched tokens are transparent.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut prev: Option<char> = None;
    let mut iter = text.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        if c == '.' {
            let ends = prev.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit() || p == ')');
            let next = iter.peek().map(|&(_, n)| n);
            if ends && next.is_none_or(|n| n == ' ') {
                out.push(text[start..=i].trim());
                start = i + 1;
            }
        }
        if c != OPEN && c != CLOSE {
            prev = Some(c);
        }
    }
    if !text[start..].trim().is_empty() {
        out.push(text[start..].trim());
    }
    out
}

/// The distinct matched terms of a marked sentence, lower-cased, leaving out those that start
/// with the entry's own name (`thallium`, `thallium's`): the passage starts with the name
/// already, and it is in most sentences of its entry.
fn matched_terms(sentence: &str, name: &str) -> usize {
    let name = name.to_lowercase();
    let mut terms: Vec<String> = Vec::new();
    let mut rest = sentence;
    while let Some(open) = rest.find(OPEN) {
        let after = &rest[open + OPEN.len_utf8()..];
        let close = after.find(CLOSE).unwrap_or(after.len());
        let term = after[..close].to_lowercase();
        if !term.starts_with(&name) && !terms.contains(&term) {
            terms.push(term);
        }
        rest = &after[close.min(after.len())..];
    }
    terms.len()
}

fn unmark(text: &str) -> String {
    text.chars().filter(|&c| c != OPEN && c != CLOSE).collect()
}

/// The excerpt of entry `name`'s prose text marked by `highlight()` (see the module docs): at
/// most `limit` whitespace-separated words of the prose (the `...` marks not counted).
pub fn excerpt(marked: &str, limit: usize, name: &str) -> String {
    let sentences = sentences(marked);
    if sentences.is_empty() {
        return String::new();
    }
    let words: Vec<usize> = sentences
        .iter()
        .map(|s| s.split_whitespace().count())
        .collect();
    let scores: Vec<usize> = sentences.iter().map(|s| matched_terms(s, name)).collect();
    let mut order: Vec<usize> = (0..sentences.len()).collect();
    // Best score first; on a tie the earlier sentence.
    order.sort_by_key(|&i| (std::cmp::Reverse(scores[i]), i));
    let best = order[0];
    if words[best] > limit {
        let cut: Vec<&str> = sentences[best].split_whitespace().take(limit).collect();
        let lead = if best > 0 { "... " } else { "" };
        return unmark(&format!("{lead}{} ...", cut.join(" ")));
    }
    let mut chosen = vec![best];
    let mut total = words[best];
    // Other matching sentences by score, each if it fits; then the others from the start of
    // the prose, up to the first that does not fit.
    for &i in order[1..].iter().filter(|&&i| scores[i] > 0) {
        if total + words[i] <= limit {
            chosen.push(i);
            total += words[i];
        }
    }
    for i in (0..sentences.len()).filter(|&i| scores[i] == 0 && i != best) {
        if total + words[i] > limit {
            break;
        }
        chosen.push(i);
        total += words[i];
    }
    chosen.sort_unstable();
    let mut out = String::new();
    if chosen[0] > 0 {
        out.push_str("...");
    }
    for (k, &i) in chosen.iter().enumerate() {
        if k > 0 {
            out.push_str(if i == chosen[k - 1] + 1 { " " } else { " ... " });
        } else if chosen[0] > 0 {
            out.push(' ');
        }
        out.push_str(sentences[i]);
    }
    if *chosen.last().expect("one sentence") + 1 < sentences.len() {
        out.push_str(" ...");
    }
    unmark(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_text_becomes_a_phrase_and_quoted_terms() {
        let terms = query_terms("Atomic number: 26? \"AND\" NEAR(x)");
        assert_eq!(terms, ["atomic", "number", "26", "and", "near", "x"]);
        assert_eq!(
            match_expression(&terms[..3]),
            r#""atomic number 26" OR "atomic" OR "number" OR "26""#
        );
        assert_eq!(match_expression(&terms[..1]), r#""atomic""#);
        assert!(query_terms(" -- :: ").is_empty());
    }

    #[test]
    fn excerpts_keep_whole_sentences() {
        let m = |s: &str| s.replace('[', "\u{1}").replace(']', "\u{2}");
        let text =
            m("Grey metal. Used in alloys. [Discovered] by J.L. Soret in 1829. Named after Thor.");
        assert_eq!(sentences(&text).len(), 4, "{:?}", sentences(&text));
        // The matched sentence, then the others by position while they fit.
        assert_eq!(
            excerpt(&text, 7, "x"),
            "... Discovered by J.L. Soret in 1829. ..."
        );
        assert_eq!(
            excerpt(&text, 10, "x"),
            "Grey metal. ... Discovered by J.L. Soret in 1829. ..."
        );
        assert_eq!(
            excerpt(&text, 40, "x"),
            "Grey metal. Used in alloys. Discovered by J.L. Soret in 1829. Named after Thor."
        );
        // Too long for the limit: cut.
        assert_eq!(excerpt(&text, 3, "x"), "... Discovered by J.L. ...");
        // Nothing matched: from the start.
        assert_eq!(excerpt("One two. Three four five.", 2, "x"), "One two. ...");
        assert_eq!(excerpt("", 5, "x"), "");
        // The entry's own name does not count.
        let text = m("[Thor] is grey. [Thor] was [found] in 1829.");
        assert_eq!(excerpt(&text, 6, "thor"), "... Thor was found in 1829.");
    }
}
