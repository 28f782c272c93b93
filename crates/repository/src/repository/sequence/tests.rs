use super::*;
use crate::core::RequestedOutput;
use crate::repository::config::parse_config;

fn config(batching: &str) -> ModelConfig {
    parse_config(&format!(
        r#"name: "m" max_batch_size: 4 sequence_batching {{ {batching} }}"#
    ))
    .unwrap()
}

const ACCUMULATE: &str = r#"
    max_sequence_idle_microseconds: 100000
    control_input [
      { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
      { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
      { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
      { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
    ]
    state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]"#;

fn request(parameters: &[(&str, ParamValue)]) -> InferRequest {
    let mut request = InferRequest::default();
    for (key, value) in parameters {
        request.parameters.insert((*key).into(), value.clone());
    }
    request.outputs.push(RequestedOutput::default());
    request
}

/// The flags of sequence `id` (a number), not a sequence of its own.
fn numbered(id: u64, start: bool, end: bool) -> SequenceFlags {
    SequenceFlags {
        id: CorrId::Number(id),
        start,
        end,
        alone: false,
    }
}

fn flags(parameters: &[(&str, ParamValue)]) -> Result<SequenceFlags, Error> {
    SequenceFlags::of(&request(parameters), "m")
}

fn state_out(value: f32) -> Tensor {
    let data: Vec<u8> = [value, value]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    Tensor::new("S_OUT", DataType::Fp32, vec![1, 2], Bytes::from(data))
}

fn floats(tensor: &Tensor) -> Vec<f32> {
    tensor
        .data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn configs_without_sequence_batching_have_no_spec() {
    assert_eq!(
        SequenceSpec::from_config(
            &parse_config("name: \"m\"").unwrap(),
            Path::new("/nonexistent")
        ),
        Ok(None)
    );
}

#[test]
fn unusable_sequence_configs_are_refused() {
    for (batching, message) in [
        (r#"control_input [ { name: "S" } ]"#, "exactly one control"),
        (
            r#"control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]"#,
            "needs int32_false_true",
        ),
        (
            r#"control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]"#,
            "a false and a true value",
        ),
        (
            r#"control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]"#,
            "must be TYPE_UINT64",
        ),
        (
            r#"state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ -1 ] } ]"#,
            "fixed shape",
        ),
        (
            r#"state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ]
                         initial_state [ { data_type: TYPE_FP32 dims: [ 1 ] data_file: "x" } ] } ]"#,
            "cannot read",
        ),
        (
            r#"state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ]
                         initial_state [ { data_type: TYPE_FP32 dims: [ 1 ] data_file: "../x" } ] } ]"#,
            "must be relative and stay within",
        ),
        (
            r#"state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1099511627776, 1099511627776 ] } ]"#,
            "larger than the",
        ),
    ] {
        let error =
            SequenceSpec::from_config(&config(batching), Path::new("/nonexistent")).unwrap_err();
        assert!(error.contains(message), "{batching}: {error}");
    }
}

#[test]
fn flags_come_from_tritons_parameters() {
    assert_eq!(
        flags(&[
            ("sequence_id", ParamValue::Int64(9)),
            ("sequence_start", ParamValue::Bool(true)),
        ]),
        Ok(numbered(9, true, false))
    );
    assert_eq!(
        flags(&[
            ("sequence_id", ParamValue::String("a".into())),
            ("sequence_end", ParamValue::Bool(true)),
        ])
        .unwrap()
        .id,
        CorrId::Text("a".into())
    );
    for id in [
        ParamValue::Uint64(0),
        ParamValue::Int64(-3),
        ParamValue::String(String::new()),
    ] {
        assert!(flags(&[("sequence_id", id)])
            .unwrap_err()
            .message()
            .contains("non-zero or non-empty correlation ID"));
    }
    assert_eq!(
        flags(&[]).unwrap_err(),
        Error::InvalidArgument(
            "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
                .into()
        )
    );
    let longest = "i".repeat(MAX_CORRELATION_ID_BYTES);
    assert!(flags(&[("sequence_id", ParamValue::String(longest))]).is_ok());
    let long = "i".repeat(MAX_CORRELATION_ID_BYTES + 1);
    assert!(flags(&[("sequence_id", ParamValue::String(long))])
        .unwrap_err()
        .message()
        .ends_with("has a correlation ID of 1025 bytes, longer than the 1024 kiln keeps"));
}

#[tokio::test]
async fn controls_are_added_in_tritons_order_whatever_the_configs() {
    // Triton's sequence batcher adds START, END, READY, then CORRID; a Python model lists its
    // inputs in an order that follows it.
    let reversed = r#"control_input [
      { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] },
      { name: "R" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
      { name: "E" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
      { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] }
    ]"#;
    let spec = SequenceSpec::from_config(&config(reversed), Path::new("/nonexistent"))
        .unwrap()
        .unwrap();
    let sequences = Sequences::new(spec);
    let flags = numbered(3, true, true);
    let turn = sequences.begin(flags, 1, "m").await.unwrap();
    let inputs = sequences.inputs(&turn);
    let names: Vec<&str> = inputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["S", "E", "R", "C"]);
}

