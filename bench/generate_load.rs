//! The load generator of `bench/generate.py`: `--concurrency` gRPC `ModelStreamInfer` streams,
//! each sending one generation request at the same moment and reading every token response until
//! the one flagged `triton_final_response`, `--rounds` times; then `--lone` requests one after
//! another. Written in Rust so that the client costs a few microseconds per response: a Python
//! client reading tens of thousands of responses a second takes a core of the two the server has.
//!
//! `cargo bench --bench generate_load -- --url 127.0.0.1:8001 --model m [--concurrency 16]
//! [--tokens 64] [--rounds 3] [--lone 20]` prints one JSON object: `rounds` (tokens/s of each
//! round), `ttft_ms` (every request's time to first token under load) and `lone_ttft_ms`.

use kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::proto::inference::infer_parameter::ParameterChoice;
use kiln::proto::inference::model_infer_request::InferInputTensor;
use kiln::proto::inference::{InferParameter, ModelInferRequest};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, Barrier};
use tonic::transport::Channel;

const PROMPTS: &[&str] = &[
    "The potter",
    "A kiln is",
    "Wood kilns take",
    "Electric kilns",
    "The temperature of",
    "In Japan",
    "When the firing",
    "The first firing",
    "Opening a kiln",
    "Most studio potters",
    "No two pieces",
    "A controller raises",
    "Earthenware fires",
    "The ash",
    "Potters have used",
    "The glaze melts",
];

struct Args {
    url: String,
    model: String,
    concurrency: usize,
    tokens: i64,
    rounds: usize,
    lone: usize,
}

fn args() -> Args {
    let mut args = Args {
        url: "127.0.0.1:8001".into(),
        model: "tiny_decoder".into(),
        concurrency: 16,
        tokens: 64,
        rounds: 3,
        lone: 20,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().expect("every option takes a value");
        match flag.as_str() {
            "--url" => args.url = value(),
            "--model" => args.model = value(),
            "--concurrency" => args.concurrency = value().parse().expect("a number"),
            "--tokens" => args.tokens = value().parse().expect("a number"),
            "--rounds" => args.rounds = value().parse().expect("a number"),
            "--lone" => args.lone = value().parse().expect("a number"),
            "--bench" => {} // added by `cargo bench`
            other => panic!("unknown option {other}"),
        }
    }
    args
}

fn request(model: &str, prompt: &str, tokens: i64) -> ModelInferRequest {
    let mut request = ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "text_input".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            ..Default::default()
        }],
        raw_input_contents: vec![kiln::core::tensor::frame_bytes([prompt])],
        ..Default::default()
    };
    for (key, value) in [
        ("max_tokens", ParameterChoice::Int64Param(tokens)),
        ("ignore_eos", ParameterChoice::BoolParam(true)),
    ] {
        request.parameters.insert(
            key.into(),
            InferParameter {
                parameter_choice: Some(value),
            },
        );
    }
    request
}

/// One request on its own stream, started when `start` opens: (sent, first, last, responses).
async fn one(
    mut client: GrpcInferenceServiceClient<Channel>,
    request: ModelInferRequest,
    start: Arc<Barrier>,
) -> (Instant, Instant, Instant, usize) {
    let (sender, receiver) = mpsc::channel(1);
    let mut responses = client
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("the stream opens")
        .into_inner();
    start.wait().await;
    let sent = Instant::now();
    sender.send(request).await.expect("the request is sent");
    let mut first = None;
    let mut count = 0;
    while let Some(response) = responses.message().await.expect("a response") {
        assert!(
            response.error_message.is_empty(),
            "{}",
            response.error_message
        );
        let now = Instant::now();
        first.get_or_insert(now);
        count += 1;
        let last = response
            .infer_response
            .and_then(|r| r.parameters.get("triton_final_response").cloned())
            .is_some_and(|p| p.parameter_choice == Some(ParameterChoice::BoolParam(true)));
        if last {
            return (sent, first.unwrap_or(now), now, count);
        }
    }
    panic!("the stream ended before the final response");
}

/// `clients` requests at once: (tokens/s, time to first token of each in ms).
async fn round(
    client: &GrpcInferenceServiceClient<Channel>,
    args: &Args,
    clients: usize,
) -> (f64, Vec<f64>) {
    let start = Arc::new(Barrier::new(clients));
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let request = request(&args.model, PROMPTS[i % PROMPTS.len()], args.tokens);
            tokio::spawn(one(client.clone(), request, Arc::clone(&start)))
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("the request task finishes"));
    }
    let begin = results.iter().map(|r| r.0).min().expect("at least one");
    let end = results.iter().map(|r| r.2).max().expect("at least one");
    let tokens: usize = results.iter().map(|r| r.3).sum();
    assert_eq!(
        tokens,
        clients * args.tokens as usize,
        "every token arrived"
    );
    let ttft = results
        .iter()
        .map(|r| (r.1 - r.0).as_secs_f64() * 1000.0)
        .collect();
    (tokens as f64 / (end - begin).as_secs_f64(), ttft)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = args();
    let client = GrpcInferenceServiceClient::connect(format!("http://{}", args.url))
        .await
        .expect("kiln answers");
    if args.rounds > 0 {
        round(&client, &args, args.concurrency).await; // warm-up
    }
    let mut rates = Vec::new();
    let mut ttft = Vec::new();
    for _ in 0..args.rounds {
        let (rate, times) = round(&client, &args, args.concurrency).await;
        rates.push(rate);
        ttft.extend(times);
    }
    let mut lone = Vec::new();
    for _ in 0..args.lone {
        lone.extend(round(&client, &args, 1).await.1);
    }
    println!(
        "{}",
        serde_json::json!({ "rounds": rates, "ttft_ms": ttft, "lone_ttft_ms": lone })
    );
}
