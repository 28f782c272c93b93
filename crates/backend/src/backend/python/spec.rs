//! What a Python model is made of, from its config: the backend that names it, its interpreter
//! and its instances ([`PythonSpec`]), and what its `auto_complete_config` makes of its config.

use super::environment::{self, Interpreter};
use super::messages::pipe_error;
use super::stub::Stub;
use super::{ModelCaller, StubEnvironment};
use crate::proto::inference::{model_instance_group::Kind, ModelConfig};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The `backend` of a Python model.
pub const BACKEND: &str = "python";
/// Its model file when the config names none.
pub const DEFAULT_MODEL_FILENAME: &str = "model.py";
/// Where Python-based backends live unless `--backend-directory` says otherwise (Triton's).
pub const DEFAULT_BACKEND_DIRECTORY: &str = "/opt/tritonserver/backends";

/// The `model.py` of the Python-based backend `config` names: `<backend_dir>/<backend>/model.py`
/// when the backend is neither ONNX Runtime nor Python and the file exists (Triton's Python-based
/// backends: one `model.py` serves every model naming the backend). A backend name that is not a
/// plain directory name names none.
pub fn backend_code(config: &ModelConfig, backend_dir: &Path) -> Option<PathBuf> {
    let backend = config.backend.as_str();
    let plain = !backend.is_empty()
        && !matches!(backend, "." | ".." | BACKEND | "onnxruntime")
        && !backend.contains(['/', '\\', '\0']);
    let code = backend_dir.join(backend).join(DEFAULT_MODEL_FILENAME);
    (plain && code.is_file()).then_some(code)
}
/// One instance: Triton's name for it and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    /// `CPU`, `GPU` or `MODEL`, as `args["model_instance_kind"]` tells the model.
    pub kind: &'static str,
    pub device: i32,
    /// Its instance group, by index in the config.
    pub group: usize,
}

/// What a Python model's versions start: the interpreter and the instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonSpec {
    pub interpreter: Interpreter,
    pub instances: Vec<Instance>,
    /// What the model's calls to other models go through.
    pub caller: ModelCaller,
    /// The `model.py` of a Python-based backend, which every version runs (`None`: each
    /// version's own).
    pub code: Option<PathBuf>,
    /// Whether the dynamic batcher takes kiln's shortcuts (see
    /// `repository::config::adaptive_batching_delay`, in `kiln-repository`).
    pub adaptive_batching: bool,
}

impl PythonSpec {
    /// Reads the interpreter and the instance groups, normalised in `config` as Triton shows
    /// them: a config without groups gets one named after the model, an unnamed group is
    /// `<model>_<index>`, counts are 1 by default; instances are `<group>_<n>`. A `KIND_GPU`
    /// group tells its instances their GPU; kiln does not check it (the model's own libraries
    /// use it).
    ///
    /// # Errors
    /// An `EXECUTION_ENV_PATH` that is not an environment, a BF16 tensor (numpy has no
    /// such type).
    pub fn from_config(
        config: &mut ModelConfig,
        dir: &Path,
        caller: &ModelCaller,
        variables: &StubEnvironment,
    ) -> Result<PythonSpec, String> {
        let name = config.name.clone();
        for (tensor, data_type) in config
            .input
            .iter()
            .map(|i| (&i.name, i.data_type))
            .chain(config.output.iter().map(|o| (&o.name, o.data_type)))
        {
            if data_type == crate::proto::inference::DataType::TypeBf16 as i32 {
                return Err(format!(
                    "tensor '{tensor}' of Python model '{name}' is BF16, which numpy cannot hold"
                ));
            }
        }
        let interpreter = interpreter(config, dir, variables)?;
        // As Triton names them: the group a config leaves out is named after the model, unnamed
        // groups `<model>_<index>`; instances `<group>_<n>`.
        if config.instance_group.is_empty() {
            config
                .instance_group
                .push(crate::proto::inference::ModelInstanceGroup {
                    name: name.clone(),
                    ..Default::default()
                });
        }
        let mut instances = Vec::new();
        for (index, group) in config.instance_group.iter_mut().enumerate() {
            if group.name.is_empty() {
                group.name = format!("{name}_{index}");
            }
            if group.count < 1 {
                group.count = 1;
            }
            let (kind, devices) = if group.kind == Kind::Gpu as i32 {
                let gpus = if group.gpus.is_empty() {
                    vec![0]
                } else {
                    group.gpus.clone()
                };
                ("GPU", gpus)
            } else if group.kind == Kind::Model as i32 {
                // The model places itself (vLLM's multi-GPU engines ask for this).
                ("MODEL", vec![0])
            } else {
                group.kind = Kind::Cpu as i32;
                ("CPU", vec![0])
            };
            let mut n = 0;
            for device in devices {
                for _ in 0..group.count {
                    instances.push(Instance {
                        name: format!("{}_{n}", group.name),
                        kind,
                        device,
                        group: index,
                    });
                    n += 1;
                }
            }
        }
        Ok(PythonSpec {
            interpreter,
            instances,
            caller: caller.clone(),
            code: None,
            adaptive_batching: false,
        })
    }
}

/// What the model's `auto_complete_config(auto_complete_model_config)` makes of `config`, as
/// Triton asks before loading, when `model_file`'s `TritonPythonModel` has one: the completed
/// config as JSON, or `None` when the model leaves it as it is. Blocking.
///
/// # Errors
/// What the model raised, or why Python did not run.
pub fn auto_complete(
    config: &ModelConfig,
    dir: &Path,
    model_file: &Path,
    variables: &StubEnvironment,
) -> Result<Option<Value>, String> {
    let interpreter = interpreter(config, dir, variables)?;
    let name = config.name.clone();
    let mut stub = Stub::spawn(&interpreter, model_file, &["--auto-complete"])?;
    let current = crate::proto::to_json(config, "inference.ModelConfig");
    let answer = stub
        .send(json!({"op": "auto_complete", "config": current}), &[])
        .and_then(|()| stub.answer(&name, "auto-complete", &ModelCaller::default()));
    let status = stub.kill();
    let mut message = answer.map_err(|e| {
        format!(
            "the Python stub of model '{name}' ended before auto_complete_config answered \
             ({}{status}): its error is in the log above; the stub needs numpy in {interpreter}",
            pipe_error(&e),
        )
    })?;
    let completed = message.header["config"].take();
    match (message.header["op"].as_str(), completed) {
        (Some("config"), Value::Null) => Ok(None),
        (Some("config"), completed) => Ok(Some(completed)),
        _ => Err(format!(
            "auto_complete_config of model '{name}' failed: {}",
            message.header["message"].as_str().unwrap_or("")
        )),
    }
}

/// The interpreter a model runs under, its stubs seeing `variables`. Blocking: a packed
/// environment is unpacked.
pub(super) fn interpreter(
    config: &ModelConfig,
    dir: &Path,
    variables: &StubEnvironment,
) -> Result<Interpreter, String> {
    let parameter = config
        .parameters
        .get(environment::EXECUTION_ENV_PATH)
        .map(|p| p.string_value.as_str());
    Interpreter::find(parameter, dir, variables)
}
