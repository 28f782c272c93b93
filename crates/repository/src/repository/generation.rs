//! Generation models: a config with `model_transaction_policy { decoupled: true }` names a
//! decoder-only ONNX graph (Optimum's text-generation export) plus a `tokenizer.json`, served
//! through a [`Generator`] instead of the scheduler. Clients see Triton's LLM tensors
//! (`text_input` in, `text_output` out); the graph's own inputs never show.
//!
//! Config `parameters` (strings, as every Triton parameter): `max_active_sequences` (sequences
//! decoded together, default 32), `continuous_batching` (`false` decodes one sequence at a time),
//! `max_sequence_length` (prompt plus generated tokens, default 2048), `eos_token` (default: the
//! tokenizer's `<|endoftext|>`, `</s>`, `<eos>`...), `tokenizer` (file name, default
//! `tokenizer.json`, looked for in the version directory, then the model directory),
//! and the general `max_inflight_requests`. ONNX Runtime's own settings (`intra_op_thread_count`,
//! default: every core kiln gives the model; graph level, memory) are read as for any model, by
//! `tuning`.

use super::config;
use super::loader::LoadError;
use super::store::contained;
use super::{Executor, IoSpec, ServingVersion};
use crate::backend::decoder::DecoderSession;
use crate::backend::{OnnxRuntime, SessionOptions};
use crate::generate::chat::ChatTemplate;
use crate::generate::text::TextCodec;
use crate::generate::{GenerateOptions, Generator};
use crate::metrics::{GenerationMetrics, ModelStats};
use crate::proto::inference::{DataType as ConfigDataType, ModelConfig, ModelInput, ModelOutput};
use std::path::Path;
use std::sync::Arc;

/// The inputs a generation model accepts (Triton's vLLM / TensorRT-LLM names), with the types a
/// config may declare for each: the first is the one filled in when the config lists none.
pub const INPUTS: &[(&str, &[ConfigDataType])] = &[
    ("text_input", &[ConfigDataType::TypeString]),
    ("max_tokens", INTEGERS),
    ("stream", &[ConfigDataType::TypeBool]),
    ("temperature", FLOATS),
    ("top_k", INTEGERS),
    ("top_p", FLOATS),
    ("seed", INTEGERS),
    ("stop", &[ConfigDataType::TypeString]),
    ("exclude_input_in_output", &[ConfigDataType::TypeBool]),
    ("sampling_parameters", &[ConfigDataType::TypeString]),
];

const INTEGERS: &[ConfigDataType] = &[
    ConfigDataType::TypeInt32,
    ConfigDataType::TypeInt64,
    ConfigDataType::TypeUint32,
    ConfigDataType::TypeUint64,
];
const FLOATS: &[ConfigDataType] = &[ConfigDataType::TypeFp32, ConfigDataType::TypeFp64];

/// The one output.
pub const TEXT_OUTPUT: &str = "text_output";

/// Whether the config describes a generation model.
pub fn is_generation(config: &ModelConfig) -> bool {
    config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
}

