//! Object-store repositories end to end: kiln serves `s3://kiln-models/models` from a real
//! S3-compatible server (s3s-fs, see `common::s3`), `gs://kiln-models/models` from the same
//! server speaking the XML API Google Cloud Storage shares with S3, and
//! `as://devstoreaccount1/kiln-models/models` from Azurite, Microsoft's Azure Storage emulator
//! (`common::azurite`); each infers with the bundled add_sub model, and in poll mode picks up
//! versions uploaded, overwritten and deleted.

use crate::common::azurite::{self, Azurite};
use crate::common::lifecycle::{add_bias_request, eventually, index, ready, row, Client};
use crate::common::onnx::{add_bias_config, add_bias_model};
use crate::common::s3::{Bucket, S3Server};
use crate::common::{add_sub_row, fp32_values, repo_path, Server, TempRepo};
use kiln::proto::inference::ModelReadyRequest;
use std::path::{Path, PathBuf};

const BUCKET: &str = "kiln-models";

/// `(version that answered, Y)` of an add-bias model for X = [1, 2, 3, 4], or `None` on error.
async fn biased(client: &Client, version: &str) -> Option<(String, Vec<f32>)> {
    let mut client = client.clone();
    let request = add_bias_request("biased", version, &[1.0, 2.0, 3.0, 4.0]);
    let response = client.model_infer(request).await.ok()?.into_inner();
    Some((
        response.model_version,
        fp32_values(&response.raw_output_contents[0]),
    ))
}

fn answer(version: &str, bias: f32) -> Option<(String, Vec<f32>)> {
    Some((
        version.into(),
        [1.0, 2.0, 3.0, 4.0].map(|x| x + bias).to_vec(),
    ))
}

