//! Starts the real `kiln` binary on ephemeral ports and stops it (by PID) when dropped.

pub mod azurite;
pub mod http_client;
pub mod lifecycle;
pub mod onnx;
pub mod s3;

use kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::proto::inference::model_infer_request::InferInputTensor;
use kiln::proto::inference::{ModelConfig, ModelConfigRequest, ModelInferRequest};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

pub struct Server {
    child: Child,
    /// gRPC address.
    pub address: String,
    /// REST address.
    pub http_address: String,
    /// Prometheus metrics address.
    pub metrics: String,
    /// Every line the server has logged so far (stderr).
    log: Arc<Mutex<Vec<String>>>,
}

/// A test server installed by `.ci/setup.sh <part>`: `$<env>` when set, else `local` (a path
/// in the checkout), running that setup step first when it is missing (once per test binary:
/// tests run on parallel threads), and failing loudly if it still is, so CI never skips the
/// tests that need it.
pub fn setup_tool(env: &str, local: &str, part: &str, what: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let local = repo_path(local);
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if !local.exists() {
        eprintln!("{what} missing: running .ci/setup.sh {part}");
        let status = Command::new(repo_path(".ci/setup.sh"))
            .arg(part)
            .status()
            .expect(".ci/setup.sh runs");
        assert!(status.success(), ".ci/setup.sh {part} failed: {status}");
    }
    assert!(
        local.exists(),
        "{what} not found at {} (run .ci/setup.sh {part})",
        local.display()
    );
    local
}

pub fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

impl Server {
    /// Serves the bundled repository and the test fixtures.
    pub fn start() -> Server {
        Server::start_with(
            &["model_repository", "tests/fixtures/model_repository"],
            &[],
        )
    }

    /// Serves `repositories` (relative to the crate) with `extra` flags, and returns once the
    /// listeners answer and the start-up model load has finished.
    pub fn start_with(repositories: &[&str], extra: &[&str]) -> Server {
        let paths: Vec<PathBuf> = repositories.iter().map(|r| repo_path(r)).collect();
        Server::launch(&paths, extra, true)
    }

    /// Starts kiln on repositories given by absolute path; `wait_for_models` false returns as soon
    /// as the listeners answer, while models may still be loading.
    pub fn launch(repositories: &[PathBuf], extra: &[&str], wait_for_models: bool) -> Server {
        Server::launch_env(repositories, extra, &[], wait_for_models)
    }

    /// As [`Server::launch`], with `env` added to kiln's environment (an S3 endpoint and keys).
    pub fn launch_env(
        repositories: &[PathBuf],
        extra: &[&str],
        env: &[(&str, &str)],
        wait_for_models: bool,
    ) -> Server {
        let command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        Server::launch_command(command, repositories, extra, env, wait_for_models)
    }

    /// As [`Server::launch_env`], started by the shell script `wrapper`, which gets kiln's path
    /// and arguments and must `exec "$@"` (so that kiln keeps the script's process ID, `$$`).
    pub fn launch_wrapped(
        wrapper: &std::path::Path,
        repositories: &[PathBuf],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let mut command = Command::new("sh");
        command.arg(wrapper).arg(env!("CARGO_BIN_EXE_kiln"));
        Server::launch_command(command, repositories, extra, env, true)
    }

