//! The loop thread of one generation model version: it owns the ONNX Runtime session and the
//! running batch's KV cache, and alternates between letting waiting requests join (one batched
//! prefill) and decoding one token for every sequence in the batch. See [`super::batch`] for the
//! bookkeeping and [`super`] for the overall shape.

use super::batch::{prefill_inputs, BatchState, Gather, Inputs, Origin};
use super::sampling::{logprob, Sampler};
use super::text::{IncrementalDecoder, StopMatcher, TextCodec};
use super::{Event, Finish, Finished, Sequence, Shared, TokenDetails};
use crate::backend::decoder::{DecoderSession, Forward, KvCache, RowSource, Step};
use crate::backend::BackendError;
use crate::metrics::{ComputeTimes, FailureReason, GenerationMetrics, ModelStats, Timing};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prefills (each of at most `max_prefill_tokens`) run back to back at most this many times
/// before a decode step.
const PREFILL_ROUNDS: usize = 8;

/// A sequence in the batch: the request and its decoding state.
struct Active {
    request: Sequence,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    generated: usize,
    last_token: u32,
    last_at: Instant,
    /// When it joined the batch (its queue time ends there).
    joined: Instant,
    done: bool,
}

impl Active {
    fn new(request: Sequence) -> Active {
        let now = Instant::now();
        Active {
            sampler: Sampler::new(request.params.sampling.clone()),
            decoder: IncrementalDecoder::new(&request.prompt),
            stop: StopMatcher::new(request.params.stop.clone()),
            generated: 0,
            last_token: 0,
            last_at: now,
            joined: now,
            done: false,
            request,
        }
    }

    /// The client stopped listening.
    fn cancelled(&self) -> bool {
        self.request.events.is_closed()
    }

    /// Samples the next token from its row of `logits` and accepts it.
    fn sample(&mut self, logits: &[f32], codec: &TextCodec, metrics: &GenerationMetrics) {
        let token = self.sampler.sample(logits);
        let details = self.request.params.details.then(|| {
            let (text, special) = codec.token(token);
            TokenDetails {
                id: token,
                text,
                logprob: logprob(logits, token),
                special,
            }
        });
        self.accept(token, details, codec, metrics);
    }

    /// Takes a generated token: finds the text it completes, checks the end conditions and sends
    /// the event.
    fn accept(
        &mut self,
        token: u32,
        details: Option<TokenDetails>,
        codec: &TextCodec,
        metrics: &GenerationMetrics,
    ) {
        let now = Instant::now();
        if self.generated == 0 {
            metrics.first_token(now - self.request.arrived);
        } else {
            metrics.token_gap(now - self.last_at);
        }
        metrics.generated(1);
        self.generated += 1;
        self.last_token = token;
        self.last_at = now;
        let decode = |ids: &[u32]| codec.decode(ids);
        let eos = !self.request.params.ignore_eos && Some(token) == codec.eos();
        let (text, finish) = if eos {
            (self.drain(decode), Some(Finish::Eos))
        } else {
            let piece = self.decoder.push(token, decode);
            let (mut text, matched) = self.stop.push(&piece);
            if matched {
                (text, Some(Finish::Stop))
            } else if self.generated >= self.request.params.max_tokens {
                text.push_str(&self.drain(decode));
                (text, Some(Finish::Length))
            } else {
                (text, None)
            }
        };
        self.done = finish.is_some();
        // A closed receiver is noticed before the next step.
        let finish = finish.map(|reason| Finished {
            reason,
            prompt_tokens: self.request.prompt.len(),
            generated_tokens: self.generated,
        });
        let _ = self.request.events.send(Event::Token {
            text,
            finish,
            details,
        });
    }

    /// The text still held back when generation ends, up to a stop string if one completes.
    fn drain(&mut self, decode: impl Fn(&[u32]) -> String) -> String {
        let rest = self.decoder.finish(decode);
        let (mut text, matched) = self.stop.push(&rest);
        if !matched {
            text.push_str(&self.stop.flush());
        }
        text
    }

