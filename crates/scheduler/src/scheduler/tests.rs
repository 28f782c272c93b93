//! Scheduler tests with fake backends: batching under concurrency, queue limits, deadlines,
//! cancellation, panics, inline runs, halts, rescheduling.
//!
//! None sleeps or reads the wall clock to decide an order: each scheduler runs on a
//! [`ManualClock`] that moves only when a test moves it, a [`Gate`] holds an instance's run until
//! the test lets it go, and a request is queued by the time the first poll of its `submit`
//! returns ([`queued`]). The only real time is [`within`]'s bound, which turns a hang into a
//! failure.

mod support;

use super::clock::ManualClock;
use super::*;
use futures_util::future::{join, join_all};
use futures_util::FutureExt;
use std::future::Future;
use std::sync::Mutex;
use support::{within, AddOne, Gate, Panicker, WhereRun};

fn request(value: u8, rows: usize) -> Request {
    let input = Tensor::new(
        "in",
        crate::core::DataType::Uint8,
        vec![rows as i64, 1],
        bytes::Bytes::from(vec![value; rows]),
    );
    Request {
        inputs: vec![input],
        rows,
        priority: None,
        timeout: None,
        deadline: None,
    }
}

/// A scheduler of `instances` [`AddOne`] sessions, on a manual clock, their runs held by `gate`
/// if given; with the batch sizes they ran and the version's statistics.
struct Fixture {
    scheduler: Arc<Scheduler>,
    batches: Arc<Mutex<Vec<i64>>>,
    stats: Arc<ModelStats>,
    clock: Arc<ManualClock>,
}

fn scheduler(config: BatchingConfig, instances: usize, gate: Option<&Gate>) -> Fixture {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let backends: Vec<Box<dyn Backend>> = (0..instances)
        .map(|_| {
            Box::new(AddOne {
                batches: Arc::clone(&batches),
                gate: gate.map(Gate::held),
            }) as Box<dyn Backend>
        })
        .collect();
    let stats = Arc::new(ModelStats::new("m", 1));
    let clock = ManualClock::new();
    let scheduler = Scheduler::start_clocked(
        "t",
        config,
        backends,
        Arc::clone(&stats),
        Clock::Manual {
            clock: Arc::clone(&clock),
        },
    );
    Fixture {
        scheduler: Arc::new(scheduler),
        batches,
        stats,
        clock,
    }
}

/// `submit`, polled once: by then the request is queued (or refused, or run inline, or, if
/// it completed a batch, perhaps answered already), so the order in which a test calls it is
/// the order requests arrive in. The answer comes when the returned future is awaited.
fn queued<'a>(scheduler: &'a Scheduler, request: Request) -> Submitted<'a> {
    let mut submit = Box::pin(scheduler.submit(request));
    match submit.as_mut().now_or_never() {
        Some(answer) => Box::pin(std::future::ready(answer)),
        None => submit,
    }
}

type Submitted<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Outcome, ScheduleError>> + Send + 'a>>;

/// Requests waiting in the queue.
fn pending(scheduler: &Scheduler) -> usize {
    scheduler.shared.lock().state.len()
}

fn dynamic(max: usize, delay: Duration) -> BatchingConfig {
    BatchingConfig {
        dynamic: true,
        max_batch_size: max,
        max_queue_delay: delay,
        ..Default::default()
    }
}

/// The same with kiln's opt-in shortcuts (`adaptive_batching_delay`).
fn adaptive(max: usize, delay: Duration) -> BatchingConfig {
    BatchingConfig {
        adaptive_delay: true,
        ..dynamic(max, delay)
    }
}

