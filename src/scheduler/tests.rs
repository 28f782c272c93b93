//! Scheduler tests with fake backends: batching under concurrency, queue limits, deadlines,
//! cancellation, panics.
use super::*;
use crate::core::DataType;
use bytes::Bytes;
use std::sync::Mutex;

/// Adds one to every byte of its single input and records the batch sizes it saw.
struct AddOne {
    batches: Arc<Mutex<Vec<i64>>>,
    delay: Duration,
}

impl Backend for AddOne {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        std::thread::sleep(self.delay);
        let input = inputs
            .first()
            .ok_or_else(|| BackendError::Run("no input".into()))?;
        self.batches.lock().unwrap().push(input.shape[0]);
        let data: Vec<u8> = input.data.iter().map(|b| b.wrapping_add(1)).collect();
        Ok(vec![Tensor::new(
            "out",
            DataType::Uint8,
            input.shape.clone(),
            Bytes::from(data),
        )])
    }
}

struct Panicker;

impl Backend for Panicker {
    fn run(&mut self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        panic!("boom")
    }
}

fn request(value: u8, rows: usize) -> Request {
    let input = Tensor::new(
        "in",
        DataType::Uint8,
        vec![rows as i64, 1],
        Bytes::from(vec![value; rows]),
    );
    Request {
        inputs: vec![input],
        rows,
        priority: None,
        timeout: None,
        deadline: None,
    }
}

fn scheduler(
    config: BatchingConfig,
    instances: usize,
    delay: Duration,
) -> (Arc<Scheduler>, Arc<Mutex<Vec<i64>>>, Arc<ModelStats>) {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let backends: Vec<Box<dyn Backend>> = (0..instances)
        .map(|_| {
            Box::new(AddOne {
                batches: Arc::clone(&batches),
                delay,
            }) as Box<dyn Backend>
        })
        .collect();
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler = Scheduler::start("t", config, backends, Arc::clone(&stats)).unwrap();
    (Arc::new(scheduler), batches, stats)
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
async fn concurrent_requests_are_batched_and_split_correctly() {
    let (scheduler, batches, stats) =
        scheduler(dynamic(8, Duration::from_millis(20)), 1, Duration::ZERO);
    let tasks: Vec<_> = (0..6u8)
        .map(|i| {
            let scheduler = Arc::clone(&scheduler);
            tokio::spawn(async move {
                (
                    i,
                    scheduler
                        .submit(request(i * 10, 1 + usize::from(i % 2)))
                        .await,
                )
            })
        })
        .collect();
    for task in tasks {
        let (i, outcome) = task.await.unwrap();
        let outcome = outcome.unwrap();
        let rows = 1 + usize::from(i % 2);
        assert_eq!(outcome.outputs[0].shape, vec![rows as i64, 1]);
        assert_eq!(&outcome.outputs[0].data[..], &vec![i * 10 + 1; rows][..]);
    }
    let seen = batches.lock().unwrap().clone();
    assert_eq!(seen.iter().sum::<i64>(), 9);
    assert!(
        seen.iter().any(|&b| b > 2),
        "requests were merged: {seen:?}"
    );
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.execution_count as usize, seen.len());
}

#[tokio::test]
async fn closed_loop_clients_stop_waiting_for_company_once_their_number_is_known() {
    // A delay whose settling time (a tenth) no batch of this test should sit out once the
    // scheduler has seen how many requests the two clients keep in flight.
    let delay = Duration::from_secs(4);
    let settle = delay / state::SETTLE_FRACTION;
    let (scheduler, batches, _) = scheduler(adaptive(8, delay), 1, Duration::ZERO);
    // The clients keep step, round by round, as closed-loop clients at one rhythm do: without
    // it, a slow machine could let one client finish a round ahead, and its last request would
    // rightly wait for company that no longer comes.
    let rounds = Arc::new(tokio::sync::Barrier::new(2));
    let clients: Vec<_> = (0..2u8)
        .map(|client| {
            let scheduler = Arc::clone(&scheduler);
            let rounds = Arc::clone(&rounds);
            tokio::spawn(async move {
                let mut queued = Vec::new();
                for round in 0..4u8 {
                    rounds.wait().await;
                    let value = client * 10 + round;
                    let outcome = scheduler.submit(request(value, 1)).await.unwrap();
                    assert_eq!(&outcome.outputs[0].data[..], &[value + 1]);
                    queued.push(outcome.queue);
                }
                queued
            })
        })
        .collect();
    for client in clients {
        let queued = client.await.unwrap();
        // The first round cannot know: it waits until the batch settles.
        assert!(queued[0] >= settle, "{queued:?}");
        assert!(
            queued[1..].iter().all(|&q| q < settle / 2),
            "later rounds went once both requests were in: {queued:?}"
        );
    }
    assert_eq!(batches.lock().unwrap().iter().sum::<i64>(), 8);
}

