//! Unit tests of the batching rules.
use super::*;

fn dynamic(max: usize, preferred: &[usize], delay_us: u64) -> BatchingConfig {
    BatchingConfig {
        dynamic: true,
        max_batch_size: max,
        preferred_batch_sizes: preferred.to_vec(),
        max_queue_delay: Duration::from_micros(delay_us),
        ..BatchingConfig::default()
    }
}

/// The same with kiln's opt-in shortcuts (`adaptive_batching_delay`).
fn adaptive(max: usize, preferred: &[usize], delay_us: u64) -> BatchingConfig {
    BatchingConfig {
        adaptive_delay: true,
        ..dynamic(max, preferred, delay_us)
    }
}

fn sub(payload: u32, batch_size: usize) -> Submission<u32> {
    Submission {
        payload,
        batch_size,
        signature: 7,
        priority: None,
        deadline: None,
        timeout: None,
    }
}

fn batch(next: Next<u32>) -> Vec<u32> {
    match next {
        Next::Batch(b) => b,
        other => panic!("expected a batch, got {other:?}"),
    }
}

#[test]
fn without_dynamic_batching_requests_run_alone_in_order() {
    let now = Instant::now();
    let mut state = State::new(BatchingConfig {
        max_batch_size: 8,
        ..Default::default()
    });
    for i in 0..3 {
        state.push(sub(i, 1), now).unwrap();
    }
    assert_eq!(batch(state.next_batch(now, false)), vec![0]);
    assert_eq!(batch(state.next_batch(now, false)), vec![1]);
    assert_eq!(batch(state.next_batch(now, false)), vec![2]);
    assert_eq!(state.next_batch(now, false), Next::Idle);
}

#[test]
fn zero_delay_sends_everything_compatible_at_once() {
    let now = Instant::now();
    let mut state = State::new(dynamic(8, &[], 0));
    for i in 0..5 {
        state.push(sub(i, 1), now).unwrap();
    }
    assert_eq!(batch(state.next_batch(now, false)), vec![0, 1, 2, 3, 4]);
    assert!(state.is_empty());
}

#[test]
fn batches_never_exceed_max_batch_size() {
    let now = Instant::now();
    let mut state = State::new(dynamic(4, &[], 0));
    for (i, rows) in [2, 1, 2, 3].into_iter().enumerate() {
        state.push(sub(i as u32, rows), now).unwrap();
    }
    assert_eq!(batch(state.next_batch(now, false)), vec![0, 1]); // 2 + 1; adding 2 would give 5
    assert_eq!(batch(state.next_batch(now, false)), vec![2]); // 2; adding 3 would give 5
    assert_eq!(batch(state.next_batch(now, false)), vec![3]);
}

#[test]
fn different_signatures_are_never_merged_and_order_is_kept() {
    let now = Instant::now();
    let mut state = State::new(dynamic(8, &[], 0));
    state.push(sub(0, 1), now).unwrap();
    state
        .push(
            Submission {
                signature: 9,
                ..sub(1, 1)
            },
            now,
        )
        .unwrap();
    state.push(sub(2, 1), now).unwrap();
    assert_eq!(batch(state.next_batch(now, false)), vec![0]);
    assert_eq!(batch(state.next_batch(now, false)), vec![1]);
    assert_eq!(batch(state.next_batch(now, false)), vec![2]);
}

#[test]
fn delay_waits_for_more_requests_until_it_expires() {
    let start = Instant::now();
    let us = |n| start + Duration::from_micros(n);
    let mut state = State::new(adaptive(16, &[], 1000));
    // Requests keep joining (every 80 us, under a tenth of the delay): the batch waits for its
    // oldest request's full delay.
    state.push(sub(0, 1), start).unwrap();
    assert_eq!(state.next_batch(start, false), Next::WaitUntil(us(100)));
    for i in 1..=12 {
        let at = i * 80;
        state.push(sub(i as u32, 1), us(at)).unwrap();
        assert_eq!(
            state.next_batch(us(at), false),
            Next::WaitUntil(us((at + 100).min(1000)))
        );
    }
    assert_eq!(state.next_batch(us(999), false), Next::WaitUntil(us(1000)));
    assert_eq!(
        batch(state.next_batch(us(1000), false)),
        (0..=12).collect::<Vec<_>>()
    );
}

