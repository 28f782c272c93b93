//! Model files are input too: a repository holding hostile models beside good ones, written at
//! test time. Each hostile model fails its own load with a clear reason, in the repository index
//! and again on an explicit load, while the server comes up and the good models serve.

use crate::common::http_client::{get, post};
use crate::common::lifecycle::{grpc_infer, grpc_load, rest_infer};
use crate::common::onnx::{add_bias_config, add_bias_model, external_data_model, unknown_op_model};
use crate::common::{fp32_bytes, fp32_values, repo_path, Server, TempRepo};
use kiln::proto::inference::model_infer_request::InferInputTensor;
use kiln::proto::inference::ModelInferRequest;
use serde_json::Value;
use std::collections::BTreeMap;
use tonic::Code;

/// A config for an add-bias model (`X`, `Y`: FP32 `[4]`, one instance) with `from` replaced by
/// `to` in its text.
fn config(name: &str, from: &str, to: &str) -> Option<String> {
    let text = add_bias_config(name, 4, 1);
    assert!(text.contains(from), "{text}");
    Some(text.replace(from, to))
}

/// Deterministic noise (xorshift).
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Writes the hostile models into `repo` (and the target of an escaping symlink into `outside`),
/// and returns each model's name with a part of the reason its load must fail with.
fn write_hostile_models(repo: &TempRepo, outside: &TempRepo) -> Vec<(&'static str, String)> {
    let good = add_bias_model(4, 1.0);
    let inputs: Vec<String> = (0..5000)
        .map(|i| format!("{{ name: \"X{i}\" data_type: TYPE_FP32 dims: [ 4 ] }}"))
        .collect();
    let giant_config = repo.path.join("giant_config/config.pbtxt");
    // (name, config.pbtxt, 1/model.onnx, part of the reason)
    let models: Vec<(&str, Option<String>, Vec<u8>, String)> =
        vec![
        // Corrupt model files: ONNX Runtime refuses them.
        (
            "truncated",
            config("truncated", "", ""),
            good[..good.len() / 2].to_vec(),
            "Protobuf parsing failed".into(),
        ),
        ("random_bytes", None, noise(4096), "Protobuf parsing failed".into()),
        (
            "unknown_op",
            None,
            unknown_op_model("NoSuchOp"),
            "No Op registered for NoSuchOp".into(),
        ),
        (
            "external_data_escape",
            None,
            external_data_model("../../../../../../../../etc/hostname"),
            "External data path escapes model directory".into(),
        ),
        // Configs declaring absurd sizes.
        (
            "absurd_dims",
            config("absurd_dims", "dims: [ 4 ]", "dims: [ 1099511627776, 1099511627776 ]"),
            good.clone(),
            "model 'absurd_dims', input 'X': dims [1099511627776, 1099511627776] describe more \
             than the 4294967296 elements kiln allows per tensor"
                .into(),
        ),
        (
            "wrong_dims",
            config("wrong_dims", "dims: [ 4 ]", "dims: [ 8 ]"),
            good.clone(),
            "model 'wrong_dims', tensor 'X': the model expects 1 dimensions (shape [4]) but the \
             model configuration specifies 1 dimensions (shape [8])"
                .into(),
        ),
        (
            "negative_dims",
            config("negative_dims", "dims: [ 4 ]", "dims: [ -7 ]"),
            good.clone(),
            "model 'negative_dims', input 'X': dims [-7]: each dimension must be an integer >= \
             1, or -1 to indicate a variable-size dimension"
                .into(),
        ),
        (
            "huge_batch",
            config("huge_batch", "max_batch_size: 0", "max_batch_size: 2147483647"),
            good.clone(),
            "max_batch_size 2147483647 of model 'huge_batch' is larger than the 1048576 kiln \
             allows"
                .into(),
        ),
        (
            "many_inputs",
            Some(format!(
                "input [ {} ]\noutput [ {{ name: \"Y\" data_type: TYPE_FP32 dims: [ 4 ] }} ]\n",
                inputs.join(",\n")
            )),
            good.clone(),
            "model 'many_inputs' declares 5000 inputs, more than the 1024 kiln allows".into(),
        ),
        (
            "many_instances",
            config("many_instances", "count: 1 ", "count: 100000 "),
            good.clone(),
            "model 'many_instances' would start 100000 ONNX Runtime sessions (1 versions × \
             100000 instances), more than the 256 kiln allows per model"
                .into(),
        ),
        // Thousands of version directories (4999 more are made below).
        (
            "many_versions",
            config("many_versions", "", ""),
            good.clone(),
            "the directory of model 'many_versions' holds more than 1024 entries (version \
             directories and files), more than kiln reads"
                .into(),
        ),
        // A config of 100 MiB (made sparse below: it costs no disk), one nested 400,000 deep
        // (under the size bound), and a FIFO that would block whoever opened it.
        (
            "giant_config",
            Some(String::new()),
            good.clone(),
            format!(
                "failed to read {}: the file is larger than the 1048576 bytes kiln reads",
                giant_config.display()
            ),
        ),
        (
            "deep_nesting",
            Some(format!("optimization {}", "{ ".repeat(400_000))),
            good.clone(),
            "failed to parse config.pbtxt".into(),
        ),
        (
            "fifo_config",
            None,
            good.clone(),
            "config.pbtxt: not a regular file".into(),
        ),
    ];
    let mut expected = Vec::new();
    for (name, config, onnx, reason) in models {
        if let Some(config) = config {
            repo.write(&format!("{name}/config.pbtxt"), config);
        }
        repo.write(&format!("{name}/1/model.onnx"), onnx);
        expected.push((name, reason));
    }
    for version in 2..=5000 {
        std::fs::create_dir(repo.path.join(format!("many_versions/{version}"))).unwrap();
    }
    std::fs::File::create(&giant_config)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(repo.path.join("fifo_config/config.pbtxt"))
        .status()
        .unwrap();
    assert!(made.success());
    // A label file of 2^20 + 1 empty lines: 1 MiB on disk, but a string per label.
    let labelled = config(
        "label_lines",
        "dims: [ 4 ] } ]\ninstance",
        "dims: [ 4 ] label_filename: \"labels.txt\" } ]\ninstance",
    );
    repo.write("label_lines/config.pbtxt", labelled.unwrap());
    repo.write("label_lines/labels.txt", "\n".repeat((1 << 20) + 1));
    repo.write("label_lines/1/model.onnx", &good);
    expected.push((
        "label_lines",
        "labels.txt for output 'Y' holds more than the 1048576 labels kiln reads".into(),
    ));
    // A text model whose tokenizer.json is 100 MiB (sparse).
    let text_model = config(
        "giant_tokenizer",
        "instance_group",
        "parameters { key: \"tokenizer_text_input\" value: { string_value: \"TEXT\" } }\ninstance_group",
    );
    repo.write("giant_tokenizer/config.pbtxt", text_model.unwrap());
    repo.write("giant_tokenizer/1/model.onnx", &good);
    std::fs::File::create(repo.path.join("giant_tokenizer/tokenizer.json"))
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    expected.push((
        "giant_tokenizer",
        "tokenizer.json is larger than the 67108864 bytes kiln reads".into(),
    ));
    // The only version directory has a number too large for a version.
    repo.write("absurd_version/99999999999999999999/model.onnx", &good);
    expected.push((
        "absurd_version",
        "at least one version must be available under the version policy of model \
         'absurd_version'"
            .into(),
    ));
    // A model directory that is a symlink out of the repository: the operator's link, followed
    // (kiln issue #48), so this one is not hostile and serves (see the test below).
    outside.write(
        "escaping_link/config.pbtxt",
        add_bias_config("escaping_link", 4, 1),
    );
    outside.write("escaping_link/1/model.onnx", &good);
    std::os::unix::fs::symlink(
        outside.path.join("escaping_link"),
        repo.path.join("escaping_link"),
    )
    .unwrap();
    expected
}