#[tokio::test]
async fn without_dynamic_batching_each_request_runs_alone() {
    let config = BatchingConfig {
        max_batch_size: 8,
        ..Default::default()
    };
    let (scheduler, batches, _) = scheduler(config, 2, Duration::from_millis(2));
    let tasks: Vec<_> = (0..8u8)
        .map(|i| {
            let scheduler = Arc::clone(&scheduler);
            tokio::spawn(async move { scheduler.submit(request(i, 1)).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(batches.lock().unwrap().as_slice(), &[1; 8]);
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
    // Margins of ~100 ms: the test must hold on a loaded machine too.
    let (scheduler, batches, _) = scheduler(config, 1, Duration::from_millis(400));
    // Occupies the only instance.
    let busy = {
        let scheduler = Arc::clone(&scheduler);
        tokio::spawn(async move { scheduler.submit(request(1, 1)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut expiring = request(2, 1);
    expiring.deadline = Some(Instant::now() + Duration::from_millis(150));
    let waiting = {
        let scheduler = Arc::clone(&scheduler);
        tokio::spawn(async move { scheduler.submit(expiring).await })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(matches!(
        scheduler.submit(request(3, 1)).await,
        Err(ScheduleError::QueueFull)
    ));
    assert!(matches!(
        waiting.await.unwrap(),
        Err(ScheduleError::Deadline)
    ));
    assert!(busy.await.unwrap().is_ok());
    assert_eq!(
        batches.lock().unwrap().len(),
        1,
        "the expired request never ran"
    );
}

#[tokio::test]
async fn the_in_flight_bound_refuses_at_once_and_recovers() {
    let config = BatchingConfig {
        max_in_flight: 2,
        // Long enough that the two held requests are still waiting to be batched when the
        // third comes (a batch nobody joins goes after a tenth of the delay).
        ..dynamic(8, Duration::from_secs(2))
    };
    let (scheduler, _, _) = scheduler(config, 1, Duration::ZERO);
    let held: Vec<_> = (0..2u8)
        .map(|i| {
            let scheduler = Arc::clone(&scheduler);
            tokio::spawn(async move { scheduler.submit(request(i, 1)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let refused_at = Instant::now();
    let refused = scheduler.submit(request(9, 1)).await.unwrap_err();
    assert!(matches!(refused, ScheduleError::Overloaded(2)));
    assert!(
        refused_at.elapsed() < Duration::from_millis(50),
        "answered at once"
    );
    for task in held {
        assert!(task.await.unwrap().is_ok(), "admitted requests still run");
    }
    assert!(scheduler.submit(request(3, 1)).await.is_ok());
}

#[tokio::test]
async fn dropped_callers_leave_the_queue() {
    let (scheduler, batches, _) =
        scheduler(dynamic(1, Duration::ZERO), 1, Duration::from_millis(50));
    let busy = {
        let scheduler = Arc::clone(&scheduler);
        tokio::spawn(async move { scheduler.submit(request(1, 1)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Times out client-side while queued: its future is dropped.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(5), scheduler.submit(request(2, 1))).await;
    assert!(gave_up.is_err());
    assert!(busy.await.unwrap().is_ok());
    assert!(scheduler.submit(request(3, 1)).await.is_ok());
    assert_eq!(
        batches.lock().unwrap().len(),
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
    )
    .unwrap();
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
    )
    .unwrap();
    scheduler.stop();
    assert!(dropped.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_bounded_halt_answers_the_queue_and_does_not_wait_for_a_long_batch() {
    let (scheduler, batches, _) = scheduler(BatchingConfig::default(), 1, Duration::from_secs(1));
    let running = tokio::spawn({
        let scheduler = Arc::clone(&scheduler);
        async move { scheduler.submit(request(1, 1)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // the only instance has it now
    let queued = tokio::spawn({
        let scheduler = Arc::clone(&scheduler);
        async move { scheduler.submit(request(2, 1)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let halted = tokio::task::spawn_blocking({
        let scheduler = Arc::clone(&scheduler);
        move || scheduler.halt_within(Some(Duration::from_millis(50)))
    });
    halted.await.unwrap();
    assert!(
        batches.lock().unwrap().is_empty(),
        "halt waited for the batch"
    );
    assert!(matches!(queued.await.unwrap(), Err(ScheduleError::Stopped)));
    // The running batch still ends and answers its request.
    assert!(running.await.unwrap().is_ok());
    assert!(matches!(
        scheduler.submit(request(3, 1)).await,
        Err(ScheduleError::Stopped)
    ));
}

/// Records the name of the thread each run happens on.
struct WhereRun {
    threads: Arc<Mutex<Vec<String>>>,
    delay: Duration,
}

impl Backend for WhereRun {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        std::thread::sleep(self.delay);
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        self.threads.lock().unwrap().push(name);
        Ok(inputs.to_vec())
    }
}

/// Runs `count` requests one after another and returns the threads they ran on.
async fn run_lone_requests(config: BatchingConfig, delay: Duration, count: usize) -> Vec<String> {
    run_requests(config, delay, count, false).await
}

/// Runs `count` requests one after another, with another request counted in flight all along
/// when `beside_another`, and returns the threads they ran on.
async fn run_requests(
    config: BatchingConfig,
    delay: Duration,
    count: usize,
    beside_another: bool,
) -> Vec<String> {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let backends: Vec<Box<dyn Backend>> = (0..2)
        .map(|_| {
            Box::new(WhereRun {
                threads: Arc::clone(&threads),
                delay,
            }) as Box<dyn Backend>
        })
        .collect();
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler = Scheduler::start("instance", config, backends, stats).unwrap();
    let other = beside_another.then(|| scheduler.admit().unwrap());
    for i in 0..count {
        let outcome = scheduler.submit(request(i as u8, 1)).await.unwrap();
        assert_eq!(&outcome.outputs[0].data[..], &[i as u8]);
    }
    drop(other);
    scheduler.stop();
    let seen = threads.lock().unwrap().clone();
    seen
}

#[tokio::test]
async fn a_quick_model_runs_lone_requests_on_the_callers_thread() {
    let seen = run_lone_requests(BatchingConfig::default(), Duration::ZERO, 4).await;
    // The first run measures the model on an instance thread; the rest need no hand-off.
    assert!(seen[0].starts_with("instance-"), "{seen:?}");
    assert!(
        seen[1..].iter().all(|t| !t.starts_with("instance-")),
        "{seen:?}"
    );
    // Dynamic batching without a delay would not have waited either.
    let seen = run_lone_requests(dynamic(8, Duration::ZERO), Duration::ZERO, 3).await;
    assert!(!seen[2].starts_with("instance-"), "{seen:?}");
    // With a delay, every request waits for company on an instance, as in Triton.
    let seen = run_lone_requests(dynamic(8, Duration::from_micros(200)), Duration::ZERO, 3).await;
    assert!(seen.iter().all(|t| t.starts_with("instance-")), "{seen:?}");
    // With kiln's shortcuts, the first request waits for company on an instance and gets none:
    // from then on a lone request would not wait, so it runs inline.
    let seen = run_lone_requests(adaptive(8, Duration::from_micros(200)), Duration::ZERO, 3).await;
    assert!(seen[0].starts_with("instance-"), "{seen:?}");
    assert!(
        seen[1..].iter().all(|t| !t.starts_with("instance-")),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_tiny_model_runs_inline_beside_other_requests() {
    // The first run is measured on an instance thread. Its time starts the average that decides
    // (runs under 25 µs), so a first run slowed down by a busy machine delays inlining by a few
    // requests; once the average settles, every request runs on the caller's thread.
    let seen = run_requests(BatchingConfig::default(), Duration::ZERO, 48, true).await;
    assert!(seen[0].starts_with("instance-"), "{seen:?}");
    assert!(
        seen[44..].iter().all(|t| !t.starts_with("instance-")),
        "{seen:?}"
    );
    // Quick enough to run a lone request inline, but not every request.
    let seen = run_requests(
        BatchingConfig::default(),
        Duration::from_micros(60),
        3,
        true,
    )
    .await;
    assert!(seen.iter().all(|t| t.starts_with("instance-")), "{seen:?}");
}

#[tokio::test]
async fn slow_models_keep_requests_on_the_instances() {
    let seen = run_lone_requests(BatchingConfig::default(), Duration::from_millis(2), 3).await;
    assert!(seen.iter().all(|t| t.starts_with("instance-")), "{seen:?}");
    let seen = run_lone_requests(
        dynamic(8, Duration::from_micros(200)),
        Duration::from_millis(2),
        3,
    )
    .await;
    assert!(seen.iter().all(|t| t.starts_with("instance-")), "{seen:?}");
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
    let backend = StaysOnInstances(WhereRun {
        threads: Arc::clone(&threads),
        delay: Duration::ZERO,
    });
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler = Scheduler::start(
        "instance",
        BatchingConfig::default(),
        vec![Box::new(backend)],
        stats,
    )
    .unwrap();
    for i in 0..4 {
        scheduler.submit(request(i, 1)).await.unwrap();
    }
    scheduler.stop();
    let seen = threads.lock().unwrap().clone();
    assert!(seen.iter().all(|t| t.starts_with("instance-")), "{seen:?}");
}

#[test]
fn stopping_waits_for_a_session_running_inline() {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let backend = Box::new(WhereRun {
        threads,
        delay: Duration::ZERO,
    }) as Box<dyn Backend>;
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler =
        Scheduler::start("instance", BatchingConfig::default(), vec![backend], stats).unwrap();
    // Take the only session as an inline caller would, and give it back later from elsewhere.
    let session = scheduler.shared.take_idle_session().unwrap();
    let shared = Arc::clone(&scheduler.shared);
    let returned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&returned);
    let returner = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::SeqCst);
        shared.give_back(session);
    });
    scheduler.stop();
    assert!(
        returned.load(Ordering::SeqCst),
        "stop returned before the session came back"
    );
    returner.join().unwrap();
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
    let scheduler = Arc::new(
        Scheduler::start(
            "r",
            dynamic(8, Duration::from_millis(200)),
            vec![Box::new(RejectsFf(Arc::clone(&failed)))],
            Arc::new(ModelStats::new("m", 1)),
        )
        .unwrap(),
    );
    let tasks: Vec<_> = [1u8, 0xff, 3]
        .into_iter()
        .map(|value| {
            let scheduler = Arc::clone(&scheduler);
            tokio::spawn(async move { (value, scheduler.submit(request(value, 1)).await) })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            (0xff, outcome) => assert!(matches!(
                outcome,
                Err(ScheduleError::Backend(BackendError::Input(_)))
            )),
            (value, outcome) => assert_eq!(&outcome.unwrap().outputs[0].data[..], &[value]),
        }
    }
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.len() >= 2 && failed[0] > 1,
        "the merged batch failed, then the bad request alone: {failed:?}"
    );
}

/// Counts each request's runs, rescheduling it until it has run as many times as its input's
/// one byte says; records the batch sizes it saw.
struct CountsDown {
    batches: Arc<Mutex<Vec<usize>>>,
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
        std::thread::sleep(Duration::from_millis(10));
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
    let instance = CountsDown {
        batches: Arc::clone(&batches),
    };
    let stats = Arc::new(ModelStats::new("m", 1));
    let scheduler = Arc::new(
        Scheduler::launch("t", dynamic(4, Duration::ZERO), vec![instance], stats).unwrap(),
    );
    let tasks: Vec<_> = [3u8, 2]
        .into_iter()
        .map(|wanted| {
            let scheduler = Arc::clone(&scheduler);
            tokio::spawn(async move {
                let countdown = Countdown {
                    tensors: request(wanted, 1).inputs,
                    runs: 0,
                };
                scheduler
                    .submit(Request {
                        inputs: countdown,
                        rows: 1,
                        priority: None,
                        timeout: None,
                        deadline: None,
                    })
                    .await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap().unwrap().outputs);
    }
    // Each is answered once, after its last run.
    assert_eq!(answers, [(3, false), (2, false)]);
    let seen = batches.lock().unwrap().clone();
    assert_eq!(seen.iter().sum::<usize>(), 5, "{seen:?}");
    assert!(
        seen.contains(&2),
        "a rescheduled request joined the other's batch: {seen:?}"
    );
    scheduler.halt();
}