    fn fail(&self, message: &str) {
        let _ = self.request.events.send(Event::Failed(message.to_string()));
    }
}

/// Everything the loop owns.
pub(super) struct Runner {
    session: DecoderSession,
    codec: Arc<TextCodec>,
    state: BatchState<Active>,
    /// Prompt tokens per prefill, at most (see [`super::GenerateOptions`]).
    max_prefill_tokens: usize,
    /// The batch's cache; `None` when the batch is empty.
    cache: Option<KvCache>,
    stats: Arc<ModelStats>,
    metrics: GenerationMetrics,
}

impl Runner {
    pub(super) fn new(
        session: DecoderSession,
        codec: Arc<TextCodec>,
        max_active: usize,
        max_prefill_tokens: usize,
        stats: Arc<ModelStats>,
        metrics: GenerationMetrics,
    ) -> Runner {
        Runner {
            session,
            codec,
            state: BatchState::new(max_active),
            max_prefill_tokens,
            cache: None,
            stats,
            metrics,
        }
    }

    /// Steps until the generator stops.
    pub(super) fn run(mut self, shared: &Shared) {
        loop {
            {
                let mut inbox = shared.lock();
                while inbox.arrivals.is_empty() && self.state.is_idle() && !inbox.stopped {
                    inbox = shared.wake.wait(inbox).unwrap_or_else(|e| e.into_inner());
                }
                if inbox.stopped {
                    return;
                }
            }
            self.step(shared);
        }
    }

    /// Moves the requests that arrived into the batch's waiting line.
    fn collect(&mut self, shared: &Shared) {
        let arrivals: Vec<Sequence> = shared.lock().arrivals.drain(..).collect();
        for request in arrivals {
            self.state.enqueue(Active::new(request));
        }
    }

    /// One iteration: cancelled sequences leave, waiting ones join, everyone decodes a token.
    /// Requests that arrive during a prefill are prefilled too before the decode step (a few
    /// rounds at most, so a stream of arrivals cannot starve the running sequences): time to
    /// first token is one prefill behind, not a whole step.
    fn step(&mut self, shared: &Shared) {
        self.collect(shared);
        let stats = Arc::clone(&self.stats);
        self.state.retain_pending(|s| {
            let keep = !s.cancelled();
            if !keep {
                stats.record_failure(s.request.arrived.elapsed(), FailureReason::Canceled);
            }
            keep
        });
        self.leave();
        for _ in 0..PREFILL_ROUNDS {
            let joining = self
                .state
                .take_joining(self.max_prefill_tokens, |s| s.request.prompt.len());
            if joining.is_empty() {
                break;
            }
            self.prefill(joining);
            self.collect(shared);
        }
        if !self.state.rows().is_empty() {
            self.decode();
        }
        self.stats.set_pending(self.state.pending());
    }

    /// Finished and cancelled sequences leave; the cache keeps only the rows that stay.
    fn leave(&mut self) {
        let (gone, plan) = self.state.leave(|s| !s.done && !s.cancelled());
        for sequence in &gone {
            let elapsed = sequence.request.arrived.elapsed();
            if sequence.done {
                let queue = sequence.joined - sequence.request.arrived;
                self.stats.record_success(1, elapsed, Timing::queued(queue));
            } else {
                self.stats.record_failure(elapsed, FailureReason::Canceled);
            }
        }
        if let Some(plan) = plan {
            let old = self.cache.take();
            self.cache = self.rebuild(&plan, old.as_ref(), None);
        }
        self.metrics.active(self.state.rows().len());
    }

