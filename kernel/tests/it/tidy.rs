//! Repository tidiness, checked from the sources themselves:
//!
//! - the crate-graph invariants of `ARCHITECTURE.md`, from `cargo metadata` (offline): plugins
//!   and the SDK never reach tch or the kernel, the kernel never reaches tch, only the backend,
//!   the host and the benchmarks reach tch, only the SDK names abi_stable in its manifest, and
//!   only the host depends on actix-web;
//! - every relative link in every tracked Markdown file resolves to a file or directory of the
//!   repository (the `#anchor` part is ignored: headings move more often than files, and a
//!   broken anchor still lands on the right page);
//! - no tracked file points outside the repository at the development share or its design
//!   notes: the specs the code relies on live in `docs/`;
//! - from the parsed Rust sources ([`source`]): no new module cycle ([`cycles`]), and blocking
//!   waits, actor starts and HTTP crates only where their allow-lists say ([`places`]).
//!
//! Each check is a function returning its problems, and each has a test that feeds it a broken
//! input, so a check that silently stopped checking would fail too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

mod cycles;
mod places;
mod source;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("kernel/ sits in the workspace root")
        .to_path_buf()
}

// ---------------------------------------------------------------- crate graph

/// The workspace's dependency graph: workspace member names, and for every package its direct
/// normal (not dev, not build) dependencies, by package name.
struct Graph {
    members: BTreeMap<String, PathBuf>,
    normal: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn from_metadata(metadata: &Json) -> Graph {
        let packages = metadata["packages"].as_array().expect("packages");
        let names: BTreeMap<&str, &str> = packages
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().expect("id"),
                    p["name"].as_str().expect("name"),
                )
            })
            .collect();
        let members = metadata["workspace_members"]
            .as_array()
            .expect("workspace_members")
            .iter()
            .map(|id| {
                let id = id.as_str().expect("member id");
                let package = packages
                    .iter()
                    .find(|p| p["id"] == id)
                    .expect("member package");
                let manifest = PathBuf::from(package["manifest_path"].as_str().expect("manifest"));
                (names[id].to_string(), manifest)
            })
            .collect();
        let mut normal = BTreeMap::new();
        for node in metadata["resolve"]["nodes"]
            .as_array()
            .expect("resolve.nodes")
        {
            let deps = node["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .expect("dep_kinds")
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| names[d["pkg"].as_str().expect("pkg")].to_string())
                .collect();
            normal.insert(names[node["id"].as_str().expect("id")].to_string(), deps);
        }
        Graph { members, normal }
    }

    /// Every package `name` reaches through normal dependencies (itself excluded).
    fn closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![name.to_string()];
        while let Some(next) = stack.pop() {
            for dep in self.normal.get(&next).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    stack.push(dep.clone());
                }
            }
        }
        seen
    }
}

/// The ARCHITECTURE.md invariants on the crate graph; one line per violation.
fn graph_problems(graph: &Graph) -> Vec<String> {
    const TORCH: [&str; 2] = ["tch", "torch-sys"];
    const MAY_REACH_TCH: [&str; 3] = ["cairn-torch", "cairn", "cairn-bench"];
    let root = workspace_root();
    let mut problems = Vec::new();
    for (name, manifest) in &graph.members {
        let reach = graph.closure(name);
        let direct = graph.normal.get(name).cloned().unwrap_or_default();
        let in_plugins = manifest.starts_with(root.join("plugins"));
        if in_plugins || name == "cairn-plugin-sdk" {
            for bad in TORCH.iter().chain(&["cairn-kernel", "cairn-torch"]) {
                if reach.contains(*bad) {
                    problems.push(format!(
                        "`{name}` depends on `{bad}`: plugins and the SDK see token ids, f32 \
                         arrays and JSON only"
                    ));
                }
            }
        }
        for bad in TORCH {
            if reach.contains(bad) && !MAY_REACH_TCH.contains(&name.as_str()) {
                problems.push(format!(
                    "`{name}` depends on `{bad}`: only {MAY_REACH_TCH:?} may link libtorch"
                ));
            }
        }
        if direct.contains("abi_stable") && name != "cairn-plugin-sdk" {
            problems.push(format!(
                "`{name}` depends on abi_stable directly: only cairn-plugin-sdk names its types"
            ));
        }
        if direct.contains("actix-web") && name != "cairn" {
            problems.push(format!(
                "`{name}` depends on actix-web: the HTTP server lives in hosts/cairn only"
            ));
        }
        if name == "cairn-kernel" && reach.contains("actix-web") {
            problems.push("`cairn-kernel` reaches actix-web: the gateway is HTTP-free".into());
        }
        if name == "cairn-gguf" {
            for bad in direct.iter().filter(|d| d.starts_with("cairn")) {
                problems.push(format!(
                    "`cairn-gguf` depends on `{bad}`: the importer stands alone (a GGUF file in, \
                     a Hugging Face directory out)"
                ));
            }
        }
    }
    problems
}

