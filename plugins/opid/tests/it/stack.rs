//! `opid` stacked on `grpo` and on `gigpo` (`cairn_plugin_sdk::Stack`): the estimator gives
//! `A^ep` (+ `ω·A^S`), opid's `advantage_add` is composed into the stack's final advantages,
//! `A_l = A^est_l + w_ep·D^ep_l + w_st·D^st_l`, with the worked example's exact values.

use cairn_gigpo::Gigpo;
use cairn_grpo::Grpo;
use cairn_opid::Opid;
use cairn_plugin_sdk::stack::{Member, Stack};
use cairn_plugin_sdk::{Algorithm, Batch, Role, StepReport, TurnRow};
use serde_json::json;

use crate::{answer, row, test_host};

fn member(name: &str, algorithm: Box<dyn Algorithm>) -> Member {
    Member {
        name: name.into(),
        requirements: algorithm.requirements(),
        algorithm,
    }
}

/// A group of two two-turn trajectories: `fail` (R = 0) and `win` (R = 1), at the anchors
/// given, turn rewards on the last turn.
fn group(group: u64, fail: (u64, [&str; 2]), win: (u64, [&str; 2])) -> Vec<TurnRow> {
    let mut rows = Vec::new();
    for (traj, anchors, success) in [(fail.0, fail.1, false), (win.0, win.1, true)] {
        for (turn, anchor) in anchors.iter().enumerate() {
            let mut r = row(group, traj, turn as u32, anchor, success);
            if turn == 1 {
                r.last_turn = true;
                r.turn_reward = r.episode_reward;
            }
            rows.push(r);
        }
    }
    rows
}

fn report(batch: Batch, new_entries: Vec<u64>) -> StepReport {
    StepReport {
        step: batch.step,
        policy_version: batch.step + 1,
        batch,
        new_entries,
        ..StepReport::default()
    }
}

/// `[rows][L]` values.
type PerToken = Vec<Vec<f32>>;

/// Step 2: 31 fails via `fail`, 32 succeeds via `win`.
fn step2(fail: [&str; 2], win: [&str; 2]) -> Batch {
    Batch {
        step: 2,
        rows: group(3, (31, fail), (32, win)),
    }
}

/// Builds the stack, plays steps 0 and 1 through `observe` (step 0's two analyses are
/// answered before step 1), and returns the stack's advantages on `batch`, the estimator's
/// alone, and opid's `advantage_add` alone.
fn run(
    estimator: &str,
    make: &dyn Fn() -> Box<dyn Algorithm>,
    opid_config: &str,
    batch: Batch,
) -> [PerToken; 3] {
    let host = test_host();
    let mut stack = Stack::new(vec![
        member(estimator, make()),
        member(
            "opid",
            Box::new(Opid::from_config_json(opid_config).unwrap()),
        ),
    ])
    .unwrap();
    let r = stack.requirements();
    assert_eq!(r.role, Role::Estimator);
    assert!(r.teacher_scores && r.reflection);

    // Step 0: trajectory 1 fails via s0 → s1, trajectory 2 succeeds via s0 → s2.
    let step0 = Batch {
        step: 0,
        rows: group(1, (1, ["s0", "s1"]), (2, ["s0", "s2"])),
    };
    stack.observe(&report(step0, vec![]), &host).unwrap();
    assert_eq!(host.reflections.lock().unwrap().len(), 2);
    let failed = answer(
        &host,
        1,
        json!({"episode_skill": "do not go to the sofa", "step_skills": {"1": "look in the drawer"}}),
    );
    let won = answer(
        &host,
        2,
        json!({"episode_skill": "open the drawer first", "step_skills": {"0": "go to the drawer"}}),
    );
    let step1 = Batch {
        step: 1,
        rows: group(2, (11, ["s0", "s1"]), (12, ["s0", "s2"])),
    };
    stack
        .observe(&report(step1, vec![failed, won]), &host)
        .unwrap();

    let got = stack.signals(&batch, &host).unwrap();
    got.validate_against(&batch).unwrap();
    assert!(got.advantage_add.is_empty() && got.advantage_scale.is_empty());
    let alone = make().signals(&batch, &host).unwrap().advantages;
    // The same skills, through a second opid that saw the same steps.
    let mut opid = Opid::from_config_json(opid_config).unwrap();
    let host2 = test_host();
    let step0 = Batch {
        step: 0,
        rows: group(1, (1, ["s0", "s1"]), (2, ["s0", "s2"])),
    };
    opid.observe(&report(step0, vec![]), &host2).unwrap();
    let a = answer(
        &host2,
        1,
        host.entries.lock().unwrap()[0].extra["reply"].clone(),
    );
    let b = answer(
        &host2,
        2,
        host.entries.lock().unwrap()[1].extra["reply"].clone(),
    );
    let step1 = Batch {
        step: 1,
        rows: group(2, (11, ["s0", "s1"]), (12, ["s0", "s2"])),
    };
    opid.observe(&report(step1, vec![a, b]), &host2).unwrap();
    let add = opid.signals(&batch, &host2).unwrap().advantage_add;
    [got.advantages, alone, add]
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-7, "{got:?} vs {want:?}");
    }
}

