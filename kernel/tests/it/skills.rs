//! The skill creator end to end on actix: the `template` reflector and the `policy` reflector
//! (over the null backend's policy actor) write bank entries through a stub bank actor, with
//! exact text and provenance; the queue bound refuses a full queue without blocking; replies
//! parse by the documented rules and prompts render exactly; the `[skills]` config keys are
//! checked. (The `endpoint` reflector is tested over real HTTP against `cairn serve` in the
//! host's tests.)

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use actix::prelude::*;
use cairn_kernel::actors::bank::PutEntries;
use cairn_kernel::actors::policy::PolicyActor;
use cairn_kernel::actors::skills::{Finished, Reflect, SkillCreatorActor, TakeFinished};
use cairn_kernel::backend::NullBackend;
use cairn_kernel::config::PipelineConfig;
use cairn_kernel::rollout::prompt::{PlainPrompt, TextCodec};
use cairn_kernel::skills::template::TemplateReflector;
use cairn_kernel::skills::{self, Draft, Job, ReflectionFailure, Reflector, ReflectorPeers};
use cairn_kernel::skills::{ReflectorKind, SkillsConfig};
use cairn_kernel::Error;
use cairn_plugin_sdk::{EntryKind, EntryStatus, NewEntry, Provenance, ReflectionRequest, TurnRow};
use parking_lot::Mutex;
use serde_json::json;

/// A bank that keeps every `PutEntries` and answers ids from 100.
#[derive(Default)]
struct BankStub {
    puts: Arc<Mutex<Vec<PutEntries>>>,
    next: u64,
}

impl Actor for BankStub {
    type Context = Context<Self>;
}

impl Handler<PutEntries> for BankStub {
    type Result = cairn_kernel::Result<Vec<u64>>;
    fn handle(&mut self, msg: PutEntries, _: &mut Self::Context) -> Self::Result {
        let ids = (0..msg.entries.len() as u64)
            .map(|k| 100 + self.next + k)
            .collect();
        self.next += msg.entries.len() as u64;
        self.puts.lock().push(msg);
        Ok(ids)
    }
}

fn row(trajectory: u64, turn: u32, action: &str, success: bool, feedback: i8) -> TurnRow {
    let mut info = serde_json::Map::new();
    info.insert("action".into(), json!(action));
    TurnRow {
        trajectory_id: trajectory,
        turn,
        task_id: "mug-3".into(),
        observation: format!("observation {turn}"),
        success,
        feedback,
        info,
        ..Default::default()
    }
}

/// Trajectory 1 failed (two turns, the last rejected), 2 succeeded (two turns).
fn rows() -> Vec<TurnRow> {
    vec![
        row(1, 0, "go to shelf 1", false, 0),
        row(1, 1, "take mug 9", false, -1),
        row(2, 1, "take mug 1 from drawer 1", true, 1),
        row(2, 0, "open drawer 1", true, 1),
    ]
}

fn request(trajectories: &[u64]) -> ReflectionRequest {
    let mut extra = serde_json::Map::new();
    extra.insert("slot".into(), json!("b"));
    ReflectionRequest {
        kind: EntryKind::Skill,
        prompt: "What worked?".into(),
        trajectories: trajectories.to_vec(),
        task_id: Some("mug-3".into()),
        parent: Some(5),
        status: EntryStatus::UnderTest,
        extra,
    }
}

fn reflect(requests: Vec<ReflectionRequest>) -> Reflect {
    Reflect {
        requests,
        rows: rows(),
        step: 7,
        policy_version: 3,
        writer: "grpo".into(),
    }
}

/// Takes finished work until `settled` reflections have been written or failed.
async fn take_until(skills: &Addr<SkillCreatorActor>, settled: usize) -> Finished {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut all = Finished::default();
    loop {
        let f = skills.send(TakeFinished).await.unwrap().unwrap();
        all.new_entries.extend(f.new_entries);
        all.failed.extend(f.failed);
        for (k, v) in f.metrics {
            match all.metrics.iter_mut().find(|(name, _)| *name == k) {
                Some(slot) if k != "skills/pending" => slot.1 += v,
                Some(slot) => slot.1 = v,
                None => all.metrics.push((k, v)),
            }
        }
        if all.new_entries.len() + all.failed.len() >= settled {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "reflections did not finish: {all:?}"
        );
        actix::clock::sleep(Duration::from_millis(10)).await;
    }
}