fn cargo_metadata() -> Json {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(workspace_root().join("Cargo.toml"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

#[test]
fn crate_graph_keeps_the_architecture_invariants() {
    let graph = Graph::from_metadata(&cargo_metadata());
    for crate_name in [
        "cairn-plugin-sdk",
        "cairn-kernel",
        "cairn-torch",
        "cairn-grpo",
        "cairn-gguf",
    ] {
        assert!(
            graph.members.contains_key(crate_name),
            "{crate_name} is a member"
        );
    }
    assert!(
        graph.closure("cairn-torch").contains("tch"),
        "the graph has edges"
    );
    assert_eq!(graph_problems(&graph), Vec::<String>::new());
}

#[test]
fn graph_check_catches_a_plugin_that_reaches_tch() {
    let mut graph = Graph::from_metadata(&cargo_metadata());
    graph
        .normal
        .get_mut("cairn-grpo")
        .expect("grpo")
        .insert("cairn-torch".into());
    graph
        .normal
        .get_mut("cairn-household")
        .expect("household")
        .insert("abi_stable".into());
    graph
        .normal
        .get_mut("cairn-gguf")
        .expect("gguf")
        .insert("cairn-kernel".into());
    let problems = graph_problems(&graph);
    assert!(
        problems.contains(&"`cairn-grpo` depends on `tch`: plugins and the SDK see token ids, f32 arrays and JSON only".to_string())
            && problems.contains(&"`cairn-grpo` depends on `tch`: only [\"cairn-torch\", \"cairn\", \"cairn-bench\"] may link libtorch".to_string())
            && problems.contains(&"`cairn-household` depends on abi_stable directly: only cairn-plugin-sdk names its types".to_string())
            && problems.contains(&"`cairn-gguf` depends on `cairn-kernel`: the importer stands alone (a GGUF file in, a Hugging Face directory out)".to_string()),
        "{problems:#?}"
    );
}

// ---------------------------------------------------------------- files

/// Files git tracks or would add (untracked but not ignored), relative to the root; without git
/// (an exported tarball), every file outside dot-directories, `target/` and `runs/`.
fn repo_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let git = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(&root)
        .output();
    if let Some(out) = git.ok().filter(|o| o.status.success()) {
        return out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
            .filter(|p| root.join(p).is_file())
            .collect();
    }
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&dir)).expect("readable") {
            let entry = entry.expect("entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = dir.join(&name);
            if entry.path().is_dir() {
                if !name.starts_with('.') && name != "target" && name != "runs" {
                    stack.push(rel);
                }
            } else {
                files.push(rel);
            }
        }
    }
    files
}

