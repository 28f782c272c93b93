use super::*;

fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("kiln").chain(flags.iter().copied()))
}

fn launch(flags: &[&str]) -> Result<Launch, String> {
    parse(flags).map_err(|e| e.to_string())?.launch()
}

#[test]
fn a_triton_deployments_command_line_starts_kiln() {
    // Flags as Triton's docs and Helm charts pass them.
    let launched = launch(&[
        "--model-store=/models",
        "--strict-model-config=false",
        "--log-verbose=1",
        "--allow-gpu-metrics=0",
        "--allow-cpu-metrics=false",
        "--metrics-interval-ms=500",
        "--backend-config=onnxruntime,default-max-batch-size=16",
        "--backend-directory=/opt/tritonserver/backends",
        "--pinned-memory-pool-byte-size=268435456",
        "--cuda-memory-pool-byte-size=0:67108864",
        "--exit-on-error=true",
        "--grpc-keepalive-time=10000",
        "--grpc-keepalive-permit-without-calls=1",
        "--grpc-http2-max-pings-without-data=0",
        "--trace-file=/tmp/trace.json",
        "--trace-level=TIMESTAMPS",
        "--trace-rate=1",
        "--id=inference-7",
        "--rate-limit=off",
        "--model-load-thread-count=2",
    ])
    .unwrap();
    let config = &launched.config;
    assert_eq!(config.model_repositories, [PathBuf::from("/models")]);
    assert!(config.auto_complete && config.exit_on_error);
    assert!(!config.metrics.gpu && !config.metrics.cpu);
    assert_eq!(config.metrics.interval, Duration::from_millis(500));
    assert_eq!(config.default_max_batch_size, 16);
    assert_eq!(
        config.grpc_transport.keepalive_time,
        Duration::from_secs(10)
    );
    assert_eq!(config.server_id, "inference-7");
    assert_eq!(config.load_threads, 2);
    assert_eq!(config.trace.settings.file, "/tmp/trace.json");
    assert_eq!(config.trace.settings.rate, 1);
    assert_eq!(launched.log.verbose_level, 1);
    assert_eq!(
        config.backend_directory,
        PathBuf::from("/opt/tritonserver/backends")
    );
    // Four flags name Triton internals kiln does not have; the log says so.
    assert_eq!(launched.notes.len(), 4, "{:?}", launched.notes);
}

#[test]
fn defaults_match_tritons_where_kiln_has_the_feature() {
    let launched = launch(&["--model-repository", "/m"]).unwrap();
    let config = &launched.config;
    assert!(config.auto_complete && !config.exit_on_error);
    assert!(config.metrics.gpu && config.metrics.cpu);
    assert_eq!(config.metrics.interval, Duration::from_secs(2));
    assert_eq!(config.metrics.config, MetricsConfig::default());
    assert_eq!(config.default_max_batch_size, 4);
    assert_eq!(config.server_id, "kiln");
    assert_eq!(
        config.backend_directory,
        PathBuf::from("/opt/tritonserver/backends")
    );
    assert_eq!(config.load_threads, 4);
    assert_eq!(config.load_retries, 0);
    assert_eq!(
        config.grpc_transport.keepalive_time,
        Duration::from_secs(7200)
    );
    assert_eq!(
        config.grpc_transport.keepalive_timeout,
        Duration::from_secs(20)
    );
    assert!(!config.grpc_transport.compress_responses);
    assert_eq!(config.grpc_transport.max_connection_age, None);
    let grpc = launched.grpc.unwrap();
    assert_eq!(grpc.address.port(), 8001);
    assert!(!grpc.reuse_port);
    assert_eq!(launched.http.unwrap().address.port(), 8000);
    assert_eq!(launched.metrics.unwrap().address.port(), 8002);
    assert!(launched.notes.is_empty());
}

#[test]
fn strict_model_config_true_and_disable_auto_complete_turn_completion_off() {
    for flags in [
        &["--model-repository=/m", "--strict-model-config=true"][..],
        &["--model-repository=/m", "--disable-auto-complete-config"],
        &[
            "--model-repository=/m",
            "--disable-auto-complete-config",
            "--strict-model-config=false",
        ],
    ] {
        assert!(!launch(flags).unwrap().config.auto_complete, "{flags:?}");
    }
}

#[test]
fn endpoints_can_be_turned_off_but_not_both_inference_apis() {
    let launched = launch(&[
        "--model-repository=/m",
        "--allow-grpc=false",
        "--allow-metrics=off",
    ])
    .unwrap();
    assert!(launched.grpc.is_none() && launched.metrics.is_none() && launched.http.is_some());
    let launched = launch(&[
        "--model-repository=/m",
        "--allow-http=0",
        "--reuse-grpc-port=true",
    ])
    .unwrap();
    assert!(launched.http.is_none() && launched.grpc.unwrap().reuse_port);
    let error = launch(&[
        "--model-repository=/m",
        "--allow-http=false",
        "--allow-grpc=false",
    ])
    .unwrap_err();
    assert!(error.contains("no inference endpoint"), "{error}");
}