    fn launch_command(
        mut command: Command,
        repositories: &[PathBuf],
        extra: &[&str],
        env: &[(&str, &str)],
        wait_for_models: bool,
    ) -> Server {
        command.envs(env.iter().copied());
        for repository in repositories {
            command.arg("--model-repository").arg(repository);
        }
        command
            .args(["--grpc-address", "127.0.0.1", "--grpc-port", "0"])
            .args(["--http-address", "127.0.0.1", "--http-port", "0"])
            .args(["--metrics-address", "127.0.0.1", "--metrics-port", "0"])
            .args(extra)
            .env("RUST_LOG", "info,ort=error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("kiln binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        // The log announces each listener: "Started <Service> at <address>".
        let (found, addresses) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[kiln] {line}");
                lines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(line.clone());
                if line.contains("start-up model loading finished") {
                    let _ = found.send(("models".to_string(), String::new()));
                }
                if let Some(rest) = line.split("Started ").nth(1) {
                    if let Some((service, address)) = rest.split_once(" at ") {
                        let _ = found.send((service.to_string(), address.trim().to_string()));
                    }
                }
            }
        });
        let mut address = None;
        let mut http_address = None;
        let mut metrics = None;
        let mut loaded = !wait_for_models;
        while address.is_none() || http_address.is_none() || metrics.is_none() || !loaded {
            match addresses.recv_timeout(Duration::from_secs(60)) {
                Ok((service, at)) if service == "GRPCInferenceService" => address = Some(at),
                Ok((service, at)) if service == "HTTPService" => http_address = Some(at),
                Ok((service, at)) if service == "Metrics Service" => metrics = Some(at),
                Ok((service, _)) if service == "models" => loaded = true,
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    panic!("kiln did not start within 60 s");
                }
            }
        }
        Server {
            child,
            address: address.expect("set above"),
            http_address: http_address.expect("set above"),
            metrics: metrics.expect("set above"),
            log,
        }
    }

    /// How many lines the server has logged so far that contain `text`.
    pub fn logged(&self, text: &str) -> usize {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().filter(|line| line.contains(text)).count()
    }

    pub async fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        GrpcInferenceServiceClient::connect(format!("http://{}", self.address))
            .await
            .expect("connects")
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    /// The Prometheus text from `/metrics`.
    pub fn metrics_text(&self) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&self.metrics).expect("metrics port answers");
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's threads: each one's name (`comm`) and its `/proc/<pid>/task/<tid>` directory.
    pub fn threads(&self) -> Vec<(String, PathBuf)> {
        let mut found = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid()));
        for task in tasks.expect("/proc is readable") {
            let path = task.expect("task entry").path();
            // A thread that exits between the listing and this read is simply not counted.
            if let Ok(comm) = std::fs::read_to_string(path.join("comm")) {
                found.push((comm.trim_end().to_string(), path));
            }
        }
        found
    }

    /// The server's resident memory (`VmRSS` of /proc/<pid>/status), in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("/proc/<pid>/status is readable");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS is reported")
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.sigterm();
        self.wait()
    }

    /// Sends SIGTERM without waiting.
    pub fn sigterm(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("kiln exits")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The config kiln serves for the latest version of `name` (gRPC `ModelConfig`).
pub async fn model_config(
    client: &mut GrpcInferenceServiceClient<Channel>,
    name: &str,
) -> ModelConfig {
    client
        .model_config(ModelConfigRequest {
            name: name.into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap()
}

/// Little-endian FP32 bytes, the raw layout of an FP32 tensor.
pub fn fp32_bytes(values: &[f32]) -> bytes::Bytes {
    values
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

/// A one-row request to the bundled `add_sub`: INPUT0 = `a`, INPUT1 = `b` (16 values each), as
/// raw contents.
pub fn add_sub_row(a: &[f32], b: &[f32]) -> ModelInferRequest {
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![fp32_bytes(a), fp32_bytes(b)],
        ..Default::default()
    }
}

/// The values of a raw FP32 tensor.
pub fn fp32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A model repository in a fresh temporary directory, removed when dropped.
pub struct TempRepo {
    pub path: PathBuf,
}

impl TempRepo {
    pub fn new(tag: &str) -> TempRepo {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kiln-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temporary repository is created");
        TempRepo { path }
    }

    /// Starts kiln on this repository alone (see [`Server::launch`]).
    pub fn serve(&self, args: &[&str], wait_for_models: bool) -> Server {
        Server::launch(std::slice::from_ref(&self.path), args, wait_for_models)
    }

    /// Writes `file` (relative to the repository) with `contents`, creating directories.
    pub fn write(&self, file: &str, contents: impl AsRef<[u8]>) {
        let path = self.path.join(file);
        std::fs::create_dir_all(path.parent().expect("files live in directories")).unwrap();
        std::fs::write(path, contents).unwrap();
    }
}

impl Drop for TempRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