fn metric(f: &Finished, name: &str) -> f64 {
    f.metrics
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no metric {name} in {:?}", f.metrics))
        .1
}

fn expected_entry(text: &str, trajectories: &[u64], ticket: u64, writer: &str) -> NewEntry {
    let mut extra = serde_json::Map::new();
    extra.insert("slot".into(), json!("b"));
    extra.insert("reflection_ticket".into(), json!(ticket));
    extra.insert("requested_by".into(), json!("grpo"));
    NewEntry {
        kind: EntryKind::Skill,
        text: text.into(),
        trigger: None,
        task_id: Some("mug-3".into()),
        trajectory_id: None,
        parent: Some(5),
        status: EntryStatus::UnderTest,
        provenance: Provenance {
            step: 7,
            policy_version: 3,
            source_trajectories: trajectories.to_vec(),
            writer: writer.into(),
        },
        extra,
    }
}

#[test]
fn the_template_reflector_writes_exact_entries_with_provenance() {
    System::new().block_on(async {
        let puts = Arc::new(Mutex::new(Vec::new()));
        let bank = BankStub {
            puts: puts.clone(),
            next: 0,
        }
        .start();
        let skills = SkillCreatorActor::new(
            &SkillsConfig::default(),
            bank.recipient(),
            Box::new(TemplateReflector),
        )
        .start();
        let tickets = skills
            .send(reflect(vec![
                request(&[1, 2]),
                request(&[1]),
                request(&[9]),
            ]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tickets, [1, 2, 3]);
        let finished = take_until(&skills, 3).await;
        assert_eq!(finished.new_entries, [100, 101]);
        assert_eq!(finished.failed.len(), 1);
        assert_eq!(finished.failed[0].0, 3);
        assert!(
            finished.failed[0]
                .1
                .contains("trajectories [9] came without rows"),
            "{:?}",
            finished.failed
        );
        for (name, value) in [
            ("skills/requested", 3.0),
            ("skills/written", 2.0),
            ("skills/errors", 1.0),
            ("skills/unparseable", 0.0),
            ("skills/timeouts", 0.0),
            ("skills/queue_full", 0.0),
            ("skills/pending", 0.0),
        ] {
            assert_eq!(metric(&finished, name), value, "{name}");
        }

        let puts = puts.lock();
        assert_eq!(puts.len(), 2);
        for put in puts.iter() {
            assert_eq!(
                (put.step, put.policy_version, put.writer.as_str()),
                (7, 3, "skill-creator:template")
            );
        }
        // The successful trajectory 2, by turn, although 1 is listed first.
        assert_eq!(
            puts[0].entries,
            [expected_entry(
                "solved in 2 turns: open drawer 1; take mug 1 from drawer 1",
                &[1, 2],
                1,
                "skill-creator:template"
            )]
        );
        assert_eq!(
            puts[1].entries,
            [expected_entry(
                "failed after 2 turns; the last action `take mug 9` got: rejected",
                &[1],
                2,
                "skill-creator:template"
            )]
        );
    });
}

/// A reflector that waits for a go-ahead per job, to hold the queue full.
struct Gated(mpsc::Receiver<()>);

impl Reflector for Gated {
    fn name(&self) -> &'static str {
        "gated"
    }
    fn reflect(&mut self, job: &Job) -> Result<Draft, ReflectionFailure> {
        self.0
            .recv_timeout(Duration::from_secs(20))
            .map_err(|e| ReflectionFailure::timeout(format!("gate: {e}")))?;
        Ok(Draft::new(format!("entry {}", job.ticket), None))
    }
}

