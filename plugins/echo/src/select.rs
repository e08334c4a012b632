//! The selection action (ours, a proposal): a `select[i,j,...]` run in the policy's response.
//!
//! **Syntax.** The first `select[` in the action text that does not continue a word (the
//! character before it, if any, is not a letter, digit or `_`), up to the next `]`, holds
//! comma-separated memory-record indices (decimal, whitespace allowed around them):
//! `select[1,3] answer[iron]`, `select[ 0 ]`, `select[]` (an explicit empty selection). The
//! environment ignores the run (search-qa finds its `search[..]` / `answer[..]` anywhere in
//! the text). The response at turn `u` may cite the records of turns `0..u` (the records that
//! exist when it is written); any other item (an index `≥ u`, or not a number) is dropped and
//! counted, and a repeated index counts once. Without a closing `]` there is no selection.
//!
//! **Meaning.** The selection in response `u` is the set `S_u` of records shown in the prompt
//! of turn `u + 1`; in the last (answer) turn it is the citation of the records the answer rests
//! on, `E_i` of the credit rule ([`crate::credit`]).

/// The selection keyword, with its opening bracket.
pub const OPEN: &str = "select[";

/// A `select[...]` run found in an action text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// Byte range of the whole run `select[...]` in the text.
    pub start: usize,
    pub end: usize,
    /// The items, in order: `Some(index)` for a decimal number, `None` for anything else.
    pub items: Vec<Option<u64>>,
}

/// The valid part of a selection at turn `u`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Valid {
    /// Distinct indices below `u`, in the order the policy wrote them.
    pub indices: Vec<u32>,
    /// Items dropped: not a number, or an index that does not exist (`≥ u`).
    pub dropped: usize,
}

impl Selection {
    /// The selection in `text`, if it holds a complete `select[...]` run.
    pub fn parse(text: &str) -> Option<Selection> {
        let start = text.match_indices(OPEN).map(|(i, _)| i).find(|&i| {
            text[..i]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })?;
        let body_start = start + OPEN.len();
        let close = text[body_start..].find(']')?;
        let body = &text[body_start..body_start + close];
        let items = if body.trim().is_empty() {
            Vec::new()
        } else {
            body.split(',')
                .map(|item| {
                    let item = item.trim();
                    (!item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| item.parse::<u64>().ok())
                        .flatten()
                })
                .collect()
        };
        Some(Selection {
            start,
            end: body_start + close + 1,
            items,
        })
    }

    /// The run's text, `select[...]`, as it appears in `text` (the text it was parsed from).
    pub fn run<'a>(&self, text: &'a str) -> &'a str {
        &text[self.start..self.end]
    }

    /// The indices that exist at turn `u` (records `0..u`), deduplicated in order.
    pub fn valid(&self, u: u32) -> Valid {
        let mut out = Valid::default();
        for item in &self.items {
            match item {
                Some(k) if *k < u64::from(u) => {
                    let k = *k as u32;
                    if !out.indices.contains(&k) {
                        out.indices.push(k);
                    }
                }
                _ => out.dropped += 1,
            }
        }
        out
    }
}

/// `text` without its selection run, whitespace collapsed to single spaces: the action
/// summary of a memory record.
pub fn without_selection(text: &str) -> String {
    let rest = match Selection::parse(text) {
        Some(s) => format!("{} {}", &text[..s.start], &text[s.end..]),
        None => text.to_string(),
    };
    collapse(&rest)
}

/// `text` on one line: every run of whitespace becomes one space, ends trimmed.
pub fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_first_complete_run() {
        let text = "select[1, 3] answer[iron] select[2]";
        let s = Selection::parse(text).unwrap();
        assert_eq!(s.run(text), "select[1, 3]");
        assert_eq!((s.start, s.end), (0, 12));
        assert_eq!(s.items, [Some(1), Some(3)]);
        assert_eq!(Selection::parse("search[iron]"), None);
        // Inside a word it is not the keyword.
        assert_eq!(Selection::parse("preselect[1] search[x]"), None);
        let s = Selection::parse("preselect[1] (select[2])").unwrap();
        assert_eq!((s.start, s.items.as_slice()), (14, &[Some(2)][..]));
        // The run ends at the first `]`, wherever the policy meant it to.
        assert_eq!(
            Selection::parse("select[1,2 answer[x]"),
            Some(Selection {
                start: 0,
                end: 20,
                items: vec![Some(1), None],
            })
        );
        assert_eq!(Selection::parse("select[1,2 search"), None);
        let empty = Selection::parse("ok select[ ] search[x]").unwrap();
        assert!(empty.items.is_empty());
        assert_eq!(empty.valid(5), Valid::default());
    }

    #[test]
    fn indices_that_do_not_exist_are_dropped_and_counted() {
        let s = Selection::parse("select[3,1,x,-2,1,4,99999999999999999999999,]").unwrap();
        assert_eq!(
            s.items,
            [Some(3), Some(1), None, None, Some(1), Some(4), None, None]
        );
        // At turn 4 records 0..4 exist: 3 and 1 (once) are kept, in the policy's order; `x`,
        // `-2`, `4`, the overflowing number and the empty item are dropped.
        assert_eq!(
            s.valid(4),
            Valid {
                indices: vec![3, 1],
                dropped: 5,
            }
        );
        assert_eq!(s.valid(0).indices, Vec::<u32>::new());
        assert_eq!(s.valid(0).dropped, 8);
    }

    #[test]
    fn the_action_summary_drops_the_run() {
        assert_eq!(
            without_selection("  select[0,2]\tanswer[ 26 ]\n"),
            "answer[ 26 ]"
        );
        assert_eq!(
            without_selection("search[iron  atomic]"),
            "search[iron atomic]"
        );
        assert_eq!(without_selection("select[1]"), "");
    }
}