#[test]
fn a_batch_nobody_joins_goes_after_a_tenth_of_the_delay() {
    let start = Instant::now();
    let us = |n| start + Duration::from_micros(n);
    let mut state = State::new(adaptive(16, &[], 1000));
    state.push(sub(0, 1), start).unwrap();
    state.push(sub(1, 1), us(50)).unwrap();
    assert_eq!(state.next_batch(us(149), false), Next::WaitUntil(us(150)));
    assert_eq!(batch(state.next_batch(us(150), false)), vec![0, 1]);
    // Only the batch's own requests count: a later, incompatible one does not keep it waiting.
    state.push(sub(2, 1), us(400)).unwrap();
    state
        .push(
            Submission {
                signature: 9,
                ..sub(3, 1)
            },
            us(450),
        )
        .unwrap();
    assert_eq!(batch(state.next_batch(us(500), false)), vec![2]);
    assert_eq!(batch(state.next_batch(us(600), false)), vec![3]);
}

#[test]
fn a_lone_client_stops_paying_the_delay_until_requests_queue_up_again() {
    let start = Instant::now();
    let us = |n| start + Duration::from_micros(n);
    let mut state = State::new(adaptive(8, &[], 1000));
    assert!(state.waits_for_company());
    state.push(sub(0, 1), start).unwrap();
    assert_eq!(state.next_batch(start, false), Next::WaitUntil(us(100)));
    assert_eq!(
        batch(state.next_batch(us(100), false)),
        vec![0],
        "waited for nobody"
    );
    assert!(!state.waits_for_company());
    state.push(sub(1, 1), us(400)).unwrap();
    assert_eq!(
        batch(state.next_batch(us(400), false)),
        vec![1],
        "goes at once"
    );
    // Two requests queued up behind a busy instance: batching pays again, and so does waiting.
    state.push(sub(2, 1), us(500)).unwrap();
    state.push(sub(3, 1), us(510)).unwrap();
    assert_eq!(batch(state.next_batch(us(520), false)), vec![2, 3]);
    assert!(state.waits_for_company());
    state.push(sub(4, 1), us(600)).unwrap();
    assert_eq!(state.next_batch(us(600), false), Next::WaitUntil(us(700)));
}

#[test]
fn a_batch_waits_for_company_only_on_the_last_free_instance() {
    let start = Instant::now();
    let us = |n| start + Duration::from_micros(n);
    let mut state = State::new(adaptive(8, &[], 1000));
    state.push(sub(0, 1), start).unwrap();
    state.push(sub(1, 1), start).unwrap();
    // Another instance is free for whoever comes next: go now, and batching still pays.
    assert_eq!(batch(state.next_batch(start, true)), vec![0, 1]);
    assert!(state.waits_for_company());
    // The last free instance waits as before.
    state.push(sub(2, 1), us(20)).unwrap();
    assert_eq!(state.next_batch(us(20), false), Next::WaitUntil(us(120)));
    // When another instance comes back, the waiting batch goes at once; it went alone, so
    // waiting stops paying, as for a batch that waited out its delay alone.
    assert_eq!(batch(state.next_batch(us(60), true)), vec![2]);
    assert!(!state.waits_for_company());
    state.push(sub(3, 1), us(100)).unwrap();
    assert_eq!(
        batch(state.next_batch(us(100), false)),
        vec![3],
        "goes at once"
    );
}

/// Four closed-loop clients, one instance: a window in which all four were in flight at once.
fn with_four_clients_seen(state: &mut State<u32>, start: Instant) -> Instant {
    for count in 1..=4 {
        state.observe_in_flight(count, start);
    }
    start + PEAK_WINDOW
}

