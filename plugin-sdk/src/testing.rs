//! A host for plugin tests: [`MockHost`] runs a plugin's hooks in process, with no kernel and
//! no model.
//!
//! It keeps an in-memory experience bank (queries filter like the kernel's bank and rank by
//! insertion order unless a test gives a ranking; puts follow the kernel's rules for versions
//! and memory records), answers reflections from a closure (the skill creator) at once or
//! later ([`MockHost::answer_pending`]), scores and renders with closures, and records every
//! call and metric so a test can assert on what the plugin asked for. Prompts render by default as the bytes of
//! `inject + "|" + observation` ([`render_bytes`]) and text tokenizes as its bytes, so a test
//! can build the exact prompt ids a plugin will see.
//!
//! [`load_test_cdylib`] opens the plugin's own `cdylib`, built for the same test run, as the
//! kernel opens it, for the one test that drives the plugin through the ABI.
//!
//! ```
//! use cairn_plugin_sdk::testing::MockHost;
//! use cairn_plugin_sdk::{BankEntry, Host, NewEntry, ReflectionRequest};
//!
//! let host = MockHost::default().with_skill_creator(|request, _ticket| {
//!     Some(NewEntry { text: format!("skill for {}", request.prompt), ..NewEntry::default() })
//! });
//! host.put(BankEntry { id: 7, text: "look first".into(), ..BankEntry::default() });
//! let tickets = host.reflect(&[ReflectionRequest { prompt: "p".into(), ..Default::default() }]);
//! assert_eq!(tickets.unwrap(), vec![1]);
//! assert_eq!(host.take_new_entries(), vec![8]);
//! assert_eq!(host.entry(8).unwrap().text, "skill for p");
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::bank::{
    BankEntry, BankQuery, EntryKind, EntryStatus, NewEntry, ReflectionRequest, Retrieved,
    StatsUpdate,
};
use crate::error::{PluginError, Result};
use crate::host::foreign::{load_plugin, LoadedPlugin};
use crate::services::{GenerateRequest, Generation, Host, RenderRequest, ScoreRequest, Scored};

type Scorer = Box<dyn Fn(&ScoreRequest) -> Result<Scored> + Send + Sync>;
type Renderer = Box<dyn Fn(&RenderRequest) -> Result<Vec<u32>> + Send + Sync>;
type Tokenizer = Box<dyn Fn(&str) -> Result<Vec<u32>> + Send + Sync>;
type Generator = Box<dyn Fn(&GenerateRequest) -> Result<Generation> + Send + Sync>;
type SkillCreator = Box<dyn Fn(&ReflectionRequest, u64) -> Option<NewEntry> + Send + Sync>;
type Ranking = Box<dyn Fn(&BankQuery, &mut Vec<BankEntry>) + Send + Sync>;
type Retrieval = Box<dyn Fn(&BankQuery, &[BankEntry]) -> Vec<BankEntry> + Send + Sync>;

