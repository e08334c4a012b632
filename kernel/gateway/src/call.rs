//! [`Call`]: a completion request being sampled, answered whole ([`Call::finish`]) or as an
//! SSE stream made while it samples ([`Gateway::stream`]).
//!
//! Both answers are built from the same events ([`super::sampler::SampleEvent`]) and the same
//! [`Output::new`] per choice, so a streamed call returns, and records, exactly what the same
//! request without `stream` returns (same seed, same ids, same text).
//!
//! **Recording a stream.** The call is recorded in its episode only after the connection took
//! the last content and finish chunks, just before `[DONE]`: a client that disconnects
//! mid-stream drops the stream first, so its call is not recorded (the harness never saw the
//! whole answer), and its rows stop sampling at the next token (the sampler's abandoned
//! requests).

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use serde_json::Value as Json;

use super::api_error::ApiError;
use super::request::{Job, Route};
use super::response::{self, ChoiceStream, Output};
use super::sampler::{ended_early, Responses, SampleEvent};
use super::{Completed, Gateway};

/// A request whose sampling has started (its policy version is known).
pub struct Call {
    pub job: Job,
    pub policy_version: u64,
    pub request_id: String,
    /// Unix seconds.
    pub created: u64,
    events: mpsc::Receiver<SampleEvent>,
    responses: Responses,
}

impl Call {
    pub(super) fn new(
        job: Job,
        request_id: String,
        created: u64,
        events: mpsc::Receiver<SampleEvent>,
        responses: Responses,
    ) -> Call {
        Call {
            job,
            policy_version: responses.policy_version.unwrap_or(0),
            request_id,
            created,
            events,
            responses,
        }
    }