#[test]
fn bad_values_are_refused_naming_the_flag() {
    for (flags, needle) in [
        (&["--allow-http=maybe"][..], "expected true or false"),
        (&["--metrics-interval-ms=0"], "--metrics-interval-ms"),
        (&["--metrics-config=summary_latencies"], "--metrics-config"),
        (&["--model-config-name=a b"], "--model-config-name"),
        (&["--model-load-thread-count=0"], "model-load-thread-count"),
        (
            &["--grpc-infer-response-compression-level=max"],
            "compression-level",
        ),
        (&["--model-namespacing=true"], "--model-namespacing"),
        (&["--backend-config=onnxruntime"], "--backend-config"),
        (&["--trace-level=LOUD"], "LOUD"),
    ] {
        let mut all = vec!["--model-repository=/m"];
        all.extend_from_slice(flags);
        let error = launch(&all).unwrap_err();
        assert!(error.contains(needle), "{flags:?}: {error}");
    }
}

#[test]
fn response_compression_and_connection_age_reach_the_grpc_transport() {
    let launched = launch(&[
        "--model-repository=/m",
        "--grpc-infer-response-compression-level=high",
        "--grpc-max-connection-age=60000",
        "--grpc-max-connection-age-grace=5000",
    ])
    .unwrap();
    let transport = &launched.config.grpc_transport;
    assert!(transport.compress_responses);
    assert_eq!(transport.max_connection_age, Some(Duration::from_secs(60)));
    assert_eq!(
        transport.max_connection_age_grace,
        Some(Duration::from_secs(5))
    );
}

#[test]
fn trace_config_wins_over_the_older_trace_flags() {
    let launched = launch(&[
        "--model-repository=/m",
        "--trace-rate=5",
        "--trace-config=rate=7",
    ])
    .unwrap();
    assert_eq!(launched.config.trace.settings.rate, 7);
}

#[test]
fn a_flag_given_twice_keeps_its_last_value_and_repeatable_ones_add_up() {
    let launched = launch(&[
        "--model-repository=/a",
        "--model-repository=/b",
        "--grpc-port=1",
        "--grpc-port=2",
        "--metrics-config=summary_latencies=true",
        "--metrics-config=counter_latencies=false",
    ])
    .unwrap();
    assert_eq!(
        launched.config.model_repositories,
        [PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert_eq!(launched.grpc.unwrap().address.port(), 2);
    let metrics = &launched.config.metrics.config;
    assert!(metrics.summary_latencies && !metrics.counter_latencies);
}

#[test]
fn the_rate_limiter_is_off_unless_asked_for() {
    let off = launch(&["--model-repository=/m", "--rate-limit-resource=R:2"]).unwrap();
    assert!(off.config.rate_limit.is_none());
    assert!(
        off.notes[0].contains("without --rate-limit=execution_count"),
        "{:?}",
        off.notes
    );
    let on = launch(&[
        "--model-repository=/m",
        "--rate-limit=execution_count",
        "--rate-limit-resource=R:2:0",
    ])
    .unwrap();
    assert!(on.config.rate_limit.is_some() && on.notes.is_empty());
    let error = launch(&["--model-repository=/m", "--rate-limit-resource=R"]).unwrap_err();
    assert!(
        error.contains("--rate-limit-resource R: expected"),
        "{error}"
    );
    let error = launch(&["--model-repository=/m", "--rate-limit=fair"]).unwrap_err();
    assert!(
        error.starts_with(
            "error: invalid value 'fair' for '--rate-limit <RATE_LIMIT>'\n  \
             [possible values: off, execution_count]"
        ),
        "{error}"
    );
}

#[test]
fn the_transport_limits_have_defaults_and_flags() {
    let defaults = launch(&["--model-repository=/m"]).unwrap().config.limits;
    assert_eq!(defaults.header_timeout, Duration::from_secs(30));
    assert_eq!(defaults.body_timeout, Duration::from_secs(60));
    assert_eq!(defaults.idle_timeout, Duration::from_secs(60));
    assert!(defaults.max_connections >= 64);
    assert_eq!(defaults.http2_max_concurrent_streams, 256);
    assert_eq!(defaults.grpc_max_decompressed_bytes, 256 << 20);
    assert_eq!(defaults.grpc_max_decode_bytes, 64 << 20);
    let set = launch(&[
        "--model-repository=/m",
        "--http-header-timeout-secs=0.5",
        "--http-body-timeout-secs=2",
        "--http-idle-timeout-secs=3",
        "--max-connections=100",
        "--http2-max-concurrent-streams=8",
        "--http2-max-pending-reset-streams=5",
        "--http2-max-local-error-reset-streams=6",
        "--grpc-max-decompressed-bytes=1000",
        "--grpc-max-decode-bytes=10",
    ])
    .unwrap()
    .config
    .limits;
    assert_eq!(set.header_timeout, Duration::from_millis(500));
    assert_eq!(set.body_timeout, Duration::from_secs(2));
    assert_eq!(set.idle_timeout, Duration::from_secs(3));
    assert_eq!(set.max_connections, 100);
    assert_eq!(set.http2_max_concurrent_streams, 8);
    assert_eq!(set.http2_max_pending_reset_streams, 5);
    assert_eq!(set.http2_max_local_error_reset_streams, 6);
    assert_eq!(set.grpc_max_decompressed_bytes, 1000);
    assert_eq!(set.grpc_max_decode_bytes, 10);
    for bad in [
        "--http-body-timeout-secs=0",
        "--http-header-timeout-secs=-1",
        "--grpc-max-decode-bytes=0",
        "--http2-max-concurrent-streams=0",
    ] {
        let error = launch(&["--model-repository=/m", bad]).unwrap_err();
        assert!(error.contains(bad.split('=').next().unwrap()), "{error}");
    }
}