#[test]
fn a_batch_does_not_wait_for_company_that_cannot_come() {
    let start = Instant::now();
    let mut state = State::new(adaptive(8, &[], 1000));
    let now = with_four_clients_seen(&mut state, start);
    let us = |n| now + Duration::from_micros(n);
    // One request running elsewhere (or answered, on its way back), two queued: the fourth
    // client may still send, so the batch waits.
    state.observe_in_flight(3, now);
    state.push(sub(0, 1), now).unwrap();
    state.push(sub(1, 1), now).unwrap();
    assert_eq!(state.next_batch(now, false), Next::WaitUntil(us(100)));
    // The fourth arrives: nobody is left to come, the batch goes without waiting.
    state.observe_in_flight(4, us(30));
    state.push(sub(2, 1), us(30)).unwrap();
    assert_eq!(batch(state.next_batch(us(30), false)), vec![0, 1, 2]);
    assert!(state.waits_for_company(), "batching still pays");
    // Even a request alone goes when every other one is out: it waited for nobody, and one that
    // goes alone stops the waiting as any lone batch does.
    state.observe_in_flight(4, us(40));
    state.push(sub(3, 1), us(40)).unwrap();
    assert_eq!(batch(state.next_batch(us(40), false)), vec![3]);
    assert!(!state.waits_for_company());
}

#[test]
fn the_peak_in_flight_is_unknown_until_a_whole_window_has_seen_requests() {
    let start = Instant::now();
    let us = |n| start + Duration::from_micros(n);
    let mut state = State::new(adaptive(8, &[], 1000));
    // At the start every arrival is a new peak: the ramp batches by the other rules.
    for i in 0..3 {
        state.observe_in_flight(i as usize + 1, us(i));
        state.push(sub(i as u32, 1), us(i)).unwrap();
        assert_eq!(state.next_batch(us(i), false), Next::WaitUntil(us(100 + i)));
    }
    assert_eq!(batch(state.next_batch(us(102), false)), vec![0, 1, 2]);
}

#[test]
fn the_peak_in_flight_follows_clients_that_leave_and_outlives_quiet_spells() {
    let start = Instant::now();
    let mut state = State::new(adaptive(8, &[], 1000));
    let next_window = with_four_clients_seen(&mut state, start);
    // Two clients left: for up to two windows the peak is still four, and a batch of two waits.
    state.observe_in_flight(2, next_window);
    state.push(sub(0, 1), next_window).unwrap();
    state.push(sub(1, 1), next_window).unwrap();
    assert!(matches!(
        state.next_batch(next_window, false),
        Next::WaitUntil(_)
    ));
    let settled = next_window + Duration::from_micros(100);
    assert_eq!(batch(state.next_batch(settled, false)), vec![0, 1]);
    // Once a window has passed with two at most, two is everyone.
    let later = next_window + PEAK_WINDOW;
    state.observe_in_flight(2, later);
    state.push(sub(2, 1), later).unwrap();
    state.push(sub(3, 1), later).unwrap();
    assert_eq!(batch(state.next_batch(later, false)), vec![2, 3]);
    // After a quiet spell the same two clients come back (a long delay makes every round such
    // a spell): the first waits for the second, the second finds everyone here.
    let after_quiet = later + PEAK_WINDOW * 3;
    state.observe_in_flight(1, after_quiet);
    state.push(sub(4, 1), after_quiet).unwrap();
    assert!(matches!(
        state.next_batch(after_quiet, false),
        Next::WaitUntil(_)
    ));
    state.observe_in_flight(2, after_quiet);
    state.push(sub(5, 1), after_quiet).unwrap();
    assert_eq!(batch(state.next_batch(after_quiet, false)), vec![4, 5]);
}

#[test]
fn by_default_nothing_shortens_the_wait() {
    let start = Instant::now();
    let mut state = State::new(dynamic(8, &[], 1000));
    let now = with_four_clients_seen(&mut state, start);
    // Everyone in flight is here, and another instance is free: it waits all the same.
    state.observe_in_flight(4, now);
    state.push(sub(0, 1), now).unwrap();
    assert_eq!(
        state.next_batch(now, true),
        Next::WaitUntil(now + Duration::from_micros(1000))
    );
}

#[test]
fn by_default_every_batch_waits_its_full_delay() {
    let start = Instant::now();
    let us = |n| start + Duration::from_micros(n);
    let mut state = State::new(dynamic(8, &[], 1000));
    for round in 0..2u64 {
        let at = round * 2000;
        state.push(sub(round as u32, 1), us(at)).unwrap();
        assert!(state.waits_for_company());
        assert_eq!(
            state.next_batch(us(at + 500), false),
            Next::WaitUntil(us(at + 1000))
        );
        assert_eq!(
            batch(state.next_batch(us(at + 1000), false)),
            vec![round as u32]
        );
    }
}

