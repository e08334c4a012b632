//! [`ChatFormat`]: what turns messages into prompt ids for one model (tokenizer, chat template,
//! end-of-turn and stop ids). The rollout's [`crate::rollout::prompt::ChatPrompt`] renders each
//! turn's prompt with it, and the gateway renders every request with it; neither re-renders or
//! re-tokenises sampled ids. Multi-call episodes are merged by token ids in
//! `cairn_gateway::Segment`.

use serde_json::{Map, Value as Json};

use super::template::{ChatTemplate, RenderOptions};
use super::template_fns::CivilTime;
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};

/// A tokenizer, a chat template and the template's end-of-turn token: what turns messages into
/// ids for one model. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ChatFormat {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    end_of_turn: u32,
    stop_ids: Vec<u32>,
    vars: Map<String, Json>,
    now: Option<CivilTime>,
}

impl ChatFormat {
    /// Uses the tokenizer's `eos_token` as the end-of-turn token (`<|im_end|>` for Qwen,
    /// `<|eot_id|>` for Llama 3 Instruct).
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate) -> Result<ChatFormat> {
        let end_of_turn = tokenizer.eos_token_id().ok_or_else(|| {
            Error::Tokenizer(
                "no eos_token in tokenizer_config.json; \
                 name the end-of-turn token with `with_end_of_turn`"
                    .into(),
            )
        })?;
        let mut format = ChatFormat {
            tokenizer,
            template,
            end_of_turn,
            stop_ids: Vec::new(),
            vars: Map::new(),
            now: None,
        };
        format.set_stop_ids();
        Ok(format)
    }

    /// The tokenizer with its own chat template (from its model directory).
    pub fn from_tokenizer(tokenizer: Tokenizer) -> Result<ChatFormat> {
        let template = tokenizer
            .chat_template()
            .cloned()
            .ok_or_else(|| Error::Tokenizer("the model directory has no chat template".into()))?;
        ChatFormat::new(tokenizer, template)
    }

    /// Names the token that closes an assistant turn, when it is not the `eos_token`.
    pub fn with_end_of_turn(mut self, token: &str) -> Result<ChatFormat> {
        self.end_of_turn = self.tokenizer.require_id(token)?;
        self.set_stop_ids();
        Ok(self)
    }

    /// Extra template variables for every render (`enable_thinking`, `date_string`...).
    pub fn with_vars(mut self, vars: Map<String, Json>) -> ChatFormat {
        self.vars = vars;
        self
    }

    /// Pins the clock `strftime_now` reads.
    pub fn with_clock(mut self, now: CivilTime) -> ChatFormat {
        self.now = Some(now);
        self
    }

    fn set_stop_ids(&mut self) {
        self.stop_ids = self.tokenizer.eos_ids().to_vec();
        if !self.stop_ids.contains(&self.end_of_turn) {
            self.stop_ids.insert(0, self.end_of_turn);
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The id that closes an assistant turn in the template.
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    /// Ids that end sampling: the end-of-turn id and the tokenizer's [`Tokenizer::eos_ids`].
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    fn options(&self, tools: Option<&[Json]>) -> RenderOptions {
        RenderOptions {
            add_generation_prompt: true,
            tools: tools.map(<[Json]>::to_vec),
            extra: self.vars.clone(),
            now: self.now,
        }
    }

    /// Ids of the rendered conversation followed by the generation prompt.
    pub fn prompt_ids(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<Vec<u32>> {
        self.tokenizer.encode(&self.prompt_text(messages, tools)?)
    }

    /// The rendered conversation followed by the generation prompt: the text
    /// [`ChatFormat::prompt_ids`] encodes (the gateway checks its length before encoding).
    pub fn prompt_text(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<String> {
        self.template.render(messages, &self.options(tools))
    }
}
