//! Property-based fuzzing (proptest) of the inputs users and harnesses write: pipeline configs,
//! gateway request bodies, the batch files of `cairn signals` / `cairn loss`, and plugin files.
//!
//! Each target mutates valid documents (the examples and the documented forms): keys deleted,
//! values of another type, extreme numbers (0, -1, 1e308, inf, nan, 2^63, 2^64...), random
//! strings, deep nesting, extra keys; then runs the function the CLI or the gateway runs on
//! them. The property is always the same: no panic, no hang (each case runs under a time
//! bound), and an error that names the key, field or file at fault.
//!
//! The case count is small by default (the whole module stays well under a minute in a debug
//! build); `PROPTEST_CASES` raises it, and `scripts/fuzz.sh` runs the long version and prints
//! how many inputs each target tried. A failing case is shrunk and its seed saved under
//! `kernel/tests/proptest-regressions/`, replayed first on every later run.

mod batch;
mod config;
mod gateway;
mod plugin_files;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::{Map, Value as Json};

/// The proptest config of a target: `default_cases` cases unless `PROPTEST_CASES` says
/// otherwise; failures persisted next to the test sources; shrinking bounded to a minute
/// (shrinking a hang runs [`CASE_LIMIT`] per step).
pub fn cases(default_cases: u32) -> Config {
    let mut config = Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_MAX_SHRINK_TIME").is_none() {
        config.max_shrink_time = 60_000;
    }
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default_cases;
    }
    config
}

/// Runs one fuzz target: `test` on `cases(default_cases)` inputs drawn from `strategy`, then
/// prints `fuzz-inputs NAME COUNT` (every input run, shrinking steps included; with
/// `--nocapture`, `scripts/fuzz.sh` sums these lines) and fails with the minimal failing
/// input if a case failed. `source_file` (`file!()`) places the saved failure seeds.
pub fn run<S>(
    name: &str,
    source_file: &'static str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    let mut config = cases(default_cases);
    config.source_file = Some(source_file);
    let mut runner = TestRunner::new(config);
    let count = AtomicU64::new(0);
    let result = runner.run(&strategy, |value| {
        count.fetch_add(1, Ordering::Relaxed);
        test(value)
    });
    eprintln!("fuzz-inputs {name} {}", count.load(Ordering::Relaxed));
    if let Err(e) = result {
        panic!("fuzz target {name}: {e}\n{runner}");
    }
}

/// Runs `work` on its own thread and returns its result; panics (failing the case) if it
/// panicked or is still running after `limit`: a hang is a failure, not a stuck test.
pub fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = work();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().expect("the worker sent its result"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The worker panicked: re-raise its payload so the case shows it.
            match handle.join() {
                Err(payload) => std::panic::resume_unwind(payload),
                Ok(_) => unreachable!("a worker that returns sends first"),
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no answer within {limit:?} (a hang)")
        }
    }
}

/// The bound for one case: generous for a debug build on a loaded 2-core machine.
pub const CASE_LIMIT: Duration = Duration::from_secs(20);

/// A placeholder string: the emitters write it, then [`Mutation::apply_text`] swaps the quoted
/// placeholder for a raw literal (numbers JSON and `toml::Value` cannot hold: 2^64, 1e400,
/// nan, unbalanced nesting).
const RAW: &str = "__cairn_fuzz_raw__";

/// What a mutation puts in place of a value.
#[derive(Clone, Debug)]
pub enum Replacement {
    /// Written into the text as is.
    Raw(String),
    /// A JSON value (strings, small structures).
    Value(Json),
}

/// One edit of a document tree.
#[derive(Clone, Debug)]
pub enum Edit {
    /// Remove the key (or array element) at the picked path.
    Delete,
    /// Replace the value at the picked path.
    Set(Replacement),
    /// Add a key to the picked table (or the table holding the picked value).
    AddKey(String, Replacement),
}

/// An edit and where it applies (an index into the document's paths, taken modulo their
/// count, so the same strategy serves every document).
#[derive(Clone, Debug)]
pub struct Mutation {
    pub at: Index,
    pub edit: Edit,
}

/// A path into a JSON tree: object keys and array indices.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Key(String),
    Item(usize),
}

