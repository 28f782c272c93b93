//! Azurite, Microsoft's Azure Storage emulator (npm), for the tests of `as://` repositories.
//! `.ci/setup.sh azurite` installs it into `<repo>/.kiln/tools/azurite`; when it is missing the
//! harness runs that step itself, and fails loudly if the emulator still cannot be found, so CI
//! never skips the Azure tests silently.

use super::s3::Bucket;
use super::setup_tool;
use base64::Engine;
use object_store::azure::MicrosoftAzureBuilder;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The emulator's one storage account and its published key.
pub const ACCOUNT: &str = "devstoreaccount1";
const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// `azurite-blob`: `$KILN_AZURITE_BLOB`, else the project-local install (npm ci, made on first
/// use).
fn binary() -> PathBuf {
    setup_tool(
        "KILN_AZURITE_BLOB",
        ".kiln/tools/azurite/node_modules/.bin/azurite-blob",
        "azurite",
        "the Azure Storage emulator Azurite",
    )
}

/// An Azurite blob service on a free loopback port, its data in memory; killed (by PID) when
/// dropped.
pub struct Azurite {
    child: Child,
    port: u16,
}

impl Azurite {
    /// Starts the emulator with one empty container, `container`.
    pub fn start(container: &str) -> Azurite {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().unwrap().port()
        };
        let child = Command::new(binary())
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .args([
                "--inMemoryPersistence",
                "--silent",
                "--skipApiVersionCheck",
                "--disableTelemetry",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("azurite-blob starts");
        let mut server = Azurite { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("azurite-blob exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "azurite-blob did not listen in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server.create_container(container);
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Azure's Create Container, signed with the account's shared key (object_store has no call
    /// for it).
    fn create_container(&self, container: &str) {
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let version = "2021-08-06";
        let resource = format!("/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container");
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n{resource}"
        );
        let engine = base64::engine::general_purpose::STANDARD;
        let key = ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            &engine.decode(ACCOUNT_KEY).unwrap(),
        );
        let signature = engine.encode(ring::hmac::sign(&key, to_sign.as_bytes()).as_ref());
        let request = format!(
            "PUT /{ACCOUNT}/{container}?restype=container HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
             x-ms-date: {date}\r\nx-ms-version: {version}\r\nContent-Length: 0\r\n\
             Authorization: SharedKey {ACCOUNT}:{signature}\r\nConnection: close\r\n\r\n",
            self.port
        );
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("azurite connects");
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 201"),
            "container {container} not created: {}",
            reply.lines().next().unwrap_or_default()
        );
    }

    /// The environment kiln needs to reach this emulator, with its model cache in `cache`.
    pub fn env(&self, cache: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", self.url()),
            ("KILN_MODEL_CACHE_DIR", cache.into()),
        ]
    }

    /// A client for `container`, to upload and delete blobs as an operator would.
    pub fn client(&self, container: &str) -> Bucket {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // As a plain account at the emulator's address: in emulator mode object_store takes the
        // address from the process's environment, which parallel tests must not share.
        let store = MicrosoftAzureBuilder::new()
            .with_endpoint(format!("{}/{ACCOUNT}", self.url()))
            .with_allow_http(true)
            .with_account(ACCOUNT)
            .with_access_key(ACCOUNT_KEY)
            .with_container_name(container)
            .build()
            .expect("Azure client for the emulator");
        Bucket::new(store)
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
