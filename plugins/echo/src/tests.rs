//! Unit tests of the hooks with exact values: the worked example of the credit rule, credit
//! only on cited turns and selection tokens, the transitive walk, records and their budget,
//! the reconstructed prompt, trajectory scope, bad selections.

use cairn_plugin_sdk::{
    Algorithm, Batch, ContextVariant, EntryKind, Observation, Role, TurnContext,
    TurnContextRequest, TurnRow, TurnSummary,
};
use serde_json::json;

use crate::testing::{last_inject, memory_records, Toy};
use crate::*;

/// The id a response ends with (the stop token; not in the toy vocabulary).
const STOP: u32 = 99_999;

/// Turn `turn` of trajectory `traj` (group 1, task `iron`): the response is `action`'s ids
/// then the stop id, all trainable; `shown` is what its prompt showed (`extra.echo_selected`).
fn row(toy: &Toy, traj: u64, turn: u32, action: &str, reward: f32) -> TurnRow {
    let mut ids = toy.ids(action);
    ids.push(STOP);
    let l = ids.len();
    let mut info = serde_json::Map::new();
    info.insert("action".into(), json!(action));
    TurnRow {
        group_id: 1,
        trajectory_id: traj,
        turn,
        task_id: "iron".into(),
        prompt_ids: vec![1, 2, 3],
        response_ids: ids,
        response_logprobs: vec![-0.5; l],
        response_mask: vec![1; l],
        old_logprobs: vec![-0.5; l],
        episode_reward: reward,
        success: reward > 0.0,
        observation: format!("observation {turn}"),
        info,
        ..TurnRow::default()
    }
}

fn shown(mut row: TurnRow, indices: &[u32]) -> TurnRow {
    row.extra.insert(SELECTED_KEY.into(), json!(indices));
    row
}

fn trajectory(toy: &Toy, traj: u64, actions: &[&str], reward: f32) -> Vec<TurnRow> {
    let n = actions.len();
    actions
        .iter()
        .enumerate()
        .map(|(t, a)| {
            let mut r = row(toy, traj, t as u32, a, reward);
            r.last_turn = t + 1 == n;
            r
        })
        .collect()
}

fn echo(json: &str) -> Echo {
    Echo::from_config_json(json).unwrap()
}

