//! Where three kinds of code may live, per file, in the non-test code of every crate
//! (issue 27 §1 and §5):
//!
//! - **blocking waits**: `block_on(..)`, as a function (`futures::executor::block_on`: waits
//!   for a future, such as an actor's answer) or a method (`System::new().block_on`: a process
//!   entry runs its actix system), and every call by path of a blocking helper, a function
//!   whose own body calls the function form (the kernel's `ask` for the plugins' host
//!   callbacks). A handler that blocks on another actor stalls its thread; [`BLOCKING_WAITS`]
//!   holds the exact count per file, so a new wait fails and a removed one asks for the count
//!   to be lowered;
//! - **actor starts**: `SyncArbiter::start`, `Supervisor::start`, `Arbiter::new`,
//!   `HttpServer::new` (it starts worker arbiters), `Actor::create`/`start_default`/
//!   `start_in_arbiter`, and in crates that depend on actix `.start()` and `.start(factory)`
//!   (`SyncThreads::start`). [`ACTOR_STARTS`] lists the files;
//! - **HTTP crates** (actix-web, awc, reqwest, ureq, hyper, http, ...): paths that start with
//!   one, in `use` or in code. [`HTTP_USERS`] lists the files and folders.
//!
//! Each entry carries its reason. A file not listed fails, and so does an entry that no longer
//! matches anything, so the lists stay exact.

use std::collections::{BTreeMap, BTreeSet};

use super::source::{workspace, Crate, Facts, SiteKind};

/// Blocking waits per file: (file, count, why). Issue 27 §1 brings the kernel's down to at
/// most 3, each documented here.
const BLOCKING_WAITS: &[(&str, usize, &str)] = &[
    (
        "benches/src/bank_actor.rs",
        1,
        "the benchmark's entry: runs its actix system on the main thread",
    ),
    (
        "benches/src/pipeline.rs",
        1,
        "the benchmark's entry: runs the pipeline's actix system on the main thread",
    ),
    (
        "hosts/cairn/src/lifecycle.rs",
        1,
        "the process entry (`on_actor_system`): `train`, `eval` and `serve` run their actix \
         system on the main thread",
    ),
    (
        "hosts/cairn/src/ui/mod.rs",
        1,
        "the process entry of `cairn ui`: the HTTP server's actix system on the main thread",
    ),
    (
        "kernel/src/actors/host.rs",
        8,
        "`ask` (its `block_on` and 7 calls): a plugin's host callbacks are synchronous (the \
         ABI has no futures), so generate, score, bank and skill calls wait for the answer",
    ),
    (
        "kernel/src/skills/policy.rs",
        1,
        "the `policy` reflector generates with the policy actor from the reflector's own \
         SyncArbiter thread",
    ),
];

/// Files that start actors or arbiter threads: (file, why).
const ACTOR_STARTS: &[(&str, &str)] = &[
    (
        "kernel/src/actors/mod.rs",
        "`start`: the one function that wires the pipeline's actors",
    ),
    (
        "kernel/src/actors/threads.rs",
        "`SyncThreads::start`, through which every `SyncArbiter` actor starts so the host can \
         wait for its thread",
    ),
    (
        "kernel/src/actors/skills.rs",
        "the skill creator starts its reflector's own `SyncArbiter` thread",
    ),
    (
        "kernel/gateway/src/engine/mod.rs",
        "`EngineActor::starter`: the closure `start` calls to start the engine's actor beside \
         the policy actor (the kernel cannot name the engine's type)",
    ),
    (
        "hosts/cairn/src/serve/mod.rs",
        "`cairn serve`: the policy and the gateway's sampler and episode store, and the HTTP \
         server",
    ),
    ("hosts/cairn/src/ui/mod.rs", "`cairn ui`: the HTTP server"),
    (
        "benches/src/bank_actor.rs",
        "the bank actor's benchmark starts that actor alone",
    ),
];

/// The crates that speak HTTP, by the name code uses for them.
const HTTP_CRATES: &[&str] = &[
    "actix_web",
    "actix_http",
    "awc",
    "reqwest",
    "ureq",
    "hyper",
    "http",
    "h2",
    "isahc",
    "surf",
    "attohttpc",
    "curl",
    "tiny_http",
];

