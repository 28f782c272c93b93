//! Triton's `model_warmup`: sample requests every instance runs while its version loads, before
//! the version serves, so that the first clients do not pay for ONNX Runtime's first-run work
//! (arena growth, kernel selection, CUDA's lazy initialisation). A sample that fails fails the
//! load. As in Triton, the samples count in the version's statistics and metrics.
//!
//! Each input of a sample is all zeros (`zero_data`), random values (`random_data`), or the raw
//! contents of a file in the model's `warmup/` directory (`input_data_file`), for one batch
//! element; a sample of batch size n repeats that element n times. BYTES elements are empty
//! strings for zero and random data, and length-prefixed in a file, as in Triton.

use super::io::IoSpec;
use super::loader::LoadError;
use super::store::contained;
use super::validate;
use crate::backend::Backend;
use crate::core::tensor::{check_bytes_framing, element_count};
use crate::core::{DataType, InferRequest, Tensor};
use crate::metrics::{ComputeTimes, ModelStats, Timing};
use crate::proto::inference::model_warmup::input::InputDataType;
use crate::proto::inference::{ModelConfig, ModelWarmup};
use crate::repository::config::datatype_from_config;
use crate::scheduler::layout::BatchLayout;
use bytes::Bytes;
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest tensor a warmup sample may make (batch included): 256 MiB.
const MAX_SAMPLE_BYTES: usize = 256 << 20;

/// Most runs a sample's `count` may ask of each instance when a client sent the config (a load's
/// config override, checked by [`super::overrides::parse`]). Triton has no bound: `count:
/// 4294967295` in an override kept a core busy for good and the load never answered. The
/// repository's own `config.pbtxt` is the operator's and has no bound, as in Triton. Ten
/// thousand runs is far more than warming up needs.
pub const MAX_WARMUP_COUNT: u32 = 10_000;

/// Runs every warmup sample of `config`, `count` times (at least once), on every instance (on
/// GPU `gpu(index)` or CPU), counting each run in `stats`.
///
/// # Errors
/// A message naming the sample and what is wrong with it ([`LoadError::Config`]), or how the
/// model failed on it ([`LoadError::Backend`]).
pub fn run(
    model_dir: &Path,
    config: &ModelConfig,
    io: &IoSpec,
    layout: &BatchLayout,
    backends: &mut [Box<dyn Backend>],
    stats: &ModelStats,
    gpu: impl Fn(usize) -> Option<i32>,
) -> Result<(), LoadError> {
    let stateful = matches!(
        config.scheduling_choice,
        Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(_))
    );
    if stateful && !config.model_warmup.is_empty() {
        return Err(LoadError::Config(format!(
            "model_warmup is not supported for model '{}': it is stateful (sequence_batching)",
            config.name
        )));
    }
    for sample in samples(model_dir, config, io).map_err(LoadError::Config)? {
        // Laid out as a batch of one request (ragged inputs flat, batch inputs added).
        let inputs = layout.assemble(&[&sample.inputs]);
        for (index, backend) in backends.iter_mut().enumerate() {
            for _ in 0..sample.count {
                let started = Instant::now();
                backend
                    .run(&inputs)
                    .map_err(|e| LoadError::Backend(sample.failed(&config.name, &e.to_string())))?;
                sample.record(stats, started.elapsed(), gpu(index));
            }
        }
        tracing::info!(
            "model '{}': {} instance(s) warmed up with sample '{}'",
            config.name,
            backends.len(),
            sample.name
        );
    }
    Ok(())
}

/// One warmup sample, ready to run.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    /// Runs per instance (at least one).
    pub count: u32,
    /// Its inputs in the model's order and layout, checked as a request's would be.
    pub inputs: Vec<Tensor>,
    /// Its batch size (1 for a model that does not batch): the batch dimension of `inputs`.
    pub batch: usize,
}

impl Sample {
    /// The sample as Triton hands it to a backend that sees requests one by one (a Python
    /// model's `execute`): `batch` requests of one batch element each, run in one call.
    pub fn requests(&self) -> Vec<Vec<Tensor>> {
        if self.batch <= 1 {
            return vec![self.inputs.clone()];
        }
        let one: Vec<Tensor> = self
            .inputs
            .iter()
            .map(|input| {
                let mut shape = input.shape.clone();
                if let Some(rows) = shape.first_mut() {
                    *rows = 1;
                }
                // The elements of the batch are copies of one another: the first one's bytes.
                let data = input.data.slice(..input.data.len() / self.batch);
                Tensor::new(input.name.clone(), input.datatype, shape, data)
            })
            .collect();
        vec![one; self.batch]
    }

    /// Counts one run of the sample, `elapsed` long, in the version's statistics, as Triton
    /// counts its warmup requests (statistics and metrics): an execution of `batch` rows, each
    /// row a request of its own.
    pub fn record(&self, stats: &ModelStats, elapsed: Duration, gpu: Option<i32>) {
        let compute = ComputeTimes {
            infer: elapsed,
            ..ComputeTimes::default()
        };
        stats.record_execution(self.batch, compute, gpu);
        let timing = Timing {
            compute,
            gpu,
            ..Timing::default()
        };
        for _ in 0..self.batch {
            stats.record_success(1, elapsed, timing);
        }
    }

    /// The load error for this sample failing with `why`.
    pub fn failed(&self, model: &str, why: &str) -> String {
        format!(
            "failed to warm up model '{model}' with sample '{}': {why}",
            self.name
        )
    }
}

