//! No module cycles (issue 27 §2), checked on the import graph of every crate of the workspace.
//!
//! The graph: a node per module file (see [`super::source`]); an edge from a file to every
//! other module file of its crate that its non-test code names (`use` paths and qualified paths
//! in code and macros).
//!
//! The rule: a module and its own descendants may name each other freely (`gateway/mod.rs`
//! re-exports `store::EpisodeStore`, `store.rs` uses `super::Route`): that is how a Rust
//! module is put together. A cycle counts when it runs between sibling subtrees. For every
//! module `P`, child `a` of `P` depends on child `b` when any file under `a` names any file
//! under `b`; a strongly connected set of two or more children of `P` is one cycle, written
//! `crate::P::{a, b}`. At the crate root this is the graph of the crate's top-level
//! subsystems (`config`, `actors`, `gateway`, `skills`): a cycle there means no one of them
//! can be read alone or moved to a crate of its own. Cycles that only pass through a parent's
//! own file (`store` → `mod.rs` → `sampler` → `store`) are not counted.
//!
//! [`KNOWN_CYCLES`] lists today's cycles exactly: the test fails on a new cycle, on a listed one
//! that grew or shrank, and on a listed one that is gone, so the list stays true and only
//! shrinks as the cycles are cut.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::source::{workspace, Crate, ModPath};

/// The module cycles of the workspace today, as [`Cycle`]'s `Display` writes them. Issue 27
/// removes them; delete an entry when its cycle is cut (the test prints the current set).
const KNOWN_CYCLES: &[&str] = &[];

/// Children of one module that depend on each other in a circle.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cycle {
    /// The crate's root file, workspace-relative.
    root: String,
    /// The module whose children these are.
    parent: ModPath,
    /// The children's names, sorted.
    members: Vec<String>,
}

impl Cycle {
    /// `kernel/src/lib.rs: crate::gateway`, the part before the member list.
    fn place(&self) -> String {
        let parent: String = self.parent.iter().map(|s| format!("::{s}")).collect();
        format!("{}: crate{parent}", self.root)
    }
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}::{{{}}}", self.place(), self.members.join(", "))
    }
}

/// A cycle with, for each dependency inside it, the first file-level mention that makes it
/// (`kernel/src/config.rs:12 names kernel/src/gateway/mod.rs`).
struct Found {
    cycle: Cycle,
    evidence: Vec<String>,
}

/// The strongly connected components of a directed graph with two or more nodes each (Tarjan),
/// each sorted, in the order of their smallest node.
fn strongly_connected<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<'g, N> {
        edges: &'g BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on_stack: BTreeSet<N>,
        components: Vec<Vec<N>>,
    }
    fn connect<N: Ord + Clone>(state: &mut State<'_, N>, node: &N) {
        let next = state.index.len();
        state.index.insert(node.clone(), next);
        state.low.insert(node.clone(), next);
        state.stack.push(node.clone());
        state.on_stack.insert(node.clone());
        for to in state.edges.get(node).into_iter().flatten() {
            if !state.index.contains_key(to) {
                connect(state, to);
                let low = state.low[node].min(state.low[to]);
                state.low.insert(node.clone(), low);
            } else if state.on_stack.contains(to) {
                let low = state.low[node].min(state.index[to]);
                state.low.insert(node.clone(), low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            loop {
                let top = state.stack.pop().expect("the node is on the stack");
                state.on_stack.remove(&top);
                let done = &top == node;
                component.push(top);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.components.push(component);
            }
        }
    }
    let nodes: BTreeSet<&N> = edges.keys().chain(edges.values().flatten()).collect();
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for node in nodes {
        if !state.index.contains_key(node) {
            connect(&mut state, node);
        }
    }
    state.components.sort();
    state.components
}

/// The cycles between sibling subtrees of `krate`, at every level of its module tree.
fn sibling_cycles(krate: &Crate) -> Vec<Found> {
    let parents: BTreeSet<&[String]> = krate
        .files
        .keys()
        .filter_map(|m| m.split_last().map(|(_, parent)| parent))
        .collect();
    let under = |m: &ModPath, parent: &[String]| m.len() > parent.len() && m.starts_with(parent);
    let mut found = Vec::new();
    for parent in parents {
        let depth = parent.len();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut first: BTreeMap<(String, String), String> = BTreeMap::new();
        for (from, facts) in &krate.facts {
            if !under(from, parent) {
                continue;
            }
            for (to, line) in &facts.names {
                if !under(to, parent) || from[depth] == to[depth] {
                    continue;
                }
                let (a, b) = (&from[depth], &to[depth]);
                edges.entry(a.clone()).or_default().insert(b.clone());
                first.entry((a.clone(), b.clone())).or_insert_with(|| {
                    format!(
                        "{a} → {b}: {}:{line} names {}",
                        krate.file(from).display(),
                        krate.file(to).display()
                    )
                });
            }
        }
        for members in strongly_connected(&edges) {
            let evidence = first
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|(_, e)| e.clone())
                .collect();
            found.push(Found {
                cycle: Cycle {
                    root: krate.root.display().to_string(),
                    parent: parent.to_vec(),
                    members,
                },
                evidence,
            });
        }
    }
    found
}