/// Files (or folders, ending in `/`) that may use an HTTP crate: (place, why).
const HTTP_USERS: &[(&str, &str)] = &[
    (
        "kernel/gateway/src/engine/client.rs",
        "the external rollout engine's client (ureq)",
    ),
    (
        "kernel/src/skills/endpoint.rs",
        "the `endpoint` reflector calls an OpenAI-compatible endpoint (ureq)",
    ),
    (
        "hosts/cairn/src/engine.rs",
        "waits for a launched engine's `GET /health` (ureq)",
    ),
    (
        "hosts/cairn/src/serve/",
        "`cairn serve`: the gateway's HTTP server (actix-web)",
    ),
    ("hosts/cairn/src/ui/", "`cairn ui`: the web UI (actix-web)"),
    (
        "hosts/cairn/src/access.rs",
        "the access middleware of the gateway's and the dashboard's servers (actix-web)",
    ),
];

/// For every module file of `crates` (once, though a package's library and binary may share
/// files), the (line, what) pairs `pick` finds in its facts; files with none are left out.
fn by_file(
    crates: &[Crate],
    pick: impl Fn(&Facts) -> Vec<(usize, String)>,
) -> BTreeMap<String, Vec<(usize, String)>> {
    let mut files = BTreeMap::new();
    for krate in crates {
        for (module, facts) in &krate.facts {
            let file = krate.file(module).display().to_string();
            if files.contains_key(&file) {
                continue;
            }
            let mut found = pick(facts);
            found.sort();
            files.insert(file, found);
        }
    }
    files.retain(|_, found| !found.is_empty());
    files
}

/// Per file, its `block_on` calls and its calls of the blocking helpers of `crates`.
fn blocking_waits(crates: &[Crate]) -> BTreeMap<String, Vec<(usize, String)>> {
    let helpers: BTreeSet<&Vec<String>> = crates
        .iter()
        .flat_map(|c| c.facts.values())
        .flat_map(|f| &f.blocking_fns)
        .collect();
    by_file(crates, |facts| {
        let block_on = facts
            .sites
            .iter()
            .filter(|s| s.kind == SiteKind::BlockOn)
            .map(|s| (s.line, "block_on".to_string()));
        let helper_calls = facts
            .calls
            .iter()
            .filter(|(target, _)| helpers.contains(target))
            .map(|(target, line)| (*line, target[1..].join("::")));
        block_on.chain(helper_calls).collect()
    })
}

fn actor_starts(facts: &Facts) -> Vec<(usize, String)> {
    facts
        .sites
        .iter()
        .filter_map(|s| match s.kind {
            SiteKind::ActorStart(form) => Some((s.line, form.to_string())),
            _ => None,
        })
        .collect()
}

fn http_uses(facts: &Facts) -> Vec<(usize, String)> {
    facts
        .externs
        .iter()
        .filter(|(krate, _)| HTTP_CRATES.contains(&krate.as_str()))
        .map(|(krate, line)| (*line, krate.clone()))
        .collect()
}