/// The warmup samples of `config`, made and checked.
///
/// # Errors
/// A message naming the sample and what is wrong with it.
pub fn samples(model_dir: &Path, config: &ModelConfig, io: &IoSpec) -> Result<Vec<Sample>, String> {
    config
        .model_warmup
        .iter()
        .map(|sample| {
            let mut made = Sample {
                name: sample.name.clone(),
                count: sample.count.max(1),
                inputs: Vec::new(),
                batch: if io.max_batch_size > 0 {
                    usize::try_from(sample.batch_size.max(1)).unwrap_or(1)
                } else {
                    1
                },
            };
            made.inputs = sample_inputs(model_dir, &config.name, io, sample)
                .map_err(|why| made.failed(&config.name, &why))?;
            Ok(made)
        })
        .collect()
}

/// The sample's inputs in the model's order and layout, checked as a request's would be.
fn sample_inputs(
    model_dir: &Path,
    model: &str,
    io: &IoSpec,
    sample: &ModelWarmup,
) -> Result<Vec<Tensor>, String> {
    let batched = io.max_batch_size > 0;
    let batch = sample.batch_size as usize;
    if batched && !(1..=io.max_batch_size).contains(&batch) {
        return Err(format!(
            "batch_size {batch} must be between 1 and the model's max_batch_size {}",
            io.max_batch_size
        ));
    }
    if !batched && batch > 1 {
        return Err(format!(
            "batch_size {batch} for a model that does not batch (max_batch_size 0)"
        ));
    }
    let mut request = InferRequest::default();
    for spec in &io.inputs {
        let input = sample
            .inputs
            .get(&spec.name)
            .ok_or_else(|| format!("no data for input '{}'", spec.name))?;
        let datatype = datatype_from_config(input.data_type)
            .ok_or_else(|| format!("input '{}' has no valid data_type", spec.name))?;
        let one = element_count(&input.dims).map_err(|e| format!("input '{}': {e}", spec.name))?;
        let data = element_data(model_dir, &spec.name, datatype, one, input)?;
        let (shape, data) = if batched {
            let batch_shape = [batch as i64].into_iter().chain(input.dims.iter().copied());
            (batch_shape.collect(), Bytes::from(data.repeat(batch)))
        } else {
            (input.dims.clone(), Bytes::from(data))
        };
        request
            .inputs
            .push(Tensor::new(spec.name.clone(), datatype, shape, data));
    }
    if let Some(extra) = sample.inputs.keys().find(|name| io.input(name).is_none()) {
        return Err(format!("'{extra}' is not an input of the model"));
    }
    validate::prepare_inputs(model, io, &mut request).map_err(|e| e.message().to_string())
}

/// One batch element's data for one input.
fn element_data(
    model_dir: &Path,
    name: &str,
    datatype: DataType,
    elements: usize,
    input: &crate::proto::inference::model_warmup::Input,
) -> Result<Vec<u8>, String> {
    let size = match datatype.element_size() {
        Some(width) => elements.checked_mul(width),
        // An empty string per element: its 4-byte length.
        None => elements.checked_mul(4),
    }
    .filter(|&size| size <= MAX_SAMPLE_BYTES)
    .ok_or_else(|| {
        format!("input '{name}' is larger than the {MAX_SAMPLE_BYTES} bytes a sample may use")
    })?;
    match &input.input_data_type {
        Some(InputDataType::ZeroData(_)) | None => Ok(vec![0; size]),
        Some(InputDataType::RandomData(_)) => Ok(random_data(datatype, elements, size)),
        Some(InputDataType::InputDataFile(file)) => {
            let path = contained(&model_dir.join("warmup"), file)
                .map_err(|e| format!("input '{name}': input_data_file {e}"))?;
            let data = std::fs::read(&path)
                .map_err(|e| format!("input '{name}': cannot read {}: {e}", path.display()))?;
            match datatype.element_size() {
                Some(_) if data.len() != size => Err(format!(
                    "input '{name}': {} holds {} bytes, one batch element takes {size}",
                    path.display(),
                    data.len()
                )),
                None => check_bytes_framing(&data, elements)
                    .map(|()| data)
                    .map_err(|e| format!("input '{name}': {}: {e}", path.display())),
                Some(_) => Ok(data),
            }
        }
    }
}

/// Values in [0, 1) for floating-point inputs, 0..=99 for integers (valid indices for most
/// embedding tables), booleans at random, empty strings for BYTES: every kind a model accepts.
fn random_data(datatype: DataType, elements: usize, size: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        // xorshift64*: fixed seed, so that a warmup is the same on every load.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let unit = |bits: u64| (bits >> 11) as f64 / (1u64 << 53) as f64;
    let mut out = Vec::with_capacity(size);
    for _ in 0..elements {
        let bits = next();
        let small = bits % 100;
        match datatype {
            DataType::Bool => out.push((bits & 1) as u8),
            DataType::Uint8 | DataType::Int8 => out.push(small as u8),
            DataType::Uint16 | DataType::Int16 => out.extend((small as u16).to_le_bytes()),
            DataType::Uint32 | DataType::Int32 => out.extend((small as u32).to_le_bytes()),
            DataType::Uint64 | DataType::Int64 => out.extend(small.to_le_bytes()),
            DataType::Fp16 => out.extend(half::f16::from_f64(unit(bits)).to_le_bytes()),
            DataType::Bf16 => out.extend(half::bf16::from_f64(unit(bits)).to_le_bytes()),
            DataType::Fp32 => out.extend((unit(bits) as f32).to_le_bytes()),
            DataType::Fp64 => out.extend(unit(bits).to_le_bytes()),
            DataType::Bytes => out.extend(0u32.to_le_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests;
