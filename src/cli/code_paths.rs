//! The flags of what code and which paths clients may bring (see "Security model" in
//! docs/operations.md): closed by default where Triton's default lets a client in, each one flag
//! away from Triton's behaviour.

use super::bool_value;
use crate::core::path::absolute_lexical;
use crate::protocol::http::sagemaker::DEFAULT_MODEL_ROOT;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct CodePathFlags {
    /// Let a load request's `file:` overrides bring code: a Python model (`backend: "python"`
    /// or a Python-based backend) or any Python file (`*.py`, `*.pyc`, `*.pth`), which then runs
    /// as the server's user, as Triton allows. Off (the default): such a load is refused, and
    /// overrides may only bring ONNX models and their data.
    #[arg(long, env = "KILN_ALLOW_CODE_IN_LOAD_OVERRIDES", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_code_in_load_overrides: bool,

    /// A directory a Python model's `EXECUTION_ENV_PATH` may name an environment in, besides
    /// the model's own repository (repeatable). The path, after `$$TRITON_MODEL_DIRECTORY` is
    /// replaced, is checked lexically (`..` folded). `/` allows any, as Triton does.
    #[arg(long = "python-env-root", value_name = "DIR")]
    pub python_env_roots: Vec<PathBuf>,

    /// A directory SageMaker's `POST /models` may load a model from (repeatable; default
    /// /opt/ml/models, where SageMaker puts them). `/` allows any but /dev, /proc and /sys, as
    /// Triton before 2.70 did.
    #[arg(long = "sagemaker-model-root", value_name = "DIR")]
    pub sagemaker_model_roots: Vec<PathBuf>,
}

impl CodePathFlags {
    /// `--python-env-root` made absolute and normal.
    pub fn python_env_roots(&self) -> Vec<PathBuf> {
        self.python_env_roots
            .iter()
            .map(|p| absolute_lexical(p))
            .collect()
    }

    /// `--sagemaker-model-root`, or SageMaker's directory, made absolute and normal.
    pub fn sagemaker_model_roots(&self) -> Vec<PathBuf> {
        if self.sagemaker_model_roots.is_empty() {
            return vec![PathBuf::from(DEFAULT_MODEL_ROOT)];
        }
        self.sagemaker_model_roots
            .iter()
            .map(|p| absolute_lexical(p))
            .collect()
    }
}
