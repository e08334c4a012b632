//! The `template` reflector: deterministic entry text from the rows alone, for tests and CPU
//! demonstrations. It ignores the request's prompt.
//!
//! The rule (docs/skills.md): take the first of the request's trajectories, in the request's
//! order, that succeeded;
//! - with one, the text is `solved in {n} turns: {a_0}; {a_1}; …` (its actions by turn);
//! - with none, it takes the first trajectory and writes
//!   ``failed after {n} turns; the last action `{a}` got: {feedback}``, the feedback in words
//!   (`rejected`, `no change`, `progress`).
//!
//! Actions are the rows' `info.action` (the rollout actor sets it); a row without one, or a
//! request without rows, is an error. The entry has no trigger.

use super::{feedback_word, Draft, Job, ReflectionFailure, Reflector};

/// The entry text for a successful trajectory with these actions, by turn:
/// `solved in {n} turns: {a_0}; {a_1}; …`. The warm start's hinted demonstrations inject the
/// same text, so a small policy learns the format of the entries it will be shown.
pub fn solved_text(actions: &[&str]) -> String {
    format!("solved in {} turns: {}", actions.len(), actions.join("; "))
}

/// The words and marks of the texts this reflector writes. A word-level tokenizer trained for
/// a pipeline that keeps a bank always has them, so an injected entry never encodes as
/// `[UNK]`.
pub const TEMPLATE_WORDS: &[&str] = &[
    "solved", "in", "turns", ":", ";", "failed", "after", "the", "last", "action", "`", "got",
    "rejected", "no", "change", "progress",
];

/// See the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateReflector;

impl Reflector for TemplateReflector {
    fn name(&self) -> &'static str {
        "template"
    }

    fn reflect(&mut self, job: &Job) -> Result<Draft, ReflectionFailure> {
        let trajectories = job.trajectories();
        let Some(&(id, rows)) = trajectories
            .iter()
            .find(|(_, rows)| rows[0].success)
            .or_else(|| trajectories.first())
        else {
            return Err(ReflectionFailure::error(format!(
                "the template reflector needs the rows of the requested trajectories {:?}, and \
                 none came with the request",
                job.request.trajectories
            )));
        };
        let actions = rows
            .iter()
            .map(|row| {
                row.info
                    .get("action")
                    .and_then(|a| a.as_str())
                    .ok_or_else(|| {
                        ReflectionFailure::error(format!(
                            "trajectory {id} turn {} has no `info.action` for the template \
                             reflector (rows from the rollout actor carry one)",
                            row.turn
                        ))
                    })
            })
            .collect::<Result<Vec<&str>, _>>()?;
        let last = rows.last().expect("a trajectory has at least one row");
        let text = if rows[0].success {
            solved_text(&actions)
        } else {
            format!(
                "failed after {} turns; the last action `{}` got: {}",
                rows.len(),
                actions.last().expect("one action per row"),
                feedback_word(last.feedback)
            )
        };
        Ok(Draft {
            text,
            trigger: None,
        })
    }
}
