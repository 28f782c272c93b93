//! A real S3-compatible server for the S3 store's tests: `s3s-fs` (crates.io), which serves the
//! directories under its root as buckets and their files as objects. `.ci/setup.sh s3` installs it
//! into `<repo>/.kiln/tools/bin`; when it is missing the harness runs that step itself, and fails
//! loudly if the server still cannot be found, so CI never skips the S3 tests silently.

use super::setup_tool;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "kiln-test-access";
pub const SECRET_KEY: &str = "kiln-test-secret-key";
pub const REGION: &str = "us-east-1";

/// The s3s-fs binary: `$KILN_S3S_FS`, else the project-local install (cargo install, a few
/// minutes, made on first use).
fn binary() -> PathBuf {
    setup_tool(
        "KILN_S3S_FS",
        ".kiln/tools/bin/s3s-fs",
        "s3",
        "the S3 test server s3s-fs",
    )
}

/// An s3s-fs process on a free loopback port over a temporary root; killed (by PID) and its root
/// removed when dropped.
pub struct S3Server {
    child: Child,
    pub root: PathBuf,
    pub endpoint: String,
    /// Whether requests must be signed (with the test keys).
    signed: bool,
}

impl S3Server {
    /// Starts a server holding one empty bucket, `bucket`.
    pub fn start(bucket: &str) -> S3Server {
        S3Server::launch(bucket, true)
    }

    /// Starts a server that asks for no signature, holding one empty bucket: a stand-in for
    /// Google Cloud Storage's XML API, which is S3's (object_store's GCS client lists and reads
    /// through it), with OAuth turned off.
    pub fn start_anonymous(bucket: &str) -> S3Server {
        S3Server::launch(bucket, false)
    }

    fn launch(bucket: &str, signed: bool) -> S3Server {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("kiln-s3-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(bucket)).expect("bucket directory is created");
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().unwrap().port()
        };
        let mut command = Command::new(binary());
        command.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        if signed {
            command.args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]);
        }
        let child = command
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("s3s-fs starts");
        let mut server = S3Server {
            child,
            root,
            endpoint: format!("http://127.0.0.1:{port}"),
            signed,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("s3s-fs exited at start: {status}");
            }
            assert!(Instant::now() < deadline, "s3s-fs did not listen in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The environment kiln needs to reach this server, with its model cache in `cache`.
    pub fn env(&self, cache: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", REGION.into()),
            ("KILN_MODEL_CACHE_DIR", cache.into()),
        ]
    }

    /// The environment kiln needs to reach this (anonymous) server as Google Cloud Storage: a
    /// service-account file (written to `dir`) whose `gcs_base_url` is the server and whose
    /// OAuth is off, and the model cache in `cache`.
    pub fn gcs_env(&self, dir: &std::path::Path, cache: &str) -> Vec<(&'static str, String)> {
        let account = dir.join("service-account.json");
        std::fs::write(&account, self.gcs_service_account()).unwrap();
        vec![
            (
                "GOOGLE_SERVICE_ACCOUNT",
                account.to_string_lossy().into_owned(),
            ),
            ("KILN_MODEL_CACHE_DIR", cache.into()),
        ]
    }

    fn gcs_service_account(&self) -> String {
        format!(
            r#"{{"private_key": "unused", "private_key_id": "unused", "client_email": "kiln@example.com",
                "disable_oauth": true, "gcs_base_url": "{}"}}"#,
            self.endpoint
        )
    }

    /// A client for `bucket`, to upload and delete objects as an operator would.
    pub fn client(&self, bucket: &str) -> Bucket {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region(REGION)
            .with_bucket_name(bucket);
        let builder = if self.signed {
            builder
                .with_access_key_id(ACCESS_KEY)
                .with_secret_access_key(SECRET_KEY)
        } else {
            builder.with_skip_signature(true)
        };
        let store = builder.build().expect("S3 client for the test server");
        Bucket::new(store)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One bucket of a test server (S3 here, Azurite's containers too).
pub struct Bucket(Box<dyn ObjectStore>);

impl Bucket {
    pub fn new(store: impl ObjectStore) -> Bucket {
        Bucket(Box::new(store))
    }

    pub async fn put(&self, key: &str, contents: impl Into<Vec<u8>>) {
        let payload = PutPayload::from(contents.into());
        self.0
            .put(&ObjectPath::from(key), payload)
            .await
            .unwrap_or_else(|e| panic!("upload of {key} failed: {e}"));
    }

    pub async fn delete(&self, key: &str) {
        self.0
            .delete(&ObjectPath::from(key))
            .await
            .unwrap_or_else(|e| panic!("delete of {key} failed: {e}"));
    }
}
