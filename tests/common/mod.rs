//! Starts the real `kiln` binary on ephemeral ports and stops it (by PID) when dropped.
// Each test crate uses a different part of these helpers.
#![allow(dead_code)]

pub mod http_client;

use kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
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

    pub fn start_with(repositories: &[&str], extra: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        for repository in repositories {
            command.arg("--model-repository").arg(repo_path(repository));
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
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[kiln] {line}");
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
        while address.is_none() || http_address.is_none() || metrics.is_none() {
            match addresses.recv_timeout(Duration::from_secs(60)) {
                Ok((service, at)) if service == "GRPCInferenceService" => address = Some(at),
                Ok((service, at)) if service == "HTTPService" => http_address = Some(at),
                Ok((service, at)) if service == "Metrics Service" => metrics = Some(at),
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
        }
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

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
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

/// Little-endian FP32 bytes, the raw layout of an FP32 tensor.
pub fn fp32_bytes(values: &[f32]) -> bytes::Bytes {
    values
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

/// The values of a raw FP32 tensor.
pub fn fp32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
