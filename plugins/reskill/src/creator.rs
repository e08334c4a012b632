//! The creator's data and decisions: episodes cut from a step's rows, the deterministic
//! diagnosis that picks the assertion best separating successes from failures, the trigger
//! derived from the goal words of the successes, the trigger-rate verification, and the
//! contrastive prompt sent to the skill creator.
//!
//! ReSkill (arXiv 2606.01619) runs an LLM pipeline here (per-group contrastive analysis, an
//! LLM diagnoser that edits the assertion set, a recommender and an author). Cairn's creator
//! replaces the analysis and diagnosis with a deterministic search over candidate assertions
//! and leaves only the writing of the skill text to the skill creator (`Host::reflect`); the
//! candidates, the separation score and the trigger derivation are ours.

use std::collections::{HashMap, HashSet};

use regex::Regex;
use serde::{Deserialize, Serialize};

use cairn_plugin_sdk::stats::group_indices;
use cairn_plugin_sdk::{Batch, Result, TurnRow};

use crate::assertion::{generalise, Assertion};

/// Which bundle a slot played during a test (`extra.reskill_version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Version {
    /// Active skills plus the skill under test.
    New,
    /// Active skills only.
    Old,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::New => "new",
            Version::Old => "old",
        }
    }
}

/// One finished trajectory, as the reservoir keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// The step whose batch held it.
    pub step: u64,
    pub trajectory_id: u64,
    pub task_id: String,
    /// The task kind the plan recorded on the slot (`extra.task_kind`; empty when absent).
    pub task_kind: String,
    /// The environment's `success` flag (what the template reflector also reads).
    pub success: bool,
    /// `info.action` of each turn, in turn order (empty for a row without one).
    pub actions: Vec<String>,
    /// The observation of each turn, in turn order.
    pub observations: Vec<String>,
}

/// An episode of the current step with what the A/B test reads from it.
#[derive(Clone, Debug, PartialEq)]
pub struct Played {
    pub episode: Episode,
    /// The episode reward `R_i` (an A/B success is `R_i > 0.5`).
    pub reward: f32,
    /// `extra.test` and `extra.reskill_version` of the slot, when it played in a test.
    pub test: Option<(u64, Version)>,
}

/// Cuts a step's rows into episodes: rows grouped by `(group_id, trajectory_id)` in order of
/// first appearance, each sorted by turn. Slot data is read from the first turn's variant.
pub fn episodes_of(batch: &Batch) -> Vec<Played> {
    let keys: Vec<(u64, u64)> = batch
        .rows
        .iter()
        .map(|r| (r.group_id, r.trajectory_id))
        .collect();
    group_indices(&keys)
        .into_iter()
        .filter_map(|indices| {
            let mut rows: Vec<&TurnRow> = indices.iter().map(|&i| &batch.rows[i]).collect();
            rows.sort_by_key(|r| r.turn);
            let first = *rows.first()?;
            let extra = &first.variant.extra;
            let test = match (
                extra.get("test").and_then(serde_json::Value::as_u64),
                extra
                    .get("reskill_version")
                    .and_then(|v| serde_json::from_value::<Version>(v.clone()).ok()),
            ) {
                (Some(id), Some(version)) => Some((id, version)),
                _ => None,
            };
            let text = |r: &TurnRow| {
                r.info
                    .get("action")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Some(Played {
                episode: Episode {
                    step: batch.step,
                    trajectory_id: first.trajectory_id,
                    task_id: first.task_id.clone(),
                    task_kind: extra
                        .get("task_kind")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    success: first.success,
                    actions: rows.iter().map(|r| text(r)).collect(),
                    observations: rows.iter().map(|r| r.observation.clone()).collect(),
                },
                reward: first.episode_reward,
                test,
            })
        })
        .collect()
}

/// The most candidate assertions scored per task kind and diagnosis.
pub const MAX_CANDIDATES: usize = 64;

/// What a diagnosis found: the assertion with the largest gap in hold rate between the
/// successes and the failures of one task kind, examples from the current step, and the
/// trigger of the skill to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnosis {
    pub task_kind: String,
    pub assertion: Assertion,
    /// Hold rate among the kind's successes and failures in the reservoir.
    pub success_rate: f64,
    pub failure_rate: f64,
    /// Trajectory ids (of the current step) of a success the assertion holds for (when
    /// there is one) and of a failure it does not hold for (when there is one).
    pub success_example: u64,
    pub failure_example: u64,
    /// A regex over observations (see [`derive_trigger`]).
    pub trigger: String,
}

