use super::*;
use crate::backend::BackendError;
use crate::core::tensor::frame_bytes;
use crate::repository::config::parse_config;
use crate::repository::io::TensorSpec;
use crate::repository::LoadError;
use std::sync::{Arc, Mutex};

/// Keeps every batch it is asked to run.
struct Recording(Arc<Mutex<Vec<Vec<Tensor>>>>);

impl Backend for Recording {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.0.lock().unwrap().push(inputs.to_vec());
        Ok(Vec::new())
    }
}

struct Failing;

impl Backend for Failing {
    fn run(&mut self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        Err(BackendError::Run("out of memory".into()))
    }
}

/// [`super::run`] on CPU instances, counting in statistics nobody reads.
fn run(
    dir: &Path,
    config: &ModelConfig,
    io: &IoSpec,
    layout: &BatchLayout,
    backends: &mut [Box<dyn Backend>],
) -> Result<(), LoadError> {
    super::run(
        dir,
        config,
        io,
        layout,
        backends,
        &ModelStats::new("m", 1),
        |_| None,
    )
}

fn io(max_batch_size: usize) -> IoSpec {
    IoSpec {
        max_batch_size,
        inputs: vec![
            TensorSpec::new("A", DataType::Fp32, &[2]),
            TensorSpec::new("T", DataType::Bytes, &[1]),
        ],
        outputs: Vec::new(),
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-warmup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("warmup")).unwrap();
    dir
}

fn config(samples: &str) -> ModelConfig {
    parse_config(&format!("name: \"m\" max_batch_size: 4 {samples}")).unwrap()
}

const BOTH: &str =
    r#"inputs { key: "T" value { data_type: TYPE_STRING dims: [1] zero_data: true } }"#;

#[test]
fn every_instance_runs_every_sample_count_times() {
    let dir = scratch("runs");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![
        Box::new(Recording(Arc::clone(&seen))),
        Box::new(Recording(Arc::clone(&seen))),
    ];
    let config = config(&format!(
        r#"model_warmup [
          {{ name: "zeros" batch_size: 3 count: 2
             inputs {{ key: "A" value {{ data_type: TYPE_FP32 dims: [2] zero_data: true }} }} {BOTH} }},
          {{ name: "random" batch_size: 1
             inputs {{ key: "A" value {{ data_type: TYPE_FP32 dims: [2] random_data: true }} }} {BOTH} }}
        ]"#
    ));
    let stats = ModelStats::new("m", 1);
    let gpu = |index| (index == 1).then_some(0);
    super::run(
        &dir,
        &config,
        &io(4),
        &Default::default(),
        &mut backends,
        &stats,
        gpu,
    )
    .unwrap();
    // Counted as Triton counts its samples: each row a request, each run an execution.
    let counted = stats.snapshot();
    assert_eq!((counted.execution_count, counted.inference_count), (6, 14));
    let batches: Vec<(u64, u64)> = counted
        .batch_stats
        .iter()
        .map(|b| (b.batch_size, b.compute_infer.as_ref().unwrap().count))
        .collect();
    assert_eq!(batches, [(1, 2), (3, 4)]);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2 * 2 + 2);
    let zeros = &seen[0];
    assert_eq!(zeros[0].shape, [3, 2]);
    assert_eq!(&zeros[0].data[..], &[0u8; 24]);
    // Three empty strings: three zero lengths.
    assert_eq!(
        (&zeros[1].shape[..], &zeros[1].data[..]),
        (&[3i64, 1][..], &[0u8; 12][..])
    );
    let random = &seen[4][0];
    let values: Vec<f32> = random
        .data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(values.iter().all(|v| (0.0..1.0).contains(v)) && values[0] != values[1]);
}

#[test]
fn file_data_comes_from_the_warmup_directory() {
    let dir = scratch("files");
    let values: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(dir.join("warmup/a.bin"), &values).unwrap();
    std::fs::write(
        dir.join("warmup/t.bin"),
        [&2u32.to_le_bytes()[..], b"hi"].concat(),
    )
    .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Recording(Arc::clone(&seen)))];
    let sample = |a: &str, t: &str| {
        config(&format!(
            r#"model_warmup {{ name: "file" batch_size: 2
                inputs {{ key: "A" value {{ data_type: TYPE_FP32 dims: [2] input_data_file: "{a}" }} }}
                inputs {{ key: "T" value {{ data_type: TYPE_STRING dims: [1] input_data_file: "{t}" }} }} }}"#
        ))
    };
    run(
        &dir,
        &sample("a.bin", "t.bin"),
        &io(4),
        &Default::default(),
        &mut backends,
    )
    .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(&seen[0][0].data[..], &[values.clone(), values].concat()[..]);
    assert_eq!(seen[0][1].data.len(), 2 * 6);
    drop(seen);
    let mut error = |a: &str, t: &str| {
        let error = run(
            &dir,
            &sample(a, t),
            &io(4),
            &Default::default(),
            &mut backends,
        )
        .unwrap_err();
        assert!(matches!(error, LoadError::Config(_)), "{error:?}");
        error.to_string()
    };
    let wrong_size = error("t.bin", "t.bin");
    assert!(
        wrong_size.contains("one batch element takes 8"),
        "{wrong_size}"
    );
    assert!(error("a.bin", "a.bin").contains("input 'T'"));
    assert!(error("../a.bin", "t.bin").contains("must be relative and stay within"));
    assert!(error("missing.bin", "t.bin").contains("cannot read"));
}

