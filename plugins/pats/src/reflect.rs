//! The requests Pats sends the skill creator (`Host::reflect`): a first scaffold for a task,
//! or a revision of a scaffold that lowered the success rate.
//!
//! Both ask for an `EntryKind::Scaffold` entry for the task, with status `UnderTest`: the
//! planner injects only `Active` scaffolds, so an answer is never injected before `observe`
//! has checked its length and made it active (a revision also retires the scaffold it
//! replaces then). `extra.pats_request` carries Pats' own request id, which the skill creator
//! copies onto the entry, so the answer is found in the bank even after a resume.

use cairn_plugin_sdk::{EntryKind, EntryStatus, ReflectionRequest};
use serde_json::Value;

use crate::arms::ScaffoldRef;
use crate::card::{CardCounts, EvidenceCard};
use crate::evaluate::Judgement;

/// `extra` key of Pats' request id, on the request and on the entry written for it.
pub const REQUEST_KEY: &str = "pats_request";

fn extra(request_id: u64) -> serde_json::Map<String, Value> {
    let mut extra = serde_json::Map::new();
    extra.insert(REQUEST_KEY.into(), Value::from(request_id));
    extra
}

/// Pats' request id of a bank entry, if Pats asked for it.
pub fn request_of(entry_extra: &serde_json::Map<String, Value>) -> Option<u64> {
    entry_extra.get(REQUEST_KEY).and_then(Value::as_u64)
}

/// A first scaffold for `task`, from a trajectory that succeeded and one that failed (in that
/// order: the `template` reflector writes from the first successful trajectory).
pub fn creation(
    task: &str,
    success: u64,
    failure: u64,
    request_id: u64,
    max_chars: u32,
) -> ReflectionRequest {
    ReflectionRequest {
        kind: EntryKind::Scaffold,
        prompt: format!(
            "Write a training scaffold for task `{task}`: advice of at most {max_chars} \
             characters that helps an agent who sometimes fails this task to solve it. The \
             first trajectory below succeeded and the second failed; say what the success did \
             that the failure did not. The scaffold is shown only during training."
        ),
        trajectories: vec![success, failure],
        task_id: Some(task.to_string()),
        parent: None,
        status: EntryStatus::UnderTest,
        extra: extra(request_id),
    }
}

/// A revision of `card.scaffold`, with the window's cards in the prompt. Its trajectories are
/// the card's succeeding excerpt, then its failing one (those it has).
pub fn revision(
    card: &EvidenceCard,
    window: &[CardCounts],
    judgement: &Judgement,
    request_id: u64,
    max_chars: u32,
) -> ReflectionRequest {
    let lines: Vec<String> = window
        .iter()
        .map(|c| {
            format!(
                "- step {}: with the scaffold {}/{} solved, without {}/{}",
                c.step, c.succ_with, c.n_with, c.succ_without, c.n_without
            )
        })
        .collect();
    let prompt = format!(
        "The training scaffold below, shown on task `{task}`, lowered the success rate: over \
         the last {k} evidence cards its gain in success rate was {gain:+.3} (plain success \
         rate {solo:.3}). Revise it: write a shorter, clearer \
         scaffold of at most {max_chars} characters that avoids what went wrong in the failing \
         trajectory below.\n\nScaffold: {text}\n\nEvidence cards:\n{cards}",
        task = card.task_id,
        k = judgement.cards,
        gain = judgement.gain,
        solo = judgement.solo,
        text = card.scaffold_text,
        cards = lines.join("\n"),
    );
    ReflectionRequest {
        kind: EntryKind::Scaffold,
        prompt,
        trajectories: card
            .success
            .iter()
            .chain(&card.failure)
            .map(|e| e.trajectory_id)
            .collect(),
        task_id: Some(card.task_id.clone()),
        parent: match card.scaffold {
            ScaffoldRef::Bank(id) => Some(id),
            // The general scaffold is not a bank entry: its revision starts a task lineage.
            ScaffoldRef::Config => None,
        },
        status: EntryStatus::UnderTest,
        extra: extra(request_id),
    }
}