#[test]
fn a_full_queue_is_refused_at_once_and_counted() {
    System::new().block_on(async {
        let (go, gate) = mpsc::channel();
        let bank = BankStub::default().start();
        let config = SkillsConfig {
            queue: 2,
            ..Default::default()
        };
        let skills =
            SkillCreatorActor::new(&config, bank.recipient(), Box::new(Gated(gate))).start();
        // Tickets come back while the reflector is still blocked.
        let t = Instant::now();
        let tickets = skills
            .send(reflect(vec![request(&[1]), request(&[2])]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tickets, [1, 2]);
        let refused = skills
            .send(reflect(vec![request(&[2])]))
            .await
            .unwrap()
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(
                refused,
                Error::ReflectionQueueFull {
                    pending: 2,
                    asked: 1,
                    capacity: 2
                }
            ),
            "{refused}"
        );
        assert!(refused.to_string().contains("`skills.queue`"), "{refused}");
        let now = skills.send(TakeFinished).await.unwrap().unwrap();
        assert_eq!(metric(&now, "skills/queue_full"), 1.0);
        assert_eq!(metric(&now, "skills/pending"), 2.0);
        assert!(now.new_entries.is_empty());

        go.send(()).unwrap();
        go.send(()).unwrap();
        let finished = take_until(&skills, 2).await;
        assert_eq!(finished.new_entries, [100, 101]);
        assert_eq!(
            metric(&finished, "skills/queue_full"),
            0.0,
            "counters are per take"
        );
        // Room again: the next request is accepted with the next ticket.
        let tickets = skills
            .send(reflect(vec![request(&[1])]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tickets, [3]);
        go.send(()).unwrap();
        assert_eq!(take_until(&skills, 1).await.new_entries, [102]);
    });
}

/// Words ↔ ids over a fixed vocabulary; unknown words are id 1.
struct Words(Vec<&'static str>);

impl TextCodec for Words {
    fn encode(&self, text: &str) -> cairn_kernel::Result<Vec<u32>> {
        Ok(text
            .split_whitespace()
            .map(|w| self.0.iter().position(|v| *v == w).unwrap_or(1) as u32)
            .collect())
    }
    fn decode(&self, ids: &[u32]) -> cairn_kernel::Result<String> {
        Ok(ids
            .iter()
            .filter(|&&id| id > 2)
            .filter_map(|&id| self.0.get(id as usize).copied())
            .collect::<Vec<_>>()
            .join(" "))
    }
}

const VOCAB: [&str; 11] = [
    "<stop>", "<unk>", "<sep>", "<entry>", "</entry>", "look", "in", "the", "drawer", "first",
    "hmm",
];

/// The policy reflector's entries come from the policy actor's generation (the null backend
/// answers every prompt with `response`).
fn policy_reflection(response: Vec<u32>) -> (Finished, Vec<PutEntries>) {
    policy_reflection_with(VOCAB.to_vec(), response, request(&[2]))
}

/// [`policy_reflection`] over a vocabulary and a request of the test's own.
fn policy_reflection_with(
    vocab: Vec<&'static str>,
    response: Vec<u32>,
    asked: ReflectionRequest,
) -> (Finished, Vec<PutEntries>) {
    System::new().block_on(async move {
        let policy = SyncArbiter::start(1, move || {
            PolicyActor::new(Box::new(NullBackend {
                version: 3,
                response: response.clone(),
                ..Default::default()
            }))
        });
        let codec = Arc::new(Words(vocab.clone()));
        let builder = Arc::new(PlainPrompt {
            codec: Words(vocab),
            separator: vec![2],
            stop_ids: vec![0],
        });
        let config = SkillsConfig {
            reflector: ReflectorKind::Policy,
            ..Default::default()
        };
        let reflector = skills::reflector(
            &config,
            ReflectorPeers {
                generate: policy.recipient(),
                builder,
                codec,
                api_key: None,
            },
        );
        assert_eq!(reflector.name(), "policy");
        let puts = Arc::new(Mutex::new(Vec::new()));
        let bank = BankStub {
            puts: puts.clone(),
            next: 0,
        }
        .start();
        let skills = SkillCreatorActor::new(&config, bank.recipient(), reflector).start();
        let tickets = skills.send(reflect(vec![asked])).await.unwrap().unwrap();
        assert_eq!(tickets, [1]);
        let finished = take_until(&skills, 1).await;
        let puts = std::mem::take(&mut *puts.lock());
        (finished, puts)
    })
}

#[test]
fn the_policy_reflector_stores_the_policys_entry() {
    // "<entry> look in the drawer first </entry>" and the stop id.
    let (finished, puts) = policy_reflection(vec![3, 5, 6, 7, 8, 9, 4, 0]);
    assert_eq!(finished.new_entries, [100]);
    assert_eq!(metric(&finished, "skills/written"), 1.0);
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0].writer, "skill-creator:policy");
    assert_eq!(
        puts[0].entries,
        [expected_entry(
            "look in the drawer first",
            &[2],
            1,
            "skill-creator:policy"
        )]
    );
}