/// add_sub (bundled): OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [1, 16].
async fn add_sub_serves(server: &Server) {
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b = vec![1.0f32; 16];
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    let response = server
        .client()
        .await
        .model_infer(ModelInferRequest {
            model_name: "add_sub".into(),
            inputs: vec![input("INPUT0"), input("INPUT1")],
            raw_input_contents: vec![fp32_bytes(&a), fp32_bytes(&b)],
            ..Default::default()
        })
        .await
        .expect("add_sub serves")
        .into_inner();
    let sum: Vec<f32> = a.iter().map(|x| x + 1.0).collect();
    let difference: Vec<f32> = a.iter().map(|x| x - 1.0).collect();
    assert_eq!(fp32_values(&response.raw_output_contents[0]), sum);
    assert_eq!(fp32_values(&response.raw_output_contents[1]), difference);
}

/// The good models answer correctly over both protocols.
async fn good_models_serve(server: &Server) {
    add_sub_serves(server).await;
    let mut client = server.client().await;
    assert_eq!(
        grpc_infer(&mut client, "good").await.unwrap(),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    let (status, body) = rest_infer(&server.http_address, "good").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["outputs"][0]["data"],
        serde_json::json!([2.0, 3.0, 4.0, 5.0])
    );
}

/// The REST repository index as `name -> (state, reason)`.
async fn rest_index(server: &Server) -> BTreeMap<String, (String, String)> {
    let response = post(&server.http_address, "/v2/repository/index", b"").await;
    assert_eq!(response.status, 200, "{}", response.text());
    let Value::Array(models) = response.json() else {
        panic!("the index is a list: {}", response.text());
    };
    models
        .iter()
        .map(|m| {
            let text = |key: &str| m[key].as_str().unwrap_or_default().to_string();
            (text("name"), (text("state"), text("reason")))
        })
        .collect()
}