impl Diagnosis {
    pub fn gap(&self) -> f64 {
        self.success_rate - self.failure_rate
    }
}

/// Candidate assertions from the successes and failures of one kind, in priority order,
/// deduplicated, without those in `tried`, at most [`MAX_CANDIDATES`]:
/// 1. `exists` of each success's first action (object numbers generalised, whole action);
/// 2. `final_matches` of each success's last action;
/// 3. `no_consecutive_repeat`;
/// 4. `not_exists` of each failure action that no success played;
/// 5. `before` of each pair of consecutive distinct actions of a success (first occurrences);
/// 6. `exists` of every other action of a success.
pub fn candidates(
    successes: &[&Episode],
    failures: &[&Episode],
    tried: &HashSet<&Assertion>,
) -> Vec<Assertion> {
    let whole = |g: String| format!(r"^\s*{g}\s*$");
    let general = |e: &Episode| -> Vec<String> {
        e.actions
            .iter()
            .filter_map(|a| generalise(a))
            .map(whole)
            .collect()
    };
    let success_actions: Vec<Vec<String>> = successes.iter().map(|e| general(e)).collect();
    let played: HashSet<&String> = success_actions.iter().flatten().collect();
    let mut out: Vec<Assertion> = Vec::new();
    let exists = |p: &String| Assertion::Exists { pattern: p.clone() };
    out.extend(success_actions.iter().filter_map(|a| a.first()).map(exists));
    out.extend(
        success_actions
            .iter()
            .filter_map(|a| a.last())
            .map(|p| Assertion::FinalMatches { pattern: p.clone() }),
    );
    out.push(Assertion::NoConsecutiveRepeat);
    for e in failures {
        out.extend(
            general(e)
                .into_iter()
                .filter(|p| !played.contains(p))
                .map(|pattern| Assertion::NotExists { pattern }),
        );
    }
    for actions in &success_actions {
        let mut seen = HashSet::new();
        let firsts: Vec<&String> = actions.iter().filter(|p| seen.insert(*p)).collect();
        out.extend(firsts.windows(2).map(|w| Assertion::Before {
            first: w[0].clone(),
            second: w[1].clone(),
        }));
    }
    out.extend(success_actions.iter().flatten().map(exists));
    let mut seen = HashSet::new();
    out.into_iter()
        .filter(|a| !tried.contains(a) && seen.insert(a.clone()))
        .take(MAX_CANDIDATES)
        .collect()
}

/// The diagnosis over the reservoir. Only task kinds with at least one success and one
/// failure in the current step are considered (the reflection's example trajectories must
/// be rows of the current step). Per kind, every candidate is scored by its hold rate among
/// the kind's reservoir successes minus that among its failures; the best positive gap wins
/// (the earlier candidate, then the alphabetically first kind, on ties). `tried` holds the
/// `(task kind, assertion)` pairs proposed before, which are not proposed again.
pub fn diagnose(
    reservoir: &[Episode],
    current: &[Episode],
    tried: &[(String, Assertion)],
) -> Result<Option<Diagnosis>> {
    let mut kinds: Vec<&str> = current.iter().map(|e| e.task_kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut best: Option<Diagnosis> = None;
    for kind in kinds {
        let now: Vec<&Episode> = current.iter().filter(|e| e.task_kind == kind).collect();
        if !(now.iter().any(|e| e.success) && now.iter().any(|e| !e.success)) {
            continue;
        }
        let pool: Vec<&Episode> = reservoir.iter().filter(|e| e.task_kind == kind).collect();
        let (successes, failures): (Vec<&Episode>, Vec<&Episode>) =
            pool.iter().partition(|e| e.success);
        if successes.is_empty() || failures.is_empty() {
            continue;
        }
        let excluded: HashSet<&Assertion> = tried
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, a)| a)
            .collect();
        let mut top: Option<(Assertion, f64, f64)> = None;
        for candidate in candidates(&successes, &failures, &excluded) {
            let check = candidate.compile()?;
            let rate = |set: &[&Episode]| {
                set.iter().filter(|e| check.holds(&e.actions)).count() as f64 / set.len() as f64
            };
            let (s, f) = (rate(&successes), rate(&failures));
            if top.as_ref().is_none_or(|(_, ts, tf)| s - f > ts - tf) {
                top = Some((candidate, s, f));
            }
        }
        let Some((assertion, success_rate, failure_rate)) = top else {
            continue;
        };
        if success_rate - failure_rate <= 0.0
            || best
                .as_ref()
                .is_some_and(|b| success_rate - failure_rate <= b.gap())
        {
            continue;
        }
        let Some(trigger) = derive_trigger(reservoir, kind) else {
            continue;
        };
        let check = assertion.compile()?;
        let pick = |success: bool| {
            let mut set: Vec<&&Episode> = now.iter().filter(|e| e.success == success).collect();
            // A success the assertion holds for, shortest first; a failure it fails on.
            set.sort_by_key(|e| (check.holds(&e.actions) != success, e.actions.len()));
            set.first().map(|e| e.trajectory_id)
        };
        let (Some(success_example), Some(failure_example)) = (pick(true), pick(false)) else {
            continue;
        };
        best = Some(Diagnosis {
            task_kind: kind.to_string(),
            assertion,
            success_rate,
            failure_rate,
            success_example,
            failure_example,
            trigger,
        });
    }
    Ok(best)
}

