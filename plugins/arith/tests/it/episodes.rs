//! Episodes: rewards, feedback, retries and the end of an episode.

use cairn_arith::{Arith, ArithConfig};
use cairn_plugin_sdk::{ContextVariant, Environment, Episode, StepOutcome};

use super::{env, test, train};

fn info(out: &StepOutcome) -> serde_json::Value {
    serde_json::from_str(&out.info_json).unwrap()
}

#[test]
fn a_right_answer_ends_the_episode_with_reward_one() {
    let env = env();
    let mut ep = env.start(test(0), 0, &ContextVariant::default()).unwrap();
    let p = env.problem(test(0)).unwrap();
    let first = ep.observation();
    assert_eq!(
        first.text,
        format!("What is {}? Answer with only the number.", p.expression())
    );
    assert!(first.admissible_actions.is_empty() && first.anchor.is_none());
    let expert = ep.expert_action().unwrap();
    assert_eq!(expert, p.answer().to_string());
    let out = ep
        .step(&format!("{} = {}", p.expression(), p.answer()))
        .unwrap();
    assert_eq!(
        (
            out.reward,
            out.done,
            out.success,
            out.feedback,
            out.tool_calls
        ),
        (1.0, true, true, 1, 0)
    );
    assert_eq!(
        info(&out),
        serde_json::json!({"turn": 1, "answer": p.answer(), "correct": true})
    );
    assert_eq!(ep.expert_action(), None);
    let err = ep.step("1").err().unwrap().to_string();
    assert!(err.contains("is over; start a new one"), "{err}");
}

#[test]
fn a_wrong_answer_earns_feedback_and_a_retry() {
    let env = env();
    let mut ep = env.episode(train(3)).unwrap();
    let p = ep.problem();
    let wrong = p.answer() + 1;
    let out = ep.step(&wrong.to_string()).unwrap();
    assert_eq!(
        (out.reward, out.done, out.success, out.feedback),
        (0.0, false, false, -1)
    );
    assert_eq!(
        out.observation.text,
        format!(
            "What is {}? Answer with only the number.\nYou answered {wrong}. That is wrong. Try again.",
            p.expression()
        )
    );
    assert_eq!(ep.turn(), 1);
    let out = ep.step(&format!("It is {}.", p.answer())).unwrap();
    assert_eq!(
        (out.reward, out.done, out.success, out.feedback),
        (1.0, true, true, 1)
    );
    assert_eq!(info(&out)["turn"], 2);
    assert_eq!(ep.turn(), 2);
}

#[test]
fn the_last_wrong_turn_ends_the_episode_unsolved() {
    let env = env();
    let mut ep = env.episode(train(0)).unwrap();
    let q = ep.problem().question();
    let out = ep.step("I do not know").unwrap();
    assert_eq!((out.done, out.feedback), (false, -1));
    assert_eq!(
        info(&out),
        serde_json::json!({"turn": 1, "answer": null, "correct": false})
    );
    assert_eq!(
        out.observation.text,
        format!("{q}\nYour reply has no number. Answer with only the number.")
    );
    let out = ep.step("99999999999999999999").unwrap();
    assert_eq!(
        (out.reward, out.done, out.success, out.feedback),
        (0.0, true, false, -1)
    );
    assert_eq!(
        out.observation.text,
        format!(
            "{q}\nYour reply has no number. Answer with only the number.\n\
             Your number is far too long. That is wrong. Try again."
        )
    );
    assert!(ep.is_done() && ep.expert_action().is_none());
    assert!(ep.step("1").is_err());
    let mut ep = env.episode(train(1)).unwrap();
    let q = ep.problem().question();
    let out = ep.step(&format!("{}.5", ep.problem().answer())).unwrap();
    assert_eq!((out.reward, out.success, out.feedback), (0.0, false, -1));
    assert_eq!(info(&out)["answer"], serde_json::Value::Null);
    assert_eq!(
        out.observation.text,
        format!("{q}\nYour answer is not a whole number. That is wrong. Try again.")
    );
}

#[test]
fn a_single_turn_episode_ends_at_the_first_answer() {
    let env = Arith::new(ArithConfig {
        max_turns: 1,
        ..ArithConfig::default()
    })
    .unwrap();
    let mut ep = env.episode(train(0)).unwrap();
    let wrong = ep.problem().answer() + 2;
    let out = ep.step(&wrong.to_string()).unwrap();
    assert_eq!((out.reward, out.done, out.success), (0.0, true, false));
    // The episode does not depend on the seed.
    let a = env.start(train(5), 1, &ContextVariant::default()).unwrap();
    let b = env.start(train(5), 2, &ContextVariant::default()).unwrap();
    assert_eq!(a.observation(), b.observation());
}