#[tokio::test]
async fn states_carry_over_within_a_sequence_and_start_again_at_start() {
    let spec = SequenceSpec::from_config(&config(ACCUMULATE), Path::new("/nonexistent"))
        .unwrap()
        .unwrap();
    let sequences = Sequences::new(spec);
    let begin = |start: bool, end: bool, id: &str| SequenceFlags {
        id: CorrId::Text(id.into()),
        start,
        end,
        alone: false,
    };
    // Not started: refused.
    let error = sequences
        .begin(begin(false, false, "a"), 1, "m")
        .await
        .err()
        .unwrap();
    assert!(error.message().contains("must specify the START flag"));
    // Batch size other than 1: refused.
    assert!(sequences
        .begin(begin(true, false, "a"), 2, "m")
        .await
        .is_err());

    let turn = sequences
        .begin(begin(true, false, "a"), 1, "m")
        .await
        .unwrap();
    let inputs = sequences.inputs(&turn);
    let names: Vec<&str> = inputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["START", "END", "READY", "CORRID", "S_IN"]);
    assert_eq!(&inputs[0].data[..], &1i32.to_le_bytes());
    assert_eq!(&inputs[1].data[..], &[0]);
    assert_eq!(&inputs[2].data[..], &1f32.to_le_bytes());
    assert_eq!(&inputs[3].data[..], &[1, 0, 0, 0, b'a']);
    assert_eq!(inputs[4].shape, [1, 2]);
    assert_eq!(floats(&inputs[4]), [0.0, 0.0]);
    let mut outputs = vec![
        state_out(5.0),
        Tensor::new("Y", DataType::Fp32, vec![1], Bytes::new()),
    ];
    sequences.finish(turn, &mut outputs);
    // The state output is taken out of the answer.
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].name, "Y");

    let turn = sequences
        .begin(begin(false, true, "a"), 1, "m")
        .await
        .unwrap();
    let inputs = sequences.inputs(&turn);
    assert_eq!(&inputs[0].data[..], &0i32.to_le_bytes());
    assert_eq!(&inputs[1].data[..], &[1]);
    assert_eq!(
        (inputs[4].name.as_str(), floats(&inputs[4])),
        ("S_IN", vec![5.0, 5.0])
    );
    sequences.finish(turn, &mut vec![state_out(6.0)]);
    // Ended: gone.
    assert_eq!(sequences.len(), 0);
    assert!(sequences
        .begin(begin(false, false, "a"), 1, "m")
        .await
        .is_err());
}

#[tokio::test]
async fn idle_sequences_are_dropped() {
    let spec = SequenceSpec::from_config(&config(ACCUMULATE), Path::new("/nonexistent"))
        .unwrap()
        .unwrap();
    let sequences = Sequences::new(spec);
    let id = |n: u64| CorrId::Number(n);
    let turn = sequences
        .begin(
            SequenceFlags {
                id: id(1),
                start: true,
                end: false,
                alone: false,
            },
            1,
            "m",
        )
        .await
        .unwrap();
    sequences.finish(turn, &mut vec![state_out(1.0)]);
    assert_eq!(sequences.len(), 1);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Any request sweeps; sequence 1 has been idle longer than its 100 ms.
    let other = sequences
        .begin(
            SequenceFlags {
                id: id(2),
                start: true,
                end: false,
                alone: false,
            },
            1,
            "m",
        )
        .await
        .unwrap();
    drop(other);
    assert_eq!(sequences.len(), 1);
    let error = sequences
        .begin(
            SequenceFlags {
                id: id(1),
                start: false,
                end: false,
                alone: false,
            },
            1,
            "m",
        )
        .await
        .err()
        .unwrap();
    assert!(error.message().contains("START"));
}

