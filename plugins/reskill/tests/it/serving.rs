//! Planning (`plan_group`) and per-turn trigger matching (`next_context`).

use cairn_plugin_sdk::{
    Algorithm, ContextVariant, EntryStatus, GroupRequest, Observation, OfflineHost, TurnContext,
    TurnContextRequest,
};
use cairn_reskill::ab::AbTest;
use cairn_reskill::config::ReskillConfig;
use cairn_reskill::{Reskill, ReskillState, Skill};
use serde_json::json;

fn skill(text: &str, trigger: Option<&str>, status: EntryStatus) -> Skill {
    Skill {
        text: text.into(),
        trigger: trigger.map(str::to_string),
        task_kind: "heat".into(),
        status,
    }
}

/// Skills 3 (heat) and 5 (cool) active; with `test`, skill 9 under test replacing 3.
fn plugin(config: &str, test: Option<f64>) -> Reskill {
    let config = ReskillConfig::from_json(config).unwrap();
    let mut state = ReskillState::new(&config);
    state.skills.insert(
        3,
        skill(
            "Heat it in the microwave.",
            Some(r"\bheat\b"),
            EntryStatus::Active,
        ),
    );
    state.skills.insert(
        5,
        skill(
            "Cool it in the fridge.",
            Some(r"\bcool\b"),
            EntryStatus::Active,
        ),
    );
    if let Some(p_new) = test {
        state.skills.insert(
            9,
            skill(
                "Open the microwave first.",
                Some("microwave"),
                EntryStatus::UnderTest,
            ),
        );
        let mut t = AbTest::new(2, 9, Some(3), 0, 0.15, 0.85);
        t.p_new = p_new;
        state.test = Some(t);
    }
    Reskill::new(config, state).unwrap()
}

fn request(size: u32, seed: u64) -> GroupRequest {
    GroupRequest {
        task_kind: "heat".into(),
        task_description: "heat some egg and put it in the garbagecan".into(),
        group_size: size,
        seed,
        ..GroupRequest::default()
    }
}

#[test]
fn without_a_test_every_slot_plays_the_active_skills() {
    let host = OfflineHost::default();
    let plan = plugin("", None).plan_group(&request(4, 1), &host).unwrap();
    assert_eq!(plan.len(), 4);
    assert!(plan.iter().all(|v| v == &plan[0]));
    let v = &plan[0];
    assert_eq!(v.label, "skill:active");
    assert_eq!(v.extra["skills"], json!([3, 5]));
    // Only the heat skill's trigger matches the goal.
    assert_eq!(v.extra["triggered"], json!([3]));
    assert_eq!(v.inject, "Heat it in the microwave.");
    assert_eq!(v.extra["task_kind"], "heat");
    assert!(v.extra.get("reskill_version").is_none() && v.extra.get("test").is_none());
    // No skills yet: the plain context.
    let plan = Reskill::from_config_json("")
        .unwrap()
        .plan_group(&request(2, 1), &host)
        .unwrap();
    assert_eq!(plan[0].label, "plain");
    assert_eq!(plan[0].inject, "");
    assert_eq!(plan[0].extra["skills"], json!([]));
}

#[test]
fn bernoulli_assignment_is_reproducible_and_its_share_is_near_p_new() {
    let host = OfflineHost::default();
    let mut p = plugin("", Some(0.85));
    let plan = p.plan_group(&request(20_000, 42), &host).unwrap();
    let new = plan.iter().filter(|v| v.label == "skill:new").count();
    let old = plan.iter().filter(|v| v.label == "skill:old").count();
    assert_eq!(new + old, 20_000);
    let share = new as f64 / 20_000.0;
    // sd of the share: sqrt(0.85 · 0.15 / 20 000) = 0.0025.
    assert!((share - 0.85).abs() < 0.01, "share {share}");
    let n = plan.iter().find(|v| v.label == "skill:new").unwrap();
    assert_eq!(n.extra["reskill_version"], "new");
    assert_eq!(n.extra["test"], 2);
    // The new bundle: the skill under test first, the skill it replaces (3) left out.
    assert_eq!(n.extra["skills"], json!([9, 5]));
    assert_eq!(
        n.extra["triggered"],
        json!([]),
        "the goal names no microwave"
    );
    let o = plan.iter().find(|v| v.label == "skill:old").unwrap();
    assert_eq!(o.extra["reskill_version"], "old");
    assert_eq!(o.extra["skills"], json!([3, 5]));
    assert_eq!(o.inject, "Heat it in the microwave.");
    // The same seed gives the same plan; another seed another one.
    let labels = |plan: &[ContextVariant]| plan.iter().map(|v| v.label.clone()).collect::<Vec<_>>();
    let small = labels(&p.plan_group(&request(64, 7), &host).unwrap());
    assert_eq!(
        small,
        labels(&p.plan_group(&request(64, 7), &host).unwrap())
    );
    assert_ne!(
        small,
        labels(&p.plan_group(&request(64, 8), &host).unwrap())
    );
    // The lower clamp end is honoured the same way.
    let plan = plugin("", Some(0.15))
        .plan_group(&request(20_000, 42), &host)
        .unwrap();
    let share = plan.iter().filter(|v| v.label == "skill:new").count() as f64 / 20_000.0;
    assert!((share - 0.15).abs() < 0.01, "share {share}");
}

