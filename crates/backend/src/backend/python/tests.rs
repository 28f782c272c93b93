use super::*;
use crate::core::DataType;
use crate::proto::inference::{ModelInstanceGroup, ModelParameter};

fn config(groups: Vec<ModelInstanceGroup>) -> ModelConfig {
    ModelConfig {
        name: "py".into(),
        backend: BACKEND.into(),
        instance_group: groups,
        ..Default::default()
    }
}

#[test]
fn instance_groups_become_named_instances() {
    let mut plain = config(Vec::new());
    let spec = PythonSpec::from_config(
        &mut plain,
        Path::new("/m"),
        &ModelCaller::default(),
        &StubEnvironment::default(),
    )
    .unwrap();
    assert_eq!(
        spec.instances,
        [Instance {
            name: "py_0".into(),
            kind: "CPU",
            device: 0,
            group: 0
        }]
    );
    // As Triton: the group a config leaves out takes the model's name.
    assert_eq!(plain.instance_group[0].name, "py");
    assert_eq!(plain.instance_group[0].count, 1);
    let mut groups = config(vec![
        ModelInstanceGroup {
            count: 2,
            kind: Kind::Auto as i32,
            ..Default::default()
        },
        ModelInstanceGroup {
            name: "gpus".into(),
            kind: Kind::Gpu as i32,
            gpus: vec![1, 3],
            ..Default::default()
        },
        ModelInstanceGroup {
            name: "placed".into(),
            kind: Kind::Model as i32,
            ..Default::default()
        },
    ]);
    let spec = PythonSpec::from_config(
        &mut groups,
        Path::new("/m"),
        &ModelCaller::default(),
        &StubEnvironment::default(),
    )
    .unwrap();
    let described: Vec<(&str, &str, i32, usize)> = spec
        .instances
        .iter()
        .map(|i| (i.name.as_str(), i.kind, i.device, i.group))
        .collect();
    assert_eq!(
        described,
        [
            ("py_0_0", "CPU", 0, 0),
            ("py_0_1", "CPU", 0, 0),
            ("gpus_0", "GPU", 1, 1),
            ("gpus_1", "GPU", 3, 1),
            ("placed_0", "MODEL", 0, 2)
        ]
    );
    assert_eq!(groups.instance_group[0].kind, Kind::Cpu as i32);
    assert_eq!(groups.instance_group[2].kind, Kind::Model as i32);
}

#[test]
fn the_interpreter_is_the_environment_or_the_default() {
    let model_dir = std::env::temp_dir().join(format!("kiln-python-test-{}", std::process::id()));
    std::fs::create_dir_all(model_dir.join("env/bin")).unwrap();
    std::fs::write(model_dir.join("env/bin/python3"), "").unwrap();
    let mut with_env = config(Vec::new());
    with_env.parameters.insert(
        environment::EXECUTION_ENV_PATH.into(),
        ModelParameter {
            string_value: "$$TRITON_MODEL_DIRECTORY/env".into(),
        },
    );
    let spec = PythonSpec::from_config(
        &mut with_env,
        &model_dir,
        &ModelCaller::default(),
        &StubEnvironment::default(),
    )
    .unwrap();
    assert_eq!(spec.interpreter.python(), model_dir.join("env/bin/python3"));
    std::fs::remove_dir_all(&model_dir).unwrap();
    let mut packed = config(Vec::new());
    packed.parameters.insert(
        environment::EXECUTION_ENV_PATH.into(),
        ModelParameter {
            string_value: "/nowhere/env.tar.gz".into(),
        },
    );
    let error = PythonSpec::from_config(
        &mut packed,
        Path::new("/m"),
        &ModelCaller::default(),
        &StubEnvironment::default(),
    )
    .unwrap_err();
    assert!(
        error.starts_with("EXECUTION_ENV_PATH '/nowhere/env.tar.gz': "),
        "{error}"
    );
}