#[test]
fn an_unparseable_policy_reply_is_counted_and_dropped() {
    // "<entry> hmm" and the stop id: no closing tag.
    let (finished, puts) = policy_reflection(vec![3, 10, 0]);
    assert!(puts.is_empty(), "nothing stored");
    assert!(finished.new_entries.is_empty());
    assert_eq!(metric(&finished, "skills/unparseable"), 1.0);
    assert_eq!(metric(&finished, "skills/written"), 0.0);
    assert_eq!(finished.failed.len(), 1);
    assert_eq!(finished.failed[0].0, 1);
    assert!(
        finished.failed[0].1.contains("\"<entry> hmm\""),
        "{:?}",
        finished.failed
    );
}

const MINIMAL: &str = r#"
[run]
dir = "runs/t"
seed = 1
steps = 2

[environment]
plugin = "household"

[algorithm]
plugin = "grpo"

[model]
[model.scratch]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1

[rollout]
tasks_per_step = 2
group_size = 4
temperature = 1.0
max_new_tokens = 8
max_turns = 8

[optimizer]
lr = 1e-3
"#;

fn parse(skills: &str) -> cairn_kernel::Result<PipelineConfig> {
    PipelineConfig::parse(&format!("{MINIMAL}\n{skills}"), "test.toml")
}

fn config_error(skills: &str) -> String {
    parse(skills).unwrap_err().to_string()
}

#[test]
fn skills_config_keys_are_checked_and_named() {
    let c = parse("").unwrap();
    assert_eq!(c.skills.reflector, ReflectorKind::Template);
    assert_eq!(c.skills.queue, 64);
    assert_eq!(
        c.skills_api_key(|_| panic!("no key is looked up")).unwrap(),
        None
    );

    let endpoint = "[skills]\nreflector = \"endpoint\"\n[skills.endpoint]\n\
                    base_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"MY_KEY\"\n";
    let c = parse(endpoint).unwrap();
    let e = c.skills.endpoint.as_ref().unwrap();
    assert_eq!(
        (e.timeout_ms, e.max_retries, e.max_tokens, e.temperature),
        (60_000, 2, 256, 0.0)
    );
    assert_eq!(
        c.skills_api_key(|var| (var == "MY_KEY").then(|| "sk-1".to_string()))
            .unwrap(),
        Some("sk-1".to_string())
    );
    // The run directory keeps the config as TOML: `[skills]` writes back what it read.
    let written = toml::to_string(&c.skills).unwrap();
    let back: SkillsConfig = toml::from_str(&written).unwrap();
    assert_eq!(toml::to_string(&back).unwrap(), written);
    assert!(written.contains("reflector = \"endpoint\""), "{written}");
    let missing = c.skills_api_key(|_| None).unwrap_err().to_string();
    assert!(
        missing.contains("key `skills.endpoint.api_key_env`, line ")
            && missing.contains("`MY_KEY` is not set"),
        "{missing}"
    );

    let cases: Vec<(String, &str)> = vec![
        (
            "[skills]\nreflector = \"endpoint\"\n".into(),
            "`skills.reflector`",
        ),
        ("[skills]\nqueue = 0\n".into(), "`skills.queue`"),
        ("[skills]\nevery = 5\n".into(), "every"),
        ("[skills]\nreflector = \"oracle\"\n".into(), "oracle"),
        (
            endpoint.replace("http://127.0.0.1:9/v1", "127.0.0.1:9"),
            "`skills.endpoint.base_url`",
        ),
        (
            format!("{endpoint}max_retries = 11\n"),
            "`skills.endpoint.max_retries`",
        ),
        (
            format!("{endpoint}timeout_ms = 0\n"),
            "`skills.endpoint.timeout_ms`",
        ),
        (
            "[skills.policy]\ntemperature = -1.0\n".into(),
            "`skills.policy.temperature`",
        ),
    ];
    for (text, key) in &cases {
        let err = config_error(text);
        assert!(err.contains(key), "{text:?}: {err}");
    }
}