#[tokio::test]
async fn a_new_sequence_takes_a_free_slot_as_tritons_batcher_gives_it() {
    // Two instances of four sequence slots each (max_batch_size 4): slots come out of Triton's
    // heap (see `slots`), a sequence keeps its instance, an ended one frees its slot, and beyond
    // the eight slots a new sequence goes to the instance with the fewest.
    let spec = SequenceSpec::from_config(&config(ACCUMULATE), Path::new("/nonexistent"))
        .unwrap()
        .unwrap();
    let sequences = Sequences::with_slots(spec, 2);
    let step = |n: u64, start: bool, end: bool| {
        let sequences = &sequences;
        async move {
            let flags = numbered(n, start, end);
            let turn = sequences.begin(flags, 1, "m").await.unwrap();
            let slot = turn.slot();
            sequences.finish(turn, &mut vec![state_out(1.0)]);
            slot
        }
    };
    let mut slot_of = Vec::new();
    for n in 1..=3 {
        slot_of.push(step(n, true, false).await);
    }
    assert_eq!(slot_of, [0, 1, 1]);
    // A sequence keeps its slot, and a restarted one too.
    assert_eq!(step(2, false, false).await, 1);
    assert_eq!(step(2, true, false).await, 1);
    for n in 4..=8 {
        slot_of.push(step(n, true, false).await);
    }
    assert_eq!(slot_of.iter().filter(|&&slot| slot == 0).count(), 4);
    // Every slot taken: the ninth goes where fewest are (a tie: the first), and so does the
    // tenth once instance 0 has one more.
    assert_eq!(step(9, true, false).await, 0);
    assert_eq!(step(10, true, false).await, 1);
    // Sequence 1 (instance 0) ends: its slot is free for the next.
    step(1, false, true).await;
    assert_eq!(step(11, true, false).await, 0);
}

