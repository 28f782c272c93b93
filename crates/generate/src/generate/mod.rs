//! Streamed text generation from decoder-only models, with continuous batching. This layer sits
//! beside the scheduler (`kiln-scheduler`): the repository starts one [`Generator`] per
//! version of a decoupled generation model, the engine submits requests to it, and it knows
//! tokens, text and the model's KV cache but nothing of the protocols.
//!
//! Layout: [`batch`] is the continuous-batching state as pure data (who runs, who waits, the
//! inputs and cache plans that follow); [`sampling`] picks tokens (greedy, temperature, top-k,
//! top-p, seeded); [`text`] holds the tokenizer, incremental detokenization and stop strings;
//! `runner` is the loop thread that owns the ONNX Runtime session and the batch's KV cache.
//!
//! Each version has one loop thread. A submitted request waits in an inbox; at the start of every
//! step the loop moves arrivals into the batch (a prefill over all of them, batched), then runs
//! one decode step for every sequence in the batch together. A sequence that finishes, or whose
//! receiver was dropped (the client went away), leaves at once and its cache rows are freed.

pub mod batch;
pub mod chat;
mod runner;
pub mod sampling;
pub mod text;

use crate::backend::decoder::DecoderSession;
use crate::metrics::{GenerationMetrics, ModelStats};
use sampling::SamplingParams;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;
use text::TextCodec;
use tokio::sync::mpsc;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model generated its end-of-sequence token.
    Eos,
    /// The text reached one of the request's stop strings.
    Stop,
    /// `max_tokens` generated.
    Length,
}

/// One generated token as a request asked to see it ([`GenerateParams::details`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenDetails {
    pub id: u32,
    /// The token alone as text, special tokens included (may differ from the event's text,
    /// which is held back for characters and stop strings).
    pub text: String,
    /// Its natural log-probability under the model's distribution for the step (the softmax of
    /// the raw logits, before temperature, top-k and top-p).
    pub logprob: f32,
    /// A special token of the tokenizer (e.g. the end-of-sequence token).
    pub special: bool,
}

/// How a sequence ended, and the tokens it counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub reason: Finish,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated, the last one included.
    pub generated_tokens: usize,
}

/// What a request's receiver gets: one token event per generated token, the last one carrying
/// [`Finished`]; or a failure, after which nothing follows.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The text this token completes (may be empty: part of a character, held back for a stop
    /// string, or the end-of-sequence token).
    Token {
        text: String,
        finish: Option<Finished>,
        /// The token itself, when the request asked for details.
        details: Option<TokenDetails>,
    },
    Failed(String),
}

/// What to generate, after the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep generating past the end-of-sequence token (for benchmarks, as vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// Send each token's [`TokenDetails`] (costs a log-softmax over the vocabulary per token).
    pub details: bool,
}

/// Settings of one generation model version (from its config's `parameters`).
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Sequences decoded together at most; 1 turns continuous batching off.
    pub max_active: usize,
    /// Prompt plus generated tokens, at most.
    pub max_sequence_length: usize,
    /// Prompt tokens one prefill takes at most (a longer prompt goes alone): waiting requests
    /// join in chunks of this size, which bounds how long a burst of long prompts holds up the
    /// running sequences' next token.
    pub max_prefill_tokens: usize,
    /// Requests waiting or running at most (0: no limit).
    pub max_in_flight: usize,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    #[error("{0}")]
    Invalid(String),
    #[error("Exceeds maximum in-flight requests ({0})")]
    Overloaded(usize),
    #[error("the model's generation loop has stopped")]
    Stopped,
}

/// A request on its way through the loop.
struct Sequence {
    prompt: Vec<u32>,
    params: GenerateParams,
    events: mpsc::UnboundedSender<Event>,
    arrived: Instant,
    /// Counts this request in [`Shared::in_flight`] until it is dropped.
    _ticket: Ticket,
}