/// Loads the `cdylib` of crate `crate_name` (`"cairn_grpo"`: the library name, underscores
/// for dashes) that cargo built for this test run, with the host's loader
/// ([`crate::host::foreign::load_plugin`]), as the kernel loads a plugin. Panics with the path
/// and the loader's error when it fails.
///
/// `cargo test -p <plugin>` builds a package's `cdylib` into `target/<profile>/deps/`, the
/// directory of the test binary, and the file name there carries no hash. The copy one level
/// up is not looked at: cargo refreshes it only on `cargo build`, so it may be stale.
pub fn load_test_cdylib(crate_name: &str) -> LoadedPlugin {
    let exe = std::env::current_exe().expect("the running test binary has a path");
    let path = exe.with_file_name(format!(
        "{}{crate_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    // Every `LoadError` starts with the path it was given.
    load_plugin(&path).unwrap_or_else(|e| {
        panic!(
            "{e} (cargo builds a package's cdylib beside its test binary when its `crate-type` \
             lists \"cdylib\"; run the test with `cargo test -p <package>`)"
        )
    })
}

/// What [`MockHost`] renders for a request by default: the bytes of
/// `inject + "|" + observation`.
pub fn render_bytes(inject: &str, observation: &str) -> Vec<u32> {
    format!("{inject}|{observation}")
        .bytes()
        .map(u32::from)
        .collect()
}

/// An in-process [`Host`] for tests. Public fields are the bank and the call records; the
/// `with_*` methods set the services a test needs (a service left unset answers with the
/// same `Host` error as a host that lacks it, except prompts and tokens, which default to
/// bytes).
#[derive(Default)]
pub struct MockHost {
    /// The experience bank, in insertion order.
    pub entries: Mutex<Vec<BankEntry>>,
    /// Every bank query, in order.
    pub queries: Mutex<Vec<BankQuery>>,
    /// Every stats update that applied, in order.
    pub updates: Mutex<Vec<StatsUpdate>>,
    /// Every reflection request; request `i` got ticket `i + 1`.
    pub reflections: Mutex<Vec<ReflectionRequest>>,
    /// Ids the skill creator wrote since the last [`MockHost::take_new_entries`].
    pub new_entries: Mutex<Vec<u64>>,
    /// Reflections the skill creator has not answered, `(ticket, request)` in order: all of
    /// them when no skill creator is set, else those it answered `None`. A test answers them
    /// later with [`MockHost::answer_pending`], as the kernel's skill creator does between
    /// steps.
    pub pending: Mutex<Vec<(u64, ReflectionRequest)>>,
    /// Every score request, in order.
    pub scores: Mutex<Vec<ScoreRequest>>,
    /// Every render request, in order.
    pub renders: Mutex<Vec<RenderRequest>>,
    /// Every metric logged, in order.
    pub metrics: Mutex<Vec<(String, f64)>>,
    /// How many reflections the skill creator's queue takes in all; `reflect` fails past it.
    reflection_room: Option<usize>,
    /// While set, every `reflect` fails ([`MockHost::set_queue_full`]).
    queue_full: AtomicBool,
    scorer: Option<Scorer>,
    renderer: Option<Renderer>,
    tokenizer: Option<Tokenizer>,
    generator: Option<Generator>,
    skill_creator: Option<SkillCreator>,
    ranking: Option<Ranking>,
    retrieval: Option<Retrieval>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding a lock has failed already; its data is still fine
    // to read for the report.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MockHost {
    /// Scores with `f`, one call per request.
    pub fn with_scorer(
        mut self,
        f: impl Fn(&ScoreRequest) -> Result<Scored> + Send + Sync + 'static,
    ) -> Self {
        self.scorer = Some(Box::new(f));
        self
    }

    /// Renders prompts with `f` instead of [`render_bytes`].
    pub fn with_renderer(
        mut self,
        f: impl Fn(&RenderRequest) -> Result<Vec<u32>> + Send + Sync + 'static,
    ) -> Self {
        self.renderer = Some(Box::new(f));
        self
    }

    /// Tokenizes with `f` instead of taking the text's bytes.
    pub fn with_tokenizer(
        mut self,
        f: impl Fn(&str) -> Result<Vec<u32>> + Send + Sync + 'static,
    ) -> Self {
        self.tokenizer = Some(Box::new(f));
        self
    }

    /// Generates with `f`, one call per request.
    pub fn with_generator(
        mut self,
        f: impl Fn(&GenerateRequest) -> Result<Generation> + Send + Sync + 'static,
    ) -> Self {
        self.generator = Some(Box::new(f));
        self
    }

    /// The skill creator: `f(request, ticket)` answers a reflection at once with the entry to
    /// write (its id is the bank's next), or `None` to leave the ticket unanswered (in
    /// [`MockHost::pending`]).
    pub fn with_skill_creator(
        mut self,
        f: impl Fn(&ReflectionRequest, u64) -> Option<NewEntry> + Send + Sync + 'static,
    ) -> Self {
        self.skill_creator = Some(Box::new(f));
        self
    }

    /// Orders a query's matches with `f` (before `k` is applied); insertion order otherwise.
    pub fn with_ranking(
        mut self,
        f: impl Fn(&BankQuery, &mut Vec<BankEntry>) + Send + Sync + 'static,
    ) -> Self {
        self.ranking = Some(Box::new(f));
        self
    }

    /// Answers every bank query with `f(query, bank)` (then `k` applied) instead of the
    /// kernel's filters: a bank that returns what a test gives it, to check the plugin's own
    /// filtering of what comes back.
    pub fn with_retrieval(
        mut self,
        f: impl Fn(&BankQuery, &[BankEntry]) -> Vec<BankEntry> + Send + Sync + 'static,
    ) -> Self {
        self.retrieval = Some(Box::new(f));
        self
    }

    /// `reflect` fails, as a host whose skill creator's queue is full does.
    pub fn refusing_reflections(self) -> Self {
        self.with_reflection_room(0)
    }

    /// The skill creator's queue takes `room` reflections in all; a `reflect` call that would
    /// pass that fails whole, as a host with a full queue does.
    pub fn with_reflection_room(mut self, room: usize) -> Self {
        self.reflection_room = Some(room);
        self
    }

    /// While `full`, every `reflect` fails whole, as a host whose skill creator's queue is
    /// full does; a test switches it between steps.
    pub fn set_queue_full(&self, full: bool) {
        self.queue_full.store(full, Ordering::SeqCst);
    }

    /// Answers every [`MockHost::pending`] reflection with `f(ticket, request)`, writes the
    /// entries as the skill creator does, and returns their ids (also added to
    /// [`MockHost::new_entries`]): what the kernel reports in the next step.
    pub fn answer_pending(
        &self,
        f: impl Fn(u64, &ReflectionRequest) -> NewEntry,
    ) -> Result<Vec<u64>> {
        let pending = std::mem::take(&mut *lock(&self.pending));
        let entries: Vec<NewEntry> = pending.iter().map(|(t, r)| f(*t, r)).collect();
        let ids = self.insert(&entries)?;
        lock(&self.new_entries).extend_from_slice(&ids);
        Ok(ids)
    }

    /// Adds an entry to the bank as is (its id included).
    pub fn put(&self, entry: BankEntry) {
        lock(&self.entries).push(entry);
    }

    /// The bank entry `id`, if there is one.
    pub fn entry(&self, id: u64) -> Option<BankEntry> {
        lock(&self.entries).iter().find(|e| e.id == id).cloned()
    }

    /// The last value logged under `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        lock(&self.metrics)
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|m| m.1)
    }

    /// The sum of the values logged under `name` (a counter logged once per call).
    pub fn metric_sum(&self, name: &str) -> f64 {
        lock(&self.metrics)
            .iter()
            .filter(|(n, _)| n == name)
            .map(|m| m.1)
            .sum()
    }

    /// The ids the skill creator wrote since the last call: what the kernel puts in the next
    /// [`crate::StepReport::new_entries`].
    pub fn take_new_entries(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.new_entries))
    }

    /// Writes `entries` with fresh ids (one past the largest id in the bank), all or none, by
    /// the kernel's rules: version 1, or the parent's version + 1; a parent that is not in the
    /// bank or a memory record without a `trajectory_id` fails the whole put.
    fn insert(&self, entries: &[NewEntry]) -> Result<Vec<u64>> {
        let mut bank = lock(&self.entries);
        let first = bank.iter().map(|e| e.id).max().unwrap_or(0) + 1;
        let ids: Vec<u64> = (first..first + entries.len() as u64).collect();
        let mut new = Vec::with_capacity(entries.len());
        for (i, (e, &id)) in entries.iter().zip(&ids).enumerate() {
            if e.kind == EntryKind::MemoryRecord && e.trajectory_id.is_none() {
                return Err(PluginError::host(format!(
                    "entry {i} of the put: a memory record without a `trajectory_id`"
                )));
            }
            let version = match e.parent {
                None => 1,
                Some(parent) => {
                    let found = bank
                        .iter()
                        .chain(&new)
                        .find(|p: &&BankEntry| p.id == parent);
                    let Some(parent) = found else {
                        return Err(PluginError::host(format!(
                            "entry {i} of the put: its parent {parent} is not in the bank"
                        )));
                    };
                    parent.version + 1
                }
            };
            new.push(BankEntry {
                id,
                kind: e.kind,
                text: e.text.clone(),
                trigger: e.trigger.clone(),
                task_id: e.task_id.clone(),
                trajectory_id: e.trajectory_id,
                version,
                parent: e.parent,
                status: e.status,
                provenance: e.provenance.clone(),
                extra: e.extra.clone(),
                ..BankEntry::default()
            });
        }
        bank.extend(new);
        Ok(ids)
    }
}

