use super::settings::from_flags;
use super::*;
use bytes::Bytes;
use serde_json::Value;
use std::path::PathBuf;

/// A fresh directory under the system's temporary one.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-trace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tracing_to(path: &std::path::Path) -> TraceSettings {
    TraceSettings {
        level: Level::TIMESTAMPS,
        rate: 1,
        file: path.display().to_string(),
        ..TraceSettings::default()
    }
}

fn read_json(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str::<Value>(&text)
        .unwrap_or_else(|e| panic!("{path:?} is not JSON ({e}): {text}"))
        .as_array()
        .expect("an array")
        .clone()
}

fn update(pairs: &[(&str, Option<&[&str]>)]) -> TraceUpdate {
    let mut update = TraceUpdate::default();
    for (key, values) in pairs {
        let values: Option<Vec<String>> = values.map(|v| v.iter().map(|s| s.to_string()).collect());
        update.set(key, values.as_deref()).unwrap();
    }
    update
}

#[test]
fn levels_read_and_print_as_triton_names_them() {
    assert_eq!(Level::parse(&["OFF"]).unwrap(), Level::OFF);
    let both = Level::parse(&["TENSORS", "TIMESTAMPS"]).unwrap();
    assert!(both.contains(Level::TIMESTAMPS) && both.contains(Level::TENSORS));
    assert_eq!(both.names(), ["TIMESTAMPS", "TENSORS"]);
    assert_eq!(Level::OFF.names(), ["OFF"]);
    assert!(!Level::OFF.contains(Level::OFF));
    let err = Level::parse(&["OFF", "TIMESTAMPS"]).unwrap_err();
    assert_eq!(
        err.message(),
        "Expect only one trace level 'OFF' is specified"
    );
    assert_eq!(
        Level::parse(&["BOGUS"]).unwrap_err(),
        Error::InvalidArgument(
            "unknown trace level 'BOGUS': expected OFF, TIMESTAMPS or TENSORS".into()
        )
    );
}

#[test]
fn updates_parse_tritons_strings_and_errors() {
    let mut u = TraceUpdate::default();
    u.set("trace_rate", Some(&["5".into()])).unwrap();
    u.set("trace_count", Some(&["-1".into()])).unwrap();
    u.set("log_frequency", None).unwrap();
    u.set("trace_level", Some(&["TIMESTAMPS".into()])).unwrap();
    assert_eq!(
        u,
        TraceUpdate {
            level: Change::Set(Level::TIMESTAMPS),
            rate: Change::Set(5),
            count: Change::Set(-1),
            log_frequency: Change::Clear,
        }
    );
    let error = |key: &str, value: &str| {
        TraceUpdate::default()
            .set(key, Some(&[value.to_string()]))
            .unwrap_err()
    };
    assert_eq!(
        error("trace_rate", "abc").message(),
        "Unable to parse 'trace_rate', got: abc"
    );
    assert_eq!(
        error("trace_rate", "99999999999").message(),
        "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"
    );
    assert_eq!(
        error("trace_count", "-2").message(),
        "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"
    );
    assert!(matches!(error("trace_file", "x"), Error::Unsupported(_)));
    assert!(matches!(error("bogus", "1"), Error::InvalidArgument(_)));
    let two = TraceUpdate::default()
        .set("trace_rate", Some(&["1".into(), "2".into()]))
        .unwrap_err();
    assert_eq!(two.message(), "expect only 1 value for 'trace_rate'");
}