/// Fills Triton's LLM inputs and output when the config lists none, and checks declared ones.
///
/// # Errors
/// A message naming the first tensor that is not a generation tensor or has the wrong type.
pub fn complete_config(config: &mut ModelConfig) -> Result<(), String> {
    let name = config.name.clone();
    if config.input.is_empty() {
        config.input = INPUTS
            .iter()
            .map(|(input, types)| ModelInput {
                name: input.to_string(),
                data_type: types[0] as i32,
                dims: vec![if *input == "stop" { -1 } else { 1 }],
                optional: *input != "text_input",
                ..Default::default()
            })
            .collect();
    }
    if config.output.is_empty() {
        config.output = vec![ModelOutput {
            name: TEXT_OUTPUT.into(),
            data_type: ConfigDataType::TypeString as i32,
            dims: vec![-1],
            ..Default::default()
        }];
    }
    for input in &config.input {
        let Some((_, types)) = INPUTS.iter().find(|(n, _)| *n == input.name) else {
            let known: Vec<&str> = INPUTS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "input '{}' of generation model '{name}' is not one of {}",
                input.name,
                known.join(", ")
            ));
        };
        if !types.iter().any(|t| *t as i32 == input.data_type) {
            return Err(format!(
                "input '{}' of generation model '{name}' must be one of {:?}",
                input.name,
                types.iter().map(|t| t.as_str_name()).collect::<Vec<_>>()
            ));
        }
    }
    if !config.input.iter().any(|i| i.name == "text_input") {
        return Err(format!(
            "generation model '{name}' must declare the input 'text_input'"
        ));
    }
    match config.output.as_slice() {
        [output]
            if output.name == TEXT_OUTPUT
                && output.data_type == ConfigDataType::TypeString as i32 => {}
        _ => {
            return Err(format!(
                "generation model '{name}' must declare exactly one output, '{TEXT_OUTPUT}' of TYPE_STRING"
            ))
        }
    }
    options(config).map(|_| ())
}

/// The generator settings from the config's parameters.
///
/// # Errors
/// A message naming a parameter that is not a valid number or boolean.
pub fn options(config: &ModelConfig) -> Result<GenerateOptions, String> {
    let number = |key: &str, default: usize| number(config, key, default);
    let continuous = match config.parameters.get("continuous_batching") {
        None => true,
        Some(p) => match p.string_value.trim() {
            "true" | "1" => true,
            "false" | "0" => false,
            other => {
                return Err(format!(
                    "parameter 'continuous_batching' of model '{}' must be true or false, got '{other}'",
                    config.name
                ))
            }
        },
    };
    let max_active = number("max_active_sequences", 32)?;
    Ok(GenerateOptions {
        max_active: if continuous { max_active } else { 1 },
        max_sequence_length: number("max_sequence_length", 2048)?,
        max_prefill_tokens: number("max_prefill_tokens", 512)?,
        max_in_flight: config::max_inflight_requests(config).map_err(|e| e.to_string())?,
    })
}

/// A positive integer parameter, or `default` when the config does not set it.
fn number(config: &ModelConfig, key: &str, default: usize) -> Result<usize, String> {
    match config.parameters.get(key) {
        None => Ok(default),
        Some(p) => p
            .string_value
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                format!(
                    "parameter '{key}' of model '{}' must be a positive integer, got '{}'",
                    config.name, p.string_value
                )
            }),
    }
}