#[tokio::test]
async fn concurrent_requests_wait_out_the_delay_then_are_batched_and_split_correctly() {
    let delay = Duration::from_millis(20);
    let fixture = scheduler(dynamic(16, delay), 1, None);
    let start = fixture.clock.now();
    let submits: Vec<_> = (0..6u8)
        .map(|i| queued(&fixture.scheduler, request(i * 10, 1 + usize::from(i % 2))))
        .collect();
    let due = within("the instance waits", fixture.clock.next_timer()).await;
    assert_eq!(
        due,
        start + delay,
        "it waits for the oldest request's delay"
    );
    fixture.clock.advance(delay);
    let outcomes = within("the batch went once its delay passed", join_all(submits)).await;
    for (i, outcome) in (0..6u8).zip(outcomes) {
        let outcome = outcome.unwrap();
        let rows = 1 + usize::from(i % 2);
        assert_eq!(outcome.outputs[0].shape, vec![rows as i64, 1]);
        assert_eq!(&outcome.outputs[0].data[..], &vec![i * 10 + 1; rows][..]);
        // Nothing went before the clock moved by the delay.
        assert_eq!(outcome.queue, delay, "request {i}");
    }
    assert_eq!(*fixture.batches.lock().unwrap(), [9], "one merged batch");
    assert_eq!(fixture.stats.snapshot().execution_count, 1);
}

#[tokio::test]
async fn closed_loop_clients_stop_waiting_for_company_once_their_number_is_known() {
    // Settling (a tenth of the delay) is the only way the first round's batch can go.
    let delay = Duration::from_secs(4);
    let settle = delay / state::SETTLE_FRACTION;
    let fixture = scheduler(adaptive(8, delay), 1, None);
    let start = fixture.clock.now();
    // Two closed-loop clients: each sends its next request once answered, both at one rhythm.
    for round in 0..4u8 {
        let first = queued(&fixture.scheduler, request(round, 1));
        let second = queued(&fixture.scheduler, request(10 + round, 1));
        if round == 0 {
            // The first round cannot know how many clients there are: it waits to settle.
            let due = within("the instance waits", fixture.clock.next_timer()).await;
            assert_eq!(due, start + settle);
            fixture.clock.advance(settle);
        }
        // Later rounds must go with the clock standing still: both requests are in.
        let (first, second) = within(
            "the batch went once both clients' requests were in",
            join(first, second),
        )
        .await;
        for (value, outcome) in [(round, first), (10 + round, second)] {
            let outcome = outcome.unwrap();
            assert_eq!(&outcome.outputs[0].data[..], &[value + 1]);
            let waited = if round == 0 { settle } else { Duration::ZERO };
            assert_eq!(outcome.queue, waited, "round {round}");
        }
    }
    assert_eq!(*fixture.batches.lock().unwrap(), [2; 4]);
}

#[tokio::test]
async fn without_dynamic_batching_each_request_runs_alone() {
    let config = BatchingConfig {
        max_batch_size: 8,
        ..Default::default()
    };
    let gate = Gate::new();
    let fixture = scheduler(config, 2, Some(&gate));
    let submits: Vec<_> = (0..8u8)
        .map(|i| queued(&fixture.scheduler, request(i, 1)))
        .collect();
    // Both instances hold a request; six wait together, and still run one by one.
    within("both instances run", gate.entered(2)).await;
    assert_eq!(pending(&fixture.scheduler), 6);
    gate.open();
    for outcome in within("all answered", join_all(submits)).await {
        outcome.unwrap();
    }
    assert_eq!(*fixture.batches.lock().unwrap(), [1; 8]);
}

/// The instance threads of `fixture`'s scheduler running now.
fn threads(fixture: &Fixture) -> usize {
    fixture.scheduler.shared.lock().threads
}