#[test]
fn flags_read_like_tritonservers() {
    let flags =
        |values: &[&str]| from_flags(&values.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(flags(&[]).unwrap().settings, TraceSettings::default());
    let settings = flags(&[
        "level=TIMESTAMPS",
        "level=TENSORS",
        "rate=1",
        "count=10",
        "mode=triton",
        "triton,file=/tmp/t.json",
        "triton,log-frequency=50",
        "triton,file-limit=7",
    ])
    .unwrap()
    .settings;
    assert_eq!(
        settings,
        TraceSettings {
            level: Level::parse(&["TIMESTAMPS", "TENSORS"]).unwrap(),
            rate: 1,
            count: 10,
            log_frequency: 50,
            file: "/tmp/t.json".into(),
            file_limit: 7,
            mode: crate::trace::TraceMode::Triton,
        }
    );
    for (bad, why) in [
        (
            "level=TIMESTAMPS",
            "--trace-config: tracing needs a file (triton,file=<path>)",
        ),
        (
            "rate=x",
            "--trace-config rate=x: Unable to parse 'rate', got: x",
        ),
        (
            "mode=zipkin",
            "--trace-config mode=zipkin: the trace modes are 'triton' and 'opentelemetry'",
        ),
        (
            "color=blue",
            "--trace-config color=blue: unknown setting 'color'",
        ),
        ("rate", "--trace-config rate: expected <setting>=<value>"),
    ] {
        assert_eq!(flags(&[bad]).unwrap_err(), why, "{bad:?}");
    }
}

#[test]
fn model_settings_mirror_global_fields_they_do_not_set() {
    let dir = scratch("mirror");
    let tracer = Tracer::new(TraceSettings {
        file: dir.join("t.json").display().to_string(),
        ..TraceSettings::default()
    });
    assert!(tracer.sample("m").is_none());
    let model = tracer
        .update(
            "m",
            &update(&[
                ("trace_level", Some(&["TIMESTAMPS"])),
                ("trace_rate", Some(&["1"])),
            ]),
        )
        .unwrap();
    assert_eq!(
        (model.level, model.rate, model.log_frequency),
        (Level::TIMESTAMPS, 1, 0)
    );
    // A later global change reaches the fields the model mirrors, not the ones it set.
    tracer
        .update(
            "",
            &update(&[
                ("log_frequency", Some(&["7"])),
                ("trace_rate", Some(&["9"])),
            ]),
        )
        .unwrap();
    let model = tracer.settings("m");
    assert_eq!((model.rate, model.log_frequency), (1, 7));
    assert_eq!(tracer.settings("other").rate, 9);
    // Only model m traces.
    assert!(tracer.sample("m").is_some());
    assert!(tracer.sample("other").is_none());
    // Clearing every field it set makes the model follow the global settings again.
    tracer
        .update("m", &update(&[("trace_level", None), ("trace_rate", None)]))
        .unwrap();
    assert_eq!(tracer.settings("m"), tracer.settings(""));
    assert!(tracer.sample("m").is_none());
    // Cleared global fields return to the start-up values.
    let global = tracer
        .update(
            "",
            &update(&[("trace_rate", None), ("log_frequency", None)]),
        )
        .unwrap();
    assert_eq!(global, tracer.lock().default);
}

#[test]
fn settings_that_cannot_trace_are_refused_unless_off() {
    let tracer = Tracer::new(TraceSettings::default());
    let error = tracer
        .update("", &update(&[("trace_level", Some(&["TIMESTAMPS"]))]))
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Attempting to set invalid trace setting :trace file name is not given"
    );
    // Off, any rate is accepted (Triton's rule).
    let settings = tracer
        .update("", &update(&[("trace_rate", Some(&["0"]))]))
        .unwrap();
    assert_eq!(settings.rate, 0);
    let dir = scratch("invalid");
    let tracer = Tracer::new(tracing_to(&dir.join("t.json")));
    let error = tracer
        .update("", &update(&[("trace_rate", Some(&["0"]))]))
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Attempting to set invalid trace setting :sample rate must be non-zero"
    );
}