    /// Runs the prompts of the joining sequences as one batch, takes each one's first token, and
    /// merges the ones that go on into the batch.
    fn prefill(&mut self, joining: Vec<Active>) {
        let started = Instant::now();
        let prompts: Vec<&[u32]> = joining
            .iter()
            .map(|s| s.request.prompt.as_slice())
            .collect();
        let inputs = prefill_inputs(&prompts);
        let tokens: usize = prompts.iter().map(|p| p.len()).sum();
        self.metrics.prompt(tokens);
        let result = self
            .session
            .empty_cache(joining.len())
            .and_then(|empty| self.forward(&inputs, empty, started));
        let step = match result {
            Ok(step) => step,
            Err(error) => {
                for sequence in &joining {
                    sequence.fail(&error.to_string());
                    self.stats
                        .record_failure(sequence.request.arrived.elapsed(), FailureReason::Backend);
                }
                return;
            }
        };
        let vocab = self.session.vocab();
        let mut staying = Vec::new();
        let mut rows = Vec::new();
        for (row, mut sequence) in joining.into_iter().enumerate() {
            sequence.joined = started;
            let logits = &step.logits[row * vocab..(row + 1) * vocab];
            sequence.sample(logits, &self.codec, &self.metrics);
            let elapsed = sequence.request.arrived.elapsed();
            if sequence.done {
                let queue = started - sequence.request.arrived;
                self.stats.record_success(1, elapsed, Timing::queued(queue));
            } else if sequence.cancelled() {
                self.stats.record_failure(elapsed, FailureReason::Canceled);
            } else {
                let len = sequence.request.prompt.len();
                staying.push((sequence, len));
                rows.push(row);
            }
        }
        if staying.is_empty() {
            return;
        }
        let plan: Vec<Gather> = self
            .state
            .join(staying)
            .into_iter()
            .map(|g| match g.origin {
                Origin::Prefill(k) => Gather {
                    origin: Origin::Prefill(rows[k]),
                    len: g.len,
                },
                Origin::Batch(_) => g,
            })
            .collect();
        let old = self.cache.take();
        self.cache = self.rebuild(&plan, old.as_ref(), Some(&step.cache));
        self.metrics.active(self.state.rows().len());
    }

    /// One token for every sequence in the batch.
    fn decode(&mut self) {
        let started = Instant::now();
        let Some(cache) = self.cache.take() else {
            self.fail_all("the batch lost its cache");
            return;
        };
        let inputs = self.state.decode_inputs(|s| s.last_token);
        match self.forward(&inputs, cache, started) {
            Ok(step) => {
                self.state.advance();
                let vocab = self.session.vocab();
                for (row, active) in self.state.rows_mut().iter_mut().enumerate() {
                    let logits = &step.logits[row * vocab..(row + 1) * vocab];
                    active.seq.sample(logits, &self.codec, &self.metrics);
                }
                self.cache = Some(step.cache);
                self.leave();
            }
            Err(error) => self.fail_all(&error.to_string()),
        }
    }

    /// Runs the model and records the execution (the batch's rows, its compute time).
    fn forward(
        &mut self,
        inputs: &Inputs,
        cache: KvCache,
        started: Instant,
    ) -> Result<Step, BackendError> {
        let rows = cache.rows();
        let ran = Instant::now();
        let step = self.session.forward(
            Forward {
                input_ids: &inputs.input_ids,
                attention_mask: &inputs.attention_mask,
                position_ids: &inputs.position_ids,
                seq: inputs.seq,
            },
            cache,
        )?;
        self.stats.record_execution(
            rows,
            ComputeTimes {
                input: ran - started,
                infer: ran.elapsed(),
                output: Duration::ZERO,
            },
            None,
        );
        Ok(step)
    }