/// Every path in `value` (the root excluded), parents before children.
pub fn paths(value: &Json) -> Vec<Vec<Step>> {
    fn walk(value: &Json, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        match value {
            Json::Object(map) => {
                for (k, v) in map {
                    prefix.push(Step::Key(k.clone()));
                    out.push(prefix.clone());
                    walk(v, prefix, out);
                    prefix.pop();
                }
            }
            Json::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    prefix.push(Step::Item(i));
                    out.push(prefix.clone());
                    walk(v, prefix, out);
                    prefix.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

/// The dotted form of a path (`rows[0].turn`).
pub fn dotted(path: &[Step]) -> String {
    let mut s = String::new();
    for step in path {
        match step {
            Step::Key(k) if s.is_empty() => s.push_str(k),
            Step::Key(k) => {
                s.push('.');
                s.push_str(k);
            }
            Step::Item(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The last key of a path (array indices skipped): what an error should name.
pub fn last_key(path: &[Step]) -> Option<&str> {
    path.iter().rev().find_map(|s| match s {
        Step::Key(k) => Some(k.as_str()),
        Step::Item(_) => None,
    })
}

fn get_mut<'a>(root: &'a mut Json, path: &[Step]) -> Option<&'a mut Json> {
    let mut cur = root;
    for step in path {
        cur = match (step, cur) {
            (Step::Key(k), Json::Object(m)) => m.get_mut(k)?,
            (Step::Item(i), Json::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// What a mutation did: the dotted path it touched and the key an error should name.
#[derive(Clone, Debug)]
pub struct Touched {
    pub path: String,
    pub key: Option<String>,
    /// The raw literal written there, if any.
    pub raw: Option<String>,
    /// Keys inside the value written there (an error may name one of those instead).
    pub inner_keys: Vec<String>,
    /// The value written holds a number of magnitude above 1e6 (arithmetic on it may
    /// overflow, as the user asked).
    pub huge: bool,
}

impl Mutation {
    /// Applies the edit to `doc`; the raw literal, if any, is for [`apply_text`].
    pub fn apply(&self, doc: &mut Json) -> Touched {
        let all = paths(doc);
        if all.is_empty() {
            return Touched {
                path: String::new(),
                key: None,
                raw: None,
                inner_keys: Vec::new(),
                huge: false,
            };
        }
        let path = all[self.at.index(all.len())].clone();
        let (parent_path, last) = path.split_at(path.len() - 1);
        let placeholder = |r: &Replacement| match r {
            Replacement::Raw(raw) => (Json::String(RAW.into()), Some(raw.clone())),
            Replacement::Value(v) => (v.clone(), None),
        };
        match &self.edit {
            Edit::Delete => {
                let parent = get_mut(doc, parent_path).expect("a listed path");
                match (parent, &last[0]) {
                    (Json::Object(m), Step::Key(k)) => {
                        m.shift_remove(k);
                    }
                    (Json::Array(a), Step::Item(i)) => {
                        a.remove(*i);
                    }
                    _ => unreachable!("paths match their parents"),
                }
                touched(&path, None, None)
            }
            Edit::Set(r) => {
                let (value, raw) = placeholder(r);
                let inner = Some(&value);
                let t = touched(&path, raw, inner);
                *get_mut(doc, &path).expect("a listed path") = value;
                t
            }
            Edit::AddKey(key, r) => {
                let (value, raw) = placeholder(r);
                let inner = value.clone();
                // The picked value if it is a table, else the table or array holding it.
                let target: Vec<Step> = match get_mut(doc, &path) {
                    Some(Json::Object(_)) => path.clone(),
                    _ => parent_path.to_vec(),
                };
                let mut added = target.clone();
                match get_mut(doc, &target).expect("a listed path") {
                    Json::Object(m) => {
                        m.insert(key.clone(), value);
                        added.push(Step::Key(key.clone()));
                    }
                    // An array: the extra key goes into a new table element, which is what an
                    // error names (`rows[4]`).
                    Json::Array(a) => {
                        let mut m = Map::new();
                        m.insert(key.clone(), value);
                        a.push(Json::Object(m));
                        added.push(Step::Item(a.len() - 1));
                    }
                    _ => unreachable!("the target holds the picked path"),
                }
                touched(&added, raw, Some(&inner))
            }
        }
    }
}

fn touched(path: &[Step], raw: Option<String>, value: Option<&Json>) -> Touched {
    let inner_keys = value
        .map(|v| {
            paths(v)
                .iter()
                .filter_map(|p| last_key(p).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    fn has_huge(v: &Json) -> bool {
        match v {
            Json::Number(n) => n.as_f64().is_some_and(|x| x.abs() > 1e6),
            Json::Array(a) => a.iter().any(has_huge),
            Json::Object(m) => m.values().any(has_huge),
            _ => false,
        }
    }
    let huge = value.is_some_and(has_huge)
        || raw
            .as_deref()
            .and_then(|r| r.parse::<f64>().ok())
            .is_some_and(|x| x.is_nan() || x.abs() > 1e6);
    Touched {
        path: dotted(path),
        key: last_key(path).map(str::to_owned),
        raw,
        inner_keys,
        huge,
    }
}

/// Puts the raw literals into an emitted text: each quoted placeholder, in order.
pub fn apply_text(mut text: String, raws: &[String]) -> String {
    for raw in raws {
        // TOML may write the placeholder as a basic or a literal string.
        for quoted in [format!("\"{RAW}\""), format!("'{RAW}'")] {
            if let Some(at) = text.find(&quoted) {
                text.replace_range(at..at + quoted.len(), raw);
                break;
            }
        }
    }
    text
}

/// Extreme and odd literals, valid in both TOML and JSON unless noted by the caller.
pub const EXTREME_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "0.0",
    "-0.0",
    "0.5",
    "1e308",
    "-1e308",
    "5e-324",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "1e400",
    "-1e400",
];

/// Literals only TOML has.
pub const TOML_ONLY: &[&str] = &["inf", "-inf", "nan", "+nan", "1979-05-27T07:32:00Z"];

/// Strings: empty, whitespace, unicode, control characters, long, path-like, numeric-looking.
pub fn any_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("../../etc/passwd".to_string()),
        Just("1e308".to_string()),
        Just("nan".to_string()),
        Just("\u{0}\u{1b}[31m\u{202e}".to_string()),
        Just("x".repeat(10_000)),
        "[a-z_]{1,12}",
        "\\PC{0,24}",
        any::<String>(),
    ]
}

/// Replacement values: extreme numbers, strings, type changes, junk structures.
pub fn replacement(toml: bool) -> impl Strategy<Value = Replacement> {
    let mut raws: Vec<String> = EXTREME_NUMBERS.iter().map(|s| s.to_string()).collect();
    if toml {
        raws.extend(TOML_ONLY.iter().map(|s| s.to_string()));
        raws.push("[[[[[[[[[[1]]]]]]]]]]".into());
    } else {
        // Past serde_json's recursion limit (128).
        raws.push(format!("{}{}", "[".repeat(300), "]".repeat(300)));
        raws.push("null".into());
    }
    let leaf = prop_oneof![
        any::<bool>().prop_map(Json::from),
        any::<i64>().prop_map(Json::from),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(Json::from),
        any_string().prop_map(Json::from),
    ];
    let structure = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Json::Object(kv.into_iter().collect())),
        ]
    });
    prop_oneof![
        3 => prop::sample::select(raws).prop_map(Replacement::Raw),
        3 => structure.prop_map(Replacement::Value),
    ]
}

/// Key names for added keys: plausible typos, real names in the wrong place, junk.
pub fn extra_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "lr",
            "seed",
            "plugin",
            "config",
            "steps",
            "max_turns",
            "temperature",
            "model",
            "dir",
            "rows",
            "messages",
            "prompt",
            "n",
            "max_tokens",
            "group_size",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,12}",
    ]
}

pub fn mutation(toml: bool) -> impl Strategy<Value = Mutation> {
    let edit = prop_oneof![
        2 => Just(Edit::Delete),
        5 => replacement(toml).prop_map(Edit::Set),
        2 => (extra_key(), replacement(toml)).prop_map(|(k, r)| Edit::AddKey(k, r)),
    ];
    (any::<Index>(), edit).prop_map(|(at, edit)| Mutation { at, edit })
}

/// Applies `mutations` in order to `doc`; returns what each touched and the raw literals to
/// put into the emitted text.
pub fn mutate(doc: &mut Json, mutations: &[Mutation]) -> (Vec<Touched>, Vec<String>) {
    let touched: Vec<Touched> = mutations.iter().map(|m| m.apply(doc)).collect();
    let raws = touched.iter().filter_map(|t| t.raw.clone()).collect();
    (touched, raws)
}

/// Whether `message` names one of the touched keys (its last segment or its dotted path), or
/// a key inside a value the mutation wrote.
pub fn names_a_touched_key(message: &str, touched: &[Touched]) -> bool {
    touched.iter().any(|t| {
        t.key.as_deref().is_some_and(|k| message.contains(k))
            || (!t.path.is_empty() && message.contains(&t.path))
            || t.inner_keys
                .iter()
                .any(|k| message.contains(&format!("`{k}`")))
    })
}