/// Every file under `dir`, relative to it, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                pending.push(entry.path());
            } else {
                let relative = entry.path().strip_prefix(dir).unwrap().to_path_buf();
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_repository_serves_and_follows_the_bucket() {
    let s3 = S3Server::start(BUCKET);
    let cache = TempRepo::new("s3-cache");
    let env = s3.env(cache.path.to_str().unwrap());
    let repository = PathBuf::from(format!("s3://{BUCKET}/models"));
    serves_and_follows(&s3.client(BUCKET), repository, &env, &cache).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gcs_repository_serves_and_follows_the_bucket() {
    // No GCS emulator on the registries speaks the XML API object_store's GCS client uses; that
    // API is S3's, so s3s-fs serves it, without OAuth (see `S3Server::start_anonymous`).
    let gcs = S3Server::start_anonymous(BUCKET);
    let cache = TempRepo::new("gcs-cache");
    let account = TempRepo::new("gcs-account");
    let env = gcs.gcs_env(&account.path, cache.path.to_str().unwrap());
    let repository = PathBuf::from(format!("gs://{BUCKET}/models"));
    serves_and_follows(&gcs.client(BUCKET), repository, &env, &cache).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_repository_serves_and_follows_the_container() {
    let azurite = Azurite::start(BUCKET);
    let cache = TempRepo::new("azure-cache");
    let env = azurite.env(cache.path.to_str().unwrap());
    let repository = PathBuf::from(format!("as://{}/{BUCKET}/models", azurite::ACCOUNT));
    serves_and_follows(&azurite.client(BUCKET), repository, &env, &cache).await;
}

/// Fills `bucket` (add_sub, an add-bias model, and a stray model outside the repository's prefix),
/// serves `repository` in poll mode, and follows uploads, overwrites and deletes.
async fn serves_and_follows(
    bucket: &Bucket,
    repository: PathBuf,
    env: &[(&'static str, String)],
    cache: &TempRepo,
) {
    let add_sub = repo_path("model_repository/add_sub");
    for file in ["config.pbtxt", "1/model.onnx"] {
        let contents = std::fs::read(add_sub.join(file)).unwrap();
        bucket
            .put(&format!("models/add_sub/{file}"), contents)
            .await;
    }
    bucket
        .put(
            "models/biased/config.pbtxt",
            add_bias_config("biased", 4, 1),
        )
        .await;
    bucket
        .put("models/biased/1/model.onnx", add_bias_model(4, 1.0))
        .await;
    // Outside the repository's prefix: never listed.
    bucket
        .put(
            "elsewhere/stray/config.pbtxt",
            add_bias_config("stray", 4, 1),
        )
        .await;

    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = [
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
    ];
    let server = Server::launch_env(&[repository], &args, &env, true);
    let mut client = server.client().await;

    assert!(ready(&mut client).await);
    let model_ready = ModelReadyRequest {
        name: "add_sub".into(),
        version: String::new(),
    };
    assert!(
        client
            .model_ready(model_ready)
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let response = client
        .model_infer(add_sub_row(
            &(0..16).map(|i| i as f32).collect::<Vec<_>>(),
            &[0.5; 16],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.model_version, "1");
    assert_eq!(fp32_values(&response.raw_output_contents[0])[3], 3.5);
    assert_eq!(fp32_values(&response.raw_output_contents[1])[3], 2.5);
    assert_eq!(
        index(&mut client).await,
        vec![
            row("add_sub", "1", "READY", ""),
            row("biased", "1", "READY", "")
        ]
    );
    assert_eq!(biased(&client, "").await, answer("1", 1.0));

    // The models were materialised under the cache directory kiln was given.
    let cached = files(&cache.path);
    for file in [
        "add_sub/1/model.onnx",
        "add_sub/config.pbtxt",
        "biased/1/model.onnx",
    ] {
        assert!(
            cached.iter().any(|f| f.ends_with(file)),
            "{file} in {cached:?}"
        );
    }

    // A new version uploaded: the default policy (latest 1) moves requests to it.
    bucket
        .put("models/biased/2/model.onnx", add_bias_model(4, 2.0))
        .await;
    eventually("version 2 to serve", || async {
        biased(&client, "").await == answer("2", 2.0)
    })
    .await;

    // The same key overwritten with other contents: the new entity tag reloads it.
    bucket
        .put("models/biased/2/model.onnx", add_bias_model(4, 3.0))
        .await;
    eventually("the overwritten version 2 to serve", || async {
        biased(&client, "").await == answer("2", 3.0)
    })
    .await;

    // The version deleted: back to version 1, and its cached files are gone.
    bucket.delete("models/biased/2/model.onnx").await;
    eventually("version 1 to serve again", || async {
        biased(&client, "").await == answer("1", 1.0)
    })
    .await;
    let cached = files(&cache.path);
    assert!(!cached.iter().any(|f| f.contains("biased/2")), "{cached:?}");
    assert!(ready(&mut client).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_prefix_or_a_missing_bucket_serves_nothing() {
    let s3 = S3Server::start(BUCKET);
    let cache = TempRepo::new("s3-cache-empty");
    let env = s3.env(cache.path.to_str().unwrap());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // An empty prefix serves no model; a missing bucket only logs that it cannot be listed.
    let repositories = [
        PathBuf::from(format!("s3://{BUCKET}/nothing-here")),
        PathBuf::from("s3://no-such-bucket/models"),
    ];
    let server = Server::launch_env(&repositories, &[], &env, true);
    let mut client = server.client().await;
    assert!(index(&mut client).await.is_empty());
    assert!(ready(&mut client).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_with_thousands_of_entries_is_refused_before_download() {
    let s3 = S3Server::start(BUCKET);
    // s3s-fs serves files under its root as objects: 1,025 version directories of one object each.
    let crowded = s3.root.join(BUCKET).join("models/crowded");
    for version in 1..=1025 {
        let dir = crowded.join(version.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.onnx"), add_bias_model(4, 1.0)).unwrap();
    }
    std::fs::write(
        crowded.join("config.pbtxt"),
        add_bias_config("crowded", 4, 1),
    )
    .unwrap();
    let cache = TempRepo::new("s3-cache-crowded");
    let env = s3.env(cache.path.to_str().unwrap());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let repository = PathBuf::from(format!("s3://{BUCKET}/models"));
    let server = Server::launch_env(&[repository], &[], &env, true);
    let mut client = server.client().await;
    assert_eq!(
        index(&mut client).await,
        vec![row(
            "crowded",
            "",
            "UNAVAILABLE",
            "the directory of model 'crowded' holds more than 1024 entries (version directories \
             and files), more than kiln reads"
        )]
    );
    assert!(files(&cache.path).is_empty(), "{:?}", files(&cache.path));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_s3_url_may_name_its_server_as_in_triton() {
    let s3 = S3Server::start(BUCKET);
    let bucket = s3.client(BUCKET);
    let add_sub = repo_path("model_repository/add_sub");
    for file in ["config.pbtxt", "1/model.onnx"] {
        let contents = std::fs::read(add_sub.join(file)).unwrap();
        bucket
            .put(&format!("models/add_sub/{file}"), contents)
            .await;
    }
    let cache = TempRepo::new("s3-cache-url");
    // The endpoint comes from the URL alone: `s3://host:port/bucket/prefix`.
    let env: Vec<(&str, String)> = s3
        .env(cache.path.to_str().unwrap())
        .into_iter()
        .filter(|(key, _)| !key.starts_with("AWS_ENDPOINT"))
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let host_port = s3.endpoint.trim_start_matches("http://");
    let repository = PathBuf::from(format!("s3://{host_port}/{BUCKET}/models"));
    let server = Server::launch_env(&[repository], &[], &env, true);
    let mut client = server.client().await;
    assert_eq!(
        index(&mut client).await,
        vec![row("add_sub", "1", "READY", "")]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_credential_file_gives_each_repository_its_credentials() {
    use crate::common::s3::{ACCESS_KEY, REGION, SECRET_KEY};
    let s3 = S3Server::start(BUCKET);
    let gcs = S3Server::start_anonymous(BUCKET);
    let bucket = s3.client(BUCKET);
    for (prefix, name) in [("models", "from_s3"), ("other", "wrong_secret")] {
        bucket
            .put(
                &format!("{prefix}/{name}/config.pbtxt"),
                add_bias_config(name, 4, 1),
            )
            .await;
        bucket
            .put(
                &format!("{prefix}/{name}/1/model.onnx"),
                add_bias_model(4, 1.0),
            )
            .await;
    }
    let google = gcs.client(BUCKET);
    google
        .put(
            "models/from_gcs/config.pbtxt",
            add_bias_config("from_gcs", 4, 1),
        )
        .await;
    google
        .put("models/from_gcs/1/model.onnx", add_bias_model(4, 1.0))
        .await;
    let cache = TempRepo::new("credential-cache");
    let secrets = TempRepo::new("credential-file");
    // kiln's environment has the S3 endpoint but no keys and no Google account: the file gives
    // them, the longest prefix winning (`other` gets a wrong secret, so it cannot be listed).
    let account = gcs.gcs_env(&secrets.path, "")[0].1.clone();
    let file = secrets.path.join("cloud_credential.json");
    std::fs::write(
        &file,
        format!(
            r#"{{
              "s3": {{
                "": {{ "key_id": "{ACCESS_KEY}", "secret_key": "{SECRET_KEY}", "region": "{REGION}" }},
                "s3://{BUCKET}/other": {{ "key_id": "{ACCESS_KEY}", "secret_key": "wrong", "region": "{REGION}" }}
              }},
              "gs": {{ "gs://{BUCKET}": "{account}" }}
            }}"#
        ),
    )
    .unwrap();
    let env = [
        ("AWS_ENDPOINT_URL", s3.endpoint.as_str()),
        ("TRITON_CLOUD_CREDENTIAL_PATH", file.to_str().unwrap()),
        ("KILN_MODEL_CACHE_DIR", cache.path.to_str().unwrap()),
    ];
    let repositories = [
        PathBuf::from(format!("s3://{BUCKET}/models")),
        PathBuf::from(format!("s3://{BUCKET}/other")),
        PathBuf::from(format!("gs://{BUCKET}/models")),
    ];
    let server = Server::launch_env(&repositories, &[], &env, true);
    let mut client = server.client().await;
    assert_eq!(
        index(&mut client).await,
        vec![
            row("from_gcs", "1", "READY", ""),
            row("from_s3", "1", "READY", "")
        ]
    );
}

/// Puts the bundled add_sub under `models/` in `bucket`.
async fn put_add_sub(bucket: &Bucket) {
    let add_sub = repo_path("model_repository/add_sub");
    for file in ["config.pbtxt", "1/model.onnx"] {
        let contents = std::fs::read(add_sub.join(file)).unwrap();
        bucket
            .put(&format!("models/add_sub/{file}"), contents)
            .await;
    }
}

/// add_sub answers one row correctly.
async fn add_sub_serves(server: &Server) {
    let mut client = server.client().await;
    let row = add_sub_row(&[1.0; 16], &[0.5; 16]);
    let response = client.model_infer(row).await.unwrap().into_inner();
    assert_eq!(fp32_values(&response.raw_output_contents[0]), [1.5; 16]);
}

/// The default cache of a remote store used to be `$TMPDIR/kiln-model-cache-<pid>`, made with
/// `create_dir_all`: a local user who planted a link there (to a directory of theirs) before
/// kiln started got the models written into it, and could swap them. Now the cache is a fresh
/// directory with a random name, mode 0700; the planted link is left alone, and the cache is
/// removed when kiln stops.
#[tokio::test(flavor = "multi_thread")]
async fn the_default_cache_is_a_fresh_private_directory() {
    use std::os::unix::fs::PermissionsExt;
    let s3 = S3Server::start(BUCKET);
    put_add_sub(&s3.client(BUCKET)).await;
    let (temp, attacker, scripts) = (
        TempRepo::new("planted-temp"),
        TempRepo::new("planted-target"),
        TempRepo::new("planted-script"),
    );
    // kiln keeps the script's process ID: the link is at the name kiln would have chosen.
    let wrapper = scripts.path.join("plant.sh");
    std::fs::write(
        &wrapper,
        "ln -s \"$ATTACKER\" \"$TMPDIR/kiln-model-cache-$$\" || exit 1\nexec \"$@\"\n",
    )
    .unwrap();
    let mut env: Vec<(&str, String)> = s3
        .env("")
        .into_iter()
        .filter(|(key, _)| *key != "KILN_MODEL_CACHE_DIR")
        .collect();
    env.push(("TMPDIR", temp.path.to_string_lossy().into_owned()));
    env.push(("ATTACKER", attacker.path.to_string_lossy().into_owned()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let repository = PathBuf::from(format!("s3://{BUCKET}/models"));
    let mut server = Server::launch_wrapped(&wrapper, &[repository], &[], &env);
    add_sub_serves(&server).await;

    assert!(
        files(&attacker.path).is_empty(),
        "{:?}",
        files(&attacker.path)
    );
    let made: Vec<PathBuf> = std::fs::read_dir(&temp.path)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| std::fs::symlink_metadata(path).unwrap().is_dir())
        .collect();
    assert_eq!(made.len(), 1, "{made:?}");
    let name = made[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("kiln-model-cache-"), "{name}");
    let mode = std::fs::metadata(&made[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(
        files(&made[0])
            .iter()
            .any(|f| f.ends_with("add_sub/1/model.onnx")),
        "{:?}",
        files(&made[0])
    );
    assert!(server.terminate().success());
    assert!(!made[0].exists(), "the cache outlived the server");
}

/// In a cache directory the operator named, a download is written beside its target first
/// (`.<file>.kiln-partial`). A link planted at that name (to someone else's file) is removed
/// and the download made in a new file, never written through the link.
#[tokio::test(flavor = "multi_thread")]
async fn downloads_never_write_through_a_planted_link() {
    use std::hash::{Hash, Hasher};
    let s3 = S3Server::start(BUCKET);
    put_add_sub(&s3.client(BUCKET)).await;
    let (cache, attacker) = (
        TempRepo::new("planted-cache"),
        TempRepo::new("planted-victim"),
    );
    let victim = attacker.path.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    // The cache's layout: `<bucket>-<hash of the URL>/<model>/` (see `RemoteStore`).
    let location = format!("s3://{BUCKET}/models");
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    location.hash(&mut hasher);
    let version = cache
        .path
        .join(format!("{BUCKET}-{:016x}", hasher.finish()))
        .join("add_sub/1");
    std::fs::create_dir_all(&version).unwrap();
    let partial = version.join(".model.onnx.kiln-partial");
    std::os::unix::fs::symlink(&victim, &partial).unwrap();

    let env = s3.env(cache.path.to_str().unwrap());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::launch_env(&[PathBuf::from(location)], &[], &env, true);
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious",
        "written through"
    );
    add_sub_serves(&server).await;
    assert!(
        std::fs::symlink_metadata(&partial).is_err(),
        "the link is gone"
    );
    let model = std::fs::symlink_metadata(version.join("model.onnx")).unwrap();
    assert!(model.is_file(), "model.onnx is a file of its own");
}