    /// A cache made of rows of the batch's cache and of a prefill's, as `plan` says; `None` for
    /// an empty plan. On failure every sequence in the batch fails.
    fn rebuild(
        &mut self,
        plan: &[Gather],
        batch: Option<&KvCache>,
        prefill: Option<&KvCache>,
    ) -> Option<KvCache> {
        if plan.is_empty() {
            return None;
        }
        let sources: Option<Vec<RowSource<'_>>> = plan
            .iter()
            .map(|g| {
                let (source, row) = match g.origin {
                    Origin::Batch(row) => (batch?, row),
                    Origin::Prefill(row) => (prefill?, row),
                };
                Some(RowSource {
                    source,
                    row,
                    len: g.len,
                })
            })
            .collect();
        let rebuilt = match sources {
            Some(sources) => self.session.gather(&sources),
            None => Err(BackendError::Run(
                "a cache to rebuild from is missing".into(),
            )),
        };
        match rebuilt {
            Ok(cache) => Some(cache),
            Err(error) => {
                self.fail_all(&error.to_string());
                None
            }
        }
    }

    /// Every sequence in the batch fails (the cache is gone or the model failed).
    fn fail_all(&mut self, message: &str) {
        let (gone, _) = self.state.leave(|_| false);
        for sequence in gone {
            sequence.fail(message);
            self.stats
                .record_failure(sequence.request.arrived.elapsed(), FailureReason::Backend);
        }
        self.cache = None;
        self.metrics.active(0);
    }
}