#[test]
fn a_lone_request_that_reaches_no_preferred_size_waits_out_the_delay() {
    // Triton: `preferred_batch_size: [2, 6]`, 10 s delay, one request of batch 1.
    let start = Instant::now();
    let mut state = State::new(dynamic(8, &[2, 6], 10_000_000));
    assert!(state.waits_for_company());
    state.push(sub(0, 1), start).unwrap();
    let due = start + Duration::from_secs(10);
    assert_eq!(state.next_batch(start, true), Next::WaitUntil(due));
    let almost = due - Duration::from_micros(1);
    assert_eq!(state.next_batch(almost, true), Next::WaitUntil(due));
    assert_eq!(batch(state.next_batch(due, false)), vec![0]);
    // Waiting for nobody changes nothing: the next lone request waits again.
    state.push(sub(1, 1), due).unwrap();
    assert!(state.waits_for_company());
    assert!(matches!(state.next_batch(due, true), Next::WaitUntil(_)));
}

#[test]
fn two_requests_that_make_a_preferred_size_go_together_at_once() {
    let now = Instant::now();
    let mut state = State::new(dynamic(8, &[2, 6], 10_000_000));
    state.push(sub(0, 1), now).unwrap();
    state.push(sub(1, 1), now).unwrap();
    assert_eq!(batch(state.next_batch(now, false)), vec![0, 1]);
}

#[test]
fn a_batch_that_cannot_grow_to_a_preferred_size_goes_at_once() {
    // Triton marks the batch where the next request would take it past the largest preferred
    // size: 3 + 3 > 4, so the first goes alone, now.
    let now = Instant::now();
    let mut state = State::new(dynamic(8, &[4], 10_000_000));
    state.push(sub(0, 3), now).unwrap();
    state.push(sub(1, 3), now).unwrap();
    assert_eq!(batch(state.next_batch(now, false)), vec![0]);
    assert!(matches!(state.next_batch(now, false), Next::WaitUntil(_)));
    // Without preferred sizes the largest is max_batch_size: 5 + 4 > 8.
    let mut state = State::new(dynamic(8, &[], 10_000_000));
    state.push(sub(0, 5), now).unwrap();
    state.push(sub(1, 4), now).unwrap();
    assert_eq!(batch(state.next_batch(now, false)), vec![0]);
    // A request of another shape ends the batch: it goes now, the other waits.
    let mut state = State::new(dynamic(8, &[], 10_000_000));
    state.push(sub(0, 1), now).unwrap();
    let other = Submission {
        signature: 9,
        ..sub(1, 1)
    };
    state.push(other, now).unwrap();
    assert_eq!(batch(state.next_batch(now, false)), vec![0]);
    assert!(matches!(state.next_batch(now, false), Next::WaitUntil(_)));
}

#[test]
fn without_a_delay_a_preferred_prefix_still_goes_first() {
    // Triton: with max_queue_delay 0 the delay is never "exceeded", so a queue that makes a
    // preferred size sends that prefix, and what is left goes next, at once.
    let now = Instant::now();
    let mut state = State::new(dynamic(8, &[4], 0));
    for i in 0..6 {
        state.push(sub(i, 1), now).unwrap();
    }
    assert_eq!(batch(state.next_batch(now, false)), vec![0, 1, 2, 3]);
    assert_eq!(batch(state.next_batch(now, false)), vec![4, 5]);
    assert_eq!(state.next_batch(now, false), Next::Idle);
}

#[test]
fn once_the_delay_passes_everything_pending_goes_past_the_preferred_sizes() {
    let start = Instant::now();
    let mut state = State::new(dynamic(8, &[4], 1000));
    for i in 0..3 {
        state.push(sub(i, 1), start).unwrap();
    }
    let due = start + Duration::from_micros(1000);
    assert_eq!(state.next_batch(start, false), Next::WaitUntil(due));
    state.push(sub(3, 1), due).unwrap();
    state.push(sub(4, 1), due).unwrap();
    // Before the delay a preferred size (4) would go; after it, the whole pending batch.
    assert_eq!(batch(state.next_batch(due, false)), vec![0, 1, 2, 3, 4]);
}

