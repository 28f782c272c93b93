//! Generation requests through the façade: a decoupled generation model takes a request in
//! Triton's LLM shape (`text_input` and settings, see [`params`]) and answers with a
//! [`Generation`], a stream of text chunks, one per generated token. Both protocols read it: gRPC
//! `ModelStreamInfer` sends one response per chunk, REST `generate_stream` one server-sent event,
//! and `generate` the whole text at once.

pub mod params;

use super::prepare::Call;
use super::record::Failed;
use super::stream::StreamedResponse;
use super::target::Target;
use super::{Admission, Engine};
use crate::core::Error;
pub use crate::generate::chat::Message;
use crate::generate::{Event, GenerateError};
pub use crate::generate::{Finish, Finished, TokenDetails};
use crate::invalid_arg;
use crate::repository::{Executor, ServingVersion};
use crate::trace::{RecordOnDrop, Trace};
pub use params::Parsed;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One piece of generated text.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub text: String,
    /// On the last chunk: why generation ended, and the tokens it counted.
    pub finished: Option<Finished>,
    /// The token generated, when the request asked for `details`.
    pub details: Option<TokenDetails>,
}

/// A generation read to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Whole {
    /// The whole text, after the prompt unless the request set `exclude_input_in_output`.
    pub text: String,
    /// Why generation ended; `None` if it never started (no chunk came).
    pub finished: Option<Finished>,
    /// Every token generated, when the request asked for `details`.
    pub tokens: Vec<TokenDetails>,
}

impl Chunk {
    /// Nothing follows this chunk.
    pub fn last(&self) -> bool {
        self.finished.is_some()
    }
}

/// A running generation. Dropping it cancels the request: the model stops generating for it and
/// frees its cache at the next step.
pub struct Generation {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    /// The request's settings (`stream`, `exclude_input_in_output`, ...).
    pub request: Parsed,
    events: mpsc::UnboundedReceiver<Event>,
    finished: bool,
    /// Keeps the version (and so its loop) alive while the request runs, through a reload.
    _serving: Arc<ServingVersion>,
    /// Counts the request in flight until the last chunk is read or the client goes away.
    _admission: Option<Admission>,
    /// The request's trace: INFER_RESPONSE_COMPLETE per chunk.
    trace: Option<Arc<Trace>>,
    /// Records its REQUEST_END at the last chunk, or when the client goes away first.
    end: Option<Arc<RecordOnDrop>>,
}

impl Generation {
    /// A piece of its text (or all of it) as a response: `text_output`, BYTES `[1]`, what a
    /// Python model's call or an ensemble's next step gets from a generation model.
    pub fn text_response(&self, text: &str) -> crate::core::InferResponse {
        crate::core::InferResponse {
            model_name: self.model_name.clone(),
            model_version: self.model_version.clone(),
            id: self.id.clone(),
            outputs: vec![crate::core::Tensor::new(
                "text_output",
                crate::core::DataType::Bytes,
                vec![1],
                crate::core::tensor::frame_bytes([text]),
            )],
            ..crate::core::InferResponse::default()
        }
    }

    /// The next chunk; `None` after the last one.
    ///
    /// # Errors
    /// INTERNAL when the model failed; UNAVAILABLE when the model stopped (unloaded) first.
    pub async fn next(&mut self) -> Option<Result<Chunk, Error>> {
        if self.finished {
            return None;
        }
        let event = self.events.recv().await;
        if let (Some(trace), Some(Event::Token { .. })) = (&self.trace, &event) {
            trace.responded();
        }
        let chunk = match event {
            Some(Event::Token {
                text,
                finish,
                details,
            }) => {
                self.finished = finish.is_some();
                Ok(Chunk {
                    text,
                    finished: finish,
                    details,
                })
            }
            Some(Event::Failed(message)) => {
                self.finished = true;
                Err(Error::Internal(message))
            }
            None => {
                self.finished = true;
                Err(Error::Unavailable(GenerateError::Stopped.to_string()))
            }
        };
        if self.finished {
            self.end = None;
        }
        Some(chunk)
    }

    /// Reads every chunk and returns the whole text, after the prompt unless the request set
    /// `exclude_input_in_output` (as Triton's LLM backends answer a request that does not stream).
    ///
    /// # Errors
    /// As [`Generation::next`].
    pub async fn text(&mut self) -> Result<String, Error> {
        self.whole().await.map(|whole| whole.text)
    }