#[tokio::test]
async fn hostile_model_files_fail_alone_with_clear_reasons() {
    let repo = TempRepo::new("hostile");
    let outside = TempRepo::new("hostile-outside");
    repo.write("good/config.pbtxt", add_bias_config("good", 4, 1));
    repo.write("good/1/model.onnx", add_bias_model(4, 1.0));
    // Links back to their own directory: harmless, as long as nothing walks them (two of them
    // once made the fingerprint of the model's files exponential, and its load never ended).
    for link in ["x", "y"] {
        std::os::unix::fs::symlink(".", repo.path.join("good/1").join(link)).unwrap();
    }
    let expected = write_hostile_models(&repo, &outside);
    let server = Server::launch(
        &[repo_path("model_repository"), repo.path.clone()],
        &["--model-control-mode", "explicit", "--load-model", "*"],
        true,
    );
    assert_eq!(
        get(&server.http_address, "/v2/health/live").await.status,
        200
    );
    good_models_serve(&server).await;

    let index = rest_index(&server).await;
    for model in [
        "add_sub",
        "string_echo",
        "mlp_classifier",
        "identity_types",
        "good",
        "escaping_link",
    ] {
        assert_eq!(index[model].0, "READY", "{model}: {:?}", index[model]);
    }
    for (name, reason) in &expected {
        let (state, found) = &index[*name];
        assert_eq!(state, "UNAVAILABLE", "{name}: {found}");
        assert!(found.contains(reason.as_str()), "{name}: {found}");
    }

    // Loading a hostile model again fails the same way, on both protocols; nothing it does
    // disturbs the models that serve.
    // (The time each takes is printed, not asserted: the machine may be loaded.)
    for (name, reason) in &expected {
        let path = format!("/v2/repository/models/{name}/load");
        let started = std::time::Instant::now();
        let response = post(&server.http_address, &path, b"").await;
        eprintln!("explicit load of {name} refused in {:?}", started.elapsed());
        assert_eq!(response.status, 400, "{name}: {}", response.text());
        let error = response.error();
        assert!(error.contains(reason.as_str()), "{name}: {error}");
    }
    let mut client = server.client().await;
    for (name, reason) in &expected {
        let refused = grpc_load(&mut client, name, vec![]).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{name}");
        assert!(
            refused.message().contains(reason.as_str()),
            "{name}: {}",
            refused.message()
        );
    }
    good_models_serve(&server).await;
    let index = rest_index(&server).await;
    assert!(expected
        .iter()
        .all(|(name, _)| index[*name].0 == "UNAVAILABLE"));
}