#[test]
fn a_full_batch_goes_before_the_delay() {
    let now = Instant::now();
    let mut state = State::new(dynamic(4, &[], 1_000_000));
    for i in 0..5 {
        state.push(sub(i, 1), now).unwrap();
    }
    assert_eq!(batch(state.next_batch(now, false)), vec![0, 1, 2, 3]);
    assert!(matches!(state.next_batch(now, false), Next::WaitUntil(_)));
}

#[test]
fn preferred_sizes_go_early_taking_the_longest_preferred_prefix() {
    let now = Instant::now();
    let mut state = State::new(dynamic(16, &[4, 2], 1_000_000));
    state.push(sub(0, 1), now).unwrap();
    assert!(matches!(state.next_batch(now, false), Next::WaitUntil(_)));
    for i in 1..5 {
        state.push(sub(i, 1), now).unwrap();
    }
    // 5 queued, preferred {2, 4}: send 4 now, keep 1 waiting.
    assert_eq!(batch(state.next_batch(now, false)), vec![0, 1, 2, 3]);
    assert!(matches!(state.next_batch(now, false), Next::WaitUntil(_)));
    assert_eq!(state.len(), 1);
}

#[test]
fn higher_priority_goes_first_and_bad_priorities_use_the_default() {
    let now = Instant::now();
    let config = BatchingConfig {
        priority_levels: 3,
        default_priority: 2,
        policies: vec![QueuePolicy::default(); 3],
        ..BatchingConfig::default()
    };
    let mut state = State::new(config);
    state
        .push(
            Submission {
                priority: Some(3),
                ..sub(0, 1)
            },
            now,
        )
        .unwrap();
    state
        .push(
            Submission {
                priority: None,
                ..sub(1, 1)
            },
            now,
        )
        .unwrap();
    state
        .push(
            Submission {
                priority: Some(99),
                ..sub(2, 1)
            },
            now,
        )
        .unwrap();
    state
        .push(
            Submission {
                priority: Some(1),
                ..sub(3, 1)
            },
            now,
        )
        .unwrap();
    let order: Vec<u32> = (0..4)
        .flat_map(|_| batch(state.next_batch(now, false)))
        .collect();
    assert_eq!(order, vec![3, 1, 2, 0]);
}

#[test]
fn max_queue_size_rejects_per_level() {
    let now = Instant::now();
    let config = BatchingConfig {
        priority_levels: 2,
        default_priority: 1,
        policies: vec![
            QueuePolicy {
                max_queue_size: 2,
                ..Default::default()
            },
            QueuePolicy::default(),
        ],
        ..dynamic(8, &[], 0)
    };
    let mut state = State::new(config);
    state.push(sub(0, 1), now).unwrap();
    state.push(sub(1, 1), now).unwrap();
    assert_eq!(state.push(sub(2, 1), now), Err((Rejection::QueueFull, 2)));
    assert_eq!(
        state.push(sub(9, 1), now).map_err(|(r, _)| r),
        Err(Rejection::QueueFull)
    );
    state
        .push(
            Submission {
                priority: Some(2),
                ..sub(3, 1)
            },
            now,
        )
        .unwrap();
    assert_eq!(state.len(), 3);
}

#[test]
fn policy_timeout_rejects_or_delays() {
    let start = Instant::now();
    let policy = |action| QueuePolicy {
        default_timeout: Some(Duration::from_millis(10)),
        timeout_action: action,
        ..Default::default()
    };
    let mut reject = State::new(BatchingConfig {
        policies: vec![policy(TimeoutAction::Reject)],
        ..dynamic(8, &[], 0)
    });
    reject.push(sub(0, 1), start).unwrap();
    assert_eq!(
        reject.next_expiry(),
        Some(start + Duration::from_millis(10))
    );
    assert!(reject.expire(start + Duration::from_millis(9)).is_empty());
    assert_eq!(
        reject.expire(start + Duration::from_millis(10)),
        vec![(0, Rejection::Timeout)]
    );
    assert!(reject.is_empty());

    let mut delay = State::new(BatchingConfig {
        policies: vec![policy(TimeoutAction::Delay)],
        ..dynamic(8, &[], 0)
    });
    delay.push(sub(0, 1), start).unwrap();
    let later = start + Duration::from_millis(20);
    assert!(delay.expire(later).is_empty());
    delay.push(sub(1, 1), later).unwrap();
    // The fresh request runs before the one whose timeout passed.
    assert_eq!(batch(delay.next_batch(later, false)), vec![1]);
    assert_eq!(batch(delay.next_batch(later, false)), vec![0]);
}