/// Lower-cased words of three or more letters.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
}

/// The trigger of a skill for `kind`: `\b<word>\b` for the word, taken from the first
/// observations (the goal) of the kind's reservoir successes, that best tells the kind's
/// episodes from the others: the largest share of the kind's episodes with the word in some
/// observation minus that share among other kinds' episodes (then the larger share in the
/// kind, the longer word, the alphabetically first). `None` when the successes' first
/// observations have no word.
pub fn derive_trigger(reservoir: &[Episode], kind: &str) -> Option<String> {
    let mut candidates: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for e in reservoir
        .iter()
        .filter(|e| e.task_kind == kind && e.success)
    {
        for w in e
            .observations
            .first()
            .map(|o| words(o))
            .into_iter()
            .flatten()
        {
            if candidates.len() < 256 && !index.contains_key(&w) {
                index.insert(w.clone(), candidates.len());
                candidates.push(w);
            }
        }
    }
    if candidates.is_empty() {
        return None;
    }
    let (mut inside, mut outside) = (
        vec![0usize; candidates.len()],
        vec![0usize; candidates.len()],
    );
    let (mut n_in, mut n_out) = (0usize, 0usize);
    for e in reservoir {
        let mut hit = vec![false; candidates.len()];
        for w in e.observations.iter().flat_map(|o| words(o)) {
            if let Some(&i) = index.get(&w) {
                hit[i] = true;
            }
        }
        let (counts, n) = if e.task_kind == kind {
            (&mut inside, &mut n_in)
        } else {
            (&mut outside, &mut n_out)
        };
        *n += 1;
        for (c, h) in counts.iter_mut().zip(hit) {
            *c += usize::from(h);
        }
    }
    let share = |c: usize, n: usize| if n == 0 { 0.0 } else { c as f64 / n as f64 };
    let key = |i: usize| {
        let (a, b) = (share(inside[i], n_in), share(outside[i], n_out));
        (a - b, a, candidates[i].chars().count())
    };
    let mut best = 0;
    for i in 1..candidates.len() {
        let (k, kb) = (key(i), key(best));
        let better = k.0 > kb.0
            || (k.0 == kb.0 && (k.1 > kb.1 || (k.1 == kb.1 && k.2 > kb.2)))
            || (k == kb && candidates[i] < candidates[best]);
        if better {
            best = i;
        }
    }
    Some(format!(r"\b{}\b", regex::escape(&candidates[best])))
}

/// The share of `episodes` a trigger fires on: an episode fires if any of its observations
/// matches (no trigger fires always). 0 for no episodes.
pub fn trigger_rate<'a>(
    trigger: Option<&Regex>,
    episodes: impl Iterator<Item = &'a Episode>,
) -> f64 {
    let (mut fired, mut total) = (0usize, 0usize);
    for e in episodes {
        total += 1;
        let fires = match trigger {
            None => true,
            Some(re) => e.observations.iter().any(|o| re.is_match(o)),
        };
        fired += usize::from(fires);
    }
    if total == 0 {
        0.0
    } else {
        fired as f64 / total as f64
    }
}

