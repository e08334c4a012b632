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
//!
//! A request with a JSON reply format ([`super::format::JsonReply`]) gets a JSON object with
//! its keys, from the same trajectory: a `string` or `any` key holds the text above; an
//! `object` key maps each turn whose action was rejected (feedback −1) to
//! ``"`{a_t}` got: rejected"``, keyed by the turn index as a string (`{}` when no turn was
//! rejected; OPID's step skills); an `array` key holds `[]`, a `number` key the episode
//! reward, a `boolean` key the success. The entry's text follows the format's `text_key`.

use serde_json::{json, Map, Value};

use super::format::{JsonReply, JsonType};
use super::{feedback_word, Draft, Job, ReflectionFailure, Reflector};

pub use crate::rollout::solved_text;

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
        let Some(format) = JsonReply::of(&job.request)? else {
            return Ok(Draft::new(text, None));
        };
        let rejected: Map<String, Value> = rows
            .iter()
            .zip(&actions)
            .filter(|(row, _)| row.feedback < 0)
            .map(|(row, a)| {
                (
                    row.turn.to_string(),
                    json!(format!("`{a}` got: {}", feedback_word(row.feedback))),
                )
            })
            .collect();
        let object: Map<String, Value> = format
            .keys
            .iter()
            .map(|(key, ty)| {
                let value = match ty {
                    JsonType::String | JsonType::Any => json!(text),
                    JsonType::Object => Value::Object(rejected.clone()),
                    JsonType::Array => json!([]),
                    JsonType::Number => json!(rows[0].episode_reward),
                    JsonType::Boolean => json!(rows[0].success),
                };
                (key.clone(), value)
            })
            .collect();
        Ok(format.draft(object, 0))
    }
}