#[test]
fn a_requests_timeout_only_shortens_the_policys_when_allowed() {
    let start = Instant::now();
    let ms = Duration::from_millis;
    let expired = |policy: Option<QueuePolicy>, own: Duration, at: Duration| {
        let mut state = State::new(BatchingConfig {
            policies: policy.into_iter().collect(),
            ..dynamic(8, &[], 0)
        });
        state
            .push(
                Submission {
                    timeout: Some(own),
                    ..sub(0, 1)
                },
                start,
            )
            .unwrap();
        !state.expire(start + at).is_empty()
    };
    // No policy timeout: the request's own does not apply (Triton 2.51 ignores it too).
    assert!(!expired(None, ms(1), ms(100)));
    // A policy timeout without override: the request's is ignored.
    let policy = QueuePolicy {
        default_timeout: Some(ms(50)),
        ..Default::default()
    };
    assert!(!expired(Some(policy.clone()), ms(1), ms(2)));
    assert!(expired(Some(policy.clone()), ms(1), ms(50)));
    // With override allowed, a shorter one applies, a longer one does not.
    let policy = QueuePolicy {
        allow_timeout_override: true,
        ..policy
    };
    assert!(expired(Some(policy.clone()), ms(1), ms(2)));
    assert!(expired(Some(policy), ms(5_000), ms(50)));
}

#[test]
fn push_reports_when_a_request_will_be_rejected() {
    let start = Instant::now();
    let ms = Duration::from_millis;
    let policy = |action| QueuePolicy {
        default_timeout: Some(ms(10)),
        timeout_action: action,
        ..Default::default()
    };
    let mut reject = State::new(BatchingConfig {
        policies: vec![policy(TimeoutAction::Reject)],
        ..dynamic(8, &[], 0)
    });
    assert_eq!(
        reject.push(sub(0, 1), start),
        Ok(Some((start + ms(10), Rejection::Timeout)))
    );
    let early = Submission {
        deadline: Some(start + ms(3)),
        ..sub(1, 1)
    };
    assert_eq!(
        reject.push(early, start),
        Ok(Some((start + ms(3), Rejection::Deadline)))
    );
    let mut delay = State::new(BatchingConfig {
        policies: vec![policy(TimeoutAction::Delay)],
        ..dynamic(8, &[], 0)
    });
    assert_eq!(
        delay.push(sub(0, 1), start),
        Ok(None),
        "DELAY never rejects"
    );
    assert_eq!(
        State::new(dynamic(8, &[], 0)).push(sub(0, 1), start),
        Ok(None)
    );
}

#[test]
fn client_deadlines_reject_even_delayed_requests() {
    let start = Instant::now();
    let mut state = State::new(dynamic(8, &[], 0));
    state
        .push(
            Submission {
                deadline: Some(start + Duration::from_millis(5)),
                ..sub(0, 1)
            },
            start,
        )
        .unwrap();
    state.push(sub(1, 1), start).unwrap();
    assert_eq!(state.next_expiry(), Some(start + Duration::from_millis(5)));
    assert_eq!(
        state.expire(start + Duration::from_millis(5)),
        vec![(0, Rejection::Deadline)]
    );
    assert_eq!(batch(state.next_batch(start, false)), vec![1]);
}

#[test]
fn cancel_removes_a_queued_request() {
    let now = Instant::now();
    let mut state = State::new(dynamic(8, &[], 1000));
    state.push(sub(0, 1), now).unwrap();
    state.push(sub(1, 1), now).unwrap();
    assert_eq!(state.cancel(|&p| p == 0), Some(0));
    assert_eq!(state.cancel(|&p| p == 0), None);
    assert_eq!(state.len(), 1);
    assert_eq!(
        batch(state.next_batch(now + Duration::from_millis(1), false)),
        vec![1]
    );
    assert_eq!(state.cancel(|&p| p == 1), None);
}