fn turn(p: &mut Reskill, variant: &ContextVariant, text: &str) -> TurnContext {
    let request = TurnContextRequest {
        turn: 1,
        variant: variant.clone(),
        observation: Observation {
            text: text.into(),
            ..Observation::default()
        },
        ..TurnContextRequest::default()
    };
    p.next_context(&request, &OfflineHost::default()).unwrap()
}

#[test]
fn next_context_injects_the_skills_whose_trigger_fires_and_keeps_otherwise() {
    let host = OfflineHost::default();
    let mut p = plugin("", Some(0.85));
    let plan = p.plan_group(&request(64, 3), &host).unwrap();
    let slot = plan
        .iter()
        .find(|v| v.label == "skill:new")
        .unwrap()
        .clone();
    assert_eq!(slot.extra["triggered"], json!([]));
    // The microwave comes into view: the skill under test fires.
    let TurnContext::Variant { variant } = turn(&mut p, &slot, "you see a Microwave 1 .") else {
        panic!("expected the tested skill to be injected");
    };
    assert_eq!(variant.inject, "Open the microwave first.");
    assert_eq!(variant.extra["triggered"], json!([9]));
    assert_eq!(variant.label, "skill:new");
    for key in ["skills", "reskill_version", "test", "task_kind"] {
        assert_eq!(variant.extra[key], slot.extra[key], "{key} is kept");
    }
    // Still in view: nothing changes.
    assert_eq!(
        turn(&mut p, &variant, "the microwave is closed ."),
        TurnContext::Keep
    );
    // Out of view: the skill is taken out again.
    let TurnContext::Variant { variant: gone } = turn(&mut p, &variant, "you see a sink .") else {
        panic!("expected the skill to be removed");
    };
    assert_eq!(
        (gone.inject.as_str(), &gone.extra["triggered"]),
        ("", &json!([]))
    );
    // A slot the plugin did not plan is left alone.
    assert_eq!(
        turn(&mut p, &ContextVariant::default(), "microwave"),
        TurnContext::Keep
    );
    // A mangled skill list is an error that names the key.
    let mut bad = slot.clone();
    bad.extra.insert("skills".into(), json!("9"));
    let request = TurnContextRequest {
        variant: bad,
        ..TurnContextRequest::default()
    };
    let e = p.next_context(&request, &host).unwrap_err();
    assert!(e.message.contains("`extra.skills`"), "{e}");
}

#[test]
fn at_most_max_active_skills_are_injected_the_tested_one_first() {
    let mut p = plugin(r#"{"max_active_skills": 1}"#, Some(0.85));
    let mut slot = ContextVariant::default();
    slot.extra.insert("skills".into(), json!([9, 5]));
    let TurnContext::Variant { variant } = turn(&mut p, &slot, "cool it next to the microwave")
    else {
        panic!("expected an injection");
    };
    assert_eq!(variant.extra["triggered"], json!([9]));
    let mut p = plugin(r#"{"max_active_skills": 2}"#, Some(0.85));
    let TurnContext::Variant { variant } = turn(&mut p, &slot, "cool it next to the microwave")
    else {
        panic!("expected an injection");
    };
    assert_eq!(variant.extra["triggered"], json!([9, 5]));
    assert_eq!(
        variant.inject,
        "Open the microwave first.\n\nCool it in the fridge."
    );
}
