//! The half/half partition of a group and the retrieval of the experiences its E half sees
//! (xvolcano02/EDGE `rollout_loop.py`: the first n/2 rollouts of a group are
//! experience-conditioned; `experience_memory.py`: general plus task-specific top-k).
//!
//! Retrieval is one [`BankQuery`]: BM25 of the task description against the experiences of
//! the task and the general ones. A query cannot ask for general entries alone (`task_id:
//! None` means every task's), and an over-long entry is skipped rather than truncated, so the
//! query asks for every match (both pools are bounded by `max_items`) and the plugin keeps, in
//! rank order, the first `top_k` general and `task_specific_top_k` task entries that fit.

use cairn_plugin_sdk::bank::injection;
use cairn_plugin_sdk::{
    BankEntry, BankQuery, ContextVariant, EntryKind, GroupRequest, Host, Result,
};
use serde_json::{json, Map, Value};

use crate::admission::{Arm, ARM_KEY};
use crate::config::EdgeConfig;

/// `variant.extra` key: the ids of the injected experiences, in prompt order.
pub const IDS_KEY: &str = "experience_ids";
/// `variant.extra` key: the task kind of the group (rows do not carry it; the success rates
/// that gate synthesis are per kind).
pub const KIND_KEY: &str = "task_kind";

/// The experiences an E slot sees.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retrieval {
    /// General entries, then task-specific ones, each in rank order.
    pub entries: Vec<BankEntry>,
    /// Entries that ranked within a quota but were longer than `max_experience_chars`.
    pub too_long: u64,
}

/// Retrieves the experiences of a group's E slots (see the module docs).
pub fn retrieve(config: &EdgeConfig, request: &GroupRequest, host: &dyn Host) -> Result<Retrieval> {
    let hits = host.bank_query(&BankQuery {
        text: request.task_description.clone(),
        k: usize::MAX,
        kinds: vec![EntryKind::Experience],
        task_id: Some(request.task_id.clone()),
        include_general: true,
        statuses: Vec::new(),
        trajectory_id: None,
    })?;
    let (mut general, mut specific, mut too_long) = (Vec::new(), Vec::new(), 0);
    for hit in hits {
        let entry = hit.entry;
        let (list, quota) = match &entry.task_id {
            None => (&mut general, config.top_k),
            Some(t) if *t == request.task_id => (&mut specific, config.task_specific_top_k),
            // Another task's entry: the bank's filter should not have returned it.
            Some(_) => continue,
        };
        if list.len() >= quota {
            continue;
        }
        if entry.text.chars().count() > config.max_experience_chars {
            too_long += 1;
            continue;
        }
        list.push(entry);
    }
    general.extend(specific);
    Ok(Retrieval {
        entries: general,
        too_long,
    })
}

fn extra(arm: Arm, kind: &str) -> Map<String, Value> {
    let mut extra = Map::new();
    extra.insert(ARM_KEY.into(), arm.as_str().into());
    extra.insert(KIND_KEY.into(), kind.into());
    extra
}

/// An experience-free slot: the plain context, tagged `N`.
pub fn n_variant(request: &GroupRequest) -> ContextVariant {
    ContextVariant {
        extra: extra(Arm::N, &request.task_kind),
        ..ContextVariant::default()
    }
}

/// An experience-conditioned slot: label `experience:<count>`, the entries injected.
pub fn e_variant(header: &str, request: &GroupRequest, entries: &[BankEntry]) -> ContextVariant {
    let mut extra = extra(Arm::E, &request.task_kind);
    let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
    extra.insert(IDS_KEY.into(), json!(ids));
    ContextVariant {
        label: format!("experience:{}", entries.len()),
        inject: injection(header, entries),
        extra,
        ..ContextVariant::default()
    }
}

/// The injected experience ids recorded on a variant (empty when none or malformed).
pub fn experience_ids(variant: &ContextVariant) -> Vec<u64> {
    variant
        .extra
        .get(IDS_KEY)
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// The task kind recorded on a variant (`""` when none).
pub fn task_kind(variant: &ContextVariant) -> &str {
    variant
        .extra
        .get(KIND_KEY)
        .and_then(Value::as_str)
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{entry, MockHost};

    fn request(task: &str) -> GroupRequest {
        GroupRequest {
            task_id: task.into(),
            task_kind: "clean".into(),
            task_description: "clean the mug".into(),
            group_size: 4,
            ..GroupRequest::default()
        }
    }

    #[test]
    fn retrieval_takes_top_k_general_and_task_specific_entries_in_rank_order() {
        let host = MockHost::default();
        host.put(entry(1, None, "general one"));
        host.put(entry(2, Some("t1"), "task one"));
        host.put(entry(3, Some("t2"), "another task's"));
        host.put(entry(4, None, "general two"));
        host.put(entry(5, Some("t1"), "task two"));
        host.put(entry(6, None, "general three"));
        let config = EdgeConfig::from_json(r#"{"top_k": 2, "task_specific_top_k": 1}"#).unwrap();
        let r = retrieve(&config, &request("t1"), &host).unwrap();
        let ids: Vec<u64> = r.entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, [1, 4, 2]);
        assert_eq!(r.too_long, 0);
        let q = host.queries.lock().unwrap()[0].clone();
        assert_eq!(q.text, "clean the mug");
        assert_eq!(q.kinds, [EntryKind::Experience]);
        assert_eq!(q.task_id.as_deref(), Some("t1"));
        assert!(q.include_general);
        let bare = e_variant("", &request("t1"), &r.entries);
        assert_eq!(bare.inject, "general one\ngeneral two\ntask one");
        let v = e_variant(crate::config::DEFAULT_HEADER, &request("t1"), &r.entries);
        assert_eq!(v.label, "experience:3");
        assert_eq!(
            v.inject,
            "Experiences from earlier attempts at tasks like this one:\n- general one\n- \
             general two\n- task one"
        );
        assert_eq!(experience_ids(&v), [1, 4, 2]);
        assert_eq!(task_kind(&v), "clean");
        assert_eq!(v.extra[ARM_KEY], "E");
        let n = n_variant(&request("t1"));
        assert_eq!((n.label.as_str(), n.inject.as_str()), ("plain", ""));
        assert_eq!(n.extra[ARM_KEY], "N");
        assert!(experience_ids(&n).is_empty());
    }

    #[test]
    fn an_over_long_entry_is_skipped_and_counted_never_truncated() {
        let host = MockHost::default();
        host.put(entry(1, None, &"x".repeat(11)));
        host.put(entry(2, None, "short"));
        // Exactly at the limit, in multi-byte characters: fits.
        host.put(entry(3, None, &"é".repeat(10)));
        let config = EdgeConfig::from_json(r#"{"top_k": 2, "max_experience_chars": 10}"#).unwrap();
        let r = retrieve(&config, &request("t1"), &host).unwrap();
        let texts: Vec<&str> = r.entries.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["short", "éééééééééé"]);
        assert_eq!(r.too_long, 1);
    }
}
