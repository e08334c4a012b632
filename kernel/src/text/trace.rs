//! Multi-turn token bookkeeping: the exact ids of an episode and which of them to train on.
//!
//! The invariant is *train only on tokens the policy sampled; never re-render or re-tokenise
//! model output*. A [`TokenTrace`] starts from the tokenised prompt (rendered with
//! `add_generation_prompt=True`), appends sampled ids verbatim with loss mask 1
//! ([`TokenTrace::push_sampled`]), and appends what the template inserts after the assistant
//! turn with mask 0 ([`TokenTrace::push_observation`]): the newline after the end-of-turn token
//! (verl #6501), the observation messages and the next generation prompt.
//!
//! The observation ids come from rendering the whole conversation (the assistant message being
//! the decoded sampled text) and taking the ids after this turn's end-of-turn token, located by
//! counting end-of-turn ids (special tokens split tokenisation, so the suffix is exactly what
//! tokenising the full render gives there). When the render is not append-only at that point
//! (Qwen3 drops the `<think>` block of turns before the last user query, verl #3477) the kept
//! ids and the render disagree: **the trace keeps the sampled ids** and records a
//! [`PrefixMismatch`]; history is never re-rendered into the trace. Callers: the rollout actor
//! (one trace per episode) and the gateway (one per merged segment).

use std::ops::Range;

use serde_json::{json, Map, Value as Json};

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

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The id that closes an assistant turn in the template.
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    /// Ids that end sampling: the end-of-turn id and the tokenizer's [`Tokenizer::eos_ids`].
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    fn options(&self, tools: Option<&[Json]>, add_generation_prompt: bool) -> RenderOptions {
        RenderOptions {
            add_generation_prompt,
            tools: tools.map(<[Json]>::to_vec),
            extra: self.vars.clone(),
            now: self.now,
        }
    }

    /// Ids of the rendered conversation followed by the generation prompt.
    pub fn prompt_ids(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(&self.template.render(messages, &self.options(tools, true))?)
    }

    /// Ids of the rendered conversation without a generation prompt (a finished transcript).
    pub fn transcript_ids(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<Vec<u32>> {
        self.tokenizer.encode(
            &self
                .template
                .render(messages, &self.options(tools, false))?,
        )
    }

    /// The assistant message a sampled turn stands for: its decoded text (special tokens kept,
    /// trailing stop ids dropped) as `content`. Tool calls and think blocks stay in the text,
    /// which is how Qwen and Hermes templates print them back.
    pub fn assistant_message(&self, sampled: &[u32]) -> Result<Json> {
        let end = sampled
            .iter()
            .rposition(|id| !self.stop_ids.contains(id))
            .map_or(0, |i| i + 1);
        let content = self.tokenizer.decode(&sampled[..end])?;
        Ok(json!({"role": "assistant", "content": content}))
    }
}

/// Where a run of trace ids came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// The initial prompt, generation prompt included. Mask 0.
    Prompt,
    /// Ids the policy sampled, end-of-turn token included. Mask 1.
    Sampled,
    /// Template text after a turn: newline, observation messages, next generation prompt. Mask 0.
    Observation,
    /// Template text after the last turn ([`TokenTrace::close`]). Mask 0.
    Closing,
}

/// A run of ids of one kind, `range` indexing [`TokenTrace::ids`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub kind: SpanKind,
    pub range: Range<usize>,
}

/// A turn at which re-rendering the conversation does not reproduce the kept ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMismatch {
    /// 0-based index of the sampled turn after which the render was taken.
    pub turn: usize,
    /// First index (into the trace ids) where kept and re-rendered ids differ.
    pub position: usize,
    /// The kept id there (`None`: the render is longer).
    pub kept: Option<u32>,
    /// The re-rendered id there (`None`: the render is shorter).
    pub rendered: Option<u32>,
}

/// The ids of one episode (or gateway segment), their loss mask and their provenance.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenTrace {
    ids: Vec<u32>,
    loss_mask: Vec<u8>,
    spans: Vec<Span>,
    /// The conversation as the template saw it; assistant turns are decoded sampled text.
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    /// Start (in `ids`) of the assistant turn being sampled.
    turn_start: usize,
    turns: usize,
    mismatches: Vec<PrefixMismatch>,
}

impl TokenTrace {
    /// Renders and tokenises the prompt with the generation prompt appended. All mask 0.
    pub fn start(
        format: &ChatFormat,
        messages: Vec<Json>,
        tools: Option<Vec<Json>>,
    ) -> Result<TokenTrace> {
        let ids = format.prompt_ids(&messages, tools.as_deref())?;
        let len = ids.len();
        Ok(TokenTrace {
            loss_mask: vec![0; len],
            spans: vec![Span {
                kind: SpanKind::Prompt,
                range: 0..len,
            }],
            ids,
            messages,
            tools,
            turn_start: len,
            turns: 0,
            mismatches: Vec::new(),
        })
    }

    /// Appends sampled ids exactly as generated, mask 1. Call once per turn or once per
    /// streamed chunk; the turn ends at the next observation.
    pub fn push_sampled(&mut self, ids: &[u32]) {
        let start = self.ids.len();
        self.ids.extend_from_slice(ids);
        self.loss_mask.resize(self.ids.len(), 1);
        self.extend_span(SpanKind::Sampled, start);
    }

