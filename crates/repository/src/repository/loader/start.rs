//! Starting one version of a prepared model: its instances' sessions (or its Python processes,
//! or its generation loop), their warmup, then its scheduler.

use super::{model_path, LoadError, Prepared};
use crate::backend::python::{PythonSpec, PythonVersion};
use crate::backend::tokenize::{TextInput, TextModel, TextSpec};
use crate::backend::{Backend, Device, OnnxRuntime, OnnxSession, SessionOptions, TensorInfo};
use crate::metrics::ModelStats;
use crate::proto::inference::ModelConfig;
use crate::repository::ensemble::EnsemblePlan;
use crate::repository::python::PythonModel;
use crate::repository::sequence::{SequenceSpec, Sequences};
use crate::repository::tuning::Tuning;
use crate::repository::{
    config, generation, ragged, text, warmup, Executor, IoSpec, ServingVersion,
};
use crate::scheduler::layout::BatchLayout;
use crate::scheduler::rate_limit::{InstanceLimit, Limit, RateLimiter};
use crate::scheduler::{Scheduler, Session};
use std::path::Path;
use std::sync::Arc;

impl Prepared {
    /// Starts one version (not reused) of the prepared model.
    ///
    /// # Errors
    /// The version's reason, as the index reports it: [`LoadError::Config`] for what its files
    /// and config refuse, [`LoadError::Backend`] for what failed to start.
    pub(super) fn start(
        &self,
        version: i64,
        runtime: &OnnxRuntime,
    ) -> Result<ServingVersion, LoadError> {
        let (name, dir, config) = (&self.name, &self.dir, &self.config);
        if let Some(plan) = &self.ensemble {
            return ensemble_version(name, dir, config, plan, version);
        }
        let path = match self.python.as_ref().and_then(|spec| spec.code.clone()) {
            Some(code) => code,
            None => model_path(dir, version, &config.default_model_filename)
                .map_err(LoadError::Config)?,
        };
        if let Some(spec) = &self.python {
            return self
                .start_python(spec, version, &path)
                .map(|serving| ServingVersion {
                    sequences: self.sequence.as_ref().map(|sequence| {
                        let slots = spec.instances.len();
                        Arc::new(Sequences::with_slots(sequence.clone(), slots))
                    }),
                    ..serving
                });
        }
        let intra_op_threads = self.intra_op_threads;
        if generation::is_generation(config) {
            let options = SessionOptions {
                intra_op_threads,
                device: Device::Cpu,
                tuning: self.tuning.session(intra_op_threads.unwrap_or(1), None),
                pool_name: Some(format!("ort-{name}-{version}")),
            };
            return generation::start_version(name, version, dir, &path, config, runtime, &options);
        }
        let instances = Instances {
            devices: &self.devices,
            limits: &self.limits,
            rate_limiter: self.rate_limiter.as_ref(),
            intra_op_threads,
            tuning: &self.tuning,
            runtime,
            text: self.text.as_ref(),
            cache_responses: self.cache_responses,
            sequence: self.sequence.as_ref(),
            adaptive_batching: self.adaptive_batching,
        };
        start_version(name, version, dir, &path, config, &instances)
    }
}

/// An ensemble's version: its plan and its declared tensors, nothing to start.
fn ensemble_version(
    name: &str,
    dir: &Path,
    config: &ModelConfig,
    plan: &Arc<EnsemblePlan>,
    version: i64,
) -> Result<ServingVersion, LoadError> {
    let io = IoSpec::from_config(config).map_err(LoadError::Config)?;
    let chat = llm_chat_template(name, dir, &io);
    Ok(ServingVersion {
        version,
        io,
        executor: Executor::Ensemble(Arc::clone(plan)),
        stats: Arc::new(ModelStats::new(name, version)),
        cache: false,
        sequences: None,
        tokenizer: None,
        chat,
    })
}