fn lines(found: &[(usize, String)]) -> String {
    found
        .iter()
        .map(|(line, what)| format!("{line} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the per-file counts in `found` differ from `allowed` (file, count, why).
fn count_problems(
    found: &BTreeMap<String, Vec<(usize, String)>>,
    allowed: &[(&str, usize, &str)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (file, sites) in found {
        let limit = allowed
            .iter()
            .find(|(f, _, _)| f == file)
            .map_or(0, |(_, n, _)| *n);
        let n = sites.len();
        if n > limit {
            problems.push(format!(
                "{file}: {n} blocking waits (lines {}), BLOCKING_WAITS allows {limit}: await the \
                 actor's answer instead of blocking the thread, or add the wait to BLOCKING_WAITS \
                 in {} with the reason it must block",
                lines(sites),
                file!()
            ));
        } else if n < limit {
            problems.push(format!(
                "{file}: {n} blocking waits (lines {}), BLOCKING_WAITS allows {limit}: lower the \
                 allow-list to {n}",
                lines(sites)
            ));
        }
    }
    for (file, limit, _) in allowed {
        if !found.contains_key(*file) {
            problems.push(format!(
                "{file}: no blocking waits, BLOCKING_WAITS allows {limit}: lower the allow-list \
                 to 0 (remove the entry)"
            ));
        }
    }
    problems
}

/// Files in `found` that no entry of `allowed` (file, or folder ending in `/`) covers, and
/// entries that cover nothing in `found`. `list` names the allow-list, `what` the finding,
/// `hint` what to do instead.
fn place_problems(
    found: &BTreeMap<String, Vec<(usize, String)>>,
    allowed: &[(&str, &str)],
    list: &str,
    what: &str,
    hint: &str,
) -> Vec<String> {
    let covers = |entry: &str, file: &str| {
        if entry.ends_with('/') {
            file.starts_with(entry)
        } else {
            file == entry
        }
    };
    let mut problems = Vec::new();
    for (file, sites) in found {
        if !allowed.iter().any(|(entry, _)| covers(entry, file)) {
            problems.push(format!(
                "{file}: {what} (lines {}) outside the places {list} allows: {hint}, or list the \
                 file in {list} in {} with the reason",
                lines(sites),
                file!()
            ));
        }
    }
    for (entry, _) in allowed {
        if !found.keys().any(|file| covers(entry, file)) {
            problems.push(format!(
                "`{entry}` in {list}: nothing there {what} any more; remove the entry"
            ));
        }
    }
    problems
}

fn assert_none(problems: Vec<String>, found: &BTreeMap<String, Vec<(usize, String)>>) {
    assert!(
        problems.is_empty(),
        "{}\n\nfound now:\n{}",
        problems.join("\n"),
        found
            .iter()
            .map(|(file, sites)| format!("    {file}: {} ({})", sites.len(), lines(sites)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn blocking_waits_are_only_the_listed_ones() {
    let found = blocking_waits(workspace());
    assert_none(count_problems(&found, BLOCKING_WAITS), &found);
}

#[test]
fn actors_start_only_in_the_listed_places() {
    let found = by_file(workspace(), actor_starts);
    let problems = place_problems(
        &found,
        ACTOR_STARTS,
        "ACTOR_STARTS",
        "starts actors",
        "start the actor from `cairn_kernel::actors::start`",
    );
    assert_none(problems, &found);
}

#[test]
fn http_crates_only_in_the_listed_modules() {
    let found = by_file(workspace(), http_uses);
    let problems = place_problems(
        &found,
        HTTP_USERS,
        "HTTP_USERS",
        "uses an HTTP crate",
        "keep HTTP in the gateway, the engine client and the hosts' servers",
    );
    assert_none(problems, &found);
}

/// The fixture crate of the tests below: a kernel-like library with a blocking helper, its
/// callers, actor starts and an HTTP client, plus test code that must not count.
fn fixture() -> Crate {
    let files: BTreeMap<&str, &str> = [
        (
            "src/lib.rs",
            "pub mod actors;\npub mod deadline;\npub mod client;\n",
        ),
        (
            "src/actors/mod.rs",
            "pub mod policy;\npub mod rollout;\n\
             pub fn start() { let a = SyncArbiter::start(1, || Policy);\n\
             let b = Reward::default().start();\n}\n",
        ),
        (
            "src/actors/policy.rs",
            "pub fn call<M>(r: &Recipient<M>, m: M) -> M::Result {\n\
             futures::executor::block_on(r.send(m)).unwrap()\n}\n",
        ),
        (
            "src/actors/rollout.rs",
            "use crate::actors::policy::{call, Generate};\nuse super::policy;\n\
             fn play(r: &Recipient<Generate>) {\n\
             let a = call(&r, Generate);\n\
             assert!(policy::call(\n&r, Generate).is_ok());\n\
             let b = crate::deadline::call(None, || 1);\n\
             let c = plugin_call(&r);\n\
             let addr = threads.start(move || Rollout);\n\
             crate::deadline::main_like();\n\
             }\n\
             #[cfg(test)]\nmod tests {\n fn t() { futures::executor::block_on(async {}); }\n}\n",
        ),
        (
            "src/deadline.rs",
            "pub fn call<T>(t: Option<u64>, f: impl FnOnce() -> T) -> T { f() }\n\
             fn main_like() { actix::System::new().block_on(async {}); }\n",
        ),
        (
            "src/client.rs",
            "use ureq::Agent;\nfn get() { let _ = http::Request::builder(); }\n",
        ),
    ]
    .into_iter()
    .collect();
    let read = |p: &std::path::Path| files.get(p.to_str()?).map(|t| t.to_string());
    Crate::load(
        std::path::Path::new("src/lib.rs"),
        Some("cairn_kernel".into()),
        true,
        &read,
    )
    .expect("the fixture loads")
}

fn texts(found: &BTreeMap<String, Vec<(usize, String)>>) -> Vec<String> {
    found
        .iter()
        .map(|(file, sites)| format!("{file}: {}", lines(sites)))
        .collect()
}

#[test]
fn blocking_wait_check_counts_block_on_and_the_helper_and_fails_on_a_change() {
    let crates = [fixture()];
    let found = blocking_waits(&crates);
    assert_eq!(
        texts(&found),
        [
            "src/actors/policy.rs: 2 block_on",
            "src/actors/rollout.rs: 4 actors::policy::call, 5 actors::policy::call",
            "src/deadline.rs: 2 block_on"
        ]
    );
    let exact = [
        ("src/actors/policy.rs", 1, "the helper"),
        ("src/actors/rollout.rs", 2, "two"),
        ("src/deadline.rs", 1, "entry"),
    ];
    assert_eq!(count_problems(&found, &exact), Vec::<String>::new());
    let problems = count_problems(
        &found,
        &[
            ("src/actors/rollout.rs", 1, "rose"),
            ("src/deadline.rs", 2, "fell"),
            ("src/gone.rs", 1, "gone"),
        ],
    );
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].starts_with(
        "src/actors/policy.rs: 1 blocking waits (lines 2 block_on), BLOCKING_WAITS allows 0: \
         await"
    ));
    assert!(problems[1].starts_with(
        "src/actors/rollout.rs: 2 blocking waits (lines 4 actors::policy::call, 5 \
         actors::policy::call), BLOCKING_WAITS allows 1: await"
    ));
    assert_eq!(
        problems[2],
        "src/deadline.rs: 1 blocking waits (lines 2 block_on), BLOCKING_WAITS allows 2: lower \
         the allow-list to 1"
    );
    assert_eq!(
        problems[3],
        "src/gone.rs: no blocking waits, BLOCKING_WAITS allows 1: lower the allow-list to 0 \
         (remove the entry)"
    );
}

#[test]
fn actor_start_check_finds_the_starts_and_fails_on_a_new_place() {
    let crates = [fixture()];
    let found = by_file(&crates, actor_starts);
    assert_eq!(
        texts(&found),
        [
            "src/actors/mod.rs: 3 SyncArbiter::start, 4 .start()",
            "src/actors/rollout.rs: 9 .start(factory)"
        ]
    );
    let problems = place_problems(
        &found,
        &[("src/actors/mod.rs", "the wiring"), ("src/old.rs", "gone")],
        "ACTOR_STARTS",
        "starts actors",
        "start it in `start`",
    );
    assert_eq!(
        problems,
        [
            format!(
                "src/actors/rollout.rs: starts actors (lines 9 .start(factory)) \
                 outside the places ACTOR_STARTS allows: start it in `start`, or list the file \
                 in ACTOR_STARTS in {} with the reason",
                file!()
            ),
            "`src/old.rs` in ACTOR_STARTS: nothing there starts actors any more; remove the entry"
                .to_string()
        ]
    );
}

#[test]
fn http_check_finds_http_crates_and_fails_outside_the_list() {
    let crates = [fixture()];
    let found = by_file(&crates, http_uses);
    assert_eq!(texts(&found), ["src/client.rs: 1 ureq, 2 http"]);
    let allowed = |entry| place_problems(&found, &[(entry, "why")], "HTTP_USERS", "uses", "no");
    assert_eq!(allowed("src/client.rs"), Vec::<String>::new());
    assert_eq!(allowed("src/"), Vec::<String>::new());
    let problems = allowed("src/gateway/");
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("src/client.rs: uses (lines 1 ureq, 2 http) outside"));
}
