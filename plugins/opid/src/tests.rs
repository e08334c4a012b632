//! The plugin's hooks against a test host: the worked example through `signals`, the routing
//! order, the analysis round trip through `observe` (requests, answers, failures, a full
//! queue), the statistical selector's candidates, state and config.

use cairn_plugin_sdk::testing::{render_bytes as render, MockHost};
use cairn_plugin_sdk::{
    Algorithm, BankEntry, Batch, ContextVariant, EntryKind, Role, ScoreWeights, Scored, StepReport,
    TurnRow,
};
use serde_json::{json, Value};

use crate::{Opid, OpidState};

/// `ℓ_old`, `ℓ^ep`, `ℓ^st` of the worked example.
const OLD: [f32; 3] = [-0.7, -1.5, -0.2];
const EP: [f32; 3] = [-0.5, -1.6, -0.2];
const ST: [f32; 3] = [-0.3, -0.9, -0.1];

/// The SDK's mock host, rendering `inject|observation` as bytes, scoring a context holding
/// the step header with [`ST`], the episode header with [`EP`], anything else with `base`,
/// and ranking the bank newest id first; the test answers reflections with [`answer`].
fn test_host(base: [f32; 3]) -> MockHost {
    MockHost::default()
        .with_scorer(move |r| {
            let context = text(&r.context_ids);
            let lp = if context.contains("Step skill") {
                ST
            } else if context.contains("Episode skill") {
                EP
            } else {
                base
            };
            Ok(Scored {
                logprobs: lp[..r.response_ids.len()].to_vec(),
                ..Scored::default()
            })
        })
        .with_ranking(|_, entries| entries.sort_by_key(|e| std::cmp::Reverse(e.id)))
}

/// [`test_host`] with the worked example's `ℓ_old` as the skill-free scores.
fn plain_host() -> MockHost {
    test_host(OLD)
}

fn text(ids: &[u32]) -> String {
    ids.iter().map(|&b| b as u8 as char).collect()
}

/// Answers reflection `ticket` (1-based) with `reply`, as the skill creator would: a Skill
/// entry with the request's extra, `reflection_ticket` and `reply`. Returns its id.
fn answer(host: &MockHost, ticket: u64, reply: Value) -> u64 {
    let request = host.reflections.lock().unwrap()[ticket as usize - 1].clone();
    let mut extra = request.extra.clone();
    extra.insert("reflection_ticket".into(), json!(ticket));
    extra.insert("reply".into(), reply.clone());
    let id = 100 + host.entries.lock().unwrap().len() as u64;
    host.put(BankEntry {
        id,
        kind: EntryKind::Skill,
        text: reply["episode_skill"].as_str().unwrap_or("").into(),
        task_id: request.task_id.clone(),
        extra,
        ..BankEntry::default()
    });
    id
}

/// The last value of metric `name`.
fn metric(host: &MockHost, name: &str) -> f64 {
    host.metric(name)
        .unwrap_or_else(|| panic!("no metric {name}: {:?}", host.metrics.lock().unwrap()))
}

/// One turn of `task` with the worked example's three tokens and `ℓ_old`, its prompt exactly
/// what the host renders for it.
fn row(traj: u64, turn: u32, anchor: &str, success: bool, task: &str) -> TurnRow {
    let observation = format!("you are at {anchor}");
    TurnRow {
        group_id: 1,
        trajectory_id: traj,
        turn,
        task_id: task.into(),
        policy_version: 4,
        prompt_ids: render("", &observation),
        response_ids: vec![5, 6, 7],
        response_logprobs: OLD.to_vec(),
        response_mask: vec![1, 1, 1],
        old_logprobs: OLD.to_vec(),
        episode_reward: f32::from(u8::from(success)),
        success,
        anchor: Some(anchor.into()),
        observation,
        ..TurnRow::default()
    }
}

/// Step 0 of task `clean-mug`: trajectory 1 fails (s0 → s1), trajectory 2 succeeds
/// (s0 → s2); turn rewards 0 then the outcome.
fn step0() -> Batch {
    let mut rows = vec![
        row(1, 0, "s0", false, "clean-mug"),
        row(1, 1, "s1", false, "clean-mug"),
        row(2, 0, "s0", true, "clean-mug"),
        row(2, 1, "s2", true, "clean-mug"),
    ];
    for r in [1, 3] {
        rows[r].last_turn = true;
        rows[r].turn_reward = rows[r].episode_reward;
    }
    Batch { step: 0, rows }
}

