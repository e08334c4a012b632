//! The two-view mixed rollout of a group (UCOB `main_ucob.py`, `_rollout_skill_mask`: in a
//! group of n the first ⌊n/2⌋ slots run without skills, the rest with them) and the skills
//! its `good` slots see.
//!
//! Retrieval is one [`BankQuery`]: BM25 of the task description against the `Skill` entries
//! of the task and the general ones; the first `skills_top_k` that fit `max_skill_chars`, in
//! rank order, are injected (an over-long entry is skipped, never truncated; an entry whose
//! text repeats one already chosen is skipped too). UCOB retrieves
//! a top-3 of task-level and of state-level skills by UCB over a utility; we keep the
//! task-level retrieval and rank by relevance only.

use cairn_plugin_sdk::bank::injection;
use cairn_plugin_sdk::{
    BankEntry, BankQuery, ContextVariant, EntryKind, GroupRequest, Host, Result, TurnRow,
};
use serde_json::{json, Map, Value};

use crate::config::{Branch, UcobConfig};

/// `variant.extra` key: the slot's branch, `"good"` or `"none"`.
pub const BRANCH_KEY: &str = "ucob_branch";
/// `variant.extra` key: the ids of the injected skills, in prompt order (`good` slots only).
pub const SKILLS_KEY: &str = "skill_ids";
/// `variant.extra` key: the task kind of the group.
pub const KIND_KEY: &str = "task_kind";

/// The skills a group's `good` slots see.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retrieval {
    /// In rank order.
    pub entries: Vec<BankEntry>,
    /// Entries that ranked within the quota but were longer than `max_skill_chars`.
    pub too_long: u64,
}

/// Retrieves the skills of a group (see the module docs).
pub fn retrieve(config: &UcobConfig, request: &GroupRequest, host: &dyn Host) -> Result<Retrieval> {
    let hits = host.bank_query(&BankQuery {
        text: request.task_description.clone(),
        // Over-long entries are skipped, so ask for more than the quota.
        k: config.skills_top_k.saturating_mul(4).max(16),
        kinds: vec![EntryKind::Skill],
        task_id: Some(request.task_id.clone()),
        include_general: true,
        ..BankQuery::default()
    })?;
    let mut out = Retrieval::default();
    for hit in hits {
        let entry = hit.entry;
        if entry.kind != EntryKind::Skill
            || entry
                .task_id
                .as_ref()
                .is_some_and(|t| *t != request.task_id)
        {
            continue; // the bank's filter should not have returned it
        }
        if out.entries.len() >= config.skills_top_k {
            break;
        }
        if entry.text.chars().count() > config.max_skill_chars {
            out.too_long += 1;
            continue;
        }
        // The creator may write the same text twice (one success, two steps): show it once.
        if out
            .entries
            .iter()
            .any(|e| e.text.trim() == entry.text.trim())
        {
            continue;
        }
        out.entries.push(entry);
    }
    Ok(out)
}

fn extra(branch: Branch, kind: &str) -> Map<String, Value> {
    let mut extra = Map::new();
    extra.insert(BRANCH_KEY.into(), branch.as_str().into());
    extra.insert(KIND_KEY.into(), kind.into());
    extra
}

/// A no-skill slot: the plain context, tagged `none`.
pub fn none_variant(request: &GroupRequest) -> ContextVariant {
    ContextVariant {
        extra: extra(Branch::NoSkill, &request.task_kind),
        ..ContextVariant::default()
    }
}

/// A skill slot: label `skill:<count>`, the skills injected, their ids recorded.
pub fn good_variant(header: &str, request: &GroupRequest, entries: &[BankEntry]) -> ContextVariant {
    let mut extra = extra(Branch::Good, &request.task_kind);
    let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
    extra.insert(SKILLS_KEY.into(), json!(ids));
    ContextVariant {
        label: format!("skill:{}", entries.len()),
        inject: injection(header, entries),
        extra,
        ..ContextVariant::default()
    }
}

/// The slots of a group of `n`: the first ⌊n/2⌋ `none`, the rest `good`; every slot `none`
/// when the retrieval found no skill.
pub fn slots(n: u32, none: &ContextVariant, good: Option<&ContextVariant>) -> Vec<ContextVariant> {
    (0..n)
        .map(|k| match good {
            Some(g) if k >= n / 2 => g.clone(),
            _ => none.clone(),
        })
        .collect()
}