    /// Appends, mask 0, the ids the template puts between the end of the sampled turn and the
    /// next generation prompt when `observation` (tool results, a user message) follows it,
    /// and returns them. They start with the template's newline after the end-of-turn token; if
    /// the turn was cut off before its end-of-turn token, they start with that token.
    pub fn push_observation(
        &mut self,
        format: &ChatFormat,
        observation: &[Json],
    ) -> Result<&[u32]> {
        let range = self.append_rendered(format, observation, true, SpanKind::Observation)?;
        Ok(&self.ids[range])
    }

    /// Appends, mask 0, what the template writes after the last sampled turn of a finished
    /// conversation (Qwen: the `\n` after `<|im_end|>`), so the trace equals the tokenised full
    /// transcript when the template is append-only. Optional; call it last.
    pub fn close(&mut self, format: &ChatFormat) -> Result<&[u32]> {
        let range = self.append_rendered(format, &[], false, SpanKind::Closing)?;
        Ok(&self.ids[range])
    }

    fn append_rendered(
        &mut self,
        format: &ChatFormat,
        observation: &[Json],
        add_generation_prompt: bool,
        kind: SpanKind,
    ) -> Result<Range<usize>> {
        let sampled = &self.ids[self.turn_start..];
        if sampled.is_empty() {
            return Err(Error::Trace(format!(
                "{kind:?} must follow a sampled assistant turn (turn {})",
                self.turns
            )));
        }
        let eot = format.end_of_turn();
        let closed = sampled.last() == Some(&eot);
        let mut messages = self.messages.clone();
        messages.push(format.assistant_message(sampled)?);
        messages.extend_from_slice(observation);
        let rendered = format.tokenizer().encode(&format.template().render(
            &messages,
            &format.options(self.tools.as_deref(), add_generation_prompt),
        )?)?;

        // The turn's end-of-turn token is the n-th in the render, n counted over the kept ids.
        let kept_eots = self.ids.iter().filter(|&&id| id == eot).count();
        let nth = if closed { kept_eots } else { kept_eots + 1 };
        // `nth >= 1`: a closed turn holds an end-of-turn id itself.
        let position = rendered
            .iter()
            .enumerate()
            .filter(|(_, &id)| id == eot)
            .nth(nth - 1)
            .map(|(i, _)| i);
        let split = match position {
            Some(i) if closed => i + 1,
            Some(i) => i,
            None => {
                return Err(Error::Trace(format!(
                    "the re-rendered conversation after turn {} has fewer than {nth} \
                     end-of-turn tokens ({})",
                    self.turns,
                    format.tokenizer().id_to_token(eot).unwrap_or_default()
                )))
            }
        };
        if rendered[..split] != self.ids[..] {
            let position = self
                .ids
                .iter()
                .zip(&rendered[..split])
                .take_while(|(a, b)| a == b)
                .count();
            let mismatch = PrefixMismatch {
                turn: self.turns,
                position,
                kept: self.ids.get(position).copied(),
                rendered: rendered[..split].get(position).copied(),
            };
            tracing::debug!(
                turn = mismatch.turn,
                position,
                "chat template is not append-only here; keeping sampled ids"
            );
            self.mismatches.push(mismatch);
        }

        let start = self.ids.len();
        self.ids.extend_from_slice(&rendered[split..]);
        self.loss_mask.resize(self.ids.len(), 0);
        self.extend_span(kind, start);
        self.messages = messages;
        self.turn_start = self.ids.len();
        self.turns += 1;
        Ok(start..self.ids.len())
    }

    fn extend_span(&mut self, kind: SpanKind, start: usize) {
        let end = self.ids.len();
        match self.spans.last_mut() {
            Some(last) if last.kind == kind && last.range.end == start => last.range.end = end,
            _ if start == end => {}
            _ => self.spans.push(Span {
                kind,
                range: start..end,
            }),
        }
    }

    /// Every id of the trace: prompt, sampled turns and observations, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// 1 on sampled ids, 0 elsewhere; same length as [`TokenTrace::ids`].
    pub fn loss_mask(&self) -> &[u8] {
        &self.loss_mask
    }

    /// Where each run of ids came from, in order and without gaps.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Length of the initial prompt.
    pub fn prompt_len(&self) -> usize {
        self.spans.first().map_or(0, |span| span.range.end)
    }

    /// The ranges of the sampled turns (one per turn, chunks merged).
    pub fn sampled_turns(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.spans
            .iter()
            .filter(|span| span.kind == SpanKind::Sampled)
            .map(|span| span.range.clone())
    }

    /// The conversation as rendered so far (assistant turns as decoded sampled text). The
    /// pending turn, if any, is not in it yet.
    pub fn messages(&self) -> &[Json] {
        &self.messages
    }

    /// The ids sampled since the last observation (the turn in progress; empty after one).
    pub fn pending_turn(&self) -> &[u32] {
        &self.ids[self.turn_start..]
    }

    /// Turns where the template re-rendered history differently from the kept ids.
    pub fn mismatches(&self) -> &[PrefixMismatch] {
        &self.mismatches
    }
}