/// Loads the graph and the tokenizer of one version and starts its generation loop.
///
/// # Errors
/// Why the version cannot serve, as the index reports it: its files or config
/// ([`LoadError::Config`]), or the graph or the loop that did not start ([`LoadError::Backend`]).
pub fn start_version(
    name: &str,
    version: i64,
    model_dir: &Path,
    model_path: &Path,
    config: &ModelConfig,
    runtime: &OnnxRuntime,
    session_options: &SessionOptions,
) -> Result<ServingVersion, LoadError> {
    if !model_path.is_file() {
        return Err(LoadError::Config(format!(
            "model file {} not found",
            model_path.display()
        )));
    }
    let started = std::time::Instant::now();
    let options = options(config).map_err(LoadError::Config)?;
    let parameter = |key: &str| config.parameters.get(key).map(|p| p.string_value.clone());
    let file = parameter("tokenizer").unwrap_or_else(|| "tokenizer.json".into());
    let refused = |e: super::store::StoreError| LoadError::Config(e.to_string());
    let in_version = contained(model_dir, &format!("{version}/{file}")).map_err(refused)?;
    let tokenizer = if in_version.is_file() {
        in_version
    } else {
        contained(model_dir, &file).map_err(refused)?
    };
    let codec = TextCodec::load(&tokenizer, parameter("eos_token").as_deref())
        .map_err(LoadError::Config)?;
    // The chat template ships beside the tokenizer (tokenizer_config.json, chat_template.jinja).
    // One that cannot be used refuses chats only: completions need none.
    let chat = ChatTemplate::load_for(name, tokenizer.parent().unwrap_or(model_dir));
    let session = DecoderSession::load(runtime, model_path, session_options)
        .map_err(|e| LoadError::Backend(e.to_string()))?;
    let stats = Arc::new(ModelStats::new(name, version));
    let generator = Generator::start(
        &format!("{name}-{version}"),
        session,
        codec,
        options,
        Arc::clone(&stats),
        GenerationMetrics::new(
            name,
            version,
            &crate::metrics::histogram::first_response_buckets(config)
                .map_err(LoadError::Config)?,
        ),
    )
    .map_err(|e| LoadError::Backend(format!("failed to start the generation loop: {e}")))?
    .with_chat_template(chat);
    stats.record_load(started.elapsed());
    Ok(ServingVersion {
        version,
        io: IoSpec::from_config(config).map_err(LoadError::Config)?,
        executor: Executor::Generate(generator),
        stats,
        cache: false,
        sequences: None,
        tokenizer: None,
        chat: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::{ModelParameter, ModelTransactionPolicy};

    fn decoupled() -> ModelConfig {
        ModelConfig {
            name: "llm".into(),
            model_transaction_policy: Some(ModelTransactionPolicy { decoupled: true }),
            ..Default::default()
        }
    }

    #[test]
    fn empty_configs_get_the_llm_tensors() {
        let mut config = decoupled();
        assert!(is_generation(&config) && !is_generation(&ModelConfig::default()));
        complete_config(&mut config).unwrap();
        let names: Vec<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names[0], "text_input");
        assert!(names.contains(&"max_tokens") && names.contains(&"stop"));
        assert!(config.input.iter().skip(1).all(|i| i.optional));
        assert_eq!(config.output[0].name, TEXT_OUTPUT);
        assert!(IoSpec::from_config(&config).is_ok());
    }

    #[test]
    fn declared_tensors_are_checked() {
        let mut config = decoupled();
        config.input.push(ModelInput {
            name: "input_ids".into(),
            data_type: ConfigDataType::TypeInt64 as i32,
            dims: vec![-1],
            ..Default::default()
        });
        assert!(complete_config(&mut config)
            .unwrap_err()
            .contains("'input_ids'"));
        let mut config = decoupled();
        config.input.push(ModelInput {
            name: "text_input".into(),
            data_type: ConfigDataType::TypeFp32 as i32,
            dims: vec![1],
            ..Default::default()
        });
        assert!(complete_config(&mut config)
            .unwrap_err()
            .contains("must be one of"));
    }

    #[test]
    fn parameters_set_the_generator_options() {
        let mut config = decoupled();
        let set = |config: &mut ModelConfig, key: &str, value: &str| {
            config.parameters.insert(
                key.into(),
                ModelParameter {
                    string_value: value.into(),
                },
            );
        };
        let defaults = options(&config).unwrap();
        assert_eq!(
            (defaults.max_active, defaults.max_sequence_length),
            (32, 2048)
        );
        assert_eq!(defaults.max_prefill_tokens, 512);
        set(&mut config, "max_active_sequences", "8");
        assert_eq!(options(&config).unwrap().max_active, 8);
        set(&mut config, "max_prefill_tokens", "64");
        assert_eq!(options(&config).unwrap().max_prefill_tokens, 64);
        set(&mut config, "continuous_batching", "false");
        assert_eq!(options(&config).unwrap().max_active, 1);
        set(&mut config, "continuous_batching", "maybe");
        assert!(options(&config)
            .unwrap_err()
            .contains("continuous_batching"));
        set(&mut config, "continuous_batching", "true");
        set(&mut config, "max_sequence_length", "0");
        assert!(options(&config)
            .unwrap_err()
            .contains("max_sequence_length"));
    }
}