#[tokio::test]
async fn instance_threads_start_with_work_and_end_without_it() {
    let config = BatchingConfig {
        max_batch_size: 8,
        ..Default::default()
    };
    let gate = Gate::new();
    let fixture = scheduler(config, 2, Some(&gate));
    // An idle version costs no thread.
    assert_eq!(threads(&fixture), 0);
    let submits: Vec<_> = (0..4u8)
        .map(|i| queued(&fixture.scheduler, request(i, 1)))
        .collect();
    // One thread per instance, however many requests wait.
    within("both instances run", gate.entered(2)).await;
    assert_eq!(threads(&fixture), 2);
    gate.open();
    for outcome in within("all answered", join_all(submits)).await {
        outcome.unwrap();
    }
    // Without work the threads end (after LINGER, real time: the bound turns a hang into a
    // failure), and the next request starts one again.
    within("the threads end", async {
        while threads(&fixture) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let again = queued(&fixture.scheduler, request(9, 1));
    assert_eq!(
        within("answered again", again).await.unwrap().outputs[0].data[0],
        10
    );
    assert_eq!(*fixture.batches.lock().unwrap(), [1; 5]);
}

#[tokio::test]
async fn full_queue_rejects_and_deadlines_expire_without_running() {
    let config = BatchingConfig {
        policies: vec![QueuePolicy {
            max_queue_size: 1,
            ..Default::default()
        }],
        ..dynamic(1, Duration::ZERO)
    };
    let gate = Gate::new();
    let fixture = scheduler(config, 1, Some(&gate));
    let scheduler = &fixture.scheduler;
    let busy = queued(scheduler, request(1, 1));
    within("the only instance runs", gate.entered(1)).await;
    let mut expiring = request(2, 1);
    let deadline = Duration::from_millis(150);
    expiring.deadline = Some(fixture.clock.now() + deadline);
    let waiting = queued(scheduler, expiring);
    let refused = scheduler.submit(request(3, 1)).now_or_never();
    assert!(
        matches!(refused, Some(Err(ScheduleError::QueueFull))),
        "{refused:?}"
    );
    fixture.clock.advance(deadline);
    // Its caller times the deadline: it is answered while the instance is still busy.
    let expired = within("the deadline was answered", waiting).await;
    assert!(
        matches!(expired, Err(ScheduleError::Deadline)),
        "{expired:?}"
    );
    gate.open();
    assert!(within("the busy request ran", busy).await.is_ok());
    assert_eq!(
        fixture.batches.lock().unwrap().len(),
        1,
        "the expired request never ran"
    );
}

#[tokio::test]
async fn the_in_flight_bound_refuses_at_once_and_recovers() {
    let config = BatchingConfig {
        max_in_flight: 2,
        ..dynamic(8, Duration::ZERO)
    };
    let gate = Gate::new();
    let fixture = scheduler(config, 1, Some(&gate));
    let scheduler = &fixture.scheduler;
    // One runs (held), one waits behind it: two in flight.
    let held = [
        queued(scheduler, request(0, 1)),
        queued(scheduler, request(1, 1)),
    ];
    within("the first runs", gate.entered(1)).await;
    // Answered on its first poll: the refusal never waits.
    let refused = scheduler.submit(request(9, 1)).now_or_never();
    assert!(
        matches!(refused, Some(Err(ScheduleError::Overloaded(2)))),
        "{refused:?}"
    );
    gate.open();
    for outcome in within("admitted requests still run", join_all(held)).await {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    let recovered = within("answered", scheduler.submit(request(3, 1))).await;
    assert!(recovered.is_ok(), "{recovered:?}");
}

#[tokio::test]
async fn dropped_callers_leave_the_queue() {
    let gate = Gate::new();
    let fixture = scheduler(dynamic(1, Duration::ZERO), 1, Some(&gate));
    let scheduler = &fixture.scheduler;
    let busy = queued(scheduler, request(1, 1));
    within("the only instance runs", gate.entered(1)).await;
    let gave_up = queued(scheduler, request(2, 1));
    assert_eq!(pending(scheduler), 1);
    // Its client went away while it was queued: its future is dropped.
    drop(gave_up);
    assert_eq!(
        pending(scheduler),
        0,
        "the abandoned request left the queue"
    );
    gate.open();
    assert!(within("busy answered", busy).await.is_ok());
    assert!(within("answered", scheduler.submit(request(3, 1)))
        .await
        .is_ok());
    assert_eq!(
        fixture.batches.lock().unwrap().len(),
        2,
        "the abandoned request never ran"
    );
}

#[tokio::test]
async fn a_panicking_backend_reports_an_error_and_keeps_serving() {
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler = Scheduler::start(
        "p",
        BatchingConfig::default(),
        vec![Box::new(Panicker)],
        stats,
    );
    for _ in 0..2 {
        let error = scheduler.submit(request(0, 1)).await.unwrap_err();
        assert!(error.to_string().contains("panicked"));
    }
}

/// Records when it is dropped, i.e. when its instance thread has released the session.
struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

impl Backend for DropFlag {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        Ok(inputs.to_vec())
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn stop_returns_after_the_instances_have_released_their_backends() {
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scheduler = Scheduler::start(
        "s",
        BatchingConfig::default(),
        vec![Box::new(DropFlag(Arc::clone(&dropped)))],
        Arc::new(ModelStats::new("m", 1)),
    );
    scheduler.stop();
    assert!(dropped.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_bounded_halt_answers_the_queue_and_does_not_wait_for_a_long_batch() {
    let gate = Gate::new();
    let fixture = scheduler(BatchingConfig::default(), 1, Some(&gate));
    let scheduler = &fixture.scheduler;
    let running = queued(scheduler, request(1, 1));
    within("the only instance runs", gate.entered(1)).await;
    let waiting = queued(scheduler, request(2, 1));
    let grace = Duration::from_millis(50);
    let halted = tokio::task::spawn_blocking({
        let scheduler = Arc::clone(scheduler);
        move || scheduler.halt_within(Some(grace))
    });
    // Answered by the halt, after it took the time its grace runs from.
    let stopped = within("the queue was answered", waiting).await;
    assert!(
        matches!(stopped, Err(ScheduleError::Stopped)),
        "{stopped:?}"
    );
    fixture.clock.advance(grace);
    within("halt waited for the batch", halted).await.unwrap();
    assert!(fixture.batches.lock().unwrap().is_empty());
    // The running batch still ends and answers its request.
    gate.open();
    assert!(within("the batch ended", running).await.is_ok());
    assert!(matches!(
        scheduler.submit(request(3, 1)).await,
        Err(ScheduleError::Stopped)
    ));
}

/// Runs `count` requests one after another on two [`WhereRun`] sessions that each take `takes`
/// of the manual clock, with another request counted in flight all along when
/// `beside_another`, and returns the threads they ran on. The clock moves on to any moment an
/// instance waits for (a batching delay) as soon as it waits: nobody else could act meanwhile.
async fn run_requests(
    config: BatchingConfig,
    takes: Duration,
    count: usize,
    beside_another: bool,
) -> Vec<String> {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let clock = ManualClock::new();
    let backends: Vec<Box<dyn Backend>> = (0..2)
        .map(|_| {
            Box::new(WhereRun {
                threads: Arc::clone(&threads),
                clock: Arc::clone(&clock),
                takes,
            }) as Box<dyn Backend>
        })
        .collect();
    let stats = Arc::new(ModelStats::new("m", 1));
    let manual = Clock::Manual {
        clock: Arc::clone(&clock),
    };
    let scheduler = Scheduler::start_clocked("instance", config, backends, stats, manual);
    let other = beside_another.then(|| scheduler.admit().unwrap());
    for i in 0..count {
        let mut submit = std::pin::pin!(scheduler.submit(request(i as u8, 1)));
        let outcome = within("answered", async {
            loop {
                tokio::select! {
                    outcome = &mut submit => break outcome,
                    due = clock.next_timer() => clock.advance_to(due),
                }
            }
        })
        .await;
        assert_eq!(&outcome.unwrap().outputs[0].data[..], &[i as u8]);
    }
    drop(other);
    scheduler.stop();
    let seen = threads.lock().unwrap().clone();
    seen
}

/// Runs `count` lone requests one after another and returns the threads they ran on.
async fn run_lone_requests(config: BatchingConfig, takes: Duration, count: usize) -> Vec<String> {
    run_requests(config, takes, count, false).await
}

fn on_instances(threads: &[String]) -> bool {
    threads.iter().all(|t| t.starts_with("instance-"))
}

fn inline(threads: &[String]) -> bool {
    threads.iter().all(|t| !t.starts_with("instance-"))
}

#[tokio::test]
async fn a_quick_model_runs_lone_requests_on_the_callers_thread() {
    let quick = Duration::from_micros(200);
    let seen = run_lone_requests(BatchingConfig::default(), quick, 4).await;
    // The first run measures the model on an instance thread; the rest need no hand-off.
    assert!(on_instances(&seen[..1]) && inline(&seen[1..]), "{seen:?}");
    // Dynamic batching without a delay would not have waited either.
    let seen = run_lone_requests(dynamic(8, Duration::ZERO), quick, 3).await;
    assert!(on_instances(&seen[..1]) && inline(&seen[1..]), "{seen:?}");
    // With a delay, every request waits for company on an instance, as in Triton.
    let delay = Duration::from_micros(200);
    let seen = run_lone_requests(dynamic(8, delay), quick, 3).await;
    assert!(on_instances(&seen), "{seen:?}");
    // With kiln's shortcuts, the first request goes to an instance (with another free, it need
    // not wait) and gets no company: from then on a lone request would not wait, so it runs
    // inline.
    let seen = run_lone_requests(adaptive(8, delay), quick, 3).await;
    assert!(on_instances(&seen[..1]) && inline(&seen[1..]), "{seen:?}");
}

#[tokio::test]
async fn a_tiny_model_runs_inline_beside_other_requests() {
    // Runs under 25 µs: every request after the first (which measures the model) runs on the
    // caller's thread, though another request is in flight.
    let seen = run_requests(
        BatchingConfig::default(),
        Duration::from_micros(20),
        4,
        true,
    )
    .await;
    assert!(on_instances(&seen[..1]) && inline(&seen[1..]), "{seen:?}");
    // Quick enough to run a lone request inline, but not every request.
    let seen = run_requests(
        BatchingConfig::default(),
        Duration::from_micros(60),
        3,
        true,
    )
    .await;
    assert!(on_instances(&seen), "{seen:?}");
}

#[tokio::test]
async fn slow_models_keep_requests_on_the_instances() {
    // Over 250 µs a run: even a lone request is handed to an instance.
    let slow = Duration::from_micros(300);
    let seen = run_lone_requests(BatchingConfig::default(), slow, 3).await;
    assert!(on_instances(&seen), "{seen:?}");
    let seen = run_lone_requests(dynamic(8, Duration::from_micros(200)), slow, 3).await;
    assert!(on_instances(&seen), "{seen:?}");
}

/// A [`WhereRun`] that must not run on the caller's thread (as a text model, which tokenizes).
struct StaysOnInstances(WhereRun);

impl Backend for StaysOnInstances {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.0.run(inputs)
    }

    fn may_run_inline(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn backends_that_ask_to_stay_on_the_instances_never_run_inline() {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let clock = ManualClock::new();
    // Runs that take no time at all: anything that may run inline would.
    let backend = StaysOnInstances(WhereRun {
        threads: Arc::clone(&threads),
        clock: Arc::clone(&clock),
        takes: Duration::ZERO,
    });
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler = Scheduler::start_clocked(
        "instance",
        BatchingConfig::default(),
        vec![Box::new(backend)],
        stats,
        Clock::Manual { clock },
    );
    for i in 0..4 {
        within("answered", scheduler.submit(request(i, 1)))
            .await
            .unwrap();
    }
    scheduler.stop();
    let seen = threads.lock().unwrap().clone();
    assert!(on_instances(&seen), "{seen:?}");
}

#[tokio::test]
async fn stopping_waits_for_a_session_running_inline() {
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clock = ManualClock::new();
    let scheduler = Scheduler::start_clocked(
        "instance",
        BatchingConfig::default(),
        vec![Box::new(DropFlag(Arc::clone(&dropped)))],
        Arc::new(ModelStats::new("m", 1)),
        Clock::Manual {
            clock: Arc::clone(&clock),
        },
    );
    // Take the only session as an inline caller would, and give it back once stop waits.
    let session = scheduler.shared.take_idle_session().unwrap();
    let shared = Arc::clone(&scheduler.shared);
    let stopping = tokio::task::spawn_blocking(move || scheduler.stop());
    // The only timed wait: stop's, for the session (the instance thread, with no session to
    // take, waits for one untimed).
    within("stop waits for the session", clock.next_timer()).await;
    assert!(!stopping.is_finished(), "stop returned without the session");
    shared.give_back(session);
    within("stop returned", stopping).await.unwrap();
    assert!(dropped.load(Ordering::SeqCst), "the session was retired");
}

/// Fails a batch with an input error when any request in it sent the byte 0xff (recording the
/// failed batch's size); echoes otherwise.
struct RejectsFf(Arc<Mutex<Vec<i64>>>);

impl Backend for RejectsFf {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        if inputs[0].data.contains(&0xff) {
            self.0.lock().unwrap().push(inputs[0].shape[0]);
            return Err(BackendError::Input("bad byte".into()));
        }
        Ok(inputs.to_vec())
    }
}

#[tokio::test]
async fn a_bad_input_fails_its_own_request_not_its_batch() {
    let failed = Arc::new(Mutex::new(Vec::new()));
    // The clock stands still: the batch goes when full, with all three.
    let scheduler = Scheduler::start_clocked(
        "r",
        dynamic(3, Duration::from_secs(1)),
        vec![Box::new(RejectsFf(Arc::clone(&failed)))],
        Arc::new(ModelStats::new("m", 1)),
        Clock::Manual {
            clock: ManualClock::new(),
        },
    );
    let values = [1u8, 0xff, 3];
    let submits: Vec<_> = values
        .iter()
        .map(|&value| queued(&scheduler, request(value, 1)))
        .collect();
    for (value, outcome) in values
        .into_iter()
        .zip(within("answered", join_all(submits)).await)
    {
        match value {
            0xff => assert!(matches!(
                outcome,
                Err(ScheduleError::Backend(BackendError::Input(_)))
            )),
            _ => assert_eq!(&outcome.unwrap().outputs[0].data[..], &[value]),
        }
    }
    assert_eq!(
        *failed.lock().unwrap(),
        [3, 1],
        "the merged batch failed, then the bad request alone"
    );
}

/// Counts each request's runs, rescheduling it until it has run as many times as its input's
/// one byte says; records the batch sizes it saw. Its runs wait for `gate`.
struct CountsDown {
    batches: Arc<Mutex<Vec<usize>>>,
    gate: Arc<support::Held>,
}

/// A request to [`CountsDown`]: how many runs it wants, and how many it had.
struct Countdown {
    tensors: Vec<Tensor>,
    runs: u8,
}

impl Instance for CountsDown {
    type Input = Countdown;
    /// Its runs so far, and whether it runs again.
    type Output = (u8, bool);

    fn tensors(input: &Countdown) -> &[Tensor] {
        &input.tensors
    }

    fn run(
        &mut self,
        batch: &mut [&mut Countdown],
        _rows: &[usize],
    ) -> (Result<Vec<(u8, bool)>, BackendError>, ComputeTimes) {
        self.gate.pass();
        self.batches.lock().unwrap().push(batch.len());
        let outputs = batch
            .iter_mut()
            .map(|countdown| {
                countdown.runs += 1;
                (
                    countdown.runs,
                    countdown.runs < countdown.tensors[0].data[0],
                )
            })
            .collect();
        (Ok(outputs), ComputeTimes::default())
    }

    fn rescheduled(output: &(u8, bool)) -> bool {
        output.1
    }
}

#[tokio::test]
async fn rescheduled_requests_run_again_batched_with_the_others_then_are_answered() {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate::new();
    let instance = CountsDown {
        batches: Arc::clone(&batches),
        gate: gate.held(),
    };
    let stats = Arc::new(ModelStats::new("m", 1));
    let manual = Clock::Manual {
        clock: ManualClock::new(),
    };
    let config = dynamic(4, Duration::ZERO);
    let scheduler = Scheduler::launch_clocked("t", config, vec![instance], stats, manual);
    let countdown = |wanted: u8| Request {
        inputs: Countdown {
            tensors: request(wanted, 1).inputs,
            runs: 0,
        },
        rows: 1,
        priority: None,
        timeout: None,
        deadline: None,
    };
    let mut three = Box::pin(scheduler.submit(countdown(3)));
    assert!(three.as_mut().now_or_never().is_none());
    // The first run of the one that wants three holds the instance while the other queues.
    within("the first runs", gate.entered(1)).await;
    let mut two = Box::pin(scheduler.submit(countdown(2)));
    assert!(two.as_mut().now_or_never().is_none());
    gate.open();
    let (three, two) = within("both answered", join(three, two)).await;
    // Each is answered once, after its last run.
    assert_eq!(three.unwrap().outputs, (3, false));
    assert_eq!(two.unwrap().outputs, (2, false));
    // The rescheduled request went back in the queue behind the other, and joined its batches.
    assert_eq!(*batches.lock().unwrap(), [1, 2, 2]);
    scheduler.halt();
}
