//! Turning an environment observation into prompt ids, and sampled ids into an action.
//!
//! The kernel owns tokenisation (docs/algorithms/kernel-contract.md, point 2): prompts are built here, once, and
//! the ids recorded on the row are exactly the ids the policy saw. Sampled ids are decoded only
//! to hand the environment its action text; the ids themselves are what the trainer sees.

use cairn_plugin_sdk::{ContextVariant, Observation};

use crate::error::Result;

/// Text ↔ ids, as the policy's tokenizer does it. Implemented by [`crate::text`]'s tokenizer.
pub trait TextCodec: Send + Sync {
    /// Ids of `text`, no special tokens added.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Text of `ids`, special tokens skipped.
    fn decode(&self, ids: &[u32]) -> Result<String>;
}

/// How to frame each turn for the policy.
pub trait PromptBuilder: Send + Sync {
    /// The prompt ids for one turn of a slot with context `variant` seeing `observation`.
    fn prompt(&self, variant: &ContextVariant, observation: &Observation) -> Result<Vec<u32>>;

    /// The environment action in a sampled response (trailing stop id excluded).
    fn action(&self, response_ids: &[u32]) -> Result<String>;

    /// The response ids that demonstrate `action` (for supervised warm starts): the action's
    /// ids followed by the stop id.
    fn demonstration(&self, action: &str) -> Result<Vec<u32>>;

    /// Ids that end a response.
    fn stop_ids(&self) -> &[u32];

    /// The prompt after earlier turns of a trajectory ([`cairn_plugin_sdk::Host::render_prompt`]).
    /// With no history it is exactly [`PromptBuilder::prompt`], the prompt rollouts use; each
    /// history turn is rendered before the observation as its observation, then `> ` and the
    /// action, on their own lines.
    fn render(
        &self,
        variant: &ContextVariant,
        observation: &Observation,
        history: &[cairn_plugin_sdk::HistoryTurn],
    ) -> Result<Vec<u32>> {
        if history.is_empty() {
            return self.prompt(variant, observation);
        }
        let mut text = String::new();
        for turn in history {
            text.push_str(&turn.observation);
            text.push_str("\n> ");
            text.push_str(&turn.action);
            text.push('\n');
        }
        text.push_str(&observation.text);
        self.prompt(
            variant,
            &Observation {
                text,
                ..observation.clone()
            },
        )
    }
}

/// The tools a slot is offered: the observation's tool schemas, unless the slot's variant turns
/// tools off (EAPO's tool-free slots), in which case the prompt carries no schema at all.
pub fn offered_tools<'a>(
    variant: &ContextVariant,
    observation: &'a Observation,
) -> Option<&'a [serde_json::Value]> {
    (variant.tools_enabled && !observation.tools.is_empty()).then_some(&observation.tools[..])
}

/// The plain format: `encode(inject + tools + observation) ++ separator`, where `tools` is a
/// `Tools: [...]` JSON line of the offered tool schemas (none for most environments); the
/// policy answers with the action's ids and a stop id.
pub struct PlainPrompt<C> {
    pub codec: C,
    /// Ids appended after the observation (e.g. the id of `<|im_start|>`), marking "answer now".
    pub separator: Vec<u32>,
    /// The stop ids; the first one is used to end demonstrations.
    pub stop_ids: Vec<u32>,
}

impl<C: TextCodec> PromptBuilder for PlainPrompt<C> {
    fn prompt(&self, variant: &ContextVariant, observation: &Observation) -> Result<Vec<u32>> {
        // Most turns encode the observation as it is, without a copy.
        let mut text = match offered_tools(variant, observation) {
            Some(tools) => std::borrow::Cow::Owned(format!(
                "Tools: {}\n{}",
                serde_json::Value::from(tools),
                observation.text
            )),
            None => std::borrow::Cow::Borrowed(observation.text.as_str()),
        };
        if !variant.inject.is_empty() {
            text = std::borrow::Cow::Owned(format!("{}\n{text}", variant.inject));
        }
        let mut ids = self.codec.encode(&text)?;
        ids.extend_from_slice(&self.separator);
        Ok(ids)
    }

    fn action(&self, response_ids: &[u32]) -> Result<String> {
        let body = match response_ids.last() {
            Some(id) if self.stop_ids.contains(id) => &response_ids[..response_ids.len() - 1],
            _ => response_ids,
        };
        Ok(self.codec.decode(body)?.trim().to_string())
    }

    fn demonstration(&self, action: &str) -> Result<Vec<u32>> {
        let mut ids = self.codec.encode(action)?;
        ids.push(
            *self
                .stop_ids
                .first()
                .expect("PlainPrompt has at least one stop id"),
        );
        Ok(ids)
    }

    fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }
}

impl TextCodec for crate::text::Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        crate::text::Tokenizer::encode(self, text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_skip_special(ids)
    }
}

