//! Criterion micro-benchmarks of the request path's data handling, in bytes per second:
//! gRPC raw-contents decode (and the entry count before it) and response encode, BYTES framing checks, JSON tensor parsing (the
//! data alone, and a whole REST request body), and dynamic-batch concat/split. Run with
//! `cargo bench --bench hot_paths`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kiln::core::tensor::{check_bytes_framing, frame_bytes};
use kiln::core::{DataType, InferResponse, Parameters, Tensor};
use kiln::proto::inference::{model_infer_request::InferInputTensor, ModelInferRequest};
use kiln::protocol::codec::{request_from_wire, response_to_wire};
use kiln::protocol::grpc_codec::check_decode_cost_of;
use kiln::protocol::http::{json, tensor_json};
use kiln::scheduler::batch;
use prost::Message;
use std::hint::black_box;

const ROWS: usize = 8;
const WIDTH: usize = 784;

fn fp32_bytes(count: usize) -> Bytes {
    (0..count)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

fn grpc_codec(c: &mut Criterion) {
    let data = fp32_bytes(ROWS * WIDTH);
    let request = ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![ROWS as i64, WIDTH as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![data.clone()],
        ..Default::default()
    };
    let wire = Bytes::from(request.encode_to_vec());
    let mut group = c.benchmark_group("grpc");
    group.throughput(Throughput::Bytes(wire.len() as u64));
    group.bench_function("decode ModelInferRequest 8x784 FP32", |b| {
        b.iter(|| {
            let message = ModelInferRequest::decode(black_box(wire.clone())).unwrap();
            black_box(request_from_wire(message).unwrap())
        })
    });
    // What the server's codec adds before that decode (issues 35, 44): the decode-memory
    // estimate, against --grpc-max-decode-bytes' default.
    group.bench_function("decode cost ModelInferRequest 8x784 FP32", |b| {
        b.iter(|| {
            black_box(check_decode_cost_of::<ModelInferRequest>(
                black_box(&wire),
                64 << 20,
            ))
        })
    });
    let response = InferResponse {
        model_name: "mlp".into(),
        model_version: "1".into(),
        id: String::new(),
        parameters: Parameters::new(),
        outputs: vec![Tensor::new(
            "OUTPUT0",
            DataType::Fp32,
            vec![ROWS as i64, WIDTH as i64],
            data,
        )],
    };
    group.bench_function("encode ModelInferResponse 8x784 FP32", |b| {
        b.iter_batched(
            || response.clone(),
            |response| black_box(response_to_wire(response).encode_to_vec()),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn bytes_framing(c: &mut Criterion) {
    let elements: Vec<String> = (0..4096)
        .map(|i| format!("sentence number {i} of the batch"))
        .collect();
    let framed = frame_bytes(&elements);
    let mut group = c.benchmark_group("bytes");
    group.throughput(Throughput::Bytes(framed.len() as u64));
    group.bench_function("check framing of 4096 elements", |b| {
        b.iter(|| check_bytes_framing(black_box(&framed), elements.len()).unwrap())
    });
    group.bench_function("frame 4096 elements", |b| {
        b.iter(|| black_box(frame_bytes(black_box(&elements))))
    });
    group.finish();
}

fn json_tensor(c: &mut Criterion) {
    let short: Vec<String> = (0..ROWS * WIDTH)
        .map(|i| format!("{}", i as f32 * 0.25))
        .collect();
    // What Python clients send for FP32 data: each value widened to a double and printed in
    // full (`numpy.ndarray.tolist()` then `json.dumps`), 16-17 significant digits.
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let widened: Vec<String> = (0..ROWS * WIDTH)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            format!("{}", f64::from((seed >> 40) as f32 / (1u64 << 24) as f32))
        })
        .collect();
    let mut group = c.benchmark_group("json");
    for (name, values) in [
        ("decode 8x784 FP32 data", &short),
        ("decode 8x784 FP32 data, widened by Python", &widened),
    ] {
        let text = format!("[{}]", values.join(","));
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                tensor_json::decode(
                    "INPUT0",
                    DataType::Fp32,
                    ROWS * WIDTH,
                    black_box(text.as_bytes()),
                )
                .unwrap()
            })
        });
    }
    // The whole request body as the REST handler reads it: the document is parsed with the
    // tensor's data validated but left raw, and the data is then converted into the tensor.
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[{ROWS},{WIDTH}],"datatype":"FP32","data":[{}]}}],"outputs":[{{"name":"OUTPUT0"}}]}}"#,
        widened.join(",")
    );
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("request body 8x784 FP32, widened by Python", |b| {
        b.iter(|| {
            let doc = json::parse(black_box(body.as_bytes()), Some("data")).unwrap();
            let input = &doc.get("inputs").unwrap().as_array().unwrap()[0];
            let Some(json::Value::Raw(data)) = input.get("data") else {
                panic!("the data is kept raw");
            };
            tensor_json::decode("INPUT0", DataType::Fp32, ROWS * WIDTH, data).unwrap()
        })
    });
    group.finish();
}

fn batching(c: &mut Criterion) {
    let requests: Vec<Vec<Tensor>> = (0..ROWS)
        .map(|_| {
            vec![Tensor::new(
                "INPUT0",
                DataType::Fp32,
                vec![1, WIDTH as i64],
                fp32_bytes(WIDTH),
            )]
        })
        .collect();
    let slices: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
    let merged = batch::concat(&slices).into_owned();
    let rows = vec![1; ROWS];
    let mut group = c.benchmark_group("batch");
    group.throughput(Throughput::Bytes((ROWS * WIDTH * 4) as u64));
    group.bench_function("concat 8 requests of 1x784 FP32", |b| {
        b.iter(|| black_box(batch::concat(black_box(&slices))))
    });
    group.bench_function("split 8x784 FP32 into 8", |b| {
        b.iter_batched(
            || merged.clone(),
            |outputs| black_box(batch::split(outputs, &rows).unwrap()),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, grpc_codec, bytes_framing, json_tensor, batching);
criterion_main!(benches);
