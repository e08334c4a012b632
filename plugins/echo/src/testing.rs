//! A host for tests (the crate's and `tests/it`): a toy BPE-like tokenizer, the kernel's
//! bank rules over an in-memory list, prompts rendered as `inject + "\n" + observation`, and
//! every call recorded. Not used by the plugin itself.
//!
//! **Tokenizer.** Like a byte-level BPE vocabulary in the ways that matter to `echo`: a run of
//! letters is one token, and one space before it is folded into it (`" select"`); each digit,
//! punctuation mark and other whitespace character is a token of its own. Ids are assigned on
//! first sight, so `tokenize` and [`TestHost::text`] invert each other.

use std::collections::HashMap;
use std::sync::Mutex;

use cairn_plugin_sdk::{
    BankEntry, BankQuery, EntryKind, EntryStatus, Host, NewEntry, PluginError, RenderRequest,
    Result, Retrieved,
};

/// See the module docs.
#[derive(Default)]
pub struct TestHost {
    vocab: Mutex<(HashMap<String, u32>, Vec<String>)>,
    /// The bank's entries, by id (ids from 1).
    pub bank: Mutex<Vec<BankEntry>>,
    /// Every render request, in order.
    pub renders: Mutex<Vec<RenderRequest>>,
    /// Every bank query, in order.
    pub queries: Mutex<Vec<BankQuery>>,
    /// Every metric logged, in order.
    pub metrics: Mutex<Vec<(String, f64)>>,
}

/// The toy tokenizer's pieces of `text` (see the module docs).
pub fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts_word = |j: usize| chars.get(j).is_some_and(|c| c.is_alphabetic());
        if c.is_alphabetic() || (c == ' ' && starts_word(i + 1)) {
            let mut j = i + 1;
            while starts_word(j) {
                j += 1;
            }
            out.push(chars[i..j].iter().collect());
            i = j;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

impl TestHost {
    /// The text of `ids` (ids this host gave out).
    pub fn text(&self, ids: &[u32]) -> String {
        let v = self.vocab.lock().unwrap();
        ids.iter().map(|&id| v.1[id as usize].as_str()).collect()
    }

    /// The ids of `text` (never fails).
    pub fn ids(&self, text: &str) -> Vec<u32> {
        let mut v = self.vocab.lock().unwrap();
        pieces(text)
            .into_iter()
            .map(|p| {
                if let Some(&id) = v.0.get(&p) {
                    return id;
                }
                let id = v.1.len() as u32;
                v.0.insert(p.clone(), id);
                v.1.push(p);
                id
            })
            .collect()
    }

    /// The memory records of `trajectory`, by id.
    pub fn records(&self, trajectory: u64) -> Vec<BankEntry> {
        let bank = self.bank.lock().unwrap();
        bank.iter()
            .filter(|e| e.kind == EntryKind::MemoryRecord && e.trajectory_id == Some(trajectory))
            .cloned()
            .collect()
    }

    /// The sum of the values logged under `name`.
    pub fn metric_sum(&self, name: &str) -> f64 {
        let m = self.metrics.lock().unwrap();
        m.iter().filter(|(n, _)| n == name).map(|(_, v)| v).sum()
    }

    /// The inject text of the last render request.
    pub fn last_inject(&self) -> String {
        let r = self.renders.lock().unwrap();
        r.last()
            .map(|r| r.variant.inject.clone())
            .unwrap_or_default()
    }
}

impl Host for TestHost {
    fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.ids(text))
    }

    fn render_prompt(&self, request: &RenderRequest) -> Result<Vec<u32>> {
        self.renders.lock().unwrap().push(request.clone());
        Ok(self.ids(&format!(
            "{}\n{}",
            request.variant.inject, request.observation.text
        )))
    }

    /// The kernel's filters (kind, task, trajectory scope, status), newest first; the text is
    /// ignored.
    fn bank_query(&self, q: &BankQuery) -> Result<Vec<Retrieved>> {
        self.queries.lock().unwrap().push(q.clone());
        let statuses = if q.statuses.is_empty() {
            vec![EntryStatus::Active, EntryStatus::UnderTest]
        } else {
            q.statuses.clone()
        };
        let bank = self.bank.lock().unwrap();
        Ok(bank
            .iter()
            .rev()
            .filter(|e| q.kinds.is_empty() || q.kinds.contains(&e.kind))
            .filter(|e| statuses.contains(&e.status))
            .filter(|e| e.trajectory_id == q.trajectory_id)
            .filter(|e| match &q.task_id {
                None => true,
                Some(t) => {
                    e.task_id.as_ref() == Some(t) || (q.include_general && e.task_id.is_none())
                }
            })
            .take(q.k)
            .map(|e| Retrieved {
                entry: e.clone(),
                score: 0.0,
            })
            .collect())
    }

    fn bank_put(&self, entries: &[NewEntry]) -> Result<Vec<u64>> {
        if let Some(i) = entries
            .iter()
            .position(|e| e.kind == EntryKind::MemoryRecord && e.trajectory_id.is_none())
        {
            return Err(PluginError::host(format!(
                "entry {i} of the put: a memory record without a `trajectory_id`"
            )));
        }
        let mut bank = self.bank.lock().unwrap();
        let mut ids = Vec::new();
        for e in entries {
            let id = bank.len() as u64 + 1;
            bank.push(BankEntry {
                id,
                kind: e.kind,
                text: e.text.clone(),
                trigger: e.trigger.clone(),
                task_id: e.task_id.clone(),
                trajectory_id: e.trajectory_id,
                parent: e.parent,
                status: e.status,
                provenance: e.provenance.clone(),
                extra: e.extra.clone(),
                ..BankEntry::default()
            });
            ids.push(id);
        }
        Ok(ids)
    }

    fn log_metric(&self, name: &str, value: f64) {
        self.metrics.lock().unwrap().push((name.into(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toy_tokenizer_folds_one_space_into_a_word() {
        assert_eq!(
            pieces("select[1,3] answer[x y]\n  go"),
            ["select", "[", "1", ",", "3", "]", " answer", "[", "x", " y", "]", "\n", " ", " go"]
        );
        let host = TestHost::default();
        let ids = host.ids("a b12 c");
        assert_eq!(host.text(&ids), "a b12 c");
        assert_eq!(ids.len(), 5);
    }
}