#[test]
fn rate_and_count_choose_which_requests_are_traced() {
    let dir = scratch("rate");
    let tracer = Tracer::new(TraceSettings {
        rate: 3,
        count: 2,
        ..tracing_to(&dir.join("t.json"))
    });
    let traced: Vec<bool> = (0..12)
        .map(|_| tracer.sample("m").map(|t| t.describe("m", 1, "")).is_some())
        .collect();
    assert_eq!(
        traced,
        [false, false, true, false, false, true, false, false, false, false, false, false]
    );
    assert_eq!(tracer.settings("").count, 0);
    // A count of traces, once taken, goes to a numbered file as soon as the last one ends.
    let records = read_json(&dir.join("t.json.0"));
    let ids: Vec<u64> = records.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn traces_are_written_in_tritons_layout() {
    let dir = scratch("layout");
    let path = dir.join("t.json");
    let tracer = Tracer::new(TraceSettings {
        level: Level::parse(&["TIMESTAMPS", "TENSORS"]).unwrap(),
        ..tracing_to(&path)
    });
    let start = Instant::now();
    {
        let trace = tracer.sample("m").unwrap();
        trace.record(Activity::HttpRecvStart, start);
        trace.describe("m", 3, "req \"1\"");
        trace.record(
            Activity::RequestStart,
            start + std::time::Duration::from_micros(5),
        );
        trace.tensors(
            TensorActivity::QueueInput,
            &[Tensor::new(
                "IN",
                crate::core::DataType::Fp32,
                vec![1, 2],
                Bytes::from([1.5f32.to_le_bytes(), (-2f32).to_le_bytes()].concat()),
            )],
        );
        let on_send = RecordOnDrop {
            trace: Arc::clone(&trace),
            activity: Activity::HttpSendEnd,
        };
        drop(trace);
        // Still held by the response body: nothing written yet.
        tracer.flush();
        assert!(!path.exists());
        drop(on_send);
    }
    let untraced_model = tracer.sample("n").unwrap();
    untraced_model.describe("n", 1, "");
    drop(untraced_model);
    tracer.flush();
    let records = read_json(&path);
    assert_eq!(records.len(), 6, "{records:?}");
    assert_eq!(records[0]["id"], 1);
    assert_eq!(records[0]["timestamps"][0]["name"], "HTTP_RECV_START");
    assert_eq!(
        records[1],
        serde_json::json!({"id": 1, "model_name": "m", "model_version": 3, "request_id": "req \"1\""})
    );
    let ns = |i: usize| records[i]["timestamps"][0]["ns"].as_u64().unwrap();
    assert_eq!(ns(2) - ns(0), 5_000);
    assert_eq!(
        records[3],
        serde_json::json!({"id": 1, "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "IN", "data": "1.5,-2", "shape": "1,2", "dtype": "FP32"}})
    );
    assert_eq!(records[4]["timestamps"][0]["name"], "HTTP_SEND_END");
    assert_eq!(
        records[5],
        serde_json::json!({"id": 2, "model_name": "n", "model_version": 1})
    );
    // Later flushes extend the same array, which stays valid JSON.
    drop(tracer.sample("m").unwrap());
    tracer.flush();
    assert_eq!(read_json(&path).len(), 6);
}

#[test]
fn log_frequency_splits_traces_into_numbered_files() {
    let dir = scratch("frequency");
    let path = dir.join("t.json");
    let tracer = Tracer::new(TraceSettings {
        log_frequency: 2,
        ..tracing_to(&path)
    });
    for _ in 0..5 {
        let trace = tracer.sample("m").unwrap();
        trace.record(Activity::RequestStart, Instant::now());
    }
    let ids = |file: &str| -> Vec<u64> {
        read_json(&dir.join(file))
            .iter()
            .map(|record| record["id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ids("t.json.0"), [1, 2]);
    assert_eq!(ids("t.json.1"), [3, 4]);
    assert!(!dir.join("t.json.2").exists());
    // Replacing the setting writes the rest.
    tracer
        .update("", &update(&[("trace_rate", Some(&["2"]))]))
        .unwrap();
    assert_eq!(ids("t.json.2"), [5]);
    assert!(!path.exists());
}

#[test]
fn without_a_log_frequency_memory_stays_bounded() {
    let dir = scratch("bounded");
    let path = dir.join("t.json");
    let tracer = Tracer::new(tracing_to(&path));
    let mut traces = 0;
    while !path.exists() {
        let trace = tracer.sample("m").unwrap();
        trace.describe("m", 1, &"x".repeat(1000));
        traces += 1;
        assert!(traces < 2_000, "1 MiB of traces was never written");
    }
    // Everything so far is in the file, which is complete JSON, and nothing is pending.
    assert_eq!(read_json(&path).len(), traces);
    assert_eq!(tracer.lock().global.lock().pending_traces, 0);
}

#[test]
fn with_a_huge_log_frequency_memory_stays_bounded() {
    // A client may set log_frequency to u32::MAX through the trace API.
    let dir = scratch("bounded-frequency");
    let path = dir.join("t.json");
    let tracer = Tracer::new(TraceSettings {
        log_frequency: u32::MAX,
        ..tracing_to(&path)
    });
    let first = dir.join("t.json.0");
    let mut traces = 0;
    while !first.exists() {
        let trace = tracer.sample("m").unwrap();
        trace.describe("m", 1, &"x".repeat(1000));
        traces += 1;
        assert!(traces < 2_000, "1 MiB of traces was never written");
    }
    assert_eq!(read_json(&first).len(), traces);
    assert_eq!(tracer.lock().global.lock().pending_traces, 0);
}

#[test]
fn monotonic_nanoseconds_follow_instants() {
    let now = Instant::now();
    let later = now + std::time::Duration::from_millis(3);
    assert_eq!(monotonic_ns(later) - monotonic_ns(now), 3_000_000);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in monotonic_ns.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let clock = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    let ours = monotonic_ns(Instant::now());
    assert!(ours.abs_diff(clock) < 50_000_000, "{ours} vs {clock}");
}

#[test]
fn an_ensemble_steps_traces_are_written_with_their_parent() {
    let dir = scratch("children");
    let path = dir.join("t.json");
    let tracer = Tracer::new(TraceSettings {
        count: 1,
        ..tracing_to(&path)
    });
    let parent = tracer.sample("e").unwrap();
    parent.describe("e", 1, "r");
    let child = parent.child();
    child.describe("add_sub", 1, "r");
    child.record(Activity::RequestStart, Instant::now());
    drop(parent);
    // The step is still running: nothing is written yet.
    assert!(!dir.join("t.json.0").exists());
    drop(child);
    let records = read_json(&dir.join("t.json.0"));
    assert_eq!(
        records[0],
        serde_json::json!({"id": 1, "model_name": "e", "model_version": 1, "request_id": "r"})
    );
    assert_eq!(
        records[1],
        serde_json::json!({"id": 2, "model_name": "add_sub", "model_version": 1,
                           "request_id": "r", "parent_id": 1})
    );
    assert_eq!(records[2]["id"], 2);
    // The child is part of its parent's trace, not one more of the count.
    assert_eq!(tracer.settings("").count, 0);
}