/// How the cycles found differ from `known` (entries as [`Cycle`]'s `Display` writes them);
/// one line (plus evidence) per difference.
fn cycle_problems(found: &[Found], known: &[&str]) -> Vec<String> {
    let members = |s: &str| -> (String, BTreeSet<String>) {
        let (place, list) = s.split_once("::{").unwrap_or((s, ""));
        let list = list.trim_end_matches('}');
        (
            place.to_string(),
            list.split(", ").map(str::to_string).collect(),
        )
    };
    let found_text: BTreeSet<String> = found.iter().map(|f| f.cycle.to_string()).collect();
    let mut problems = Vec::new();
    let mut explained = BTreeSet::new();
    for listed in known.iter().filter(|k| !found_text.contains(**k)) {
        let (place, listed_members) = members(listed);
        let now: Vec<&Found> = found
            .iter()
            .filter(|f| f.cycle.place() == place && !known.contains(&&*f.cycle.to_string()))
            .filter(|f| {
                let m: BTreeSet<String> = f.cycle.members.iter().cloned().collect();
                m.is_subset(&listed_members) || m.is_superset(&listed_members)
            })
            .collect();
        if now.is_empty() {
            problems.push(format!(
                "`{listed}` is gone: remove it from KNOWN_CYCLES in {}",
                file!()
            ));
        }
        for f in now {
            explained.insert(f.cycle.to_string());
            let grew = f.cycle.members.len() > listed_members.len();
            problems.push(format!(
                "`{listed}` {} to `{}`{}",
                if grew { "grew" } else { "shrank" },
                f.cycle,
                if grew {
                    format!(
                        ": cut the new dependencies; the cycle's edges:\n    {}",
                        f.evidence.join("\n    ")
                    )
                } else {
                    format!(": write the new set into KNOWN_CYCLES in {}", file!())
                }
            ));
        }
    }
    for f in found {
        let text = f.cycle.to_string();
        if known.contains(&text.as_str()) || explained.contains(&text) {
            continue;
        }
        problems.push(format!(
            "new module cycle `{text}`: cut one of its edges (move the shared type to the module \
             both sides use, or pass it in):\n    {}",
            f.evidence.join("\n    ")
        ));
    }
    problems
}

#[test]
fn module_graph_has_only_the_known_cycles() {
    let found: Vec<Found> = workspace().iter().flat_map(sibling_cycles).collect();
    let problems = cycle_problems(&found, KNOWN_CYCLES);
    assert!(
        problems.is_empty(),
        "{}\n\nthe module cycles now:\n{}",
        problems.join("\n"),
        found
            .iter()
            .map(|f| format!("    \"{}\",", f.cycle))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Loads an in-memory crate rooted at `src/lib.rs` from `(path, text)` pairs.
fn fixture(files: &[(&str, &str)]) -> Crate {
    let files: BTreeMap<&Path, &str> = files.iter().map(|(p, t)| (Path::new(*p), *t)).collect();
    let read = |p: &Path| files.get(p).map(|t| t.to_string());
    Crate::load(
        Path::new("src/lib.rs"),
        Some("fixture".into()),
        false,
        &read,
    )
    .expect("the fixture loads")
}

#[test]
fn tarjan_finds_a_cycle_and_only_cycles() {
    fn graph(pairs: &[(&'static str, &'static str)]) -> Vec<Vec<&'static str>> {
        let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (a, b) in pairs {
            edges.entry(*a).or_default().insert(*b);
        }
        strongly_connected(&edges)
    }
    assert_eq!(graph(&[("a", "b"), ("b", "a")]), [["a", "b"]]);
    assert_eq!(
        graph(&[("a", "b"), ("b", "c"), ("a", "c")]),
        Vec::<Vec<&str>>::new()
    );
    assert_eq!(
        graph(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "d")
        ]),
        [vec!["a", "b", "c"], vec!["d", "e"]]
    );
}

