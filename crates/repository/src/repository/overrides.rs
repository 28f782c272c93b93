//! The load API's parameters, checked as Triton checks them: `config` (a JSON model config used
//! instead of `config.pbtxt`) and `file:<path>` (bytes of a file in an override model directory,
//! which then replaces the repository's directory entirely and requires `config`). Override files
//! are written to a fresh private temporary directory (see [`crate::scratch`]) that is removed
//! once the load has read them.

use super::config::ConfigError;
use super::limits::MAX_CONFIG_BYTES;
use super::store::plain_relative;
use super::warmup::MAX_WARMUP_COUNT;
use crate::core::{Error, LoadParameter};
use crate::invalid_arg;
use crate::proto::descriptor_pool;
use crate::proto::inference::ModelConfig;
use prost_reflect::DynamicMessage;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const FILE_PREFIX: &str = "file:";

/// What a load request asks for beyond the repository's own files.
#[derive(Debug, Default)]
pub struct Overrides {
    pub config: Option<ModelConfig>,
    /// `(relative path, contents)` of every override file.
    pub files: Vec<(String, bytes::Bytes)>,
}

/// What Triton answers for a load whose model it could not poll (INTERNAL), with kiln's `reason`
/// after it. Triton reads the override (config and files) while polling the model (core
/// src/model_repository_manager/model_repository_manager.cc, `InitializeModelInfo` and the
/// `LocalizeRepoAgent`); a failure there only goes to its log, and `LoadUnloadModel` answers this
/// text, which Triton's own client examples (`simple_grpc_model_control.py`) and
/// qa/L0_http `test_load_oversized_file_parameter` expect.
pub fn poll_failure(name: &str, reason: &str) -> Error {
    Error::Internal(format!(
        "failed to load '{name}', failed to poll from model repository: {reason}"
    ))
}

/// The endings of override files that are Python code: modules, their compiled forms, and the
/// `.pth` files the interpreter runs lines of at start-up.
const CODE_ENDINGS: &[&str] = &[".py", ".pyc", ".pyo", ".pyw", ".pth"];

impl Overrides {
    /// What code this load's files would bring, described, or `None` for a load that brings
    /// none: a config that makes the model a Python model (`backend: "python"`, or a backend with
    /// a `model.py` under `backend_dir`), which runs code of the load's files or on them, or a
    /// file that is Python code. A load without files brings nothing (its model's files are the
    /// repository's).
    pub fn code(&self, backend_dir: &Path) -> Option<String> {
        if self.files.is_empty() {
            return None;
        }
        if let Some(file) = self
            .files
            .iter()
            .map(|(path, _)| path)
            .find(|path| CODE_ENDINGS.iter().any(|end| path.ends_with(end)))
        {
            return Some(format!("file '{FILE_PREFIX}{file}' is Python code"));
        }
        let config = self.config.as_ref()?;
        if super::config::is_python(config) {
            return Some("its config names the Python backend".into());
        }
        crate::backend::python::backend_code(config, backend_dir).map(|code| {
            format!(
                "its config names the Python-based backend '{}' ({})",
                config.backend,
                code.display()
            )
        })
    }
}