#[tokio::test]
async fn initial_states_can_come_from_a_file() {
    let dir = std::env::temp_dir().join(format!("kiln-initial-state-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("initial_state")).unwrap();
    let data: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("initial_state/s.bin"), &data).unwrap();
    std::fs::write(dir.join("initial_state/short.bin"), &data[..4]).unwrap();
    let with_file = |file: &str| {
        config(&format!(
            r#"state [ {{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 2 ]
                 initial_state [ {{ data_type: TYPE_FP32 dims: [ 2 ] data_file: "{file}" }} ] }} ]"#
        ))
    };
    let error = SequenceSpec::from_config(&with_file("short.bin"), &dir).unwrap_err();
    assert!(
        error.contains("holds 4 bytes, state 'S_IN' takes 8"),
        "{error}"
    );
    let spec = SequenceSpec::from_config(&with_file("s.bin"), &dir)
        .unwrap()
        .unwrap();
    let sequences = Sequences::new(spec);
    let flags = numbered(1, true, false);
    let turn = sequences.begin(flags, 1, "m").await.unwrap();
    let inputs = sequences.inputs(&turn);
    assert_eq!(
        (inputs[0].name.as_str(), floats(&inputs[0])),
        ("S_IN", vec![1.5, 2.5])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn idle_time_counts_from_the_end_of_the_last_request() {
    let spec = SequenceSpec::from_config(&config(ACCUMULATE), Path::new("/nonexistent"))
        .unwrap()
        .unwrap();
    let sequences = Sequences::new(spec);
    let flags = |start: bool| numbered(5, start, false);
    // A request that runs longer than the 100 ms idle time...
    let turn = sequences.begin(flags(true), 1, "m").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    sequences.finish(turn, &mut vec![state_out(1.0)]);
    // ...does not make its sequence idle for the next one.
    let turn = sequences.begin(flags(false), 1, "m").await.unwrap();
    assert_eq!(floats(&sequences.inputs(&turn)[4]), [1.0, 1.0]);
}

#[tokio::test]
async fn turns_come_in_the_order_places_were_taken_whoever_asks_first() {
    let spec = SequenceSpec::from_config(&config(ACCUMULATE), Path::new("/nonexistent"))
        .unwrap()
        .unwrap();
    let sequences = Arc::new(Sequences::new(spec));
    let flags = |start: bool| numbered(9, start, false);
    // Three requests take their places, in order, before any asks for its turn.
    let first = sequences.place(flags(true), 1, "m").unwrap();
    let second = sequences.place(flags(false), 1, "m").unwrap();
    let given_up = sequences.place(flags(false), 1, "m").unwrap();
    let fourth = sequences.place(flags(false), 1, "m").unwrap();
    // The later ones ask first (as tasks scheduled out of order would): they wait.
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiting = |place: Place, name: &'static str| {
        let (sequences, order) = (Arc::clone(&sequences), Arc::clone(&order));
        tokio::spawn(async move {
            let turn = place.turn().await;
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(20)).await;
            sequences.finish(turn, &mut vec![state_out(1.0)]);
        })
    };
    let fourth = waiting(fourth, "fourth");
    let second = waiting(second, "second");
    // The third waits too, then its client goes away (its task is dropped while it waits).
    let given_up = tokio::spawn(async move { given_up.turn().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    given_up.abort();
    assert!(
        order.lock().unwrap().is_empty(),
        "a turn came before the first's"
    );
    // The first runs; the others follow in their order, the third's place passed on.
    let turn = first.turn().await;
    assert_eq!(floats(&sequences.inputs(&turn)[4]), [0.0, 0.0]);
    sequences.finish(turn, &mut vec![state_out(1.0)]);
    second.await.unwrap();
    fourth.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["second", "fourth"]);
    // A request of an unknown sequence gets no place.
    let lost = numbered(10, false, false);
    let Err(refused) = sequences.place(lost, 1, "m") else {
        panic!("a request of an unknown sequence was placed");
    };
    assert_eq!(
        refused,
        Error::InvalidArgument(
            "inference request for sequence 10 to model 'm' must specify the START flag on the \
             first request of the sequence"
                .into()
        )
    );
}

#[test]
fn an_iterative_sequences_request_without_an_id_is_a_sequence_of_its_own() {
    let iterative = SequenceSpec::from_config(
        &config("iterative_sequence: true"),
        Path::new("/nonexistent"),
    )
    .unwrap()
    .unwrap();
    let sequences = Sequences::new(iterative);
    let (first, second) = (
        sequences.flags(&request(&[]), "m").unwrap(),
        sequences
            .flags(&request(&[("sequence_id", ParamValue::Uint64(0))]), "m")
            .unwrap(),
    );
    assert!(first.start && !first.end && first.alone && second.start && second.alone);
    assert_ne!(first.id, second.id, "each has an ID of its own");
    // A request naming its sequence is in that one.
    let named = sequences
        .flags(&request(&[("sequence_id", ParamValue::Uint64(7))]), "m")
        .unwrap();
    assert_eq!(
        (named.id, named.start, named.end, named.alone),
        (CorrId::Number(7), false, false, false)
    );
    // Without iterative_sequence, a request needs its sequence's ID.
    let plain = Sequences::new(
        SequenceSpec::from_config(&config(ACCUMULATE), Path::new("/nonexistent"))
            .unwrap()
            .unwrap(),
    );
    assert_eq!(
        plain.flags(&request(&[]), "m").unwrap_err(),
        Error::InvalidArgument(
            "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
                .into()
        )
    );
}

#[tokio::test]
async fn a_sequence_of_its_own_is_over_when_its_request_is() {
    let sequences = Sequences::new(
        SequenceSpec::from_config(
            &config("iterative_sequence: true"),
            Path::new("/nonexistent"),
        )
        .unwrap()
        .unwrap(),
    );
    let flags = sequences.flags(&request(&[]), "m").unwrap();
    let turn = sequences.begin(flags, 1, "m").await.unwrap();
    assert_eq!(sequences.len(), 1);
    sequences.finish(turn, &mut Vec::new());
    assert_eq!(sequences.len(), 0, "not left to go idle");
}