    /// The row the next token went to; `None` once every row has ended.
    async fn next(&mut self) -> Option<Result<usize, ApiError>> {
        loop {
            if self.responses.complete() {
                return None;
            }
            let Some(event) = self.events.next().await else {
                return Some(Err(ended_early(true)));
            };
            match self.responses.apply(event) {
                Ok(Some(row)) => return Some(Ok(row)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Waits for every choice: the non-streaming answer.
    pub async fn finish(mut self, gateway: &Gateway) -> Result<Completed, ApiError> {
        while let Some(token) = self.next().await {
            token?;
        }
        let outputs = (0..self.responses.generations.len())
            .map(|row| gateway.output(&self.job, &self.responses, row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.completed(outputs))
    }

    fn completed(self, outputs: Vec<Output>) -> Completed {
        Completed {
            job: self.job,
            outputs,
            policy_version: self.policy_version,
            request_id: self.request_id,
            created: self.created,
        }
    }
}

/// SSE framing of one payload.
fn event(payload: &Json) -> String {
    format!("data: {payload}\n\n")
}

const DONE: &str = "data: [DONE]\n\n";

enum Phase {
    /// Role chunks not sent yet.
    Opening,
    /// Choices sampling.
    Sampling,
    /// The usage chunk is out; record, then `[DONE]`.
    Recording,
    Ended,
}

struct StreamState {
    gateway: Gateway,
    call: Call,
    episode: Option<String>,
    choices: Vec<ChoiceStream>,
    outputs: Vec<Option<Output>>,
    phase: Phase,
}

impl StreamState {
    fn meta(&self) -> response::Meta<'_> {
        response::Meta {
            request_id: &self.call.request_id,
            model: &self.gateway.inner.settings.model_name,
            created: self.call.created,
            policy_version: self.call.policy_version,
        }
    }

    /// The chunks a token of `row` makes: progress, or the choice's last chunks.
    fn on_token(&mut self, row: usize) -> Result<String, ApiError> {
        let StreamState {
            gateway,
            call,
            choices,
            outputs,
            ..
        } = self;
        let tokenizer = gateway.inner.format.tokenizer();
        let meta = response::Meta {
            request_id: &call.request_id,
            model: &gateway.inner.settings.model_name,
            created: call.created,
            policy_version: call.policy_version,
        };
        let (job, choice) = (&call.job, &mut choices[row]);
        let mut text = String::new();
        if call.responses.finished(row) {
            let output = gateway.output(job, &call.responses, row)?;
            for c in choice.finish(job, &meta, row, &output, tokenizer) {
                text.push_str(&event(&c));
            }
            outputs[row] = Some(output);
        } else {
            let g = &call.responses.generations[row];
            if let Some(c) = choice.progress(job, &meta, row, &g.ids, &g.logprobs, tokenizer)? {
                text.push_str(&event(&c));
            }
        }
        Ok(text)
    }

    /// The next piece of the body; `None` ends it.
    async fn step(&mut self) -> Option<String> {
        match self.phase {
            Phase::Opening if self.call.job.route == Route::Chat => {
                self.phase = Phase::Sampling;
                let job = &self.call.job;
                let meta = self.meta();
                Some(
                    (0..self.choices.len())
                        .map(|i| event(&response::role_chunk(job, &meta, i)))
                        .collect(),
                )
            }
            Phase::Opening | Phase::Sampling => loop {
                match self.call.next().await {
                    Some(Ok(row)) => match self.on_token(row) {
                        Ok(text) if text.is_empty() => continue,
                        Ok(text) => return Some(text),
                        Err(e) => return Some(self.fail(e)),
                    },
                    Some(Err(e)) => return Some(self.fail(e)),
                    // Every choice ended, and the connection took their last chunks.
                    None if self.call.job.include_usage => {
                        self.phase = Phase::Recording;
                        let outputs: Vec<Output> = self.outputs.iter().flatten().cloned().collect();
                        let usage = response::usage_chunk(&self.call.job, &outputs, &self.meta());
                        return Some(event(&usage));
                    }
                    None => return Some(self.tail()),
                }
            },
            Phase::Recording => Some(self.tail()),
            Phase::Ended => None,
        }
    }

    /// Records the call and ends the stream. Polled only after the connection took every
    /// chunk: the client has the whole answer. A client that went away dropped the stream
    /// before this point, so its call is not recorded.
    fn tail(&mut self) -> String {
        self.phase = Phase::Ended;
        let mut tail = String::new();
        if let Some(id) = self.episode.clone() {
            if let Err(e) = self.record(&id) {
                tail.push_str(&event(&e.to_json()));
            }
        }
        tail.push_str(DONE);
        tail
    }

    fn record(&mut self, episode: &str) -> Result<Json, ApiError> {
        let outputs: Vec<Output> = self.outputs.iter_mut().filter_map(Option::take).collect();
        let c = &self.call;
        let done = Completed {
            job: c.job.clone(),
            outputs,
            policy_version: c.policy_version,
            request_id: c.request_id.clone(),
            created: c.created,
        };
        self.gateway.record(&done, episode)
    }

    /// An error event and `[DONE]`; the stream ends.
    fn fail(&mut self, e: ApiError) -> String {
        self.phase = Phase::Ended;
        if e.status() >= 500 {
            tracing::warn!(error = %e.message, "a stream failed");
        }
        format!("{}{DONE}", event(&e.to_json()))
    }
}

impl Gateway {
    /// The output of a call's ended row (stop strings, text, tool calls applied).
    fn output(&self, job: &Job, responses: &Responses, row: usize) -> Result<Output, ApiError> {
        let format = &self.inner.format;
        Ok(Output::new(
            job,
            responses.generations[row].clone(),
            format.tokenizer(),
            format.stop_ids(),
        )?)
    }

    /// The SSE body of a streaming call (`data: {chunk}\n\n` pieces, then `data: [DONE]`),
    /// made while it samples: chat role chunks first, then each choice's chunks as its ids
    /// come ([`ChoiceStream`]), its finish chunk as soon as it ends, the usage chunk when
    /// asked; `episode`: recorded there once every chunk is taken (module docs). A failure
    /// mid-stream sends the OpenAI error body as an event, then `[DONE]`.
    pub fn stream(&self, call: Call, episode: Option<String>) -> impl Stream<Item = String> {
        let rows = call.responses.generations.len();
        let state = StreamState {
            gateway: self.clone(),
            call,
            episode,
            choices: vec![ChoiceStream::default(); rows],
            outputs: vec![None; rows],
            phase: Phase::Opening,
        };
        futures::stream::unfold(state, |mut s| async move {
            let piece = s.step().await?;
            Some((piece, s))
        })
    }
}