fn missing<T>(what: &str) -> Result<T> {
    Err(PluginError::host(format!(
        "this mock host has no {what}; give one with MockHost::with_{what}"
    )))
}

impl Host for MockHost {
    fn score(&self, requests: &[ScoreRequest]) -> Result<Vec<Scored>> {
        lock(&self.scores).extend_from_slice(requests);
        let Some(f) = &self.scorer else {
            return missing("scorer");
        };
        requests.iter().map(f).collect()
    }

    fn generate(&self, requests: &[GenerateRequest]) -> Result<Vec<Generation>> {
        let Some(f) = &self.generator else {
            return missing("generator");
        };
        requests.iter().map(f).collect()
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tokenizer {
            Some(f) => f(text),
            None => Ok(text.bytes().map(u32::from).collect()),
        }
    }

    fn render_prompt(&self, request: &RenderRequest) -> Result<Vec<u32>> {
        lock(&self.renders).push(request.clone());
        match &self.renderer {
            Some(f) => f(request),
            None => Ok(render_bytes(
                &request.variant.inject,
                &request.observation.text,
            )),
        }
    }

    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        lock(&self.queries).push(q.clone());
        let statuses = if q.statuses.is_empty() {
            vec![EntryStatus::Active, EntryStatus::UnderTest]
        } else {
            q.statuses.clone()
        };
        if let Some(retrieve) = &self.retrieval {
            let found = retrieve(q, &lock(&self.entries));
            return Ok(found
                .into_iter()
                .take(q.k)
                .map(|entry| Retrieved { entry, score: 1.0 })
                .collect());
        }
        // Trajectory scope as the kernel's: a query that names a trajectory sees only the
        // entries scoped to it, one that names none only unscoped entries.
        let mut matches: Vec<BankEntry> = lock(&self.entries)
            .iter()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
            .filter(|e| statuses.contains(&e.status))
            .filter(|e| match &q.task_id {
                None => true,
                Some(t) => {
                    e.task_id.as_ref() == Some(t) || (q.include_general && e.task_id.is_none())
                }
            })
            .filter(|e| e.trajectory_id == q.trajectory_id)
            .cloned()
            .collect();
        if let Some(rank) = &self.ranking {
            rank(q, &mut matches);
        }
        Ok(matches
            .into_iter()
            .take(q.k)
            .map(|entry| Retrieved { entry, score: 1.0 })
            .collect())
    }

    fn bank_put(&self, entries: &[NewEntry]) -> Result<Vec<u64>> {
        self.insert(entries)
    }

    fn bank_update(&self, updates: &[StatsUpdate]) -> Result<()> {
        let mut bank = lock(&self.entries);
        // All or nothing, as the kernel's bank applies them in one transaction.
        if let Some(u) = updates.iter().find(|u| !bank.iter().any(|e| e.id == u.id)) {
            return Err(PluginError::host(format!("no entry {}", u.id)));
        }
        for u in updates {
            let e = bank
                .iter_mut()
                .find(|e| e.id == u.id)
                .expect("checked above: every update names an entry");
            if let Some(stats) = &u.set {
                e.stats = stats.clone();
            }
            e.stats.exposures += u.add_exposures;
            e.stats.successes += u.add_successes;
            if let Some(status) = u.status {
                e.status = status;
            }
        }
        lock(&self.updates).extend_from_slice(updates);
        Ok(())
    }

    fn reflect(&self, requests: &[ReflectionRequest]) -> Result<Vec<u64>> {
        let first = {
            let mut r = lock(&self.reflections);
            if self.queue_full.load(Ordering::SeqCst)
                || self
                    .reflection_room
                    .is_some_and(|room| r.len() + requests.len() > room)
            {
                return Err(PluginError::host(
                    "the skill creator's queue is full (`skills.queue`)",
                ));
            }
            let first = r.len() as u64 + 1;
            r.extend_from_slice(requests);
            first
        };
        let tickets: Vec<u64> = (first..first + requests.len() as u64).collect();
        for (request, &ticket) in requests.iter().zip(&tickets) {
            match self.skill_creator.as_ref().and_then(|c| c(request, ticket)) {
                Some(entry) => {
                    let ids = self.insert(std::slice::from_ref(&entry))?;
                    lock(&self.new_entries).extend(ids);
                }
                None => lock(&self.pending).push((ticket, request.clone())),
            }
        }
        Ok(tickets)
    }

    fn log_metric(&self, name: &str, value: f64) {
        lock(&self.metrics).push((name.into(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_test_cdylib_is_named_by_its_path_beside_the_test_binary() {
        let panic = std::panic::catch_unwind(|| load_test_cdylib("cairn_no_such_plugin"))
            .expect_err("this crate builds no such cdylib");
        let message = panic
            .downcast_ref::<String>()
            .expect("a formatted panic message");
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().display().to_string();
        let file = format!(
            "{}cairn_no_such_plugin{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        assert!(
            message.starts_with(&format!("{dir}/{file}: cannot open")),
            "{message}"
        );
    }
    use crate::bank::{EntryKind, EntryStats};
    use crate::batch::ContextVariant;
    use crate::env::Observation;

    fn entry(id: u64, kind: EntryKind, task: Option<&str>) -> BankEntry {
        BankEntry {
            id,
            kind,
            task_id: task.map(str::to_string),
            ..BankEntry::default()
        }
    }

    #[test]
    fn the_bank_filters_like_the_kernels_and_ranks_by_insertion_or_the_given_order() {
        let host = MockHost::default();
        host.put(entry(1, EntryKind::Experience, Some("a")));
        host.put(entry(2, EntryKind::Skill, None));
        host.put(entry(3, EntryKind::Experience, Some("b")));
        let ids = |host: &MockHost, q: BankQuery| -> Vec<u64> {
            host.bank_query(&q)
                .unwrap()
                .iter()
                .map(|r| r.entry.id)
                .collect()
        };
        let q = BankQuery {
            k: 10,
            task_id: Some("a".into()),
            include_general: true,
            ..BankQuery::default()
        };
        assert_eq!(ids(&host, q.clone()), vec![1, 2]);
        let kinds = BankQuery {
            kinds: vec![EntryKind::Experience],
            k: 1,
            ..BankQuery::default()
        };
        assert_eq!(ids(&host, kinds.clone()), vec![1]);
        let newest_first = MockHost::default().with_ranking(|_, m| m.reverse());
        for id in 1..=3 {
            newest_first.put(entry(id, EntryKind::Experience, None));
        }
        assert_eq!(ids(&newest_first, kinds), vec![3]);
        assert_eq!(host.queries.lock().unwrap().len(), 2);
    }

    #[test]
    fn updates_apply_all_or_nothing_and_puts_take_fresh_ids() {
        let host = MockHost::default();
        host.put(entry(4, EntryKind::Skill, None));
        let ids = host
            .bank_put(&[NewEntry::default(), NewEntry::default()])
            .unwrap();
        assert_eq!(ids, vec![5, 6]);
        let e = host
            .bank_update(&[
                StatsUpdate {
                    id: 4,
                    add_exposures: 2,
                    ..StatsUpdate::default()
                },
                StatsUpdate {
                    id: 9,
                    ..StatsUpdate::default()
                },
            ])
            .unwrap_err();
        assert_eq!(e.message, "no entry 9");
        assert_eq!(host.entry(4).unwrap().stats.exposures, 0);
        host.bank_update(&[StatsUpdate {
            id: 4,
            set: Some(EntryStats {
                exposures: 3,
                ..EntryStats::default()
            }),
            add_successes: 1,
            status: Some(EntryStatus::Retired),
            ..StatsUpdate::default()
        }])
        .unwrap();
        let e = host.entry(4).unwrap();
        assert_eq!((e.stats.exposures, e.stats.successes), (3, 1));
        assert_eq!(e.status, EntryStatus::Retired);
    }

    #[test]
    fn the_skill_creator_answers_from_its_closure_and_a_full_queue_refuses() {
        let host = MockHost::default().with_skill_creator(|r, ticket| {
            (ticket != 2).then(|| NewEntry {
                kind: EntryKind::Skill,
                text: format!("{} #{ticket}", r.prompt),
                ..NewEntry::default()
            })
        });
        let request = |p: &str| ReflectionRequest {
            prompt: p.into(),
            ..ReflectionRequest::default()
        };
        let tickets = host
            .reflect(&[request("a"), request("b"), request("c")])
            .unwrap();
        assert_eq!(tickets, vec![1, 2, 3]);
        assert_eq!(host.take_new_entries(), vec![1, 2]);
        assert!(host.take_new_entries().is_empty());
        assert_eq!(host.entry(2).unwrap().text, "c #3");
        let full = MockHost::default().refusing_reflections();
        assert!(full.reflect(&[request("a")]).is_err());
        assert!(full.reflections.lock().unwrap().is_empty());
        let one = MockHost::default().with_reflection_room(1);
        assert!(one.reflect(&[request("a"), request("b")]).is_err());
        assert_eq!(one.reflect(&[request("a")]).unwrap(), vec![1]);
        let e = one.reflect(&[request("b")]).unwrap_err();
        assert_eq!(
            e.message,
            "the skill creator's queue is full (`skills.queue`)"
        );
    }

    #[test]
    fn prompts_and_tokens_default_to_bytes_and_missing_services_say_how_to_add_them() {
        let host = MockHost::default();
        let request = RenderRequest {
            variant: ContextVariant {
                inject: "x".into(),
                ..ContextVariant::default()
            },
            observation: Observation {
                text: "y".into(),
                ..Observation::default()
            },
            ..RenderRequest::default()
        };
        assert_eq!(host.render_prompt(&request).unwrap(), vec![120, 124, 121]);
        assert_eq!(host.tokenize("ab").unwrap(), vec![97, 98]);
        let e = host.score(&[ScoreRequest::default()]).unwrap_err();
        assert!(e.message.contains("MockHost::with_scorer"), "{e}");
        assert_eq!(host.scores.lock().unwrap().len(), 1);
        let scored = MockHost::default()
            .with_scorer(|r| {
                Ok(Scored {
                    logprobs: vec![-1.0; r.response_ids.len()],
                    ..Scored::default()
                })
            })
            .score(&[ScoreRequest {
                response_ids: vec![1, 2],
                ..ScoreRequest::default()
            }])
            .unwrap();
        assert_eq!(scored[0].logprobs, vec![-1.0, -1.0]);
        host.log_metric("m", 1.0);
        host.log_metric("m", 2.0);
        assert_eq!(host.metric("m"), Some(2.0));
        assert_eq!(host.metric("n"), None);
    }

    #[test]
    fn trajectory_scope_versions_and_memory_records_follow_the_kernels_bank() {
        let host = MockHost::default();
        let record = |trajectory| NewEntry {
            kind: EntryKind::MemoryRecord,
            text: "r".into(),
            trajectory_id: trajectory,
            ..NewEntry::default()
        };
        let e = host.bank_put(&[record(Some(4)), record(None)]).unwrap_err();
        assert_eq!(
            e.message,
            "entry 1 of the put: a memory record without a `trajectory_id`"
        );
        assert!(host.entries.lock().unwrap().is_empty(), "all or none");
        assert_eq!(host.bank_put(&[record(Some(4))]).unwrap(), vec![1]);
        host.put(entry(2, EntryKind::MemoryRecord, None));
        let ids = |trajectory| -> Vec<u64> {
            let q = BankQuery {
                k: 10,
                trajectory_id: trajectory,
                ..BankQuery::default()
            };
            host.bank_query(&q)
                .unwrap()
                .iter()
                .map(|r| r.entry.id)
                .collect()
        };
        assert_eq!(
            (ids(Some(4)), ids(None), ids(Some(5))),
            (vec![1], vec![2], vec![])
        );

        let child = |parent| NewEntry {
            text: "c".into(),
            parent: Some(parent),
            ..NewEntry::default()
        };
        let ids = host.bank_put(&[NewEntry::default(), child(3)]).unwrap();
        assert_eq!(ids, vec![3, 4]);
        assert_eq!(
            (
                host.entry(3).unwrap().version,
                host.entry(4).unwrap().version
            ),
            (1, 2)
        );
        let e = host.bank_put(&[child(9)]).unwrap_err();
        assert_eq!(
            e.message,
            "entry 0 of the put: its parent 9 is not in the bank"
        );
    }

    #[test]
    fn unanswered_reflections_wait_until_the_test_answers_them_and_a_full_queue_can_be_switched() {
        let host = MockHost::default();
        let request = |p: &str| ReflectionRequest {
            prompt: p.into(),
            ..ReflectionRequest::default()
        };
        assert_eq!(
            host.reflect(&[request("a"), request("b")]).unwrap(),
            vec![1, 2]
        );
        assert!(host.entries.lock().unwrap().is_empty());
        let ids = host
            .answer_pending(|ticket, r| NewEntry {
                text: format!("{} #{ticket}", r.prompt),
                ..NewEntry::default()
            })
            .unwrap();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(host.entry(2).unwrap().text, "b #2");
        assert!(host.pending.lock().unwrap().is_empty());
        assert_eq!(host.take_new_entries(), vec![1, 2]);

        host.set_queue_full(true);
        assert!(host.reflect(&[request("c")]).is_err());
        host.set_queue_full(false);
        assert_eq!(host.reflect(&[request("c")]).unwrap(), vec![3]);
        assert_eq!(host.pending.lock().unwrap()[0].0, 3);
    }

    #[test]
    fn a_retrieval_closure_answers_queries_in_place_of_the_filters() {
        let host = MockHost::default().with_retrieval(|q, bank| {
            let mut all = bank.to_vec();
            all.push(entry(9, EntryKind::Skill, Some(q.text.as_str())));
            all
        });
        host.put(entry(1, EntryKind::Experience, Some("other")));
        let q = BankQuery {
            text: "x".into(),
            task_id: Some("t".into()),
            kinds: vec![EntryKind::Skill],
            k: 2,
            ..BankQuery::default()
        };
        let got: Vec<(u64, Option<String>)> = host
            .bank_query(&q)
            .unwrap()
            .into_iter()
            .map(|r| (r.entry.id, r.entry.task_id))
            .collect();
        assert_eq!(got, vec![(1, Some("other".into())), (9, Some("x".into()))]);
        assert_eq!(host.queries.lock().unwrap().len(), 1);
        host.log_metric("n", 1.0);
        host.log_metric("n", 2.0);
        assert_eq!(host.metric_sum("n"), 3.0);
    }
}