/// The link targets of a Markdown text: inline `[text](target)` and reference definitions
/// `[id]: target`, outside fenced code blocks and inline code spans.
fn markdown_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code spans.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let trimmed = prose.trim_start();
        if trimmed.starts_with('[') {
            if let Some((_, rest)) = trimmed.split_once("]: ") {
                links.push(rest.split_whitespace().next().unwrap_or("").to_string());
                continue;
            }
        }
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            links.push(
                after[..end]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
            rest = &after[end..];
        }
    }
    links
}

/// Relative links of `file` (repository-relative) whose target does not exist.
fn broken_links(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    markdown_links(text)
        .into_iter()
        .filter(|link| {
            let link = link.trim_start_matches('<').trim_end_matches('>');
            !(link.is_empty()
                || link.starts_with('#')
                || link.contains("://")
                || link.starts_with("mailto:"))
        })
        .filter(|link| {
            let path = link.split('#').next().unwrap_or(link);
            let target = if let Some(abs) = path.strip_prefix('/') {
                root.join(abs)
            } else {
                root.join(dir).join(path)
            };
            !target.exists()
        })
        .map(|link| format!("{}: link `{link}` does not resolve", file.display()))
        .collect()
}

#[test]
fn every_relative_markdown_link_resolves() {
    let root = workspace_root();
    let markdown: Vec<PathBuf> = repo_files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    assert!(
        markdown.iter().any(|p| p == Path::new("ARCHITECTURE.md")),
        "the file list holds the docs"
    );
    let problems: Vec<String> = markdown
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(root.join(file)).expect("Markdown is UTF-8");
            broken_links(&root, file, &text)
        })
        .collect();
    assert_eq!(problems, Vec::<String>::new());
}

#[test]
fn link_check_catches_a_broken_link() {
    let root = workspace_root();
    let text = "See [the guide](plugin-sdk/README.md#errors), [gone](docs/nowhere.md), \
                [web](https://example.com), `[code](not/a/link.md)`, [top](#layout).\n\
                [ref]: docs/missing.md\n```\n[fenced](also/not/checked.md)\n```\n";
    assert_eq!(
        broken_links(&root, Path::new("README.md"), text),
        [
            "README.md: link `docs/nowhere.md` does not resolve",
            "README.md: link `docs/missing.md` does not resolve"
        ]
    );
    // Relative to the linking file's directory.
    assert_eq!(
        broken_links(
            &root,
            Path::new("docs/x.md"),
            "[up](../README.md) [here](gateway.md)"
        ),
        Vec::<String>::new()
    );
}

/// Text that points at the development share outside the repository. Spelt in pieces so this
/// file does not match itself.
fn outside_pointers() -> [String; 6] {
    let share = ["..", "/shared"].concat();
    [
        share,
        ["algorithms", ".md"].concat(),
        ["shared/", "cases"].concat(),
        ["shared/", "design"].concat(),
        ["shared/", "tokenizers"].concat(),
        ["bugs", ".json"].concat(),
    ]
}

fn pointer_problems(file: &Path, bytes: &[u8]) -> Vec<String> {
    outside_pointers()
        .iter()
        .filter(|needle| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .map(|needle| {
            format!(
                "{} mentions `{needle}`: cite the repository's docs (docs/, docs/algorithms/) \
                 and the paper instead",
                file.display()
            )
        })
        .collect()
}

#[test]
fn no_file_points_outside_the_repository() {
    let root = workspace_root();
    let files = repo_files();
    assert!(files.len() > 50, "the file list holds the sources");
    let problems: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let bytes = std::fs::read(root.join(file)).expect("readable");
            pointer_problems(file, &bytes)
        })
        .collect();
    assert_eq!(problems, Vec::<String>::new());
}

#[test]
fn pointer_check_catches_a_pointer() {
    let text = format!("see {} §2", ["algorithms", ".md"].concat());
    assert_eq!(
        pointer_problems(Path::new("x.rs"), text.as_bytes()),
        [format!(
            "x.rs mentions `{}`: cite the repository's docs (docs/, docs/algorithms/) and the \
             paper instead",
            ["algorithms", ".md"].concat()
        )]
    );
}
