use super::*;
use crate::trace::settings::{from_flags, TraceMode};

fn flags(values: &[&str]) -> Result<crate::trace::TraceConfig, String> {
    from_flags(&values.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

#[test]
fn traceparent_headers_are_read_as_w3c_writes_them() {
    let context =
        SpanContext::parse("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01").unwrap();
    assert_eq!(context.trace_id[..2], [0x0a, 0xf7]);
    assert_eq!(context.span_id[7], 0x24);
    for bad in [
        "",
        "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424",
        "00-0af7651916cd43dd8448eb211c12666c-b7ad6b71692424-01",
        "00-00000000000000000000000000000000-b7ad6b7169242424-01",
        "00-0af7651916cd43dd8448eb211c12666c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01",
        "00-0AF7651916CD43DD8448EB211C12666C-b7ad6b7169242424-01",
        "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-extra",
        "00-0af7651916cd43dd8448eb211c12666g-b7ad6b7169242424-01",
    ] {
        assert_eq!(SpanContext::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn opentelemetry_flags_need_no_file_and_allow_rate_zero() {
    let config = flags(&[
        "mode=opentelemetry",
        "level=TIMESTAMPS",
        "rate=0",
        "opentelemetry,url=collector:4318/v1/traces",
        "opentelemetry,resource=service.name=triton",
        "opentelemetry,resource=test.key=test.value",
        "opentelemetry,bsp_schedule_delay=100",
    ])
    .unwrap();
    assert_eq!(config.settings.mode, TraceMode::OpenTelemetry);
    assert_eq!(config.settings.invalid_reason(), None);
    let otel = config.otel.unwrap();
    assert_eq!(otel.url, "http://collector:4318/v1/traces");
    assert_eq!(
        otel.resource,
        [
            ("service.name".to_string(), "triton".to_string()),
            ("test.key".to_string(), "test.value".to_string())
        ]
    );
    assert_eq!(otel.schedule_delay_ms, 100);
    let report = config.settings.report();
    assert_eq!(report.last().unwrap().1, ["opentelemetry"]);
    // Triton mode still needs its file and a rate.
    assert_eq!(
        flags(&["level=TIMESTAMPS"]).unwrap_err(),
        "--trace-config: tracing needs a file (triton,file=<path>)"
    );
    assert!(flags(&["mode=triton"]).unwrap().otel.is_none());
    for (bad, needle) in [
        ("mode=jaeger", "the trace modes are"),
        ("opentelemetry,port=1", "unknown opentelemetry setting"),
        ("opentelemetry,bsp_max_queue_size=0", "positive integer"),
        (
            "opentelemetry,bsp_max_export_batch_size=4096",
            "must not exceed",
        ),
        ("opentelemetry,resource=novalue", "resource must be"),
    ] {
        let error = flags(&["mode=opentelemetry", bad]).unwrap_err();
        assert!(error.contains(needle), "{bad}: {error}");
    }
}

#[test]
fn environment_resource_attributes_fill_in_what_flags_leave() {
    let config = OtelConfig::default()
        .with_environment(Some("service.name=env,deployment.environment=prod,broken"));
    assert_eq!(
        config.resource,
        [
            ("service.name".to_string(), "kiln".to_string()),
            ("deployment.environment".to_string(), "prod".to_string())
        ]
    );
}

fn request(id: u64, model: &str, base: u64) -> OtelTrace {
    OtelTrace {
        model: model.into(),
        version: 1,
        request_id: "r1".into(),
        events: vec![
            (Activity::HttpRecvStart, base),
            (Activity::RequestStart, base + 10),
            (Activity::QueueStart, base + 20),
            (Activity::ComputeStart, base + 30),
            (Activity::ComputeInputEnd, base + 40),
            (Activity::ComputeOutputStart, base + 50),
            (Activity::ComputeEnd, base + 60),
            (Activity::RequestEnd, base + 70),
            (Activity::HttpSendEnd, base + 80),
        ],
        ..OtelTrace::new(id, None)
    }
}

fn names(span: &wire::Span) -> Vec<&str> {
    span.events.iter().map(|e| e.name.as_str()).collect()
}

#[test]
fn a_request_becomes_tritons_three_spans() {
    let spans = request(7, "add_sub", 1000).spans(None);
    assert_eq!(spans.len(), 3);
    let (root, model, compute) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(root.name, "InferRequest");
    assert!(root.parent_span_id.is_empty());
    assert_eq!(names(root), ["HTTP_RECV_START", "HTTP_SEND_END"]);
    assert_eq!(
        (root.start_time_unix_nano, root.end_time_unix_nano),
        (1000, 1080)
    );
    assert_eq!(model.name, "add_sub");
    assert_eq!(model.parent_span_id, root.span_id);
    assert_eq!(
        names(model),
        ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    );
    // Triton 2.51's attributes, a client's request with parent 0.
    assert_eq!(
        model.attributes,
        [
            wire::KeyValue::string("triton.model_name", "add_sub"),
            wire::KeyValue::int("triton.model_version", 1),
            wire::KeyValue::int("triton.trace_id", 7),
            wire::KeyValue::int("triton.trace_parent_id", 0),
            wire::KeyValue::string("triton.request_id", "r1"),
        ]
    );
    assert!(spans.iter().all(|s| s.kind == wire::SPAN_KIND_SERVER));
    assert_eq!(compute.name, "compute");
    assert_eq!(compute.parent_span_id, model.span_id);
    assert_eq!(
        names(compute),
        [
            "COMPUTE_START",
            "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START",
            "COMPUTE_END"
        ]
    );
    assert_eq!(
        (compute.start_time_unix_nano, compute.end_time_unix_nano),
        (1030, 1060)
    );
    assert!(spans
        .iter()
        .all(|s| s.trace_id == root.trace_id && s.trace_id.len() == 16));
    assert!(spans.iter().all(|s| s.span_id.len() == 8));
}

#[test]
fn ensemble_steps_nest_under_the_ensemble_and_a_caller_context_is_joined() {
    let remote =
        SpanContext::parse("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01").unwrap();
    let mut ensemble = OtelTrace {
        model: "ensemble".into(),
        version: 1,
        events: vec![
            (Activity::GrpcWaitreadEnd, 0),
            (Activity::RequestStart, 5),
            (Activity::RequestEnd, 500),
            (Activity::GrpcSendEnd, 510),
        ],
        ..OtelTrace::new(1, Some(remote))
    };
    for (id, model) in [(2, "add"), (3, "sub")] {
        let mut step = request(id, model, 100);
        step.events.retain(|(a, _)| !a.is_protocol());
        ensemble.children.push(OtelTrace {
            model: step.model,
            events: step.events,
            version: 1,
            ..ensemble.child(id)
        });
    }
    // The context a Python model is given is its model span's, in the caller's trace.
    let context = ensemble.context();
    let spans = ensemble.spans(Some(remote));
    let by_name = |name: &str| spans.iter().find(|s| s.name == name).unwrap();
    assert_eq!(spans.len(), 6); // root, ensemble, 2 × (model, compute)
    let root = by_name("InferRequest");
    assert_eq!(root.trace_id, remote.trace_id);
    assert_eq!(root.parent_span_id, remote.span_id);
    assert_eq!(by_name("ensemble").parent_span_id, root.span_id);
    let ensemble_span = hex(&by_name("ensemble").span_id);
    assert_eq!(
        context,
        format!(r#"{{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-{ensemble_span}-01"}}"#)
    );
    assert_eq!(by_name("add").parent_span_id, by_name("ensemble").span_id);
    assert!(by_name("sub")
        .attributes
        .contains(&wire::KeyValue::int("triton.trace_parent_id", 1)));
    // The ensemble itself computes nothing: no compute span of its own.
    let computes = spans.iter().filter(|s| s.name == "compute").count();
    assert_eq!(computes, 2);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_collector_that_is_down_loses_spans_but_never_blocks() {
    // Port 9 (discard) on loopback: nothing listens, so every POST fails at once.
    let config = OtelConfig {
        url: "http://127.0.0.1:9/v1/traces".into(),
        schedule_delay_ms: 10,
        max_queue_size: 4,
        max_export_batch_size: 2,
        ..OtelConfig::default()
    };
    let exporter = Exporter::start(config).unwrap();
    for id in 0..3 {
        // 3 spans each: the second push finds the queue full (4) and is dropped.
        exporter.push(request(id, "m", 1000).spans(None));
    }
    exporter.flush(std::time::Duration::from_secs(30));
    assert_eq!(exporter.queued(), 0);
    assert!(exporter.dropped() >= 3, "{}", exporter.dropped());
}