/// The final advantages `Â · scale` of a constant estimator advantage, as the stack composes
/// them (f64, rounded once).
fn composed(adv: f32, scale: &[f32]) -> Vec<f32> {
    scale
        .iter()
        .map(|&s| (f64::from(adv) * f64::from(s)) as f32)
        .collect()
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

/// The worked example: success, `Â = 0.8`, `η = 0.5`, the answer turn t4 selected records
/// {1, 3}: t1 → 1.2, t2 → 0.8, t3 → 1.2, t4 (selection + answer) → 1.2, and t0 → 0.8
/// (docs/algorithms/echo.md, "Worked example").
#[test]
fn the_worked_example_gives_the_documented_advantages() {
    let toy = Toy::default();
    let host = toy.host();
    let rows = trajectory(
        &toy,
        7,
        &[
            "search[iron]",
            "search[iron atomic number]",
            "search[gold]",
            "search[iron discoverer]",
            "select[1,3] answer[26]",
        ],
        1.0,
    );
    let batch = Batch { step: 0, rows };
    let s = echo("").signals(&batch, &host).unwrap();
    s.validate_against(&batch).unwrap();
    assert!(
        s.advantages.is_empty(),
        "a stacked plugin gives no advantages"
    );
    let a: Vec<Vec<f32>> = s.advantage_scale.iter().map(|x| composed(0.8, x)).collect();
    let n = |r: usize| batch.rows[r].response_ids.len();
    close(&a[0], &vec![0.8; n(0)]);
    close(&a[1], &vec![1.2; n(1)]);
    close(&a[2], &vec![0.8; n(2)]);
    close(&a[3], &vec![1.2; n(3)]);
    // t4: `select[1,3]` is 6 toy tokens, then ` answer[26]` and the stop id.
    assert_eq!(toy.text(&batch.rows[4].response_ids[..6]), "select[1,3]");
    close(&a[4], &vec![1.2; n(4)]);
    assert_eq!(
        s.metrics,
        [
            ("echo/routed_trajectories".to_string(), 1.0),
            ("echo/uncited_successes".to_string(), 0.0),
            ("echo/evidence_turns".to_string(), 2.0),
            ("echo/credited_selections".to_string(), 1.0),
            ("echo/unmatched_selections".to_string(), 0.0),
            ("echo/invalid_citations".to_string(), 0.0),
            (
                "echo/routed_token_fraction".to_string(),
                (n(1) + n(3) + n(4)) as f64 / (0..5).map(n).sum::<usize>() as f64
            ),
        ]
    );
}

/// Over a group with a routed success, a failure that cites records, and a success that
/// cites none: every token keeps exactly `Â` except the tokens of the cited turns and of the
/// selection runs of the routed trajectory.
#[test]
fn credit_lands_only_on_cited_source_turns_and_selection_tokens() {
    let toy = Toy::default();
    let host = toy.host();
    let mut rows = trajectory(
        &toy,
        1,
        &[
            "search[iron]",
            "select[0] search[gold]",
            "search[iron discoverer]",
            "go select[2 , 0] answer[26] select[1]",
        ],
        1.0,
    );
    // The failure cites everything: no routing for it.
    rows.extend(trajectory(
        &toy,
        2,
        &["search[iron]", "search[tin]", "select[0,1] answer[50]"],
        0.0,
    ));
    // A success without a citation: no routing either.
    rows.extend(trajectory(&toy, 3, &["search[iron]", "answer[26]"], 1.0));
    let batch = Batch { step: 3, rows };
    let s = echo(r#"{"eta": 0.25}"#).signals(&batch, &host).unwrap();
    // Expected factor per token, built independently: trajectory 1's turns 0 and 2 whole
    // (evidence) and its answer turn 3 whole; turn 1's `select[0]` kept 0 alive only if
    // turn 2's prompt showed it, which no row says here: not credited.
    for (i, (row, scale)) in batch.rows.iter().zip(&s.advantage_scale).enumerate() {
        let action = credit::action(row);
        let routed: Vec<bool> = match (row.trajectory_id, row.turn) {
            (1, 0) | (1, 2) | (1, 3) => vec![true; scale.len()],
            _ => vec![false; scale.len()],
        };
        for (l, (&x, &r)) in scale.iter().zip(&routed).enumerate() {
            let want = if r { 1.25 } else { 1.0 };
            assert_eq!(x, want, "row {i} ({action:?}) token {l}");
        }
    }
    let metric = |name: &str| s.metrics.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(metric("echo/routed_trajectories"), 1.0);
    assert_eq!(metric("echo/uncited_successes"), 1.0);
    assert_eq!(metric("echo/evidence_turns"), 2.0);
    assert_eq!(metric("echo/credited_selections"), 1.0);
    // Failures: with eta 0 nothing is routed at all.
    let s = echo(r#"{"eta": 0}"#).signals(&batch, &host).unwrap();
    assert!(s.advantage_scale.iter().flatten().all(|&x| x == 1.0));
}

/// The selections that kept an evidence record alive (selected, shown in the next prompt,
/// still alive there) are credited back to where the chain breaks.
#[test]
fn selections_that_kept_the_evidence_alive_are_credited() {
    let toy = Toy::default();
    let host = toy.host();
    let actions = [
        "search[iron]",
        "search[iron atomic number]",
        "select[1] search[gold]",
        "select[1,2] search[tin]",
        "select[1] answer[26]",
    ];
    let build = |shown_at_3: &[u32]| {
        let mut rows = trajectory(&toy, 9, &actions, 1.0);
        rows[3] = shown(rows[3].clone(), shown_at_3);
        rows[4] = shown(rows[4].clone(), &[1, 2]);
        Batch { step: 0, rows }
    };
    let run_tokens = |turn: usize, run: &str| {
        let mut v = vec![1.5; toy.ids(run).len()];
        let n = toy.ids(actions[turn]).len() + 1;
        v.resize(n, 1.0);
        v
    };
    // t4 cites 1; t3's selection held 1 and t4's prompt showed it; t2's held 1 and t3's
    // prompt showed it: all three runs credited, turn 1 (the evidence) whole.
    let batch = build(&[1]);
    let s = echo("").signals(&batch, &host).unwrap();
    assert_eq!(
        s.advantage_scale[0],
        vec![1.0; batch.rows[0].response_ids.len()]
    );
    assert_eq!(
        s.advantage_scale[1],
        vec![1.5; batch.rows[1].response_ids.len()]
    );
    assert_eq!(s.advantage_scale[2], run_tokens(2, "select[1]"));
    assert_eq!(s.advantage_scale[3], run_tokens(3, "select[1,2]"));
    // The answer turn: every token.
    assert_eq!(
        s.advantage_scale[4],
        vec![1.5; batch.rows[4].response_ids.len()]
    );
    // Turn 3's prompt did not show record 1 (over budget): the chain breaks there, so t2's
    // selection kept nothing alive.
    let batch = build(&[2]);
    let s = echo("").signals(&batch, &host).unwrap();
    assert_eq!(
        s.advantage_scale[2],
        vec![1.0; batch.rows[2].response_ids.len()]
    );
    assert_eq!(s.advantage_scale[3], run_tokens(3, "select[1,2]"));
    let credited = s
        .metrics
        .iter()
        .find(|(n, _)| n == "echo/credited_selections")
        .unwrap();
    assert_eq!(credited.1, 2.0);
}

/// A citation of records that do not exist: those indices are dropped and counted, the rest
/// is routed; an answer citing only missing records routes nothing, and nothing fails.
#[test]
fn citations_of_missing_records_are_dropped_and_counted() {
    let toy = Toy::default();
    let host = toy.host();
    let mut rows = trajectory(
        &toy,
        4,
        &[
            "search[iron]",
            "search[tin]",
            "select[1, 3, 7, one] answer[26]",
        ],
        1.0,
    );
    rows.extend(trajectory(
        &toy,
        5,
        &["search[iron]", "select[5] answer[26]"],
        1.0,
    ));
    let batch = Batch { step: 0, rows };
    let s = echo("").signals(&batch, &host).unwrap();
    assert_eq!(
        s.advantage_scale[1],
        vec![1.5; batch.rows[1].response_ids.len()]
    );
    assert!(s.advantage_scale[0].iter().all(|&x| x == 1.0));
    assert!(s.advantage_scale[3..].iter().flatten().all(|&x| x == 1.0));
    let metric = |name: &str| s.metrics.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(metric("echo/invalid_citations"), 4.0);
    assert_eq!(metric("echo/routed_trajectories"), 1.0);
    assert_eq!(metric("echo/uncited_successes"), 1.0);
}

/// An earlier selection run whose sampled ids are not its canonical tokenisation: its tokens
/// are not credited (counted); the evidence turn and the answer turn still are.
#[test]
fn an_unmatched_selection_span_is_counted_and_the_evidence_still_credited() {
    let toy = Toy::default();
    let host = toy.host();
    let mut rows = trajectory(
        &toy,
        6,
        &[
            "search[iron]",
            "select[0] search[tin]",
            "select[0] answer[26]",
        ],
        1.0,
    );
    // Turn 1's selection kept record 0 alive (turn 2's prompt showed it), but the policy
    // sampled `select[0]` as other pieces than the tokenizer's (`sel` + `ect`...).
    rows[2] = shown(rows[2].clone(), &[0]);
    let mut ids = toy.ids("sel");
    ids.extend(toy.ids("ect[0] search[tin]"));
    ids.push(STOP);
    let l = ids.len();
    rows[1].response_ids = ids;
    rows[1].response_logprobs = vec![-0.5; l];
    rows[1].response_mask = vec![1; l];
    rows[1].old_logprobs = vec![-0.5; l];
    let batch = Batch { step: 0, rows };
    let s = echo("").signals(&batch, &host).unwrap();
    assert!(s.advantage_scale[1].iter().all(|&x| x == 1.0));
    assert!(s.advantage_scale[0].iter().all(|&x| x == 1.5));
    assert!(s.advantage_scale[2].iter().all(|&x| x == 1.5));
    let metric = |name: &str| s.metrics.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(metric("echo/unmatched_selections"), 1.0);
    assert_eq!(metric("echo/credited_selections"), 1.0);
}

fn summary(observation: &str, action: &str) -> TurnSummary {
    TurnSummary {
        observation: observation.into(),
        action: action.into(),
        ..TurnSummary::default()
    }
}

fn request(traj: u64, turns: Vec<TurnSummary>, observation: &str) -> TurnContextRequest {
    TurnContextRequest {
        step: 2,
        group_id: 1,
        trajectory_id: traj,
        task_id: "iron".into(),
        turn: turns.len() as u32,
        variant: ContextVariant::default(),
        turns,
        observation: Observation {
            text: observation.into(),
            ..Observation::default()
        },
    }
}

fn prompt(answer: TurnContext) -> (Vec<u32>, serde_json::Map<String, serde_json::Value>) {
    match answer {
        TurnContext::Prompt { prompt_ids, extra } => (prompt_ids, extra),
        other => panic!("expected a prompt, got {other:?}"),
    }
}

/// Turn by turn: records are written as turns complete, scoped to the trajectory, and each
/// prompt is task + selected records + the current observation, rendered by the host.
#[test]
fn each_turn_writes_its_record_and_rebuilds_the_prompt_from_the_selection() {
    let toy = Toy::default();
    let host = toy.host();
    let mut e = echo(r#"{"header": "Memory:"}"#);
    let q = "Question: what is the atomic number of iron?";
    let t0 = summary(q, "search[iron]");
    let o1 = "Iron: a metal, atomic number 26.";
    // Turn 1: record 0 is written; no record to show yet (record 0 is the observation).
    let (ids, extra) = prompt(
        e.next_context(&request(3, vec![t0.clone()], o1), &host)
            .unwrap(),
    );
    assert_eq!(
        last_inject(&host),
        format!("Task: {q}\nMemory:\n[0] search[iron] =>")
    );
    assert_eq!(toy.text(&ids), format!("{}\n{o1}", last_inject(&host)));
    assert_eq!(extra[SELECTED_KEY], json!([]));
    assert_eq!(extra[DEFAULT_KEY], json!(true));
    let records = memory_records(&host, 3);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].text, format!("[0] search[iron] => {o1}"));
    assert_eq!(records[0].task_id.as_deref(), Some("iron"));
    assert_eq!(records[0].provenance.source_trajectories, [3]);
    assert_eq!(
        serde_json::Value::Object(records[0].extra.clone()),
        json!({"idx": 0, "tokens": toy.ids(&records[0].text).len(), "cut": false,
               "raw": {"trajectory_id": 3, "turn": 0}})
    );
    // Turn 2, no selection in response 1: the default shows the most recent record (0).
    let t1 = summary(o1, "search[iron discoverer]");
    let o2 = "Iron has been known since antiquity.";
    let (_, extra) = prompt(
        e.next_context(&request(3, vec![t0.clone(), t1.clone()], o2), &host)
            .unwrap(),
    );
    assert_eq!(
        last_inject(&host),
        format!("Task: {q}\nMemory:\n[0] search[iron] => {o1}\n[1] search[iron discoverer] =>")
    );
    assert_eq!(extra[SELECTED_KEY], json!([0]));
    // Turn 3: response 2 selects record 0 only, and cites one that does not exist yet (2).
    let t2 = summary(o2, "select[0, 2] search[gold]");
    let o3 = "Gold: atomic number 79.";
    let (_, extra) = prompt(
        e.next_context(&request(3, vec![t0, t1, t2], o3), &host)
            .unwrap(),
    );
    assert_eq!(
        last_inject(&host),
        format!("Task: {q}\nMemory:\n[0] search[iron] => {o1}\n[2] search[gold] =>")
    );
    assert_eq!(extra[SELECTED_KEY], json!([0]));
    assert_eq!(extra[DEFAULT_KEY], json!(false));
    let texts: Vec<String> = memory_records(&host, 3)
        .into_iter()
        .map(|r| r.text)
        .collect();
    assert_eq!(
        texts,
        [
            format!("[0] search[iron] => {o1}"),
            format!("[1] search[iron discoverer] => {o2}"),
            format!("[2] search[gold] => {o3}"),
        ]
    );
    // Every query named the trajectory.
    assert!(host
        .queries
        .lock()
        .unwrap()
        .iter()
        .all(|q| q.trajectory_id == Some(3) && q.kinds == [EntryKind::MemoryRecord]));
    assert_eq!(host.metric_sum("echo/contexts"), 3.0);
    assert_eq!(host.metric_sum("echo/records_written"), 3.0);
    assert_eq!(host.metric_sum("echo/default_selections"), 2.0);
    assert_eq!(host.metric_sum("echo/invalid_indices"), 1.0);
    assert_eq!(host.metric_sum("echo/records_shown"), 2.0);
}

/// An environment that repeats its instructions and question in every observation (search-qa)
/// does not fill the records with them: the digest keeps only the lines the first observation
/// does not have, so the evidence fits in `b`.
#[test]
fn a_digest_leaves_out_the_lines_the_task_already_shows() {
    let toy = Toy::default();
    let host = toy.host();
    let mut e = echo(r#"{"record_tokens": 32, "context_budget": 64}"#);
    let intro = "Answer the question. Reply with search[query] or answer[text].";
    let question = "Question: what is the atomic number of iron";
    let o0 = format!("{intro}\n{question}\nTurns left: 3.");
    let o1 =
        format!("{intro}\nLatest results: iron | Atomic number: 26\n{question}\nTurns left: 2.");
    e.next_context(&request(4, vec![summary(&o0, "search[iron]")], &o1), &host)
        .unwrap();
    let records = memory_records(&host, 4);
    assert_eq!(
        records[0].text,
        "[0] search[iron] => Latest results: iron | Atomic number: 26 Turns left: 2."
    );
    assert!(!records[0].text.contains("Answer the question"));
    assert!(!records[0].text.contains("Question:"));
    assert_eq!(records[0].extra["cut"], json!(false));
    // Without the first observation to compare with, the whole observation is the digest.
    assert_eq!(
        record::line(0, "search[iron]", Some(&o1), None),
        format!("[0] search[iron] => {}", crate::select::collapse(&o1))
    );
}

/// Another trajectory's records are never read or shown, even of the same task.
#[test]
fn a_prompt_never_shows_another_trajectorys_records() {
    let toy = Toy::default();
    let host = toy.host();
    let mut e = echo("");
    let t0 = summary("Question: iron?", "search[iron]");
    let other = summary("Iron: 26", "search[secret]");
    prompt(
        e.next_context(
            &request(10, vec![t0.clone(), other], "secret result"),
            &host,
        )
        .unwrap(),
    );
    // Trajectory 11 of the same task selects index 1, which only trajectory 10 has.
    let mine = summary("Iron: 26", "select[0,1] search[tin]");
    let (_, extra) = prompt(
        e.next_context(&request(11, vec![t0, mine], "Tin: 50"), &host)
            .unwrap(),
    );
    assert!(
        !last_inject(&host).contains("secret"),
        "{}",
        last_inject(&host)
    );
    assert_eq!(extra[SELECTED_KEY], json!([0]));
    assert_eq!(memory_records(&host, 10).len(), 2);
    assert_eq!(memory_records(&host, 11).len(), 2);
}

/// A long observation's record is cut to `b` tokens at a word boundary; the selected records
/// are taken in the policy's order while they fit `B`, and the default most-recent window
/// stops at the first record that does not fit.
#[test]
fn records_fit_b_and_prompts_fit_the_context_budget() {
    let toy = Toy::default();
    let host = toy.host();
    let mut e = echo(
        r#"{"record_tokens": 16, "context_budget": 24, "task_block": false,
                       "header": ""}"#,
    );
    let long = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu";
    let turns = vec![
        summary("q", "search[a]"),
        summary(long, "search[b]"),
        summary("short", "search[c]"),
        summary("tiny", "select[2, 0, 1] search[d]"),
    ];
    let (_, extra) = prompt(
        e.next_context(&request(5, turns.clone(), "end"), &host)
            .unwrap(),
    );
    let records = memory_records(&host, 5);
    let tokens = |i: usize| records[i].extra["tokens"].as_u64().unwrap();
    // Record 0: `[0] search[a] => ` is 10 toy tokens, each word 1, ` …` 2: the line is cut
    // after the fourth word, at 16 tokens.
    assert_eq!(records[0].text, "[0] search[a] => alpha beta gamma delta …");
    assert_eq!(records[0].extra["cut"], json!(true));
    assert_eq!(tokens(0), 16);
    assert_eq!(tokens(0), toy.ids(&records[0].text).len() as u64);
    assert_eq!(records[1].text, "[1] search[b] => short");
    assert_eq!(records[2].text, "[2] search[c] => tiny");
    assert_eq!(records[1].extra["cut"], json!(false));
    // Selection [2, 0, 1]: 2 (11 tokens) fits, 0 (16) does not (27 > 24), 1 (11) does.
    assert_eq!((tokens(1), tokens(2)), (11, 11));
    assert_eq!(extra[SELECTED_KEY], json!([1, 2]));
    assert_eq!(extra[TOKENS_KEY], json!(22));
    assert_eq!(host.metric_sum("echo/over_budget"), 1.0);
    // No selection: the most recent records while they fit: 2, 1 (22), then 0 would not.
    let mut turns = turns;
    turns[3].action = "search[d]".into();
    let (_, extra) = prompt(e.next_context(&request(5, turns, "end"), &host).unwrap());
    assert_eq!(extra[SELECTED_KEY], json!([1, 2]));
    assert_eq!(extra[DEFAULT_KEY], json!(true));
    // The records were written once.
    assert_eq!(memory_records(&host, 5).len(), 4);
}

/// `observe` writes what no `next_context` wrote: the last turn's record (and a record a
/// context call missed), from the step's rows, once.
#[test]
fn observe_writes_the_last_turns_record_once() {
    let toy = Toy::default();
    let host = toy.host();
    let mut e = echo("");
    // Turn 1's context call wrote record 0 of trajectory 8.
    prompt(
        e.next_context(
            &request(
                8,
                vec![summary("observation 0", "search[iron]")],
                "observation 1",
            ),
            &host,
        )
        .unwrap(),
    );
    let mut rows = trajectory(&toy, 8, &["search[iron]", "select[0] answer[26]"], 1.0);
    rows.extend(trajectory(&toy, 12, &["answer[3]"], 0.0));
    let report = cairn_plugin_sdk::StepReport {
        batch: Batch { step: 0, rows },
        ..Default::default()
    };
    e.observe(&report, &host).unwrap();
    let texts = |t| -> Vec<String> {
        memory_records(&host, t)
            .into_iter()
            .map(|r| r.text)
            .collect()
    };
    assert_eq!(
        texts(8),
        [
            "[0] search[iron] => observation 1",
            "[1] answer[26] => (episode ended)"
        ]
    );
    assert_eq!(texts(12), ["[0] answer[3] => (episode ended)"]);
    e.observe(&report, &host).unwrap();
    assert_eq!(memory_records(&host, 8).len(), 2);
    assert_eq!(
        host.metrics.lock().unwrap().last().unwrap(),
        &("echo/final_records_written".to_string(), 0.0)
    );
}

#[test]
fn echo_is_an_auxiliary_plugin_with_a_turn_hook_and_memory_records() {
    let r = echo("").requirements();
    assert_eq!(r.role, Role::Auxiliary);
    assert!(r.turn_context);
    assert_eq!(r.bank, [EntryKind::MemoryRecord]);
    assert!(!r.teacher_scores && !r.reflection && !r.anchor_keys);
    // No turn before: keep.
    let toy = Toy::default();
    let host = toy.host();
    let answer = echo("")
        .next_context(&request(1, vec![], "o"), &host)
        .unwrap();
    assert_eq!(answer, TurnContext::Keep);
    assert!(Echo::from_config_json(r#"{"context_budget": 1}"#).is_err());
}