fn report(batch: Batch, new_entries: Vec<u64>, failed: Vec<(u64, String)>) -> StepReport {
    StepReport {
        step: batch.step,
        policy_version: batch.step + 1,
        batch,
        new_entries,
        failed_reflections: failed,
        ..StepReport::default()
    }
}

/// Trajectory 1's analysis: an avoidance rule and a step skill for its turn 1 (anchor s1).
fn failed_reply() -> Value {
    json!({"episode_skill": "do not go to the sofa", "step_skills": {"1": "look in the drawer"}})
}

/// An `opid` that asked for step 0's analyses and got trajectory 1's answer at step 1.
fn analysed(config: &str, host: &MockHost) -> Opid {
    let mut opid = Opid::from_config_json(config).unwrap();
    opid.observe(&report(step0(), vec![], vec![]), host)
        .unwrap();
    assert_eq!(host.reflections.lock().unwrap().len(), 2);
    let id = answer(host, 1, failed_reply());
    let mut next = step0();
    next.step = 1;
    for r in &mut next.rows {
        r.trajectory_id += 10;
    }
    opid.observe(&report(next, vec![id], vec![]), host).unwrap();
    opid
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-7, "{got:?} vs {want:?}");
    }
}

/// The final advantage with the worked example's `A^ep = 0.5`.
fn with_episode_advantage(add: &[f32]) -> Vec<f32> {
    add.iter().map(|a| 0.5 + a).collect()
}

#[test]
fn the_worked_example_through_signals_critical_first() {
    let host = plain_host();
    let opid = analysed("", &host);
    // Step 2: a failed row at s1 (the step skill's anchor) and one at s0 (episode skill only).
    let batch = Batch {
        step: 2,
        rows: vec![
            row(31, 1, "s1", false, "clean-mug"),
            row(31, 0, "s0", false, "clean-mug"),
        ],
    };
    let s = opid.signals(&batch, &host).unwrap();
    s.validate_against(&batch).unwrap();
    assert!(s.advantages.is_empty());
    close(
        &with_episode_advantage(&s.advantage_add[0]),
        &[0.5004, 0.5006, 0.5001],
    );
    close(
        &with_episode_advantage(&s.advantage_add[1]),
        &[0.5002, 0.4999, 0.5],
    );
    // Scored by the version that sampled the rows, on their own sampled ids, under the row's
    // context with the skill injected.
    let scored = host.scores.lock().unwrap();
    assert_eq!(scored.len(), 2);
    for r in scored.iter() {
        assert_eq!(r.weights, ScoreWeights::Version(4));
        assert_eq!(r.response_ids, [5, 6, 7]);
    }
    assert_eq!(
        text(&scored[0].context_ids),
        "Step skill for this decision only:\nlook in the drawer|you are at s1"
    );
    assert_eq!(
        text(&scored[1].context_ids),
        "Episode skill, from earlier attempts at this task; refer to it when deciding what to \
         do:\ndo not go to the sofa|you are at s0"
    );
    let m = |k: &str| s.metrics.iter().find(|(n, _)| n == k).unwrap().1;
    assert_eq!((m("opid/rows_step"), m("opid/rows_episode")), (1.0, 1.0));
    assert_eq!(m("opid/rows_rescored_base"), 0.0);
    assert!((m("opid/d_st_mean") - 1.1 / 3.0).abs() < 1e-6);
    assert!((m("opid/d_ep_mean") - 0.1 / 3.0).abs() < 1e-6);
    assert_eq!(m("opid/teacher_token_share"), 1.0);
}