/// Checks and decodes the load parameters of model `name`.
///
/// # Errors
/// INVALID_ARGUMENT with Triton's text for a mistyped, unknown or unusable parameter; a config
/// that does not parse is Triton's poll failure ([`poll_failure`]).
pub fn parse(name: &str, parameters: BTreeMap<String, LoadParameter>) -> Result<Overrides, Error> {
    let mut overrides = Overrides::default();
    for (key, value) in parameters {
        if key == "config" {
            let LoadParameter::String(json) = value else {
                return Err(invalid_arg!(
                    "Config parameter 'config' must have string type for its value"
                ));
            };
            if json.len() as u64 > MAX_CONFIG_BYTES {
                return Err(poll_failure(
                    name,
                    &format!("Invalid config override: the config is larger than the {MAX_CONFIG_BYTES} bytes kiln reads"),
                ));
            }
            let config = config_from_json(&json)
                .map_err(|e| poll_failure(name, &format!("Invalid config override: {e}")))?;
            if let Some(sample) = config
                .model_warmup
                .iter()
                .find(|sample| sample.count > MAX_WARMUP_COUNT)
            {
                return Err(invalid_arg!(
                    "failed to warm up model '{name}' with sample '{}': count {} is more than the \
                     {MAX_WARMUP_COUNT} runs kiln allows a sample of a load's config override",
                    sample.name,
                    sample.count
                ));
            }
            overrides.config = Some(config);
        } else if let Some(path) = key.strip_prefix(FILE_PREFIX) {
            let LoadParameter::Bytes(contents) = value else {
                return Err(invalid_arg!(
                    "File parameter '{key}' must have bytes type for its value"
                ));
            };
            if !plain_relative(path) {
                return Err(invalid_arg!(
                    "Invalid file parameter '{key}' with normalized path '{path}' must stay within model directory."
                ));
            }
            overrides.files.push((path.to_string(), contents));
        } else {
            return Err(invalid_arg!(
                "Unrecognized load parameter '{key}' with type '{}'",
                value.type_name()
            ));
        }
    }
    if !overrides.files.is_empty() && overrides.config.is_none() {
        return Err(invalid_arg!(
            "Load parameter 'config' must be specified for model file override"
        ));
    }
    Ok(overrides)
}

/// Parses the protobuf-JSON form of a [`ModelConfig`] (the load API's `config` parameter): field
/// names as in the proto or in lowerCamelCase, enums by name, 64-bit integers as numbers or
/// strings; unknown fields are refused, as Triton refuses them.
///
/// # Errors
/// [`ConfigError::Parse`] with the JSON position and reason.
pub fn config_from_json(text: &str) -> Result<ModelConfig, ConfigError> {
    let descriptor = descriptor_pool()
        .get_message_by_name("inference.ModelConfig")
        .expect("inference.ModelConfig is in the descriptor set");
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let message = DynamicMessage::deserialize(descriptor, &mut deserializer)
        .map_err(|e| ConfigError::Parse(e.to_string()))?;
    deserializer
        .end()
        .map_err(|e| ConfigError::Parse(e.to_string()))?;
    message
        .transcode_to::<ModelConfig>()
        .map_err(|e| ConfigError::Parse(e.to_string()))
}

/// A temporary model directory made of override files; removed when dropped.
#[derive(Debug)]
pub struct OverrideDir {
    /// `<temp>/kiln-override-<random>`, mode 0700, removed on drop.
    base: PathBuf,
    /// `<base>/<model name>`, the directory the model loads from.
    model: PathBuf,
}

impl OverrideDir {
    /// Writes `files` under a new directory named after the model.
    ///
    /// # Errors
    /// INVALID_ARGUMENT when a path collides with a file, INTERNAL when writing fails.
    pub fn write(name: &str, files: &[(String, bytes::Bytes)]) -> Result<OverrideDir, Error> {
        let internal =
            |e: std::io::Error| Error::Internal(format!("failed to write override files: {e}"));
        let base = crate::scratch::private_dir("kiln-override-").map_err(internal)?;
        let dir = OverrideDir {
            model: base.join(name),
            base,
        };
        std::fs::create_dir(&dir.model).map_err(internal)?;
        for (relative, contents) in files {
            dir.write_one(relative, contents)?;
        }
        Ok(dir)
    }

    /// Writes one override file into a new file of its own (inside the private directory, so
    /// nothing but this load has put anything there).
    fn write_one(&self, relative: &str, contents: &[u8]) -> Result<(), Error> {
        let internal =
            |e: std::io::Error| Error::Internal(format!("failed to write override files: {e}"));
        let path = self.model.join(relative);
        if let Some(parent) = path.parent() {
            if parent.exists() && !parent.is_dir() {
                return Err(invalid_arg!(
                    "Invalid file parameter '{FILE_PREFIX}{relative}', directory has been created as a file"
                ));
            }
            std::fs::create_dir_all(parent).map_err(internal)?;
        }
        if path.is_dir() {
            return Err(invalid_arg!(
                "Invalid file parameter '{FILE_PREFIX}{relative}', a directory of that name was created by another file"
            ));
        }
        let mut file = crate::scratch::create_new_file(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                // `a/./b` and `a/b` name one file.
                invalid_arg!(
                    "Invalid file parameter '{FILE_PREFIX}{relative}', another file parameter names the same file"
                )
            } else {
                internal(e)
            }
        })?;
        file.write_all(contents).map_err(internal)
    }

    pub fn path(&self) -> &Path {
        &self.model
    }
}