/// The reflection prompt: the diagnosis, the contrast of the two example trajectories (the
/// skill creator appends them, success first), and the answer's limits.
pub fn contrastive_prompt(d: &Diagnosis, parent: Option<&str>, max_chars: u32) -> String {
    let kind = if d.task_kind.is_empty() {
        "these tasks".to_string()
    } else {
        format!("tasks of kind `{}`", d.task_kind)
    };
    let mut prompt = format!(
        "You maintain a small library of skills for an agent playing {kind}. A rule check over \
         recent episodes separates successes from failures: `{}` holds in {:.0}% of the \
         successful episodes and in {:.0}% of the failed ones. Trajectory {} below succeeded \
         and trajectory {} failed. Contrast them and write one skill: a short, reusable \
         procedure that makes the agent behave as the successful trajectory does on this \
         point, in at most {max_chars} characters.",
        d.assertion,
        100.0 * d.success_rate,
        100.0 * d.failure_rate,
        d.success_example,
        d.failure_example,
    );
    if let Some(text) = parent {
        prompt.push_str(&format!(
            " It replaces this skill, which you may revise instead of starting over: \"{text}\"."
        ));
    }
    prompt.push_str(&format!(
        " The skill is shown when its trigger, a regular expression searched in the \
         observation, matches; if you give none, `{}` is used.",
        d.trigger
    ));
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_plugin_sdk::ContextVariant;

    pub(crate) fn episode(id: u64, kind: &str, success: bool, actions: &[&str]) -> Episode {
        Episode {
            step: 0,
            trajectory_id: id,
            task_id: format!("{kind}-{id}"),
            task_kind: kind.into(),
            success,
            actions: actions.iter().map(|a| a.to_string()).collect(),
            observations: actions
                .iter()
                .map(|_| format!("task : {kind} some apple and put it on the table ."))
                .collect(),
        }
    }

    #[test]
    fn rows_become_episodes_in_turn_order_with_their_slot_data() {
        let mut variant = ContextVariant::default();
        variant.extra.insert("task_kind".into(), "heat".into());
        variant.extra.insert("test".into(), 3.into());
        variant.extra.insert("reskill_version".into(), "old".into());
        let row = |traj: u64, turn: u32, action: &str| {
            let mut r = TurnRow {
                group_id: 1,
                trajectory_id: traj,
                turn,
                task_id: "t".into(),
                variant: variant.clone(),
                episode_reward: 1.0,
                success: true,
                observation: format!("obs {turn}"),
                ..TurnRow::default()
            };
            r.info.insert("action".into(), action.into());
            r
        };
        let mut plain = row(8, 0, "look");
        plain.variant = ContextVariant::default();
        plain.info.clear();
        let batch = Batch {
            step: 4,
            rows: vec![
                row(7, 1, "open drawer 1"),
                row(7, 0, "go to drawer 1"),
                plain,
            ],
        };
        let played = episodes_of(&batch);
        assert_eq!(played.len(), 2);
        let e = &played[0].episode;
        assert_eq!(
            (e.step, e.trajectory_id, e.task_kind.as_str()),
            (4, 7, "heat")
        );
        assert_eq!(e.actions, ["go to drawer 1", "open drawer 1"]);
        assert_eq!(e.observations, ["obs 0", "obs 1"]);
        assert_eq!(played[0].test, Some((3, Version::Old)));
        assert_eq!(played[1].test, None);
        assert_eq!(played[1].episode.actions, [""], "a row without info.action");
        assert_eq!(played[1].episode.task_kind, "");
    }

    #[test]
    fn the_diagnosis_picks_the_assertion_with_the_largest_gap() {
        // Successes open the drawer before taking; failures go straight to take, or loop.
        let reservoir = vec![
            episode(
                1,
                "heat",
                true,
                &["go to drawer 1", "open drawer 1", "take apple 1"],
            ),
            episode(
                2,
                "heat",
                true,
                &["go to drawer 2", "open drawer 2", "take apple 2"],
            ),
            episode(3, "heat", false, &["go to drawer 1", "take apple 1"]),
            episode(4, "heat", false, &["go to drawer 3", "go to drawer 3"]),
            episode(5, "cool", true, &["look"]),
        ];
        let d = diagnose(&reservoir, &reservoir, &[]).unwrap().unwrap();
        // exists(go to drawer) holds everywhere (gap 0); final_matches(take apple) holds in
        // 2/2 successes and 1/2 failures; before(go to, open) separates fully: 1 − 0.
        assert_eq!(d.task_kind, "heat");
        assert_eq!(
            d.assertion,
            Assertion::Before {
                first: r"^\s*go to drawer \d+\s*$".into(),
                second: r"^\s*open drawer \d+\s*$".into()
            }
        );
        assert_eq!((d.success_rate, d.failure_rate), (1.0, 0.0));
        assert_eq!((d.success_example, d.failure_example), (1, 3));
        // The goal word that tells heat episodes from cool ones.
        assert_eq!(d.trigger, r"\bheat\b");
        // Once tried, the next best for the kind is proposed instead.
        let tried = vec![("heat".to_string(), d.assertion.clone())];
        let next = diagnose(&reservoir, &reservoir, &tried).unwrap().unwrap();
        assert_eq!(
            next.assertion,
            Assertion::Before {
                first: r"^\s*open drawer \d+\s*$".into(),
                second: r"^\s*take apple \d+\s*$".into()
            }
        );
        // A kind with only successes (cool) is never diagnosed; without failures, nothing.
        let only = &reservoir[..2];
        assert_eq!(diagnose(only, only, &[]).unwrap(), None);
    }

    #[test]
    fn examples_come_from_the_current_step_only() {
        let old = episode(1, "heat", true, &["open drawer 1", "take apple 1"]);
        let now = vec![
            episode(10, "heat", false, &["take apple 1"]),
            episode(11, "heat", true, &["open drawer 1", "look", "take apple 1"]),
        ];
        let mut reservoir = vec![old];
        reservoir.extend(now.clone());
        let d = diagnose(&reservoir, &now, &[]).unwrap().unwrap();
        assert_eq!((d.success_example, d.failure_example), (11, 10));
        // No failure in the current step: no diagnosis, whatever the reservoir holds.
        assert_eq!(diagnose(&reservoir, &now[1..], &[]).unwrap(), None);
    }

    #[test]
    fn the_trigger_rate_counts_episodes_with_any_matching_observation() {
        let mut a = episode(1, "heat", true, &["x", "y"]);
        a.observations = vec!["you see a drawer".into(), "the drawer is open".into()];
        let mut b = episode(2, "heat", true, &["x"]);
        b.observations = vec!["you see a fridge".into()];
        let re = crate::assertion::pattern("drawer is open", "trigger").unwrap();
        let all = [a, b];
        assert_eq!(trigger_rate(Some(&re), all.iter()), 0.5);
        assert_eq!(trigger_rate(None, all.iter()), 1.0);
        assert_eq!(trigger_rate(Some(&re), [].iter()), 0.0);
    }

    #[test]
    fn the_prompt_names_the_assertion_the_examples_and_the_parent() {
        let d = Diagnosis {
            task_kind: "heat".into(),
            assertion: Assertion::NoConsecutiveRepeat,
            success_rate: 0.75,
            failure_rate: 0.2,
            success_example: 4,
            failure_example: 9,
            trigger: r"\bheat\b".into(),
        };
        let p = contrastive_prompt(&d, Some("old text"), 500);
        assert!(p.contains("tasks of kind `heat`"), "{p}");
        assert!(
            p.contains(
                "`no_consecutive_repeat` holds in 75% of the successful episodes and in 20%"
            ),
            "{p}"
        );
        assert!(
            p.contains("Trajectory 4 below succeeded and trajectory 9 failed"),
            "{p}"
        );
        assert!(p.contains("at most 500 characters"), "{p}");
        assert!(
            p.contains("revise instead of starting over: \"old text\""),
            "{p}"
        );
        assert!(p.ends_with(r"if you give none, `\bheat\b` is used."), "{p}");
    }
}