/// The stack's advantages are the estimator's plus opid's term, token by token, rounded once.
fn composed(got: &[Vec<f32>], alone: &[Vec<f32>], add: &[Vec<f32>]) {
    for ((g, a), d) in got.iter().zip(alone).zip(add) {
        let want: Vec<f32> = a
            .iter()
            .zip(d)
            .map(|(&a, &d)| (f64::from(a) + f64::from(d)) as f32)
            .collect();
        assert_eq!(g, &want);
    }
}

/// Rows: 31 t0 (s3, failed: episode skill "do not go to the sofa"), 31 t1 (s1: the failed
/// analysis' step skill), 32 t0 (s0: the success's step skill), 32 t1 (s2: episode skill
/// "open the drawer first"). `A^ep = ∓0.5`.
fn check_worked_example(got: &[Vec<f32>]) {
    close(&got[0], &[-0.4998, -0.5001, -0.5]);
    close(&got[1], &[-0.4996, -0.4994, -0.4999]);
    close(&got[2], &[0.5004, 0.5006, 0.5001]);
    close(&got[3], &[0.5002, 0.4999, 0.5]);
}

#[test]
fn over_dr_grpo_the_final_advantages_are_the_worked_examples() {
    let make = || -> Box<dyn Algorithm> {
        Box::new(Grpo::from_config_json(r#"{"norm_adv_by_std": false}"#).unwrap())
    };
    let [got, alone, add] = run("grpo", &make, "", step2(["s3", "s1"], ["s0", "s2"]));
    assert_eq!(alone[0], [-0.5; 3]);
    assert_eq!(alone[2], [0.5; 3]);
    composed(&got, &alone, &add);
    check_worked_example(&got);
}

#[test]
fn over_gigpo_with_w_step_zero_the_final_advantages_are_the_worked_examples() {
    let make = || -> Box<dyn Algorithm> {
        Box::new(Gigpo::from_config_json(r#"{"omega": 0.0}"#).unwrap())
    };
    let [got, alone, add] = run("gigpo", &make, "", step2(["s3", "s1"], ["s0", "s2"]));
    composed(&got, &alone, &add);
    check_worked_example(&got);
}

#[test]
fn over_gigpo_the_step_term_and_both_teacher_terms_add() {
    // ω = 1 and both trajectories pass s0 at turn 0: returns 0 (31) and 0.95 (32), so
    // A^S = ∓0.475 there; additive routing scores s0 under both skills (the success's step
    // skill "go to the drawer" and each outcome's episode skill).
    let make = || -> Box<dyn Algorithm> { Box::new(Gigpo::from_config_json("").unwrap()) };
    let [got, alone, add] = run(
        "gigpo",
        &make,
        r#"{"routing": "additive"}"#,
        step2(["s0", "s1"], ["s0", "s2"]),
    );
    composed(&got, &alone, &add);
    close(&alone[0], &[-0.975; 3]);
    close(&alone[2], &[0.975; 3]);
    close(&got[0], &[-0.9744, -0.9745, -0.9749]);
    close(&got[1], &[-0.4994, -0.4995, -0.4999]);
    close(&got[2], &[0.9756, 0.9755, 0.9751]);
    // s2 has no step skill: the episode term alone.
    close(&got[3], &[0.5002, 0.4999, 0.5]);
}