fn check_reply(reply: &str, expected: Option<(&str, Option<&str>)>) {
    let expected = expected.map(|(text, trigger)| Draft::new(text, trigger.map(Into::into)));
    assert_eq!(skills::parse_reply(reply), expected, "reply: {reply:?}");
}

#[test]
fn replies_parse_by_the_documented_rules() {
    check_reply(
        "<entry>open the drawer first</entry>",
        Some(("open the drawer first", None)),
    );
    check_reply(
        "Sure! <entry>\n  open the drawer first \n</entry> done",
        Some(("open the drawer first", None)),
    );
    check_reply(
        "<entry>open it <trigger>a closed drawer</trigger> first</entry>",
        Some(("open it  first", Some("a closed drawer"))),
    );
    check_reply(
        "<trigger> a closed drawer </trigger><entry>open it</entry>",
        Some(("open it", Some("a closed drawer"))),
    );
    check_reply("<entry>a</entry><entry>b</entry>", Some(("a", None)));
    check_reply(
        "Here: ```json\n{\"text\": \"look in the cabinet\", \"trigger\": \"lost mug\"}\n```",
        Some(("look in the cabinet", Some("lost mug"))),
    );
    check_reply(
        r#"{"note": 1} then {"text": "second", "trigger": ""}"#,
        Some(("second", None)),
    );
    check_reply(r#"{"text": {"nested": 1}}"#, None);
    // An unclosed entry falls back to JSON, then fails.
    check_reply("<entry> always open", None);
    check_reply("<entry>   </entry>", None);
    check_reply(r#"{"text": "  "}"#, None);
    check_reply("I have no idea.", None);
    check_reply("", None);
}

#[test]
fn jobs_keep_request_order_then_turns() {
    let row = |t: u64, turn: u32| TurnRow {
        trajectory_id: t,
        turn,
        ..Default::default()
    };
    let rows = vec![row(1, 1), row(2, 0), row(1, 0), row(3, 0)];
    let request = ReflectionRequest {
        trajectories: vec![2, 1, 2, 9],
        ..Default::default()
    };
    let job = Job::new(4, request, &rows);
    let order: Vec<(u64, u32)> = job.rows.iter().map(|r| (r.trajectory_id, r.turn)).collect();
    assert_eq!(order, [(2, 0), (1, 0), (1, 1)], "a repeated id counts once");
    let groups: Vec<(u64, usize)> = job
        .trajectories()
        .iter()
        .map(|(id, r)| (*id, r.len()))
        .collect();
    assert_eq!(groups, [(2, 1), (1, 2)]);
    assert_eq!(job.missing_trajectories(), [9]);
}

#[test]
fn prompts_render_trajectories_then_the_reply_format() {
    let codec = Words(vec!["<stop>", "<unk>", "<sep>", "take", "mug"]);
    let mut acted = TurnRow {
        trajectory_id: 4,
        task_id: "mug-3".into(),
        observation: "You see a drawer. ".into(),
        success: true,
        episode_reward: 1.0,
        feedback: 1,
        ..Default::default()
    };
    acted.info.insert("action".into(), json!("open drawer"));
    // No `info.action`: the sampled ids are decoded; the last id has mask 0 (not sampled).
    let decoded = TurnRow {
        turn: 1,
        observation: "The drawer is open.".into(),
        response_ids: vec![3, 4, 3],
        response_mask: vec![1, 1, 0],
        turn_reward: 1.0,
        info: Default::default(),
        ..acted.clone()
    };
    let request = ReflectionRequest {
        prompt: "What worked?\n".into(),
        trajectories: vec![4],
        ..Default::default()
    };
    let job = Job::new(1, request, &[decoded, acted]);
    assert_eq!(
        skills::render_prompt(&job, &codec).unwrap(),
        "What worked?\n\n\
         Trajectory 4 (task mug-3): succeeded, reward 1\n\
         Turn 0\nObservation: You see a drawer.\nAction: open drawer\nFeedback: progress, reward 0\n\
         Turn 1\nObservation: The drawer is open.\nAction: take mug\nFeedback: progress, reward 1\n\n\
         Answer with the entry between <entry> and </entry>. If it applies only in some \
         situations, add the situation between <trigger> and </trigger>."
    );
}

/// OPID's analyzer format: an episode skill (the entry's text) and step skills by turn.
fn json_request(trajectories: &[u64], retries: u32) -> ReflectionRequest {
    let mut r = request(trajectories);
    r.extra.insert(
        "reply_format".into(),
        json!({
            "json_keys": {"episode_skill": "string", "step_skills": "object"},
            "retries": retries,
            "text_key": "episode_skill"
        }),
    );
    r
}

/// Words whose space-joined decoding is JSON: ids 3.. spell
/// `{"episode_skill": "look", "step_skills": {"1": "open", "0": "look"}}`.
const JSON_VOCAB: [&str; 12] = [
    "<stop>",
    "<unk>",
    "<sep>",
    "{\"episode_skill\":",
    "\"look\",",
    "\"step_skills\":",
    "{\"1\":",
    "\"open\",",
    "\"0\":",
    "\"look\"}}",
    "hmm",
    "{}}",
];

#[test]
fn a_json_reply_of_the_policy_is_stored_with_the_object_in_extra() {
    let (finished, puts) = policy_reflection_with(
        JSON_VOCAB.to_vec(),
        vec![3, 4, 5, 6, 7, 8, 9, 0],
        json_request(&[2], 2),
    );
    assert_eq!(finished.failed, []);
    assert_eq!(finished.new_entries, [100]);
    assert_eq!(metric(&finished, "skills/reasked"), 0.0);
    let mut want = expected_entry("look", &[2], 1, "skill-creator:policy");
    want.extra.insert(
        "reply_format".into(),
        json_request(&[2], 2).extra["reply_format"].clone(),
    );
    want.extra.insert(
        "reply".into(),
        json!({"episode_skill": "look", "step_skills": {"1": "open", "0": "look"}}),
    );
    want.extra.insert("reply_attempts".into(), json!(1));
    assert_eq!(puts[0].entries, [want]);
    // The key order of the reply is kept (OPID takes its first K step skills in that order).
    let reply = puts[0].entries[0].extra["reply"]["step_skills"]
        .as_object()
        .unwrap();
    assert_eq!(reply.keys().collect::<Vec<_>>(), ["1", "0"]);
}

#[test]
fn an_invalid_json_reply_is_reasked_then_counted_as_unparseable() {
    // "hmm" every time: the first reply and two re-asks fail; nothing is stored.
    let (finished, puts) =
        policy_reflection_with(JSON_VOCAB.to_vec(), vec![10, 0], json_request(&[2], 2));
    assert!(puts.is_empty());
    assert!(finished.new_entries.is_empty());
    assert_eq!(metric(&finished, "skills/unparseable"), 1.0);
    assert_eq!(metric(&finished, "skills/reasked"), 2.0);
    assert_eq!(metric(&finished, "skills/errors"), 0.0);
    assert_eq!(finished.failed.len(), 1);
    assert_eq!(
        finished.failed[0].1,
        "the policy's reply is not a JSON object with the requested keys (the reply holds no \
         JSON object) after 3 attempts: \"hmm\""
    );
    // A JSON object without `step_skills`, with no re-asks allowed: one attempt.
    let (finished, _) =
        policy_reflection_with(JSON_VOCAB.to_vec(), vec![3, 9, 0], json_request(&[2], 0));
    assert_eq!(metric(&finished, "skills/reasked"), 0.0);
    assert_eq!(
        finished.failed[0].1,
        r#"the policy's reply is not a JSON object with the requested keys (the JSON object has no key "step_skills") after 1 attempt: "{\"episode_skill\": \"look\"}}""#
    );
}

/// Replies from a script, one per ask; records the prompts.
struct Scripted {
    replies: Vec<&'static str>,
    prompts: Arc<Mutex<Vec<String>>>,
}

impl Reflector for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn reflect(&mut self, job: &Job) -> Result<Draft, ReflectionFailure> {
        let codec = Words(VOCAB.to_vec());
        skills::ask(job, &codec, "the script's reply", |prompt, attempt| {
            self.prompts.lock().push(prompt.to_string());
            Ok(self.replies[attempt as usize].to_string())
        })
    }
}

#[test]
fn a_reask_after_an_invalid_reply_can_succeed_and_counts() {
    let prompts = Arc::new(Mutex::new(Vec::new()));
    let scripted = Scripted {
        replies: vec![
            r#"{"episode_skill": "open the drawer first"}"#,
            r#"Fixed: {"episode_skill": "open the drawer first", "step_skills": {"1": "look"}}"#,
        ],
        prompts: prompts.clone(),
    };
    let (finished, puts) = System::new().block_on(async move {
        let puts = Arc::new(Mutex::new(Vec::new()));
        let bank = BankStub {
            puts: puts.clone(),
            next: 0,
        }
        .start();
        let skills = SkillCreatorActor::new(
            &SkillsConfig::default(),
            bank.recipient(),
            Box::new(scripted),
        )
        .start();
        skills
            .send(reflect(vec![json_request(&[1], 2)]))
            .await
            .unwrap()
            .unwrap();
        let finished = take_until(&skills, 1).await;
        let puts = std::mem::take(&mut *puts.lock());
        (finished, puts)
    });
    assert_eq!(finished.new_entries, [100]);
    assert_eq!(metric(&finished, "skills/reasked"), 1.0);
    let entry = &puts[0].entries[0];
    assert_eq!(entry.text, "open the drawer first");
    assert_eq!(entry.extra["reply_attempts"], 2);
    assert_eq!(entry.extra["reply"]["step_skills"], json!({"1": "look"}));
    let prompts = prompts.lock();
    assert_eq!(prompts.len(), 2);
    let instruction = "Answer with one JSON object and nothing else. It must have the keys \
                       \"episode_skill\" (a non-empty string), \"step_skills\" (a JSON object).";
    assert!(prompts[0].starts_with("What worked?\n\nTrajectory 1 (task mug-3): failed"));
    assert!(prompts[0].ends_with(instruction), "{}", prompts[0]);
    assert_eq!(
        prompts[1],
        format!(
            "{}\n\nYour previous answer could not be used: the JSON object has no key \
             \"step_skills\".\nPrevious answer:\n{}\n\nReturn only one valid JSON object with the \
             keys \"episode_skill\" (a non-empty string), \"step_skills\" (a JSON object).",
            prompts[0], r#"{"episode_skill": "open the drawer first"}"#
        )
    );
}

#[test]
fn the_template_reflector_answers_a_json_format_from_the_rows() {
    let json = |trajectories: &[u64]| {
        let job = Job::new(1, json_request(trajectories, 2), &rows());
        TemplateReflector.reflect(&job).unwrap()
    };
    // Trajectory 1 failed; its turn 1 was rejected.
    let failed = json(&[1]);
    let text = "failed after 2 turns; the last action `take mug 9` got: rejected";
    assert_eq!(failed.text, text);
    assert_eq!(
        serde_json::Value::Object(failed.reply.unwrap()),
        json!({"episode_skill": text, "step_skills": {"1": "`take mug 9` got: rejected"}})
    );
    let solved = json(&[2]);
    assert_eq!(
        serde_json::Value::Object(solved.reply.unwrap()),
        json!({
            "episode_skill": "solved in 2 turns: open drawer 1; take mug 1 from drawer 1",
            "step_skills": {}
        })
    );
    // A malformed format is an error naming the key, for every reflector.
    let mut bad = request(&[1]);
    bad.extra
        .insert("reply_format".into(), json!({"json_keys": {"a": "text"}}));
    let e = TemplateReflector
        .reflect(&Job::new(1, bad.clone(), &rows()))
        .unwrap_err();
    assert!(
        e.reason.starts_with(
            "the request's `extra.reply_format` is not a valid reply format: `json_keys.a`"
        ),
        "{e}"
    );
    assert!(skills::render_prompt(&Job::new(1, bad, &rows()), &Words(VOCAB.to_vec())).is_err());
}