    /// Reads every chunk: the whole text as [`Generation::text`], why it ended and the tokens.
    ///
    /// # Errors
    /// As [`Generation::next`].
    pub async fn whole(&mut self) -> Result<Whole, Error> {
        let mut whole = Whole {
            text: if self.request.exclude_input {
                String::new()
            } else {
                self.request.prompt.clone()
            },
            finished: None,
            tokens: Vec::new(),
        };
        while let Some(chunk) = self.next().await {
            let chunk = chunk?;
            whole.text.push_str(&chunk.text);
            whole.finished = chunk.finished.or(whole.finished);
            whole.tokens.extend(chunk.details);
        }
        Ok(whole)
    }

    /// Its pieces as `text_output` responses, what a Python model's call or an ensemble's next
    /// step reads: one per piece when the request streams, else one with the whole text.
    /// Dropping the receiver drops the generation.
    pub(super) fn responses(mut self) -> mpsc::UnboundedReceiver<StreamedResponse> {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            if !self.request.stream {
                let text = self.text().await;
                let response = text.map(|text| Some(self.text_response(&text)));
                let _ = sender.send(StreamedResponse {
                    response,
                    last: true,
                });
                return;
            }
            loop {
                let chunk = tokio::select! {
                    chunk = self.next() => match chunk {
                        Some(chunk) => chunk,
                        None => return,
                    },
                    // Nobody listens any more: the generation is dropped.
                    () = sender.closed() => return,
                };
                let last = chunk.as_ref().map_or(true, |chunk| chunk.last());
                let response = chunk.map(|chunk| Some(self.text_response(&chunk.text)));
                if sender.send(StreamedResponse { response, last }).is_err() || last {
                    return;
                }
            }
        });
        receiver
    }
}

impl Target {
    /// The prompt its chat template makes of `messages`, on a blocking thread (a
    /// template may compute for a while, within its bounds).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a model without a chat template, or a conversation the template
    /// refuses.
    pub async fn chat_prompt(&self, messages: Vec<Message>) -> Result<String, Error> {
        let (model, serving) = (Arc::clone(&self.model), Arc::clone(&self.serving));
        tokio::task::spawn_blocking(move || {
            let (template, beside) = match &serving.executor {
                Executor::Generate(generator) => (generator.chat_template(), "its tokenizer"),
                // A model that takes Triton's LLM tensors: its model directory's.
                Executor::Python(_) | Executor::Ensemble(_) if serving.io.is_llm() => (
                    serving
                        .chat
                        .as_ref()
                        .map(|chat| chat.as_deref().map_err(String::as_str)),
                    "its config.pbtxt",
                ),
                _ => {
                    return Err(invalid_arg!(
                        "model '{}' does not generate text",
                        model.name
                    ))
                }
            };
            match template {
                Some(Ok(template)) => template.render(&messages).map_err(Error::InvalidArgument),
                Some(Err(why)) => Err(invalid_arg!(
                    "the chat template of model '{}' cannot be used: {why}",
                    model.name
                )),
                None => Err(invalid_arg!(
                    "model '{}' has no chat template (a tokenizer_config.json with \
                     chat_template, or a chat_template.jinja, beside {beside}): send the \
                     formatted prompt to /v1/completions",
                    model.name
                )),
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("chat template task failed: {e}")))?
    }
}

impl Engine {
    /// Starts generating for a checked `call` with its `parsed` settings.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for settings the model refuses; RESOURCE_EXHAUSTED at the model's
    /// `max_inflight_requests`; UNAVAILABLE when it stopped.
    pub(super) async fn start_generation(
        &self,
        call: Call,
        parsed: Parsed,
    ) -> Result<Generation, Failed> {
        let (model, serving, prefix) = (&call.model, &call.serving, &call.prefix);
        let submitting = Arc::clone(serving);
        let (prompt, settings) = (parsed.prompt.clone(), parsed.params.clone());
        let events = tokio::task::spawn_blocking(move || match &submitting.executor {
            Executor::Generate(generator) => generator.submit(&prompt, settings),
            Executor::Batched(_) | Executor::Ensemble(_) | Executor::Python(_) => {
                Err(GenerateError::Stopped)
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("generation task failed: {e}")))?
        .map_err(|e| match e {
            GenerateError::Invalid(message) => invalid_arg!("{prefix}{message}"),
            GenerateError::Overloaded(_) => {
                Error::ResourceExhausted(format!("{prefix}{e} for model '{}'", model.name))
            }
            GenerateError::Stopped => Error::Unavailable(format!("{prefix}{e}")),
        })?;
        Ok(Generation {
            model_name: model.name.clone(),
            model_version: serving.version.to_string(),
            id: call.request.id,
            request: parsed,
            events,
            finished: false,
            _serving: call.serving,
            _admission: call.admission,
            trace: call.scope.trace,
            end: call.end,
        })
    }
}
