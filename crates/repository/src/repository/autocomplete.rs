//! Config auto-complete from the ONNX graph, following Triton's ONNX Runtime backend: nothing is
//! touched when the config already lists both inputs and outputs; otherwise missing tensors are
//! read from the model, and a model whose every input and output has a dynamic first dimension
//! gets `max_batch_size` 4 (`--backend-config default-max-batch-size`) and an empty
//! `dynamic_batching {}` when the config left it at 0.

use super::config::datatype_to_config;
use crate::backend::python::StubEnvironment;
use crate::backend::TensorInfo;
use crate::proto::inference::{
    model_config::SchedulingChoice, ModelConfig, ModelDynamicBatching, ModelInput, ModelOutput,
    ModelTensorReshape,
};
use std::path::Path;

/// Triton's `default-max-batch-size` backend setting.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// Fills `config` from the model's declared inputs and outputs; a batchable model whose config
/// left `max_batch_size` at 0 gets `default_max_batch_size`.
///
/// # Errors
/// A message in Triton's words when the config asks for batching the model cannot do, or the model
/// uses a type the protocol cannot carry.
pub fn autocomplete(
    config: &mut ModelConfig,
    inputs: &[TensorInfo],
    outputs: &[TensorInfo],
    default_max_batch_size: i32,
) -> Result<(), String> {
    if !config.input.is_empty() && !config.output.is_empty() {
        return Ok(());
    }
    let batchable = inputs
        .iter()
        .chain(outputs)
        .all(|t| t.shape.first() == Some(&-1));
    if batchable {
        if config.max_batch_size == 0 {
            config.max_batch_size = default_max_batch_size;
            if config.max_batch_size > 1 && config.scheduling_choice.is_none() {
                config.scheduling_choice = Some(SchedulingChoice::DynamicBatching(
                    ModelDynamicBatching::default(),
                ));
            }
        }
    } else if config.max_batch_size != 0 {
        return Err(format!(
            "autofill failed for model '{}': model does not support batching while non-zero \
             max_batch_size is specified",
            config.name
        ));
    }
    let batched = config.max_batch_size > 0;
    let model = config.name.clone();
    let io_dims =
        |info: &TensorInfo| -> Result<(i32, Vec<i64>, Option<ModelTensorReshape>), String> {
            let datatype = info.datatype.ok_or_else(|| {
            format!(
                "autofill failed for model '{model}': tensor '{}' has a type the protocol cannot carry",
                info.name
            )
        })?;
            let dims: Vec<i64> = if batched {
                info.shape[1..].to_vec()
            } else {
                info.shape.clone()
            };
            // A scalar is shown as [1] and reshaped to [] for the model.
            let (dims, reshape) = if dims.is_empty() {
                (vec![1], Some(ModelTensorReshape { shape: vec![] }))
            } else {
                (dims, None)
            };
            Ok((datatype_to_config(datatype) as i32, dims, reshape))
        };
    if config.input.is_empty() {
        for info in inputs {
            let (data_type, dims, reshape) = io_dims(info)?;
            config.input.push(ModelInput {
                name: info.name.clone(),
                data_type,
                dims,
                reshape,
                ..Default::default()
            });
        }
    }
    if config.output.is_empty() {
        for info in outputs {
            let (data_type, dims, reshape) = io_dims(info)?;
            config.output.push(ModelOutput {
                name: info.name.clone(),
                data_type,
                dims,
                reshape,
                ..Default::default()
            });
        }
    }
    Ok(())
}