impl Drop for OverrideDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, LoadParameter)]) -> BTreeMap<String, LoadParameter> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn error(list: &[(&str, LoadParameter)]) -> String {
        parse("m", params(list)).unwrap_err().message().to_string()
    }

    #[test]
    fn parameters_are_checked_as_triton_checks_them() {
        use LoadParameter::*;
        assert!(parse("m", BTreeMap::new()).unwrap().config.is_none());
        let ok = parse(
            "m",
            params(&[
                ("config", String(r#"{"max_batch_size": 2}"#.into())),
                ("file:1/model.onnx", Bytes(vec![1u8, 2].into())),
            ]),
        )
        .unwrap();
        assert_eq!(ok.config.unwrap().max_batch_size, 2);
        assert_eq!(ok.files[0].0, "1/model.onnx");
        assert_eq!(&ok.files[0].1[..], &[1, 2]);
        assert_eq!(
            error(&[("config", Bytes(bytes::Bytes::new()))]),
            "Config parameter 'config' must have string type for its value"
        );
        // Triton's poll failure, kiln's reason after it.
        let bad = parse("m", params(&[("config", String("{".into()))])).unwrap_err();
        assert!(matches!(bad, Error::Internal(_)), "{bad:?}");
        assert!(bad.message().starts_with(
            "failed to load 'm', failed to poll from model repository: Invalid config override: "
        ));
        let giant = format!("{{\"name\": \"{}\"}}", "x".repeat(1 << 20));
        assert_eq!(
            error(&[("config", String(giant))]),
            "failed to load 'm', failed to poll from model repository: Invalid config override: \
             the config is larger than the 1048576 bytes kiln reads"
        );
        assert_eq!(
            error(&[("file:1/model.onnx", String("x".into()))]),
            "File parameter 'file:1/model.onnx' must have bytes type for its value"
        );
        assert_eq!(
            error(&[("file:1/model.onnx", Bytes(bytes::Bytes::new()))]),
            "Load parameter 'config' must be specified for model file override"
        );
        // A client's config may not ask for endless warmup (the repository's own may, as in
        // Triton): the most a sample may ask passes, one more is refused at once.
        let warmup = |count: u32| {
            String(format!(
                r#"{{"model_warmup": [{{"name": "w", "batch_size": 1, "count": {count}}}]}}"#
            ))
        };
        assert!(parse("m", params(&[("config", warmup(10_000))])).is_ok());
        assert_eq!(
            error(&[("config", warmup(u32::MAX))]),
            "failed to warm up model 'm' with sample 'w': count 4294967295 is more than the \
             10000 runs kiln allows a sample of a load's config override"
        );
        assert_eq!(
            error(&[("colour", Int64(1))]),
            "Unrecognized load parameter 'colour' with type 'INT'"
        );
        for bad in [
            "file:../x",
            "file:/etc/passwd",
            "file:1/../../x",
            "file:",
            "file:a//b",
        ] {
            assert!(
                error(&[
                    ("config", String("{}".into())),
                    (bad, Bytes(bytes::Bytes::new()))
                ])
                .contains("must stay within model directory"),
                "{bad}"
            );
        }
    }

    #[test]
    fn code_in_overrides_is_told_apart() {
        use LoadParameter::*;
        let load = |config: &str, files: &[&str]| {
            let mut list = vec![("config".to_string(), String(config.into()))];
            for file in files {
                list.push((format!("file:{file}"), Bytes(bytes::Bytes::new())));
            }
            parse("m", list.into_iter().collect()).unwrap()
        };
        let backends = std::env::temp_dir().join(format!("kiln-backends-{}", std::process::id()));
        std::fs::create_dir_all(backends.join("pyish")).unwrap();
        std::fs::write(backends.join("pyish/model.py"), "").unwrap();
        let code = |config: &str, files: &[&str]| load(config, files).code(&backends);
        assert_eq!(code("{}", &["1/model.onnx", "labels.txt"]), None);
        assert_eq!(
            code(r#"{"backend": "onnxruntime"}"#, &["1/model.onnx"]),
            None
        );
        // A config alone loads the repository's files: no code of the client's.
        assert_eq!(code(r#"{"backend": "python"}"#, &[]), None);
        assert_eq!(
            code(r#"{"backend": "python"}"#, &["1/model.py"]).unwrap(),
            "file 'file:1/model.py' is Python code"
        );
        assert_eq!(
            code(r#"{"backend": "python"}"#, &["1/model.txt"]).unwrap(),
            "its config names the Python backend"
        );
        for file in ["helper.py", "1/x.pyc", "site/evil.pth", "a.pyw", "b.pyo"] {
            assert_eq!(
                code("{}", &["1/model.onnx", file]).unwrap(),
                format!("file 'file:{file}' is Python code")
            );
        }
        assert_eq!(
            code(r#"{"backend": "pyish"}"#, &["1/model.json"]).unwrap(),
            format!(
                "its config names the Python-based backend 'pyish' ({})",
                backends.join("pyish/model.py").display()
            )
        );
        // A backend without a model.py is no Python-based backend (its load fails as unknown).
        assert_eq!(code(r#"{"backend": "tensorrt"}"#, &["1/model.plan"]), None);
        let _ = std::fs::remove_dir_all(&backends);
    }

    #[test]
    fn override_directories_are_written_and_removed() {
        let files = vec![
            (
                "1/model.onnx".to_string(),
                bytes::Bytes::from_static(b"onnx"),
            ),
            ("labels.txt".to_string(), bytes::Bytes::from_static(b"a\nb")),
        ];
        let dir = OverrideDir::write("m", &files).unwrap();
        let path = dir.path().to_path_buf();
        assert!(path.ends_with("m"));
        assert_eq!(std::fs::read(path.join("1/model.onnx")).unwrap(), b"onnx");
        drop(dir);
        assert!(!path.exists());
        let clash = vec![
            ("1".to_string(), bytes::Bytes::from_static(b"file")),
            (
                "1/model.onnx".to_string(),
                bytes::Bytes::from_static(b"onnx"),
            ),
        ];
        assert_eq!(
            OverrideDir::write("m", &clash).unwrap_err(),
            Error::InvalidArgument(
                "Invalid file parameter 'file:1/model.onnx', directory has been created as a file"
                    .into()
            )
        );
        let twice = vec![
            ("1/model.onnx".to_string(), bytes::Bytes::from_static(b"a")),
            (
                "1/./model.onnx".to_string(),
                bytes::Bytes::from_static(b"b"),
            ),
        ];
        assert!(OverrideDir::write("m", &twice)
            .unwrap_err()
            .message()
            .contains("another file parameter names the same file"));
    }

    #[test]
    fn override_directories_are_private_and_unpredictable() {
        use std::os::unix::fs::PermissionsExt;
        let files = vec![("1/model.onnx".to_string(), bytes::Bytes::new())];
        let (one, two) = (
            OverrideDir::write("m", &files).unwrap(),
            OverrideDir::write("m", &files).unwrap(),
        );
        assert_ne!(one.base, two.base);
        let name = one.base.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("kiln-override-"), "{name}");
        let old_name = format!("kiln-override-{}-", std::process::id());
        assert!(!name.starts_with(&old_name), "{name}");
        let mode = std::fs::metadata(&one.base).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn json_configs_parse_like_the_load_api_sends_them() {
        let config = config_from_json(
            r#"{"name": "m", "backend": "onnxruntime", "max_batch_size": 4,
                "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2, "-1"]}],
                "instanceGroup": [{"count": 1, "kind": "KIND_CPU"}]}"#,
        )
        .unwrap();
        assert_eq!(config.max_batch_size, 4);
        assert_eq!(config.input[0].dims, vec![2, -1]);
        assert_eq!(config.instance_group[0].count, 1);
        for (bad, why) in [
            (
                r#"{"nonsense": 1}"#,
                "unrecognized field name 'nonsense' at line 1 column 11",
            ),
            ("{", "EOF while parsing an object at line 1 column 1"),
            ("{} trailing", "trailing characters at line 1 column 4"),
        ] {
            assert_eq!(
                config_from_json(bad).unwrap_err(),
                ConfigError::Parse(why.into()),
                "{bad}"
            );
        }
    }
}