#[test]
fn the_worked_example_additive() {
    let host = plain_host();
    let opid = analysed(r#"{"routing": "additive"}"#, &host);
    let batch = Batch {
        step: 2,
        rows: vec![row(31, 1, "s1", false, "clean-mug")],
    };
    let s = opid.signals(&batch, &host).unwrap();
    close(
        &with_episode_advantage(&s.advantage_add[0]),
        &[0.5006, 0.5005, 0.5001],
    );
    assert_eq!(host.scores.lock().unwrap().len(), 2);
}

#[test]
fn routing_is_step_skill_first_then_episode_then_none() {
    let host = plain_host();
    let opid = analysed("", &host);
    let mut masked = row(31, 1, "s1", false, "clean-mug");
    masked.response_mask = vec![0, 0, 0];
    let batch = Batch {
        step: 2,
        rows: vec![
            // Step skill of its anchor: the step context.
            row(31, 1, "s1", false, "clean-mug"),
            // A successful row of the task: no success skill yet, the failure's is used.
            row(32, 0, "s0", true, "clean-mug"),
            // Another task: no skill at all, no scoring.
            row(33, 0, "s1", false, "other-task"),
            // Nothing trainable: never scored.
            masked,
        ],
    };
    let s = opid.signals(&batch, &host).unwrap();
    s.validate_against(&batch).unwrap();
    let contexts: Vec<String> = host
        .scores
        .lock()
        .unwrap()
        .iter()
        .map(|r| text(&r.context_ids))
        .collect();
    assert_eq!(contexts.len(), 2);
    assert!(contexts[0].starts_with("Step skill") && contexts[0].ends_with("at s1"));
    assert!(contexts[1].starts_with("Episode skill") && contexts[1].ends_with("at s0"));
    assert_eq!(s.advantage_add[2], [0.0, 0.0, 0.0]);
    assert_eq!(s.advantage_add[3], [0.0, 0.0, 0.0]);
    // Without a step weight the critical row falls back to the episode skill.
    host.scores.lock().unwrap().clear();
    let no_step = analysed(r#"{"w_st": 0.0}"#, &plain_host());
    no_step.signals(&batch, &host).unwrap();
    let contexts = host.scores.lock().unwrap();
    assert_eq!(contexts.len(), 2);
    assert!(contexts
        .iter()
        .all(|r| text(&r.context_ids).starts_with("Episode skill")));
}

#[test]
fn a_task_without_skills_gets_no_teacher_term_and_no_scoring() {
    let host = plain_host();
    let opid = Opid::from_config_json("").unwrap();
    let s = opid.signals(&step0(), &host).unwrap();
    assert!(s.advantage_add.is_empty());
    assert!(host.scores.lock().unwrap().is_empty());
    assert!(s
        .metrics
        .iter()
        .any(|(k, v)| k == "opid/rows_episode" && *v == 0.0));
}

#[test]
fn a_prompt_the_builder_does_not_reproduce_is_compared_with_its_rescored_plain_context() {
    // The row's prompt has something the renderer does not give back (history, tools): the
    // plain context is re-scored with the same weights; here it scores like the skill-free
    // model would, [−0.6, −1.5, −0.3].
    let host = test_host([-0.6, -1.5, -0.3]);
    let opid = analysed("", &host);
    let mut r = row(31, 0, "s0", false, "clean-mug");
    r.prompt_ids.insert(0, 7);
    let batch = Batch {
        step: 2,
        rows: vec![r.clone()],
    };
    let s = opid.signals(&batch, &host).unwrap();
    // D^ep = ℓ^ep − ℓ^plain = [0.1, −0.1, 0.1].
    close(&s.advantage_add[0], &[0.0001, -0.0001, 0.0001]);
    assert_eq!(host.scores.lock().unwrap().len(), 2);
    assert_eq!(
        text(&host.scores.lock().unwrap()[0].context_ids),
        "|you are at s0"
    );
    // `reference = "rescored"` always does so, even when the prompt matches.
    host.scores.lock().unwrap().clear();
    let always = analysed(r#"{"reference": "rescored"}"#, &plain_host());
    let exact = Batch {
        step: 2,
        rows: vec![row(31, 0, "s0", false, "clean-mug")],
    };
    let s = always.signals(&exact, &host).unwrap();
    close(&s.advantage_add[0], &[0.0001, -0.0001, 0.0001]);
    // With the prompt reproduced, `ℓ_old` is the reference and must be there.
    let plain = analysed("", &plain_host());
    let mut missing = row(31, 0, "s0", false, "clean-mug");
    missing.old_logprobs.clear();
    let e = plain
        .signals(
            &Batch {
                step: 2,
                rows: vec![missing],
            },
            &host,
        )
        .unwrap_err();
    assert!(e.message.contains("row 0 has 0 old_logprobs"), "{e}");
}

#[test]
fn normalisation_and_clip_apply_before_the_weights() {
    let host = plain_host();
    let opid = analysed(r#"{"normalise": "mean_norm", "clip": 0.05}"#, &host);
    let batch = Batch {
        step: 2,
        rows: vec![row(31, 0, "s0", false, "clean-mug")],
    };
    let s = opid.signals(&batch, &host).unwrap();
    // D^ep = [0.2, −0.1, 0], mean 1/30 removed: [0.1667, −0.1333, −0.0333], clipped to ±0.05.
    close(&s.advantage_add[0], &[0.00005, -0.00005, -0.0000333333]);
}

#[test]
fn observe_asks_one_analysis_per_completed_trajectory_with_a_json_format() {
    let host = plain_host();
    let mut opid = Opid::from_config_json("").unwrap();
    let mut b = step0();
    // A trajectory cut by a fault is not analysed.
    let mut cut = row(3, 0, "s0", false, "clean-mug");
    cut.finish_reason = cairn_plugin_sdk::FinishReason::Aborted;
    cut.last_turn = true;
    b.rows.push(cut);
    opid.observe(&report(b, vec![], vec![]), &host).unwrap();
    let asked = host.reflections.lock().unwrap();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[0].trajectories, [1]);
    assert_eq!(asked[0].kind, EntryKind::Skill);
    assert_eq!(asked[0].extra["opid"]["candidates"], json!([0, 1]));
    assert_eq!(
        asked[0].extra["reply_format"]["json_keys"],
        json!({"episode_skill": "string", "step_skills": "object"})
    );
    assert_eq!(asked[0].extra["reply_format"]["retries"], 2);
    assert!(asked[0].prompt.contains("avoidance rule"));
    assert!(asked[1].prompt.contains("reusable workflow"));
    assert_eq!(opid.state().pending.len(), 2);
    assert_eq!(metric(&host, "opid/reflections_requested"), 2.0);
    drop(asked);

    let failed_only = plain_host();
    let mut f = Opid::from_config_json(r#"{"failed_only": true, "retries": 0}"#).unwrap();
    f.observe(&report(step0(), vec![], vec![]), &failed_only)
        .unwrap();
    let asked = failed_only.reflections.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].trajectories, [1]);
    assert_eq!(asked[0].extra["reply_format"]["retries"], 0);
}

#[test]
fn an_analysis_that_failed_is_counted_and_training_goes_on_without_its_skill() {
    // The skill creator re-asked the analyzer and then gave up on ticket 1 (invalid JSON):
    // it reports the failure; ticket 2 (trajectory 2, the success) is answered.
    let host = plain_host();
    let mut opid = Opid::from_config_json("").unwrap();
    opid.observe(&report(step0(), vec![], vec![]), &host)
        .unwrap();
    let id = answer(
        &host,
        2,
        json!({"episode_skill": "open the drawer first", "step_skills": {}}),
    );
    let mut next = step0();
    next.step = 1;
    for r in &mut next.rows {
        r.trajectory_id += 10;
    }
    let failure = (
        1,
        "the policy's reply is not a JSON object with the requested keys (the reply holds no \
         JSON object) after 3 attempts: \"hmm\""
            .to_string(),
    );
    opid.observe(
        &report(
            next.clone(),
            vec![id],
            vec![failure, (99, "another plugin's".into())],
        ),
        &host,
    )
    .unwrap();
    assert_eq!(metric(&host, "opid/reflections_failed"), 1.0);
    assert_eq!(metric(&host, "opid/analyses_received"), 1.0);
    assert_eq!(opid.state().counters.failed, 1);
    // Two new requests for step 1's trajectories are pending; tickets 1 and 2 are settled.
    assert_eq!(
        opid.state().pending.keys().copied().collect::<Vec<_>>(),
        [3, 4]
    );
    // Failed rows get the success's skill as their fallback; nothing for the failed
    // trajectory's own step skills, which never arrived; no error.
    let s = opid.signals(&next, &host).unwrap();
    assert_eq!(host.scores.lock().unwrap().len(), 4);
    assert!(host
        .scores
        .lock()
        .unwrap()
        .iter()
        .all(|r| text(&r.context_ids).contains("open the drawer first")));
    close(&s.advantage_add[0], &[0.0002, -0.0001, 0.0]);
}

#[test]
fn a_full_reflection_queue_is_counted_not_an_error() {
    let host = plain_host().with_reflection_room(1);
    let mut opid = Opid::from_config_json("").unwrap();
    opid.observe(&report(step0(), vec![], vec![]), &host)
        .unwrap();
    assert_eq!(metric(&host, "opid/reflections_requested"), 1.0);
    assert_eq!(metric(&host, "opid/reflections_refused"), 1.0);
    assert_eq!(opid.state().counters.refused, 1);
}

#[test]
fn the_statistical_selector_names_the_candidate_turns() {
    // Group 1 at s0: trajectory 1 fails (return 0), 2 succeeds (0.95 at s0): the s0 group has
    // variance 0.225625 and is the only eligible one; trajectory 1's turn 0 is below the mean.
    let host = plain_host();
    let mut opid = Opid::from_config_json(r#"{"critical": "statistical"}"#).unwrap();
    assert!(opid.requirements().anchor_keys);
    opid.observe(&report(step0(), vec![], vec![]), &host)
        .unwrap();
    let asked = host.reflections.lock().unwrap();
    assert_eq!(asked[0].extra["opid"]["candidates"], json!([0]));
    assert_eq!(asked[1].extra["opid"]["candidates"], json!([]));
    assert!(asked[0]
        .prompt
        .contains("at most 1 critical turn, chosen from turns [0]"));
    assert!(asked[1]
        .prompt
        .contains("\"step_skills\": an empty object {}."));
    assert_eq!(metric(&host, "opid/critical_turns"), 1.0);
    drop(asked);
    // The answer's step skill for turn 1 is not a candidate: dropped.
    let id = answer(&host, 1, failed_reply());
    let mut next = step0();
    next.step = 1;
    opid.observe(&report(next, vec![id], vec![]), &host)
        .unwrap();
    assert_eq!(metric(&host, "opid/step_skills_dropped"), 1.0);
    assert_eq!(metric(&host, "opid/step_skills_kept"), 0.0);
}

#[test]
fn state_round_trips_and_a_resume_drops_pending_tickets() {
    let host = plain_host();
    let opid = analysed("", &host);
    let saved = opid.save_state().unwrap();
    let mut resumed = Opid::from_config_json("").unwrap();
    resumed.load_state(&saved).unwrap();
    let mut want: OpidState = opid.state().clone();
    assert!(!want.pending.is_empty());
    want.pending.clear();
    assert_eq!(resumed.state(), &want);
    assert_eq!(resumed.state().skills.0["clean-mug"].steps.len(), 1);
    let e = resumed.load_state("{not json").unwrap_err();
    assert!(e.message.contains("the opid state is not valid"), "{e}");
    resumed.load_state("").unwrap();
}

#[test]
fn unanswered_tickets_expire() {
    let host = plain_host();
    let mut opid = Opid::from_config_json(r#"{"failed_only": true}"#).unwrap();
    opid.observe(&report(step0(), vec![], vec![]), &host)
        .unwrap();
    let late = Batch {
        step: crate::MAX_PENDING_STEPS,
        ..Batch::default()
    };
    opid.observe(&report(late, vec![], vec![]), &host).unwrap();
    assert_eq!(metric(&host, "opid/pending_expired"), 1.0);
    assert!(opid.state().pending.is_empty());
}

#[test]
fn requirements_and_config_errors() {
    let opid = Opid::from_config_json("").unwrap();
    let r = opid.requirements();
    assert_eq!(r.role, Role::Auxiliary);
    assert!(r.teacher_scores && r.reflection && !r.anchor_keys && !r.teacher_topk);
    assert_eq!(r.bank, [EntryKind::Skill]);
    let c = opid.config();
    assert_eq!(
        (c.w_ep, c.w_st, c.max_step_skills, c.retries),
        (0.001, 0.001, 5, 2)
    );
    for (bad, key) in [
        (r#"{"w_ep": -1}"#, "`w_ep`"),
        (r#"{"w_ep": 0, "w_st": 0}"#, "`w_ep` and `w_st` are both 0"),
        (
            r#"{"max_step_skills": 0}"#,
            "`max_step_skills` = 0 with `w_st` = 0.001",
        ),
        (r#"{"max_step_skills": 0, "w_st": 0.5}"#, "set `w_st = 0`"),
        (r#"{"retries": 11}"#, "`retries`"),
        (r#"{"clip": 0}"#, "`clip`"),
        (r#"{"gamma": 1.5}"#, "`gamma`"),
        (r#"{"var_quantile": 2}"#, "`var_quantile`"),
        (r#"{"min_group_size": 1}"#, "`min_group_size`"),
        (
            r#"{"critical_per_trajectory": 0}"#,
            "`critical_per_trajectory`",
        ),
        (r#"{"max_skill_chars": 0}"#, "`max_skill_chars`"),
        (r#"{"routing": "first"}"#, "`routing`"),
        (r#"{"weights": 1}"#, "unknown field `weights`"),
    ] {
        let e = Opid::from_config_json(bad).err().unwrap();
        assert!(e.message.contains(key), "{bad}: {e}");
    }
    // Without a step term, no step skill is needed.
    let c = Opid::from_config_json(r#"{"max_step_skills": 0, "w_st": 0}"#).unwrap();
    assert_eq!((c.config().max_step_skills, c.config().w_st), (0, 0.0));
    // A variant's injection is kept before the skill block.
    let v = ContextVariant {
        inject: "hint".into(),
        ..ContextVariant::default()
    };
    assert_eq!(opid.with_skill(&v, "H:", "s").inject, "hint\n\nH:\ns");
    assert_eq!(
        opid.with_skill(&ContextVariant::default(), "", "s").inject,
        "s"
    );
}
