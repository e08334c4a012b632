//! `ucob` stacked on `grpo` and on `gigpo` (`cairn_plugin_sdk::Stack`): the estimator's
//! advantages are untouched, bit for bit, on the batch's rows and 0 on the auxiliary rows;
//! `ucob` adds its extra rows, its term and its metrics only.

use cairn_gigpo::Gigpo;
use cairn_grpo::Grpo;
use cairn_plugin_sdk::stack::{Member, Stack};
use cairn_plugin_sdk::{Algorithm, Batch, EntryKind, Role, TeacherForm, TurnRow};

use crate::{plan, row, test_host, ucob};
use cairn_plugin_sdk::testing::MockHost;

fn member(name: &str, algorithm: Box<dyn Algorithm>) -> Member {
    Member {
        name: name.into(),
        requirements: algorithm.requirements(),
        algorithm,
    }
}

/// Two groups of four trajectories, slots as `ucob` planned them (two `none`, two `good`).
/// Group 1 plays the worked example at `s0`: returns (none, 0.9025), (none, 0), (good, 0.95),
/// (good, 0) (γ = 0.95); group 2 succeeds nowhere.
fn batch(host: &MockHost) -> Batch {
    let mut u = ucob();
    let mut rows: Vec<TurnRow> = Vec::new();
    let s = plan(&mut u, host, 1);
    assert_eq!(s[2].label, "skill:2");
    // none: s0 → a1 → a2, reward 1 at the end (G = 0.9025 at s0).
    rows.push(row(1, 10, 0, &s[0], "s0", 0.0, 1.0));
    rows.push(row(1, 10, 1, &s[0], "a1", 0.0, 1.0));
    let mut last = row(1, 10, 2, &s[0], "a2", 1.0, 1.0);
    last.last_turn = true;
    rows.push(last);
    // none, fails at s0.
    let mut c = row(1, 11, 0, &s[1], "s0", 0.0, 0.0);
    c.last_turn = true;
    rows.push(c);
    // good: s0 → b1, reward 1 (G = 0.95 at s0): the winner.
    rows.push(row(1, 12, 0, &s[2], "s0", 0.0, 1.0));
    let mut last = row(1, 12, 1, &s[2], "b1", 1.0, 1.0);
    last.last_turn = true;
    rows.push(last);
    // good, fails at s0.
    let mut d = row(1, 13, 0, &s[3], "s0", 0.0, 0.0);
    d.last_turn = true;
    rows.push(d);
    let s = plan(&mut u, host, 2);
    for (k, v) in s.iter().enumerate() {
        let mut r = row(2, 20 + k as u64, 0, v, "t0", 0.0, 0.0);
        r.last_turn = true;
        rows.push(r);
    }
    Batch { step: 0, rows }
}

fn check(estimator: &str, base: Box<dyn Algorithm>, alone: Box<dyn Algorithm>) {
    let host = test_host(None);
    let b = batch(&host);
    let want = alone.signals(&b, &host).unwrap();
    let ucob_signals = ucob().signals(&b, &host).unwrap();

    let mut stack = Stack::new(vec![
        member(estimator, base),
        member("ucob", Box::new(ucob())),
    ])
    .unwrap();
    let r = stack.requirements();
    assert_eq!(r.role, Role::Estimator);
    assert!(r.anchor_keys && r.teacher_scores && r.teacher_topk && r.reflection);
    assert!(r.bank.contains(&EntryKind::Skill) && r.min_group_size >= 2);
    // The planner plans the slots.
    let slots = plan(&mut stack, &host, 9);
    assert_eq!(slots[0].extra["ucob_branch"], "none");
    assert_eq!(slots[3].extra["ucob_branch"], "good");

    let got = stack.signals(&b, &host).unwrap();
    got.validate_against(&b).unwrap();
    let n = b.rows.len();
    assert_eq!(
        got.advantages[..n],
        want.advantages[..],
        "{estimator}: advantages bit for bit"
    );
    assert_eq!(got.extra_rows, ucob_signals.extra_rows);
    assert_eq!(got.extra_rows.len(), 2, "winner × (none, 0) and (good, 0)");
    for (aux, adv) in got.extra_rows.iter().zip(&got.advantages[n..]) {
        assert!(
            adv.iter().all(|&a| a == 0.0),
            "an auxiliary row has no advantage"
        );
        // The winner's sampled ids, verbatim, under a no-skill prompt.
        assert_eq!(aux.response_ids, b.rows[4].response_ids);
        assert_eq!(aux.response_mask, b.rows[4].response_mask);
        assert_eq!(aux.prompt_ids, b.rows[4].prompt_ids);
        let prompt = aux.train_prompt_ids.as_ref().unwrap();
        assert!(
            !String::from_utf8_lossy(&prompt.iter().map(|&x| x as u8).collect::<Vec<_>>())
                .contains("Skills")
        );
    }
    assert_eq!(
        got.extra_rows[0].train_prompt_ids.as_ref(),
        Some(&b.rows[3].prompt_ids)
    );
    assert!(got.aux.is_empty());
    assert_eq!(got.teacher, ucob_signals.teacher);
    assert_eq!(got.teacher.len(), 1);
    assert_eq!(got.teacher[0].form, TeacherForm::TopKForwardKl { k: 32 });
    let rows: Vec<usize> = got.teacher[0].targets.iter().map(|t| t.row).collect();
    assert_eq!(rows, [n, n + 1]);
    assert_eq!(got.dropped_groups, want.dropped_groups);
    let mut metrics = want.metrics.clone();
    metrics.extend(ucob_signals.metrics.clone());
    assert_eq!(got.metrics, metrics);
}

#[test]
fn over_grpo_the_advantages_are_grpos_and_ucob_adds_only_its_rows_and_term() {
    check(
        "grpo",
        Box::new(Grpo::from_config_json("").unwrap()),
        Box::new(Grpo::from_config_json("").unwrap()),
    );
}

#[test]
fn over_gigpo_the_advantages_are_gigpos_and_ucob_adds_only_its_rows_and_term() {
    check(
        "gigpo",
        Box::new(Gigpo::from_config_json(r#"{"gamma": 0.95}"#).unwrap()),
        Box::new(Gigpo::from_config_json(r#"{"gamma": 0.95}"#).unwrap()),
    );
}