/// Completes `config` with the Python model's `auto_complete_config(auto_complete_model_config)`
/// (in `model_file`), as Triton does before loading. Blocking.
///
/// # Errors
/// What the model raised, a config it made that does not parse or renames the model, or why
/// Python did not run.
pub fn python(
    config: &mut ModelConfig,
    dir: &Path,
    model_file: &Path,
    variables: &StubEnvironment,
) -> Result<(), String> {
    let name = config.name.clone();
    let Some(completed) =
        crate::backend::python::auto_complete(config, dir, model_file, variables)?
    else {
        return Ok(());
    };
    let completed = super::config_from_json(&completed.to_string()).map_err(|e| {
        format!("auto_complete_config of model '{name}' made a config kiln cannot read: {e}")
    })?;
    if completed.name != name {
        return Err(format!(
            "auto_complete_config of model '{name}' renamed it '{}'",
            completed.name
        ));
    }
    *config = completed;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::DataType;
    use crate::repository::config::{datatype_from_config, has_dynamic_batching, parse_config};

    fn info(name: &str, datatype: DataType, shape: &[i64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            datatype: Some(datatype),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn batchable_model_gets_default_batch_and_dynamic_batching() {
        let mut config = parse_config("name: \"m\"").unwrap();
        let inputs = [
            info("x", DataType::Fp32, &[-1, 16]),
            info("s", DataType::Bytes, &[-1, -1]),
        ];
        let outputs = [info("y", DataType::Fp32, &[-1, 16])];
        autocomplete(&mut config, &inputs, &outputs, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 4);
        assert!(has_dynamic_batching(&config));
        assert_eq!(config.input[0].dims, vec![16]);
        assert_eq!(config.input[1].dims, vec![-1]);
        assert_eq!(
            datatype_from_config(config.input[1].data_type),
            Some(DataType::Bytes)
        );
        assert_eq!(config.output[0].name, "y");
    }

    #[test]
    fn the_default_batch_size_comes_from_the_backend_setting() {
        let inputs = [info("x", DataType::Fp32, &[-1, 3])];
        let mut config = parse_config("name: \"m\"").unwrap();
        autocomplete(&mut config, &inputs, &inputs, 1).unwrap();
        assert_eq!(config.max_batch_size, 1);
        // Batch 1 leaves nothing to batch dynamically.
        assert!(config.scheduling_choice.is_none());
        let mut config = parse_config("name: \"m\"").unwrap();
        autocomplete(&mut config, &inputs, &inputs, 0).unwrap();
        assert_eq!(config.max_batch_size, 0);
        assert_eq!(config.input[0].dims, [-1, 3]);
    }

    #[test]
    fn fixed_first_dim_means_no_batching() {
        let mut config = parse_config("name: \"m\"").unwrap();
        let inputs = [info("x", DataType::Fp32, &[3, -1])];
        let outputs = [info("y", DataType::Fp32, &[3, -1])];
        autocomplete(&mut config, &inputs, &outputs, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 0);
        assert!(!has_dynamic_batching(&config));
        assert_eq!(config.input[0].dims, vec![3, -1]);
    }

    #[test]
    fn batch_size_on_unbatchable_model_is_an_error() {
        let mut config = parse_config("name: \"m\" max_batch_size: 8").unwrap();
        let inputs = [info("x", DataType::Fp32, &[3])];
        let err = autocomplete(&mut config, &inputs, &inputs, DEFAULT_MAX_BATCH_SIZE).unwrap_err();
        assert!(err.contains("model does not support batching while non-zero max_batch_size"));
    }

    #[test]
    fn explicit_batch_size_is_kept_and_batch_dim_dropped() {
        let mut config = parse_config("name: \"m\" max_batch_size: 16").unwrap();
        let inputs = [info("x", DataType::Int64, &[-1, 2, 3])];
        autocomplete(&mut config, &inputs, &inputs, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 16);
        assert!(!has_dynamic_batching(&config));
        assert_eq!(config.input[0].dims, vec![2, 3]);
    }

    #[test]
    fn scalars_become_dims_one_with_empty_reshape() {
        let mut config = parse_config("name: \"m\"").unwrap();
        let inputs = [info("x", DataType::Fp32, &[])];
        autocomplete(&mut config, &inputs, &inputs, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.max_batch_size, 0);
        assert_eq!(config.input[0].dims, vec![1]);
        assert_eq!(
            config.input[0].reshape.as_ref().unwrap().shape,
            Vec::<i64>::new()
        );
    }

    #[test]
    fn complete_config_is_left_alone() {
        let text = "name: \"m\" input [{name: \"a\" data_type: TYPE_FP32 dims: [2]}] \
                    output [{name: \"b\" data_type: TYPE_FP32 dims: [2]}]";
        let mut config = parse_config(text).unwrap();
        let before = config.clone();
        let inputs = [info("a", DataType::Fp32, &[-1, 2])];
        autocomplete(&mut config, &inputs, &inputs, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config, before);
    }

    #[test]
    fn partial_config_fills_only_the_missing_side() {
        let text =
            "name: \"m\" max_batch_size: 2 input [{name: \"a\" data_type: TYPE_FP32 dims: [7]}]";
        let mut config = parse_config(text).unwrap();
        let inputs = [info("a", DataType::Fp32, &[-1, 2])];
        let outputs = [info("b", DataType::Fp16, &[-1, 5])];
        autocomplete(&mut config, &inputs, &outputs, DEFAULT_MAX_BATCH_SIZE).unwrap();
        assert_eq!(config.input[0].dims, vec![7]);
        assert_eq!(config.output[0].dims, vec![5]);
    }
}