/// The chat format: each turn is a fresh conversation (an optional system message, then the
/// observation as the user message) rendered with the model's chat template and the
/// generation prompt. The policy answers with the action and its end-of-turn id.
pub struct ChatPrompt {
    pub format: crate::text::ChatFormat,
    /// System message (empty: none).
    pub system: String,
}

impl PromptBuilder for ChatPrompt {
    fn prompt(&self, variant: &ContextVariant, observation: &Observation) -> Result<Vec<u32>> {
        let user = if variant.inject.is_empty() {
            observation.text.clone()
        } else {
            format!("{}\n\n{}", variant.inject, observation.text)
        };
        let mut messages = Vec::new();
        if !self.system.is_empty() {
            messages.push(serde_json::json!({"role": "system", "content": self.system}));
        }
        messages.push(serde_json::json!({"role": "user", "content": user}));
        self.format
            .prompt_ids(&messages, offered_tools(variant, observation))
    }

    /// The first line of the decoded response, special tokens skipped; a response holding a
    /// `<tool_call>` block is handed over whole (the call spans lines), for the environment to
    /// run or, on a tools-off slot, refuse.
    fn action(&self, response_ids: &[u32]) -> Result<String> {
        let body = match response_ids.last() {
            Some(id) if self.format.stop_ids().contains(id) => {
                &response_ids[..response_ids.len() - 1]
            }
            _ => response_ids,
        };
        let text = self.format.tokenizer().decode_skip_special(body)?;
        if text.contains("<tool_call>") {
            return Ok(text.trim().to_string());
        }
        Ok(text.trim().lines().next().unwrap_or("").trim().to_string())
    }

    fn demonstration(&self, action: &str) -> Result<Vec<u32>> {
        let mut ids = self.format.tokenizer().encode(action)?;
        ids.push(self.format.end_of_turn());
        Ok(ids)
    }

    fn stop_ids(&self) -> &[u32] {
        self.format.stop_ids()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A whitespace word codec over a growing vocabulary, for kernel tests.
    #[derive(Default)]
    pub struct WordCodec {
        pub vocab: parking_lot::Mutex<Vec<String>>,
    }

    impl TextCodec for WordCodec {
        fn encode(&self, text: &str) -> Result<Vec<u32>> {
            let mut v = self.vocab.lock();
            Ok(text
                .split_whitespace()
                .map(|w| match v.iter().position(|x| x == w) {
                    Some(i) => i as u32 + 10,
                    None => {
                        v.push(w.to_string());
                        v.len() as u32 + 9
                    }
                })
                .collect())
        }
        fn decode(&self, ids: &[u32]) -> Result<String> {
            let v = self.vocab.lock();
            Ok(ids
                .iter()
                .filter_map(|&i| i.checked_sub(10).and_then(|i| v.get(i as usize)).cloned())
                .collect::<Vec<_>>()
                .join(" "))
        }
    }

    #[test]
    fn plain_prompt_round_trips_actions() {
        let p = PlainPrompt {
            codec: WordCodec::default(),
            separator: vec![1],
            stop_ids: vec![2],
        };
        let obs = Observation {
            text: "you see a mug".into(),
            ..Default::default()
        };
        let ids = p.prompt(&ContextVariant::default(), &obs).unwrap();
        assert_eq!(ids.len(), 5);
        assert_eq!(*ids.last().unwrap(), 1);
        let demo = p.demonstration("take mug 1").unwrap();
        assert_eq!(*demo.last().unwrap(), 2);
        assert_eq!(p.action(&demo).unwrap(), "take mug 1");
        // A truncated response (no stop id) decodes whole.
        assert_eq!(p.action(&demo[..2]).unwrap(), "take mug");
    }

    #[test]
    fn tools_reach_the_plain_prompt_only_when_enabled() {
        let p = PlainPrompt {
            codec: WordCodec::default(),
            separator: vec![1],
            stop_ids: vec![2],
        };
        let bare = Observation {
            text: "compute 1 + 2".into(),
            ..Default::default()
        };
        let with_tools = Observation {
            tools: vec![serde_json::json!({"type": "function", "function": {"name": "calc"}})],
            ..bare.clone()
        };
        let off = ContextVariant {
            tools_enabled: false,
            ..Default::default()
        };
        let on = ContextVariant::default();
        assert_eq!(offered_tools(&on, &with_tools), Some(&with_tools.tools[..]));
        assert_eq!(offered_tools(&off, &with_tools), None);
        assert_eq!(offered_tools(&on, &bare), None);
        let plain = p.prompt(&on, &bare).unwrap();
        assert_eq!(p.prompt(&off, &with_tools).unwrap(), plain);
        let shown = p.prompt(&on, &with_tools).unwrap();
        assert_eq!(
            p.codec.decode(&shown).unwrap(),
            r#"Tools: [{"type":"function","function":{"name":"calc"}}] compute 1 + 2"#
        );
        assert!(shown.ends_with(&plain[plain.len() - 5..]));
    }
}
