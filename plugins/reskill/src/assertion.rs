//! The assertion engine: cheap rule checks over a trajectory's actions, evaluated without a
//! model (ReSkill, arXiv 2606.01619, "assertion-driven diagnosis"; amazon-science/reskill
//! `skill_creator/diagnosis/assertion_engine.py`, whose check semantics these follow).
//!
//! An [`Assertion`] is plain data (it lives in the plugin state and in a skill's bank
//! `extra`); [`Assertion::compile`] turns it into a [`Check`] with its regexes built once.
//! Patterns are regexes searched anywhere in an action, case-insensitively.

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use cairn_plugin_sdk::{PluginError, Result};

/// A rule over the actions of one trajectory, by turn.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Assertion {
    /// Some action matches `pattern`.
    Exists { pattern: String },
    /// No action matches `pattern`.
    NotExists { pattern: String },
    /// Both patterns match some action, and the first action matching `first` comes strictly
    /// before the first action matching `second`.
    Before { first: String, second: String },
    /// No two consecutive actions are the same (trimmed, case-insensitive).
    NoConsecutiveRepeat,
    /// The trajectory has an action and its last action matches `pattern`.
    FinalMatches { pattern: String },
}

impl std::fmt::Display for Assertion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Assertion::Exists { pattern } => write!(f, "exists(/{pattern}/)"),
            Assertion::NotExists { pattern } => write!(f, "not_exists(/{pattern}/)"),
            Assertion::Before { first, second } => write!(f, "before(/{first}/, /{second}/)"),
            Assertion::NoConsecutiveRepeat => write!(f, "no_consecutive_repeat"),
            Assertion::FinalMatches { pattern } => write!(f, "final_matches(/{pattern}/)"),
        }
    }
}

/// Compiles a case-insensitive pattern; the error names the pattern and what it was for.
pub fn pattern(text: &str, what: &str) -> Result<Regex> {
    RegexBuilder::new(text)
        .case_insensitive(true)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| PluginError::input(format!("{what} `{text}` is not a valid regex: {e}")))
}

/// A compiled [`Assertion`].
#[derive(Clone, Debug)]
pub enum Check {
    Exists(Regex),
    NotExists(Regex),
    Before(Regex, Regex),
    NoConsecutiveRepeat,
    FinalMatches(Regex),
}

impl Assertion {
    pub fn compile(&self) -> Result<Check> {
        let what = "assertion pattern";
        Ok(match self {
            Assertion::Exists { pattern: p } => Check::Exists(pattern(p, what)?),
            Assertion::NotExists { pattern: p } => Check::NotExists(pattern(p, what)?),
            Assertion::Before { first, second } => {
                Check::Before(pattern(first, what)?, pattern(second, what)?)
            }
            Assertion::NoConsecutiveRepeat => Check::NoConsecutiveRepeat,
            Assertion::FinalMatches { pattern: p } => Check::FinalMatches(pattern(p, what)?),
        })
    }
}

impl Check {
    /// Whether the rule holds for `actions` (one per turn, in turn order).
    pub fn holds<S: AsRef<str>>(&self, actions: &[S]) -> bool {
        let first = |re: &Regex| actions.iter().position(|a| re.is_match(a.as_ref()));
        match self {
            Check::Exists(re) => first(re).is_some(),
            Check::NotExists(re) => first(re).is_none(),
            Check::Before(a, b) => matches!((first(a), first(b)), (Some(i), Some(j)) if i < j),
            Check::NoConsecutiveRepeat => !actions.windows(2).any(|w| {
                w[0].as_ref().trim().to_lowercase() == w[1].as_ref().trim().to_lowercase()
            }),
            Check::FinalMatches(re) => actions.last().is_some_and(|a| re.is_match(a.as_ref())),
        }
    }
}

