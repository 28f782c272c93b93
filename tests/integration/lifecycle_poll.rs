//! Poll mode through the real binary: versions and models added to or removed from a repository
//! on disk are picked up without a restart; unchanged versions keep serving across a reload; a
//! broken change leaves what serves alone.

use crate::common::lifecycle::{add_bias_request, eventually, Client};
use crate::common::onnx::{add_bias_config, add_bias_model};
use crate::common::{fp32_values, TempRepo};
use kiln::proto::inference::{
    ModelStatisticsRequest, RepositoryIndexRequest, RepositoryModelLoadRequest, ServerReadyRequest,
};
use tonic::Code;

/// `(version that answered, Y)` for X = [1, 2, 3, 4], or the gRPC error.
async fn infer(client: &mut Client, name: &str, version: &str) -> Result<(String, Vec<f32>), Code> {
    let request = add_bias_request(name, version, &[1.0, 2.0, 3.0, 4.0]);
    let response = client
        .model_infer(request)
        .await
        .map_err(|s| s.code())?
        .into_inner();
    let y = fp32_values(&response.raw_output_contents[0]);
    Ok((response.model_version, y))
}

/// `(name, version, state)` of every index row.
async fn index(client: &mut Client) -> Vec<(String, String, String)> {
    client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner()
        .models
        .into_iter()
        .map(|m| (m.name, m.version, m.state))
        .collect()
}

async fn answers(client: &Client, name: &str, version: &str, expected: (&str, f32)) -> bool {
    let mut client = client.clone();
    let (answered, bias) = expected;
    infer(&mut client, name, version).await
        == Ok((
            answered.to_string(),
            vec![1.0 + bias, 2.0 + bias, 3.0 + bias, 4.0 + bias],
        ))
}

async fn inference_count(client: &mut Client, name: &str, version: &str) -> u64 {
    let request = ModelStatisticsRequest {
        name: name.into(),
        version: version.into(),
    };
    let stats = client.model_statistics(request).await.unwrap().into_inner();
    stats.model_stats[0].inference_count
}

#[tokio::test]
async fn poll_mode_follows_the_repository() {
    let repo = TempRepo::new("poll");
    repo.write("poller/config.pbtxt", add_bias_config("poller", 4, 1));
    repo.write("poller/1/model.onnx", add_bias_model(4, 1.0));
    let args = [
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
    ];
    let server = repo.serve(&args, true);
    let mut client = server.client().await;
    assert!(answers(&client, "poller", "", ("1", 1.0)).await);
    let load = client
        .repository_model_load(RepositoryModelLoadRequest {
            model_name: "poller".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(load.code(), Code::Unavailable);

    // A new version: the default policy (latest 1) moves requests to it.
    repo.write("poller/2/model.onnx", add_bias_model(4, 2.0));
    eventually("version 2 to serve", || {
        answers(&client, "poller", "", ("2", 2.0))
    })
    .await;
    assert_eq!(
        index(&mut client).await,
        vec![("poller".into(), "2".into(), "READY".into())]
    );
    assert_eq!(infer(&mut client, "poller", "1").await, Err(Code::NotFound));

    // The version removed: back to version 1.
    std::fs::remove_dir_all(repo.path.join("poller/2")).unwrap();
    eventually("version 1 to serve again", || {
        answers(&client, "poller", "", ("1", 1.0))
    })
    .await;

    // A new model, then its directory removed.
    repo.write("newcomer/config.pbtxt", add_bias_config("newcomer", 4, 1));
    repo.write("newcomer/1/model.onnx", add_bias_model(4, 5.0));
    eventually("the new model to serve", || {
        answers(&client, "newcomer", "", ("1", 5.0))
    })
    .await;
    std::fs::remove_dir_all(repo.path.join("newcomer")).unwrap();
    eventually("the removed model to be gone", || {
        let mut client = client.clone();
        async move { infer(&mut client, "newcomer", "").await == Err(Code::NotFound) }
    })
    .await;
    assert!(index(&mut client)
        .await
        .iter()
        .all(|row| row.0 != "newcomer"));
}

#[tokio::test]
async fn poll_reloads_keep_unchanged_versions_and_survive_broken_changes() {
    let repo = TempRepo::new("poll-keep");
    let config = add_bias_config("kept", 4, 1) + "version_policy: { all { } }\n";
    repo.write("kept/config.pbtxt", &config);
    repo.write("kept/1/model.onnx", add_bias_model(4, 1.0));
    repo.write("kept/2/model.onnx", add_bias_model(4, 2.0));
    let args = [
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
    ];
    let server = repo.serve(&args, true);
    let mut client = server.client().await;
    for _ in 0..3 {
        assert!(answers(&client, "kept", "1", ("1", 1.0)).await);
    }
    assert_eq!(inference_count(&mut client, "kept", "1").await, 3);

    // A third version loads beside the first two, which keep serving (their statistics survive:
    // they were not reloaded).
    repo.write("kept/3/model.onnx", add_bias_model(4, 3.0));
    eventually("version 3 to serve", || {
        answers(&client, "kept", "", ("3", 3.0))
    })
    .await;
    assert!(answers(&client, "kept", "2", ("2", 2.0)).await);
    assert_eq!(inference_count(&mut client, "kept", "1").await, 3);

    // A broken fourth version fails the reload; versions 1 to 3 keep serving and the server
    // stays ready. The poll that tried it is seen in the log (the only trace a failed reload
    // leaves while older versions serve), so the checks below follow a poll, not a guess at one.
    let reloads_failed = || server.logged("reload failed, the loaded versions keep serving");
    assert_eq!(reloads_failed(), 0);
    repo.write("kept/4/model.onnx", b"garbage");
    eventually("a poll to try version 4", || {
        let tried = reloads_failed() > 0;
        async move { tried }
    })
    .await;
    assert!(answers(&client, "kept", "", ("3", 3.0)).await);
    let versions: Vec<String> = index(&mut client).await.into_iter().map(|r| r.1).collect();
    assert_eq!(versions, vec!["1", "2", "3"]);
    let ready = client.server_ready(ServerReadyRequest {}).await.unwrap();
    assert!(ready.into_inner().ready);

    // Fixing it is picked up; a config change reloads every version.
    repo.write("kept/4/model.onnx", add_bias_model(4, 4.0));
    eventually("version 4 to serve", || {
        answers(&client, "kept", "", ("4", 4.0))
    })
    .await;
    repo.write("kept/config.pbtxt", add_bias_config("kept", 4, 1));
    eventually("the latest-1 policy to apply", || {
        let mut client = client.clone();
        async move { index(&mut client).await.len() == 1 }
    })
    .await;
    assert!(answers(&client, "kept", "", ("4", 4.0)).await);
}
