//! `--idle-poll-us` through the real binary: one poller per CPU, in the SCHED_IDLE class,
//! requests answered as usual while they poll, and pollers asleep once traffic stops (an idle
//! server spends no CPU). Without the flag there are no pollers.

use crate::common::lifecycle::eventually;
use crate::common::{add_sub_row, fp32_values, Server};

/// `policy` value of a SCHED_IDLE thread in /proc/<pid>/task/<tid>/stat.
const SCHED_IDLE: u32 = 5;

/// (state, policy) of each of the server's threads named `idle-poll-*`.
fn pollers(server: &Server) -> Vec<(char, u32)> {
    let mut found = Vec::new();
    for (name, path) in server.threads() {
        if !name.starts_with("idle-poll-") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue; // the thread exited
        };
        // Fields after the parenthesised name, from field 3 (state); `policy` is field 41.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .expect("stat has a name")
            .1
            .split_whitespace()
            .collect();
        let state = fields[0].chars().next().expect("a state");
        found.push((state, fields[41 - 3].parse().expect("a policy")));
    }
    found
}

#[tokio::test]
async fn pollers_poll_at_idle_priority_and_sleep_without_traffic() {
    let server = Server::start_with(&["model_repository"], &["--idle-poll-us", "200"]);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = pollers(&server);
    assert_eq!(threads.len(), cpus, "one poller per CPU: {threads:?}");
    assert!(
        threads.iter().all(|&(_, policy)| policy == SCHED_IDLE),
        "{threads:?}"
    );

    let client = server.client().await;
    let answers = (0..64).map(|i| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let response = client
                .model_infer(add_sub_row(&[i as f32; 16], &[1.0; 16]))
                .await?
                .into_inner();
            Ok::<_, tonic::Status>(fp32_values(&response.raw_output_contents[0])[0])
        })
    });
    let answers: Vec<f32> = futures_util::future::join_all(answers)
        .await
        .into_iter()
        .map(|joined| joined.expect("task").expect("answered"))
        .collect();
    let expected: Vec<f32> = (0..64).map(|i| i as f32 + 1.0).collect();
    assert_eq!(answers, expected);

    // No traffic: every poller goes to sleep.
    eventually("every poller asleep", || async {
        pollers(&server).iter().all(|&(state, _)| state == 'S')
    })
    .await;

    let plain = Server::start_with(&["model_repository"], &[]);
    assert!(pollers(&plain).is_empty());
}

#[test]
fn windows_beyond_a_second_are_refused() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "--model-repository",
            "model_repository",
            "--idle-poll-us",
            "1000001",
        ])
        .output()
        .expect("kiln runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid value '1000001' for '--idle-poll-us"),
        "{stderr}"
    );
}