/// The pattern of an action with its object numbers generalised: the trimmed action with
/// regex metacharacters escaped and every run of ASCII digits replaced by `\d+`
/// (`go to drawer 3` → `go to drawer \d+`). `None` for an empty action.
pub fn generalise(action: &str) -> Option<String> {
    let action = action.trim();
    if action.is_empty() {
        return None;
    }
    let mut out = String::new();
    let mut literal = String::new();
    let mut in_digits = false;
    for c in action.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push_str(&regex::escape(&literal));
                literal.clear();
                out.push_str(r"\d+");
                in_digits = true;
            }
        } else {
            in_digits = false;
            literal.push(c);
        }
    }
    out.push_str(&regex::escape(&literal));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(assertion: Assertion, cases: &[(&[&str], bool)]) {
        let compiled = assertion.compile().unwrap();
        for (actions, want) in cases {
            assert_eq!(compiled.holds(actions), *want, "{assertion} on {actions:?}");
        }
    }

    fn p(s: &str) -> String {
        s.to_string()
    }

    #[test]
    fn exists_and_not_exists() {
        let cases: &[(&[&str], bool)] = &[
            (&["go to drawer 1", "Open Drawer 1"], true),
            (&["go to drawer 1"], false),
            (&[], false),
        ];
        check(
            Assertion::Exists {
                pattern: p("open drawer"),
            },
            cases,
        );
        let negated: Vec<(&[&str], bool)> = cases.iter().map(|&(a, w)| (a, !w)).collect();
        check(
            Assertion::NotExists {
                pattern: p("open drawer"),
            },
            &negated,
        );
    }

    #[test]
    fn before_needs_both_and_compares_first_matches() {
        check(
            Assertion::Before {
                first: p("^take"),
                second: p("^put"),
            },
            &[
                (
                    &["take apple 1", "go to table 1", "put apple 1 in table 1"],
                    true,
                ),
                (
                    &[
                        "put mug 1 in sink 1",
                        "take apple 1",
                        "put apple 1 in table 1",
                    ],
                    false,
                ),
                (&["take apple 1"], false),
                (&["put apple 1 in table 1"], false),
                // One action matching both is not "before".
                (&["take then put"], false),
            ],
        );
    }

    #[test]
    fn no_consecutive_repeat_and_final_matches() {
        check(
            Assertion::NoConsecutiveRepeat,
            &[
                (&["look", "go to sink 1", "look"], true),
                (&["look", " LOOK "], false),
                (&[], true),
            ],
        );
        check(
            Assertion::FinalMatches {
                pattern: p(r"^put .* in"),
            },
            &[
                (&["take apple 1", "put apple 1 in fridge 1"], true),
                (&["put apple 1 in fridge 1", "look"], false),
                (&[], false),
            ],
        );
    }

    #[test]
    fn assertions_serialise_as_a_tagged_enum() {
        let a = Assertion::Before {
            first: p("a"),
            second: p("b"),
        };
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"{"check":"before","first":"a","second":"b"}"#);
        assert_eq!(serde_json::from_str::<Assertion>(&json).unwrap(), a);
        assert_eq!(
            serde_json::to_string(&Assertion::NoConsecutiveRepeat).unwrap(),
            r#"{"check":"no_consecutive_repeat"}"#
        );
        let e = Assertion::Exists { pattern: p("(") }.compile().unwrap_err();
        assert!(
            e.message
                .starts_with("assertion pattern `(` is not a valid regex"),
            "{e}"
        );
    }

    #[test]
    fn generalised_actions_match_other_object_numbers_only() {
        let g = generalise(" go to drawer 12 ").unwrap();
        assert_eq!(g, r"go to drawer \d+");
        let put = generalise("put mug 2 in/on coffeemachine 1").unwrap();
        assert_eq!(put, r"put mug \d+ in/on coffeemachine \d+");
        let re = pattern(&put, "test").unwrap();
        assert!(re.is_match("put mug 7 in/on coffeemachine 3"));
        assert!(!re.is_match("put cup 7 in/on coffeemachine 3"));
        assert_eq!(generalise("use (x)").unwrap(), r"use \(x\)");
        assert_eq!(generalise("   "), None);
    }
}