#[cfg(test)]
mod tests {
    //! The loop driven one step at a time from the test (no thread): what each step does is
    //! seen in the batch's state, whatever the machine's timing.
    use super::*;
    use crate::backend::{Device, OnnxRuntime, SessionOptions};
    use crate::generate::{Event, GenerateParams, Inbox, Ticket};
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Condvar, Mutex};
    use tokio::sync::mpsc;

    fn model_dir() -> std::path::PathBuf {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("model_repository/tiny_decoder")
    }

    fn codec() -> Arc<TextCodec> {
        Arc::new(TextCodec::load(&model_dir().join("tokenizer.json"), None).unwrap())
    }

    fn runner(max_active: usize, stats: &Arc<ModelStats>) -> Runner {
        let runtime = OnnxRuntime::get().expect("ONNX Runtime (.ci/setup.sh runtime)");
        let options = SessionOptions {
            intra_op_threads: Some(1),
            device: Device::Cpu,
            tuning: Default::default(),
            pool_name: None,
        };
        let session =
            DecoderSession::load(&runtime, &model_dir().join("1/model.onnx"), &options).unwrap();
        let metrics = GenerationMetrics::new("runner_test", 1, &[]);
        Runner::new(
            session,
            codec(),
            max_active,
            512,
            Arc::clone(stats),
            metrics,
        )
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            in_flight: AtomicUsize::new(0),
        })
    }

    /// Queues a greedy request that runs its `max_tokens` to the end, as `Generator::submit` does.
    fn submit(
        shared: &Arc<Shared>,
        prompt: &str,
        max_tokens: usize,
    ) -> mpsc::UnboundedReceiver<Event> {
        let (events, receiver) = mpsc::unbounded_channel();
        shared
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        shared.lock().arrivals.push(Sequence {
            prompt: codec().encode(prompt).unwrap(),
            params: GenerateParams {
                max_tokens,
                sampling: Default::default(),
                stop: Vec::new(),
                ignore_eos: true,
                details: false,
            },
            events,
            arrived: Instant::now(),
            _ticket: Ticket(Arc::clone(shared)),
        });
        receiver
    }

    /// What a receiver got so far: (text, tokens, finished).
    fn received(receiver: &mut mpsc::UnboundedReceiver<Event>, got: &mut (String, usize, bool)) {
        while let Ok(event) = receiver.try_recv() {
            match event {
                Event::Token { text, finish, .. } => {
                    got.0.push_str(&text);
                    got.1 += 1;
                    got.2 |= finish.is_some();
                }
                Event::Failed(message) => panic!("generation failed: {message}"),
            }
        }
    }

    const PROMPTS: [(&str, usize); 5] = [
        ("The potter", 3),
        ("Wood kilns", 6),
        ("Glaze", 2),
        ("A kiln fires clay", 5),
        ("Ash", 4),
    ];

    /// Steps until every request finished; returns each one's text and, per step, the rows
    /// running after it and the requests still waiting.
    fn drive(max_active: usize, stats: &Arc<ModelStats>) -> (Vec<String>, Vec<(usize, usize)>) {
        let mut runner = runner(max_active, stats);
        let shared = shared();
        let mut receivers: Vec<_> = PROMPTS
            .iter()
            .map(|(p, n)| submit(&shared, p, *n))
            .collect();
        let mut got = vec![(String::new(), 0, false); PROMPTS.len()];
        let mut steps = Vec::new();
        while !got.iter().all(|g| g.2) {
            assert!(
                steps.len() < 100,
                "the loop stopped making progress: {steps:?}"
            );
            runner.step(&shared);
            steps.push((runner.state.rows().len(), runner.state.pending()));
            for (receiver, got) in receivers.iter_mut().zip(&mut got) {
                received(receiver, got);
            }
        }
        for (got, (_, max_tokens)) in got.iter().zip(PROMPTS) {
            assert_eq!(got.1, max_tokens, "one event per generated token");
        }
        (got.into_iter().map(|g| g.0).collect(), steps)
    }

    fn batch_sizes(stats: &ModelStats) -> Vec<u64> {
        let snapshot = stats.snapshot();
        snapshot.batch_stats.iter().map(|b| b.batch_size).collect()
    }

    #[test]
    fn max_active_caps_the_batch_and_waiting_requests_join_as_rows_free() {
        // One at a time: the reference texts, and batches of one only.
        let alone = Arc::new(ModelStats::new("alone", 1));
        let (texts, steps) = drive(1, &alone);
        assert!(steps.iter().all(|(rows, _)| *rows <= 1), "{steps:?}");
        assert_eq!(batch_sizes(&alone), [1]);

        let capped = Arc::new(ModelStats::new("capped", 1));
        let (batched, steps) = drive(2, &capped);
        // Batched greedy decoding gives each request the text it gets alone.
        assert_eq!(batched, texts);
        // All five were waiting at the first step: two joined, three wait.
        assert_eq!(steps[0], (2, 3), "{steps:?}");
        assert!(steps.iter().all(|(rows, _)| *rows <= 2), "{steps:?}");
        // Rows free after a step (its finished sequences left at its end) are taken by waiting
        // requests at the next one, up to the cap: the batch that decodes is full while
        // requests wait.
        for pair in steps.windows(2) {
            let ((rows, waiting), (_, still_waiting)) = (pair[0], pair[1]);
            if waiting > 0 {
                let joined = waiting - still_waiting;
                assert_eq!(rows + joined, 2, "a row stayed free: {steps:?}");
            }
        }
        assert_eq!(batch_sizes(&capped), [1, 2]);
        // Five requests of 20 tokens in all: fewer steps together than alone.
        assert!(steps.len() < 20, "{steps:?}");
    }

    #[test]
    fn a_cancelled_request_leaves_its_row_to_a_waiting_one() {
        let stats = Arc::new(ModelStats::new("cancel", 1));
        let mut runner = runner(1, &stats);
        let shared = shared();
        let first = submit(&shared, "The potter", 50);
        let mut second = submit(&shared, "Wood kilns", 2);
        runner.step(&shared);
        assert_eq!((runner.state.rows().len(), runner.state.pending()), (1, 1));
        drop(first); // the client goes away
        let mut got = (String::new(), 0, false);
        for _ in 0..4 {
            runner.step(&shared);
            received(&mut second, &mut got);
        }
        assert_eq!(
            (got.1, got.2),
            (2, true),
            "the waiting request ran once the row freed"
        );
        assert!(runner.state.is_idle());
        let inference = stats.snapshot().inference_stats.unwrap();
        assert_eq!(
            inference.fail.map(|f| f.count),
            Some(1),
            "the cancelled one failed"
        );
        assert_eq!(inference.success.map(|s| s.count), Some(1));
        assert_eq!(
            shared.in_flight.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }
}