/// The branch a row's slot ran in: `extra.ucob_branch`; a row planned by something else is
/// `good` when its slot had text injected and `none` otherwise.
pub fn branch_of(row: &TurnRow) -> Branch {
    row.variant
        .extra
        .get(BRANCH_KEY)
        .and_then(Value::as_str)
        .and_then(Branch::parse)
        .unwrap_or(if row.variant.inject.is_empty() {
            Branch::NoSkill
        } else {
            Branch::Good
        })
}

/// The injected skill ids recorded on a variant (empty when none or malformed).
pub fn skill_ids(variant: &ContextVariant) -> Vec<u64> {
    variant
        .extra
        .get(SKILLS_KEY)
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{mock_host, skill};

    fn request(task: &str, n: u32) -> GroupRequest {
        GroupRequest {
            task_id: task.into(),
            task_kind: "clean".into(),
            task_description: "clean the mug".into(),
            group_size: n,
            ..GroupRequest::default()
        }
    }

    #[test]
    fn retrieval_takes_the_top_skills_of_the_task_and_general_ones_in_rank_order() {
        let host = mock_host();
        host.put(skill(1, None, "general one"));
        host.put(skill(2, Some("t1"), "task one"));
        host.put(skill(8, None, " task one")); // the same text again: shown once
        host.put(skill(3, Some("t2"), "another task's"));
        host.put(skill(4, None, &"x".repeat(20)));
        host.put(skill(5, Some("t1"), "task two"));
        host.put(skill(6, None, "general three"));
        let config = UcobConfig::from_json(r#"{"max_skill_chars": 15}"#).unwrap();
        let r = retrieve(&config, &request("t1", 4), &host).unwrap();
        let ids: Vec<u64> = r.entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, [1, 2, 5]);
        assert_eq!(r.too_long, 1);
        let q = host.queries.lock().unwrap()[0].clone();
        assert_eq!(q.text, "clean the mug");
        assert_eq!(q.kinds, [EntryKind::Skill]);
        assert_eq!(q.task_id.as_deref(), Some("t1"));
        assert!(q.include_general);
        let v = good_variant(crate::config::DEFAULT_HEADER, &request("t1", 4), &r.entries);
        assert_eq!(v.label, "skill:3");
        assert_eq!(
            v.inject,
            "Skills for tasks like this one:\n- general one\n- task one\n- task two"
        );
        assert_eq!(skill_ids(&v), [1, 2, 5]);
        assert_eq!(v.extra[BRANCH_KEY], "good");
        assert_eq!(v.extra[KIND_KEY], "clean");
        assert_eq!(
            good_variant("", &request("t1", 4), &r.entries).inject,
            "general one\ntask one\ntask two"
        );
        let n = none_variant(&request("t1", 4));
        assert_eq!((n.label.as_str(), n.inject.as_str()), ("plain", ""));
        assert_eq!(n.extra[BRANCH_KEY], "none");
        assert!(skill_ids(&n).is_empty());
    }

    #[test]
    fn the_first_half_rounded_down_runs_without_skills() {
        let none = none_variant(&request("t", 0));
        let good = good_variant("", &request("t", 0), &[skill(1, None, "s")]);
        let branches = |n: u32, g: Option<&ContextVariant>| -> Vec<&'static str> {
            slots(n, &none, g)
                .iter()
                .map(|v| v.extra[BRANCH_KEY].as_str().unwrap())
                .map(|s| Branch::parse(s).unwrap().as_str())
                .collect()
        };
        assert_eq!(branches(4, Some(&good)), ["none", "none", "good", "good"]);
        assert_eq!(branches(3, Some(&good)), ["none", "good", "good"]);
        assert_eq!(
            branches(8, Some(&good))
                .iter()
                .filter(|b| **b == "none")
                .count(),
            4
        );
        assert_eq!(branches(4, None), ["none"; 4]);
    }

    #[test]
    fn a_rows_branch_is_its_tag_or_else_whether_something_was_injected() {
        let mut row = TurnRow::default();
        assert_eq!(branch_of(&row), Branch::NoSkill);
        row.variant.inject = "a hint".into();
        assert_eq!(branch_of(&row), Branch::Good);
        row.variant.extra.insert(BRANCH_KEY.into(), "none".into());
        assert_eq!(branch_of(&row), Branch::NoSkill);
    }
}