#[test]
fn cycle_check_catches_a_cycle_between_sibling_modules() {
    let lib = "mod a;\nmod b;\nmod c;\n";
    let cycles = |files: &[(&str, &str)]| -> Vec<String> {
        sibling_cycles(&fixture(files))
            .iter()
            .map(|f| f.cycle.to_string())
            .collect()
    };
    // a → b → a, through a `use` and a qualified path inside a macro.
    let with_cycle = [
        ("src/lib.rs", lib),
        ("src/a.rs", "use crate::b::X;\npub fn g() -> X { X }\n"),
        (
            "src/b.rs",
            "pub struct X;\npub fn f() { println!(\"{:?}\", super::a::g()); }\n",
        ),
        ("src/c.rs", "pub fn h() { crate::a::g(); }\n"),
    ];
    assert_eq!(cycles(&with_cycle), ["src/lib.rs: crate::{a, b}"]);
    let found = sibling_cycles(&fixture(&with_cycle));
    assert_eq!(
        found[0].evidence,
        [
            "a → b: src/a.rs:1 names src/b.rs",
            "b → a: src/b.rs:2 names src/a.rs"
        ]
    );
    // The same without b's back edge; test code does not count.
    let without = [
        ("src/lib.rs", lib),
        ("src/a.rs", "use crate::b::X;\npub fn g() -> X { X }\n"),
        (
            "src/b.rs",
            "pub struct X;\n#[cfg(test)]\nmod tests { use crate::a::g; }\n",
        ),
        ("src/c.rs", "pub fn h() { crate::a::g(); }\n"),
    ];
    assert_eq!(cycles(&without), Vec::<String>::new());
}

#[test]
fn cycle_rule_allows_parent_and_child_and_catches_a_cycle_through_a_reexport() {
    // gateway/mod.rs re-exports its child, the child uses its parent: allowed.
    let gateway = "mod store;\npub use store::Store;\npub struct Route;\n";
    let store = "use super::Route;\npub struct Store(Route);\n";
    let files = [
        ("src/lib.rs", "mod config;\nmod gateway;\n"),
        ("src/gateway/mod.rs", gateway),
        ("src/gateway/store.rs", store),
        ("src/config.rs", "pub struct Config;\n"),
    ];
    assert!(sibling_cycles(&fixture(&files)).is_empty());
    // config names the gateway's re-export, the gateway's child names config: a cycle between
    // the top-level modules, though no two files name each other.
    let store = "use super::Route;\npub struct Store(Route, crate::config::Config);\n";
    let files = [
        ("src/lib.rs", "mod config;\nmod gateway;\n"),
        ("src/gateway/mod.rs", gateway),
        ("src/gateway/store.rs", store),
        (
            "src/config.rs",
            "pub struct Config(crate::gateway::Store);\n",
        ),
    ];
    let found = sibling_cycles(&fixture(&files));
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].cycle.to_string(),
        "src/lib.rs: crate::{config, gateway}"
    );
    assert_eq!(
        found[0].evidence,
        [
            "config → gateway: src/config.rs:1 names src/gateway/mod.rs",
            "gateway → config: src/gateway/store.rs:2 names src/config.rs"
        ]
    );
}

#[test]
fn cycle_list_must_match_exactly() {
    let cycle = |members: &[&str]| Found {
        cycle: Cycle {
            root: "src/lib.rs".into(),
            parent: vec![],
            members: members.iter().map(|s| s.to_string()).collect(),
        },
        evidence: vec!["a → b: src/a.rs:1 names src/b.rs".into()],
    };
    let ab = "src/lib.rs: crate::{a, b}";
    assert_eq!(
        cycle_problems(&[cycle(&["a", "b"])], &[ab]),
        Vec::<String>::new()
    );
    let new = cycle_problems(&[cycle(&["a", "b"])], &[]);
    assert!(
        new[0].starts_with("new module cycle `src/lib.rs: crate::{a, b}`"),
        "{new:?}"
    );
    let grew = cycle_problems(&[cycle(&["a", "b", "c"])], &[ab]);
    assert!(
        grew.len() == 1
            && grew[0].starts_with(
                "`src/lib.rs: crate::{a, b}` grew to `src/lib.rs: crate::{a, b, c}`: cut"
            ),
        "{grew:?}"
    );
    let shrank = cycle_problems(&[cycle(&["a", "b"])], &["src/lib.rs: crate::{a, b, c}"]);
    assert!(
        shrank.len() == 1
            && shrank[0].starts_with(
                "`src/lib.rs: crate::{a, b, c}` shrank to `src/lib.rs: crate::{a, b}`: write"
            ),
        "{shrank:?}"
    );
    let gone = cycle_problems(&[], &[ab]);
    assert!(
        gone.len() == 1 && gone[0].starts_with("`src/lib.rs: crate::{a, b}` is gone: remove it"),
        "{gone:?}"
    );
}