struct Ticket(Arc<Shared>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Shared {
    inbox: Mutex<Inbox>,
    wake: Condvar,
    /// Requests submitted and not yet finished (waiting or running).
    in_flight: AtomicUsize,
}

#[derive(Default)]
struct Inbox {
    arrivals: Vec<Sequence>,
    stopped: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The generation loop of one model version. Dropping it stops the loop after its current
/// step; requests still waiting or running see their event stream end.
pub struct Generator {
    shared: Arc<Shared>,
    codec: Arc<TextCodec>,
    options: GenerateOptions,
    thread: Option<std::thread::JoinHandle<()>>,
    /// How the model lays out a conversation, when it ships a chat template (boxed: a compiled
    /// template is large, and most generators have none); `Err` when the one it ships cannot be
    /// used, which only chats are refused for.
    chat: Option<Result<Box<chat::ChatTemplate>, String>>,
}

impl Generator {
    /// Starts the loop thread, named `label`.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub fn start(
        label: &str,
        session: DecoderSession,
        codec: TextCodec,
        options: GenerateOptions,
        stats: Arc<ModelStats>,
        metrics: GenerationMetrics,
    ) -> std::io::Result<Generator> {
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            in_flight: AtomicUsize::new(0),
        });
        let codec = Arc::new(codec);
        let loop_state = runner::Runner::new(
            session,
            Arc::clone(&codec),
            options.max_active,
            options.max_prefill_tokens,
            stats,
            metrics,
        );
        let loop_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(label.to_string())
            .spawn(move || loop_state.run(&loop_shared))?;
        Ok(Generator {
            shared,
            codec,
            options,
            thread: Some(thread),
            chat: None,
        })
    }

    /// The same generator, laying conversations out with `chat`.
    pub fn with_chat_template(
        mut self,
        chat: Option<Result<chat::ChatTemplate, String>>,
    ) -> Generator {
        self.chat = chat.map(|template| template.map(Box::new));
        self
    }

    /// The model's chat template, if it ships one (`Err`: why it cannot be used).
    pub fn chat_template(&self) -> Option<Result<&chat::ChatTemplate, &str>> {
        self.chat
            .as_ref()
            .map(|template| template.as_deref().map_err(String::as_str))
    }

    /// Tokenizes `prompt`, checks the request against the model's limits and queues it; the
    /// events arrive on the returned receiver. Dropping the receiver cancels the request.
    /// Blocking (tokenization): call it off the async runtime.
    ///
    /// # Errors
    /// [`GenerateError::Invalid`] for an empty or too long prompt or `max_tokens` 0;
    /// [`GenerateError::Overloaded`] at the model's in-flight limit; [`GenerateError::Stopped`].
    pub fn submit(
        &self,
        prompt: &str,
        params: GenerateParams,
    ) -> Result<mpsc::UnboundedReceiver<Event>, GenerateError> {
        if params.max_tokens == 0 {
            return Err(GenerateError::Invalid(
                "max_tokens must be at least 1".into(),
            ));
        }
        let ids = self.codec.encode(prompt).map_err(GenerateError::Invalid)?;
        if ids.is_empty() {
            return Err(GenerateError::Invalid(
                "the prompt must hold at least one token".into(),
            ));
        }
        let limit = self.options.max_sequence_length;
        if ids.len().saturating_add(params.max_tokens) > limit {
            return Err(GenerateError::Invalid(format!(
                "the prompt ({} tokens) plus max_tokens ({}) exceeds the model's max_sequence_length ({limit})",
                ids.len(),
                params.max_tokens
            )));
        }
        let count = self.shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let ticket = Ticket(Arc::clone(&self.shared));
        let max = self.options.max_in_flight;
        if max > 0 && count > max {
            return Err(GenerateError::Overloaded(max));
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let sequence = Sequence {
            prompt: ids,
            params,
            events,
            arrived: Instant::now(),
            _ticket: ticket,
        };
        {
            let mut inbox = self.shared.lock();
            if inbox.stopped {
                return Err(GenerateError::Stopped);
            }
            inbox.arrivals.push(sequence);
        }
        self.shared.wake.notify_one();
        Ok(receiver)
    }

    /// Stops the loop and waits until its thread has dropped the session. Blocking.
    pub fn stop(mut self) {
        let thread = self.thread.take();
        drop(self);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_all();
    }
}