#[test]
fn what_numpy_cannot_hold_fails_the_load_with_its_name() {
    let mut bf16 = config(Vec::new());
    bf16.output.push(crate::proto::inference::ModelOutput {
        name: "y".into(),
        data_type: crate::proto::inference::DataType::TypeBf16 as i32,
        ..Default::default()
    });
    let error = PythonSpec::from_config(
        &mut bf16,
        Path::new("/m"),
        &ModelCaller::default(),
        &StubEnvironment::default(),
    )
    .unwrap_err();
    assert!(error.contains("'y'") && error.contains("BF16"), "{error}");
}

#[test]
fn parameters_reach_the_model_as_json_and_error_codes_keep_their_meaning() {
    let mut parameters = Parameters::new();
    parameters.insert("flag".into(), ParamValue::Bool(true));
    parameters.insert("n".into(), ParamValue::Int64(-3));
    parameters.insert("s".into(), ParamValue::String("x".into()));
    let parsed: Value = serde_json::from_str(&parameters_json(&parameters)).unwrap();
    assert_eq!(parsed, json!({"flag": true, "n": -3, "s": "x"}));
    assert!(matches!(
        model_error("m".into(), 3),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(model_error("m".into(), 1), Error::Internal(_)));
    assert!(matches!(model_error("m".into(), 99), Error::Internal(_)));
    for code in 1..=6 {
        assert_eq!(error_code(&model_error("m".into(), code)), code);
    }
}

#[test]
fn a_backend_with_a_model_py_in_the_backend_directory_is_python_based() {
    let dir = std::env::temp_dir().join(format!("kiln-backends-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("echo_llm")).unwrap();
    std::fs::write(
        dir.join("echo_llm/model.py"),
        "class TritonPythonModel: pass\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    let with = |backend: &str| ModelConfig {
        backend: backend.into(),
        ..Default::default()
    };
    assert_eq!(
        backend_code(&with("echo_llm"), &dir),
        Some(dir.join("echo_llm/model.py"))
    );
    // Built-in backends, a backend without model.py, and names that are not a plain directory
    // name have none.
    for backend in [
        "",
        "python",
        "onnxruntime",
        "empty",
        "missing",
        "..",
        "echo_llm/",
        "../backends/echo_llm",
    ] {
        assert_eq!(backend_code(&with(backend), &dir), None, "{backend}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_decoupled_call_is_answered_response_by_response_then_ended() {
    let caller = ModelCaller::default();
    caller.connect(
        |_| Err(Error::Internal("not this one".into())),
        |request, _| {
            let (sink, responses) = std::sync::mpsc::channel();
            for value in [1u8, 2] {
                let _ = sink.send(Ok(InferResponse {
                    outputs: vec![Tensor::new(
                        "Y",
                        DataType::Uint8,
                        vec![1],
                        vec![value].into(),
                    )],
                    ..InferResponse::default()
                }));
            }
            let _ = sink.send(Err(Error::NotFound(format!(
                "{} stopped",
                request.model_name
            ))));
            responses
        },
        |_| Ok(false),
    );
    let message = || channel::Message {
        header: json!({"op": "call", "request": {"model": "m", "decoupled": true, "inputs": [],
                                                 "outputs": [], "parameters": "{}"}}),
        blobs: Vec::new(),
    };
    let mut answers = Vec::new();
    call(&caller, message(), None, &mut |header, tensors| {
        answers.push((header, tensors));
        true
    });
    let data: Vec<Vec<u8>> = answers
        .iter()
        .flat_map(|(_, tensors)| tensors.iter().map(|t| t.data.to_vec()))
        .collect();
    assert_eq!(data, [vec![1], vec![2]]);
    let headers: Vec<&Value> = answers.iter().map(|(header, _)| header).collect();
    assert!(headers.iter().all(|h| h["op"] == "called"));
    assert_eq!(headers[0]["outputs"][0]["name"], "Y");
    assert_eq!(headers[2]["error"], "m stopped");
    assert_eq!(headers[2]["code"], 2);
    assert_eq!(*headers[3], json!({"op": "called", "end": true}));
    assert_eq!(headers.len(), 4);
    // A stub that cannot be written to any more gets nothing after.
    let mut written = 0;
    call(&caller, message(), None, &mut |_, _| {
        written += 1;
        false
    });
    assert_eq!(written, 1);
}

#[test]
fn management_messages_become_requests_to_the_repository() {
    use crate::core::LoadParameter;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let caller = ModelCaller::default();
    let noted = Arc::clone(&asked);
    caller.connect(
        |_| Err(Error::Internal("no calls here".into())),
        |_, _| {
            let (sink, responses) = std::sync::mpsc::channel();
            let _ = sink.send(Err(Error::Internal("no calls here".into())));
            responses
        },
        move |management| {
            let ready = matches!(&management, Management::Ready { model, .. } if model == "up");
            noted.lock().unwrap().push(management);
            Ok(ready)
        },
    );
    let message = |header: Value, blobs: Vec<&'static [u8]>| channel::Message {
        header,
        blobs: blobs.into_iter().map(bytes::Bytes::from_static).collect(),
    };
    let load = json!({"op": "manage", "action": "load", "model": "m", "config": "{}",
                      "files": ["file:1/model.py"]});
    assert_eq!(
        manage(&caller, &message(load, vec![b"code"])),
        json!({"op": "managed", "ready": false})
    );
    let ready = json!({"op": "manage", "action": "ready", "model": "up", "version": "2"});
    assert_eq!(
        manage(&caller, &message(ready, vec![]))["ready"],
        json!(true)
    );
    let unload =
        json!({"op": "manage", "action": "unload", "model": "m", "unload_dependents": true});
    manage(&caller, &message(unload, vec![]));
    assert_eq!(
        *asked.lock().unwrap(),
        [
            Management::Load {
                model: "m".into(),
                parameters: [
                    ("config".to_string(), LoadParameter::String("{}".into())),
                    (
                        "file:1/model.py".to_string(),
                        LoadParameter::Bytes(bytes::Bytes::from_static(b"code"))
                    ),
                ]
                .into_iter()
                .collect(),
            },
            Management::Ready {
                model: "up".into(),
                version: "2".into()
            },
            Management::Unload {
                model: "m".into(),
                dependents: true
            },
        ]
    );
    // Files without their data, and actions kiln does not know, are answered with an error.
    for (header, blobs) in [
        (
            json!({"op": "manage", "action": "load", "model": "m", "files": ["file:a"]}),
            vec![],
        ),
        (
            json!({"op": "manage", "action": "explode", "model": "m"}),
            vec![],
        ),
    ] {
        let answer = manage(&caller, &message(header, blobs));
        assert_eq!(answer["code"], json!(3), "{answer}");
    }
}

#[test]
fn a_stream_is_cancelled_only_while_it_is_the_open_one() {
    let streams = Streams::default();
    let mut first = streams.open(1);
    streams.cancel(&json!({"op": "cancel", "stream": 2}));
    assert!(
        first.try_recv().is_err(),
        "another stream's cancel reached it"
    );
    streams.cancel(&json!({"op": "cancel", "stream": 1}));
    assert_eq!(first.try_recv(), Ok(()));
    // Closed, then asked to cancel: nothing is sent (its sender is gone).
    let mut second = streams.open(2);
    streams.close(2);
    streams.cancel(&json!({"op": "cancel", "stream": 2}));
    assert!(matches!(
        second.try_recv(),
        Err(tokio::sync::oneshot::error::TryRecvError::Closed)
    ));
}

#[test]
fn a_call_is_traced_as_a_child_of_its_request_while_that_lives() {
    use crate::trace::{Level, TraceSettings, Tracer};
    let dir = std::env::temp_dir().join(format!("kiln-caller-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tracer = Tracer::new(TraceSettings {
        level: Level::TIMESTAMPS,
        rate: 1,
        file: dir.join("t.json").display().to_string(),
        ..TraceSettings::default()
    });
    let request = tracer.sample("m").unwrap();
    let caller = ModelCaller::default();
    assert_eq!(
        caller.traced(None),
        0,
        "an untraced request goes without an id"
    );
    let id = caller.traced(Some(&request));
    assert_eq!(id, request.id());
    let call = caller
        .child_trace(id)
        .expect("a child while the request lives");
    assert_ne!(call.id(), id);
    assert!(
        caller.child_trace(id + 1000).is_none(),
        "an id no request has"
    );
    drop((call, request));
    assert!(caller.child_trace(id).is_none(), "the request is gone");
    let _ = std::fs::remove_dir_all(&dir);
}
