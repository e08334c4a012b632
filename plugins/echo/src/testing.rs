//! Test fixtures (the crate's and `tests/it`): a toy BPE-like tokenizer, and the SDK's mock
//! host set up with it, prompts rendered as `inject + "\n" + observation`, and the bank
//! newest first. Not used by the plugin itself.
//!
//! **Tokenizer.** Like a byte-level BPE vocabulary in the ways that matter to `echo`: a run of
//! letters is one token, and one space before it is folded into it (`" select"`); each digit,
//! punctuation mark and other whitespace character is a token of its own. Ids are assigned on
//! first sight, so [`Toy::ids`] and [`Toy::text`] invert each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn_plugin_sdk::testing::MockHost;
use cairn_plugin_sdk::{BankEntry, EntryKind};

/// The toy tokenizer's vocabulary (see the module docs); clones share it.
#[derive(Clone, Default)]
pub struct Toy(Arc<Mutex<Vocab>>);

/// Piece to id, and id to piece.
type Vocab = (HashMap<String, u32>, Vec<String>);

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

impl Toy {
    /// The text of `ids` (ids this vocabulary gave out).
    pub fn text(&self, ids: &[u32]) -> String {
        let v = self.0.lock().unwrap();
        ids.iter().map(|&id| v.1[id as usize].as_str()).collect()
    }

    /// The ids of `text` (never fails).
    pub fn ids(&self, text: &str) -> Vec<u32> {
        let mut v = self.0.lock().unwrap();
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

    /// The SDK's mock host tokenizing with this vocabulary, rendering a prompt as the ids of
    /// `inject + "\n" + observation`, and answering bank queries newest first.
    pub fn host(&self) -> MockHost {
        let (tokens, prompts) = (self.clone(), self.clone());
        MockHost::default()
            .with_tokenizer(move |text| Ok(tokens.ids(text)))
            .with_renderer(move |r| {
                Ok(prompts.ids(&format!("{}\n{}", r.variant.inject, r.observation.text)))
            })
            .with_ranking(|_, matches| matches.reverse())
    }
}

/// The memory records of `trajectory` in `host`'s bank, by id.
pub fn memory_records(host: &MockHost, trajectory: u64) -> Vec<BankEntry> {
    let bank = host.entries.lock().unwrap();
    bank.iter()
        .filter(|e| e.kind == EntryKind::MemoryRecord && e.trajectory_id == Some(trajectory))
        .cloned()
        .collect()
}

/// The inject text of `host`'s last render request.
pub fn last_inject(host: &MockHost) -> String {
    let r = host.renders.lock().unwrap();
    r.last()
        .map(|r| r.variant.inject.clone())
        .unwrap_or_default()
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
        let toy = Toy::default();
        let ids = toy.ids("a b12 c");
        assert_eq!(toy.text(&ids), "a b12 c");
        assert_eq!(ids.len(), 5);
    }
}