#[test]
fn bad_samples_fail_the_load_with_a_reason() {
    let dir = scratch("bad");
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Failing)];
    let a = |dims: &str| {
        format!(
            r#"inputs {{ key: "A" value {{ data_type: TYPE_FP32 dims: {dims} zero_data: true }} }}"#
        )
    };
    let check = |samples: String, io: IoSpec, expected: &str| {
        let mut ok: Vec<Box<dyn Backend>> =
            vec![Box::new(Recording(Arc::new(Mutex::new(Vec::new()))))];
        let error = run(&dir, &config(&samples), &io, &Default::default(), &mut ok).unwrap_err();
        assert!(matches!(error, LoadError::Config(_)), "{error:?}");
        let error = error.to_string();
        assert!(
            error.starts_with("failed to warm up model 'm' with sample 's': ")
                && error.contains(expected),
            "{error}"
        );
    };
    let sample = |batch: u32, body: String| {
        format!(r#"model_warmup {{ name: "s" batch_size: {batch} {body} }}"#)
    };
    check(
        sample(5, a("[2]") + BOTH),
        io(4),
        "batch_size 5 must be between 1 and the model's max_batch_size 4",
    );
    check(sample(0, a("[2]") + BOTH), io(4), "batch_size 0");
    check(sample(2, a("[2]") + BOTH), io(0), "does not batch");
    check(sample(1, a("[2]")), io(4), "no data for input 'T'");
    check(sample(1, a("[3]") + BOTH), io(4), "unexpected shape");
    check(sample(1, a("[-1]") + BOTH), io(4), "input 'A'");
    check(
        sample(1, a("[1048576, 1048576]") + BOTH),
        io(4),
        "larger than the",
    );
    let extra = r#"inputs { key: "Z" value { data_type: TYPE_FP32 dims: [1] zero_data: true } }"#;
    check(
        sample(1, a("[2]") + BOTH + extra),
        io(4),
        "'Z' is not an input of the model",
    );
    // The model itself failing: the backend's failure, not the sample's.
    let error = run(
        &dir,
        &config(&sample(1, a("[2]") + BOTH)),
        &io(4),
        &Default::default(),
        &mut backends,
    )
    .unwrap_err();
    assert!(
        matches!(&error, LoadError::Backend(why) if why.ends_with("out of memory")),
        "{error:?}"
    );
}

#[test]
fn stateful_models_are_not_warmed_up() {
    let mut config = config(&format!(
        r#"model_warmup {{ name: "s" batch_size: 1
            inputs {{ key: "A" value {{ data_type: TYPE_FP32 dims: [2] zero_data: true }} }} {BOTH} }}"#
    ));
    config.scheduling_choice = Some(
        crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(
            Default::default(),
        ),
    );
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Failing)];
    let error = run(
        &scratch("stateful"),
        &config,
        &io(4),
        &Default::default(),
        &mut backends,
    )
    .unwrap_err();
    assert!(
        matches!(&error, LoadError::Config(why) if why.contains("stateful")),
        "{error:?}"
    );
}

#[test]
fn random_data_fits_every_type() {
    for datatype in DataType::ALL {
        let size = datatype.element_size().unwrap_or(4) * 5;
        let data = random_data(datatype, 5, size);
        assert_eq!(data.len(), size, "{datatype:?}");
    }
    assert_eq!(
        random_data(DataType::Int64, 3, 24),
        random_data(DataType::Int64, 3, 24)
    );
}

#[test]
fn a_batched_sample_is_a_request_per_element_for_models_that_see_requests() {
    let sample = Sample {
        name: "s".into(),
        count: 1,
        inputs: vec![
            Tensor::new(
                "X",
                DataType::Fp32,
                vec![2, 2],
                Bytes::from([1.5f32, 2.5, 1.5, 2.5].map(f32::to_le_bytes).concat()),
            ),
            Tensor::new("T", DataType::Bytes, vec![2, 1], frame_bytes(["ab", "ab"])),
        ],
        batch: 2,
    };
    let requests = sample.requests();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request[0].shape, vec![1, 2]);
        assert_eq!(
            request[0].data,
            Bytes::from([1.5f32, 2.5].map(f32::to_le_bytes).concat())
        );
        assert_eq!(request[1].shape, vec![1, 1]);
        assert_eq!(request[1].data, frame_bytes(["ab"]));
    }
    let alone = Sample { batch: 1, ..sample };
    assert_eq!(alone.requests(), vec![alone.inputs.clone()]);
}
