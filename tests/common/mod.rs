//! Starts the real `kiln` binary on an ephemeral port and stops it (by PID) when dropped.

use kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tonic::transport::Channel;

pub struct Server {
    child: Child,
    pub address: String,
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
            .args(extra)
            .env("RUST_LOG", "info,ort=error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("kiln binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (found, address) = mpsc::channel();
        std::thread::spawn(move || {
            let mut found = Some(found);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[kiln] {line}");
                if let Some(rest) = line.split("Started GRPCInferenceService at ").nth(1) {
                    if let Some(sender) = found.take() {
                        let _ = sender.send(rest.trim().to_string());
                    }
                }
            }
        });
        let address = match address.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                panic!("kiln did not start within 60 s");
            }
        };
        Server { child, address }
    }

    pub async fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        GrpcInferenceServiceClient::connect(format!("http://{}", self.address))
            .await
            .expect("connects")
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
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