/// How the instances of each version are made.
struct Instances<'a> {
    /// Where each instance runs.
    devices: &'a [Device],
    /// What each instance needs from `rate_limiter`.
    limits: &'a [Option<InstanceLimit>],
    rate_limiter: Option<&'a Arc<RateLimiter>>,
    /// Threads of each session's own, if it has a pool of its own.
    intra_op_threads: Option<usize>,
    tuning: &'a Tuning,
    runtime: &'a OnnxRuntime,
    /// A text model's tokenizer, wrapped around each session.
    text: Option<&'a TextSpec>,
    /// Whether the version's responses go to the response cache.
    cache_responses: bool,
    /// A stateful model's sequence batching.
    sequence: Option<&'a SequenceSpec>,
    /// Whether the dynamic batcher takes kiln's shortcuts.
    adaptive_batching: bool,
}

/// Starts one version: its instances' sessions, their warmup, then its scheduler. `dir` is the
/// model's directory, `path` the version's model file.
fn start_version(
    name: &str,
    version: i64,
    dir: &Path,
    path: &Path,
    config: &ModelConfig,
    instances: &Instances<'_>,
) -> Result<ServingVersion, LoadError> {
    if !path.is_file() {
        return Err(LoadError::Config(format!(
            "model file {} not found",
            path.display()
        )));
    }
    let Instances {
        devices,
        limits,
        rate_limiter,
        intra_op_threads,
        tuning,
        runtime,
        text,
        cache_responses,
        sequence,
        adaptive_batching,
    } = *instances;
    let started = std::time::Instant::now();
    // An instance that asks for more than the rate limiter has fails before any session loads.
    let limits = (0..devices.len())
        .map(|index| Limit::for_instance(rate_limiter, limits.get(index).and_then(Option::as_ref)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(LoadError::Config)?;
    // Checked against the graph with the first session, then the scheduler's and warmup's.
    let layout = Arc::new(ragged::layout(config).map_err(LoadError::Config)?);
    let mut backends: Vec<Box<dyn Backend>> = Vec::with_capacity(devices.len());
    let mut io = None;
    let mut text_input = None;
    for (index, device) in devices.iter().enumerate() {
        let options = SessionOptions {
            intra_op_threads,
            device: device.clone(),
            tuning: tuning.session(
                intra_op_threads.unwrap_or(1),
                device.gpu().map(|gpu| gpu.id),
            ),
            // The instance's own thread is `{name}-{version}-{index}` (the scheduler's).
            pool_name: Some(format!("ort-{name}-{version}-{index}")),
        };
        let session = OnnxSession::load(runtime, path, &options)
            .map_err(|e| LoadError::Backend(e.to_string()))?;
        if io.is_none() {
            let (spec, bound) =
                io_spec(config, &layout, &session, text, sequence).map_err(LoadError::Config)?;
            io = Some(spec);
            text_input = bound;
        }
        let backend = session
            .into_backend()
            .map_err(|e| LoadError::Backend(e.to_string()))?;
        let backend: Box<dyn Backend> = match &text_input {
            Some(text) => Box::new(TextModel::new(Arc::clone(text), backend)),
            None => backend,
        };
        backends.push(backend);
    }
    let io = io.ok_or_else(|| LoadError::Config(format!("model '{name}' has no instances")))?;
    let mut gpus: Vec<(i32, String)> = Vec::new();
    for device in devices {
        if let Device::Cuda { gpu, options } = device {
            if !gpus.iter().any(|(id, _)| *id == gpu.id) {
                tracing::info!(
                    "model '{name}' version {version}: instances on GPU {} ({}), CUDA options: {options}",
                    gpu.id,
                    gpu.uuid
                );
                gpus.push((gpu.id, gpu.uuid.clone()));
            }
        }
    }
    let stats = Arc::new(ModelStats::with_gpus(name, version, &gpus, cache_responses));
    let gpu = |index: usize| devices[index].gpu().map(|gpu| gpu.id);
    warmup::run(dir, config, &io, &layout, &mut backends, &stats, gpu)?;
    let sessions = backends
        .into_iter()
        .zip(limits)
        .map(|(backend, limit)| Session::new(backend, Arc::clone(&layout), limit))
        .collect();
    let mut batching = config::batching_config(config, adaptive_batching);
    batching.layout = layout;
    let scheduler = Scheduler::launch(
        &format!("{name}-{version}"),
        batching,
        sessions,
        Arc::clone(&stats),
    );
    stats.record_load(started.elapsed());
    Ok(ServingVersion {
        version,
        io,
        executor: Executor::Batched(scheduler),
        stats,
        cache: cache_responses,
        sequences: sequence.map(|spec| Arc::new(Sequences::new(spec.clone()))),
        tokenizer: text_input.map(|text| Arc::clone(text.tokenizer())),
        chat: None,
    })
}

impl Prepared {
    /// Starts one version of a Python model (its code at `path`): a process per instance, each
    /// through `initialize`; its responses go to the response cache when the model caches them.
    fn start_python(
        &self,
        spec: &PythonSpec,
        version: i64,
        path: &Path,
    ) -> Result<ServingVersion, LoadError> {
        let (name, dir, config, cached) =
            (&self.name, &self.dir, &self.config, self.cache_responses);
        let (rate_limiter, limits) = (self.rate_limiter.as_ref(), self.limits.as_slice());
        if !path.is_file() {
            return Err(LoadError::Config(format!(
                "model file {} not found",
                path.display()
            )));
        }
        let started = std::time::Instant::now();
        let io = IoSpec::from_config(config).map_err(LoadError::Config)?;
        // A version whose responses are cached has the cache's series too.
        let stats = Arc::new(ModelStats::with_gpus(name, version, &[], cached));
        let samples = warmup::samples(dir, config, &io).map_err(LoadError::Config)?;
        let limits = limits
            .iter()
            .map(|limit| Limit::for_instance(rate_limiter, limit.as_ref()))
            .collect::<Result<_, _>>()
            .map_err(LoadError::Config)?;
        let what = PythonVersion {
            config,
            version,
            dir,
            model_file: path,
            spec,
        };
        let model =
            PythonModel::start(what, &samples, &stats, limits).map_err(LoadError::Backend)?;
        stats.record_load(started.elapsed());
        Ok(ServingVersion {
            version,
            chat: llm_chat_template(name, dir, &io),
            io,
            executor: Executor::Python(Arc::new(model)),
            stats,
            cache: cached,
            sequences: None,
            tokenizer: None,
        })
    }
}

/// The chat template in `dir` of a model whose contract is Triton's LLM tensors (BYTES
/// `text_input` in, BYTES `text_output` out); none for other models.
fn llm_chat_template(
    name: &str,
    dir: &Path,
    io: &IoSpec,
) -> Option<Result<Arc<crate::generate::chat::ChatTemplate>, String>> {
    if !io.is_llm() {
        return None;
    }
    Some(crate::generate::chat::ChatTemplate::load_for(name, dir)?.map(Arc::new))
}

/// The version's contract, checked against its graph; a text model's text input is bound to the
/// graph's token inputs, and its spec replaces them.
fn io_spec(
    config: &ModelConfig,
    layout: &BatchLayout,
    session: &OnnxSession,
    text: Option<&TextSpec>,
    sequence: Option<&SequenceSpec>,
) -> Result<(IoSpec, Option<Arc<TextInput>>), String> {
    // The inputs a stateful model's sequence batcher fills are not the clients'.
    let client_inputs: Vec<TensorInfo> = match sequence {
        Some(spec) => {
            spec.check_graph(&config.name, session.inputs(), session.outputs())?;
            session
                .inputs()
                .iter()
                .filter(|t| !spec.fills(&t.name))
                .cloned()
                .collect()
        }
        None => session.inputs().to_vec(),
    };
    // A text model shows clients its text input in place of the token inputs.
    let bound = text
        .map(|text| {
            let bound = text.bind(session.inputs()).map_err(|e| e.to_string())?;
            text::check_config(config, &bound)?;
            Ok::<_, String>(bound)
        })
        .transpose()?;
    let inputs = match &bound {
        Some(bound) => bound.client_inputs(&client_inputs),
        None => client_inputs,
    };
    let mut spec = IoSpec::with_defaults(
        config,
        layout,
        &inputs,
        session.defaults(),
        session.outputs(),
    )?;
    if let Some(bound) = &bound {
        for input in spec
            .inputs
            .iter_mut()
            .filter(|i| i.name == bound.text_input())
        {
            input.text = true;
        }
    }
    Ok((spec, bound.map(Arc::new)))
}
