use super::*;
use axum::http::HeaderValue;

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.insert(*k, HeaderValue::from_static(v));
    }
    map
}

fn specs(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn constant_time_comparison() {
    assert!(constant_time_eq(b"secret", b"secret"));
    assert!(!constant_time_eq(b"secret", b"secreT"));
    assert!(!constant_time_eq(b"secret", b"secret2"));
    assert!(!constant_time_eq(b"secret", b"secre"));
    assert!(!constant_time_eq(b"secret", b""));
    assert!(constant_time_eq(b"", b""));
    // A missing byte never compares equal to a zero byte.
    assert!(!constant_time_eq(b"\0", b""));
}

#[test]
fn secrets_never_print() {
    let policy = AccessPolicy::parse(&specs(&["inference:k=hunter2"]), "f", "")
        .unwrap()
        .with_bearer_token(Some(Secret::new("tok3n")));
    let debug = format!("{policy:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains("tok3n"),
        "{debug}"
    );
    assert!(!policy.describe().join(" ").contains("hunter2"));
}

#[test]
fn parses_triton_flags_and_checks_headers() {
    let policy = AccessPolicy::parse(
        &specs(&[
            "model-repository:admin-key=admin-value",
            "inference, health:Infer-Key=a:b=c",
        ]),
        "grpc-restricted-protocol",
        GRPC_HEADER_PREFIX,
    )
    .unwrap();
    let admin = headers(&[("triton-grpc-protocol-admin-key", "admin-value")]);
    let infer = headers(&[("triton-grpc-protocol-infer-key", "a:b=c")]);
    assert_eq!(policy.check(ApiGroup::ModelRepository, &admin), Ok(()));
    assert_eq!(
        policy.check(ApiGroup::ModelRepository, &infer),
        Err(Denied::Restricted {
            header: "triton-grpc-protocol-admin-key".into()
        })
    );
    assert_eq!(policy.check(ApiGroup::Inference, &infer), Ok(()));
    assert_eq!(policy.check(ApiGroup::Health, &infer), Ok(()));
    assert!(policy.check(ApiGroup::Health, &HeaderMap::new()).is_err());
    // Unrestricted groups need nothing.
    assert_eq!(
        policy.check(ApiGroup::Statistics, &HeaderMap::new()),
        Ok(())
    );
    let wrong = headers(&[("triton-grpc-protocol-infer-key", "a:b=C")]);
    assert!(policy.check(ApiGroup::Inference, &wrong).is_err());
    assert_eq!(
        Denied::Restricted {
            header: "admin-key".into()
        }
        .message("API"),
        "This API is restricted, expecting header 'admin-key'"
    );
}

#[test]
fn rejects_what_triton_rejects_without_echoing_values() {
    let parse = |list: &[&str]| AccessPolicy::parse(&specs(list), "http-restricted-api", "");
    assert_eq!(
        parse(&["model-reposit,health:k1=v1"]).unwrap_err(),
        "unknown restricted api 'model-reposit'"
    );
    assert_eq!(
        parse(&["model-repository,health:k1=v1", "metadata,health:k2=v2"]).unwrap_err(),
        "api 'health' can not be specified in multiple config groups"
    );
    for bad in [
        "health",
        "health:novalue",
        "health:=v",
        "health:k=",
        "health:bad key=v",
    ] {
        let err = parse(&[bad]).unwrap_err();
        assert!(err.starts_with("--http-restricted-api expects"), "{err}");
        assert!(
            !err.contains("novalue") && !err.contains("bad key"),
            "{err}"
        );
    }
    assert!(parse(&[]).unwrap().is_open());
}

#[test]
fn bearer_token_guards_inference_only() {
    let policy = AccessPolicy::default().with_bearer_token(Some(Secret::new("t0k")));
    assert!(!policy.is_open());
    for good in ["Bearer t0k", "bearer t0k", "BEARER  t0k "] {
        let mut map = HeaderMap::new();
        map.insert(header::AUTHORIZATION, HeaderValue::from_str(good).unwrap());
        assert_eq!(policy.check(ApiGroup::Inference, &map), Ok(()), "{good}");
    }
    for bad in ["Bearer t0kk", "Basic t0k", "t0k", "Bearer", ""] {
        let mut map = HeaderMap::new();
        map.insert(header::AUTHORIZATION, HeaderValue::from_str(bad).unwrap());
        assert_eq!(
            policy.check(ApiGroup::Inference, &map),
            Err(Denied::Unauthenticated),
            "{bad}"
        );
    }
    assert_eq!(
        policy.check(ApiGroup::Inference, &HeaderMap::new()),
        Err(Denied::Unauthenticated)
    );
    assert_eq!(policy.check(ApiGroup::Metadata, &HeaderMap::new()), Ok(()));
}

#[test]
fn grpc_methods_map_to_triton_groups() {
    use grpc::group_of;
    let method = |m: &str| group_of(&format!("/inference.GRPCInferenceService/{m}"));
    assert_eq!(method("ModelInfer"), Some(ApiGroup::Inference));
    assert_eq!(method("ModelStreamInfer"), Some(ApiGroup::Inference));
    assert_eq!(method("ServerLive"), Some(ApiGroup::Health));
    assert_eq!(method("ModelReady"), Some(ApiGroup::Health));
    assert_eq!(method("ModelMetadata"), Some(ApiGroup::Metadata));
    assert_eq!(method("ModelConfig"), Some(ApiGroup::ModelConfig));
    assert_eq!(method("ModelStatistics"), Some(ApiGroup::Statistics));
    assert_eq!(
        method("RepositoryModelUnload"),
        Some(ApiGroup::ModelRepository)
    );
    assert_eq!(
        method("CudaSharedMemoryRegister"),
        Some(ApiGroup::SharedMemory)
    );
    assert_eq!(method("LogSettings"), Some(ApiGroup::Logging));
    assert_eq!(method("TraceSetting"), Some(ApiGroup::Trace));
    assert_eq!(
        group_of("/grpc.health.v1.Health/Check"),
        Some(ApiGroup::Health)
    );
    assert_eq!(
        group_of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
        None
    );
    assert_eq!(group_of("garbage"), None);
}

#[test]
fn rest_paths_map_to_triton_groups() {
    use http::{also_of, group_of};
    let cases = [
        ("/v2", Some(ApiGroup::Metadata)),
        ("/v2/", Some(ApiGroup::Metadata)),
        ("/v2/health/ready", Some(ApiGroup::Health)),
        ("/v2/models/m", Some(ApiGroup::Metadata)),
        ("/v2/models/m/versions/2", Some(ApiGroup::Metadata)),
        ("/v2/models/m/ready", Some(ApiGroup::Health)),
        ("/v2/models/m/versions/1/infer", Some(ApiGroup::Inference)),
        ("/v2/models/m/generate_stream", Some(ApiGroup::Inference)),
        ("/v2/models/m/config", Some(ApiGroup::ModelConfig)),
        ("/v2/models/m/versions/1/stats", Some(ApiGroup::Statistics)),
        ("/v2/models/stats", Some(ApiGroup::Statistics)),
        ("/v2/models/m/trace/setting", Some(ApiGroup::Trace)),
        ("/v2/repository/index", Some(ApiGroup::ModelRepository)),
        (
            "/v2/repository/models/m/load",
            Some(ApiGroup::ModelRepository),
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            Some(ApiGroup::SharedMemory),
        ),
        ("/v2/logging", Some(ApiGroup::Logging)),
        ("/v2/trace/setting", Some(ApiGroup::Trace)),
        ("/v2/openapi.json", Some(ApiGroup::Metadata)),
        ("/console/status", Some(ApiGroup::Statistics)),
        ("/console", None),
        // SageMaker's service.
        ("/ping", Some(ApiGroup::Health)),
        ("/invocations", Some(ApiGroup::Inference)),
        ("/models", Some(ApiGroup::ModelRepository)),
        ("/models/4a8f", Some(ApiGroup::ModelRepository)),
        ("/models/4a8f/invoke", Some(ApiGroup::Inference)),
        // The OpenAI-compatible API.
        ("/health", Some(ApiGroup::Health)),
        ("/health/ready", Some(ApiGroup::Health)),
        ("/v1/models", Some(ApiGroup::Metadata)),
        ("/v1/models/m", Some(ApiGroup::Metadata)),
        ("/v1/completions", Some(ApiGroup::Inference)),
        ("/v1/chat/completions", Some(ApiGroup::Inference)),
        ("/v1/embeddings", Some(ApiGroup::Inference)),
        ("/metrics", None),
        ("/", None),
    ];
    for (path, group) in cases {
        assert_eq!(group_of(path), group, "{path}");
    }
    // The status page's data holds the repository index too.
    for (path, also) in [
        ("/console/status", Some(ApiGroup::ModelRepository)),
        ("/console/status/", Some(ApiGroup::ModelRepository)),
        ("/console", None),
        ("/v2/models/stats", None),
    ] {
        assert_eq!(also_of(path), also, "{path}");
    }
}
