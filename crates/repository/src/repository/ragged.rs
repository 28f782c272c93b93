//! Ragged batching in the config: inputs with `allow_ragged_batch`, `batch_input` and
//! `batch_output`, checked and turned into the scheduler's [`BatchLayout`]; and what the ONNX
//! graph must look like for them (a ragged input is one dimension, a batch input is an extra graph
//! input of its own type, a scatter output is one dimension).

use super::config::datatype_from_config;
use crate::backend::TensorInfo;
use crate::core::DataType;
use crate::proto::inference::{batch_input, batch_output, ModelConfig};
use crate::scheduler::layout::{BatchInput, BatchInputKind, BatchLayout, ScatterOutput};

/// The batch layout `config` asks for.
///
/// # Errors
/// A message naming what is inconsistent: ragged batching on a model that does not batch, a
/// batch input or output without exactly one target and one source, a source that is not an
/// input, a target that is a client input or not an output, a type other than INT32 or FP32.
pub fn layout(config: &ModelConfig) -> Result<BatchLayout, String> {
    let model = &config.name;
    let ragged: Vec<String> = config
        .input
        .iter()
        .filter(|input| input.allow_ragged_batch)
        .map(|input| input.name.clone())
        .collect();
    let asks =
        !ragged.is_empty() || !config.batch_input.is_empty() || !config.batch_output.is_empty();
    if asks && config.max_batch_size <= 0 {
        return Err(format!(
            "model '{model}' uses ragged batching (allow_ragged_batch, batch_input or \
             batch_output), which needs max_batch_size > 0"
        ));
    }
    let is_input = |name: &str| config.input.iter().any(|input| input.name == name);
    let one = |what: &str, names: &[String]| -> Result<String, String> {
        match names {
            [name] => Ok(name.clone()),
            _ => Err(format!(
                "{what} of model '{model}' must name exactly one, got [{}]",
                names.join(", ")
            )),
        }
    };
    let mut batch_inputs = Vec::new();
    for spec in &config.batch_input {
        let target = one("batch_input target_name", &spec.target_name)?;
        let source = one(
            &format!("batch_input '{target}' source_input"),
            &spec.source_input,
        )?;
        if is_input(&target) {
            return Err(format!(
                "batch_input '{target}' of model '{model}' is also a configuration input; the \
                 server provides it"
            ));
        }
        if !is_input(&source) {
            return Err(format!(
                "batch_input '{target}' of model '{model}': source_input '{source}' is not an input"
            ));
        }
        let datatype = match datatype_from_config(spec.data_type) {
            Some(datatype @ (DataType::Int32 | DataType::Fp32)) => datatype,
            _ => {
                return Err(format!(
                    "batch_input '{target}' of model '{model}' must have data_type TYPE_INT32 or \
                     TYPE_FP32"
                ))
            }
        };
        let kind = match batch_input::Kind::try_from(spec.kind) {
            Ok(batch_input::Kind::BatchElementCount) => BatchInputKind::ElementCount,
            Ok(batch_input::Kind::BatchAccumulatedElementCount) => {
                BatchInputKind::AccumulatedElementCount
            }
            Ok(batch_input::Kind::BatchAccumulatedElementCountWithZero) => {
                BatchInputKind::AccumulatedElementCountWithZero
            }
            Ok(batch_input::Kind::BatchMaxElementCountAsShape) => {
                BatchInputKind::MaxElementCountAsShape
            }
            Ok(batch_input::Kind::BatchItemShape) => BatchInputKind::ItemShape,
            Ok(batch_input::Kind::BatchItemShapeFlatten) => BatchInputKind::ItemShapeFlatten,
            Err(_) => {
                return Err(format!(
                    "batch_input '{target}' of model '{model}' has an unknown kind {}",
                    spec.kind
                ))
            }
        };
        batch_inputs.push(BatchInput {
            kind,
            target,
            datatype,
            source,
        });
    }
    let mut scatter = Vec::new();
    for spec in &config.batch_output {
        let output = one("batch_output target_name", &spec.target_name)?;
        let source = one(
            &format!("batch_output '{output}' source_input"),
            &spec.source_input,
        )?;
        if batch_output::Kind::try_from(spec.kind)
            != Ok(batch_output::Kind::BatchScatterWithInputShape)
        {
            return Err(format!(
                "batch_output '{output}' of model '{model}' has an unknown kind {}",
                spec.kind
            ));
        }
        if !config.output.iter().any(|o| o.name == output) {
            return Err(format!(
                "batch_output '{output}' of model '{model}' is not a configuration output"
            ));
        }
        if !is_input(&source) {
            return Err(format!(
                "batch_output '{output}' of model '{model}': source_input '{source}' is not an input"
            ));
        }
        scatter.push(ScatterOutput { output, source });
    }
    Ok(BatchLayout {
        ragged,
        batch_inputs,
        scatter,
    })
}

/// Checks the graph tensors that ragged batching shapes differently: a ragged input or a scatter
/// output is one dimension (`tensor` of `kind` "input" or "output"), whatever its config dims.
///
/// # Errors
/// A message naming the tensor.
pub fn check_flat(model: &str, kind: &str, tensor: &str, graph: &[i64]) -> Result<(), String> {
    if graph.len() == 1 {
        return Ok(());
    }
    let role = if kind == "input" {
        "a ragged input reaches the model as one dimension holding every request's elements"
    } else {
        "a batch_output scattered by input shape leaves the model as one dimension"
    };
    Err(format!(
        "model '{model}', {kind} '{tensor}': {role}, but the model's shape has {} dimensions",
        graph.len()
    ))
}

/// Checks that each batch input is a graph input of its type and rank (2 for item shapes, else 1).
///
/// # Errors
/// A message naming the batch input.
pub fn check_batch_inputs(
    model: &str,
    layout: &BatchLayout,
    graph_inputs: &[TensorInfo],
) -> Result<(), String> {
    for spec in &layout.batch_inputs {
        let Some(info) = graph_inputs.iter().find(|g| g.name == spec.target) else {
            return Err(format!(
                "unable to load model '{model}': batch_input '{}' is not a model input",
                spec.target
            ));
        };
        if info.datatype != Some(spec.datatype) {
            return Err(format!(
                "unable to load model '{model}': batch_input '{}' is {} but the model input is {}",
                spec.target,
                spec.datatype,
                info.datatype
                    .map_or("an unsupported type", DataType::as_wire)
            ));
        }
        let rank = if spec.kind == BatchInputKind::ItemShape {
            2
        } else {
            1
        };
        if info.shape.len() != rank {
            return Err(format!(
                "unable to load model '{model}': batch_input '{}' is given {rank} dimension(s), \
                 but the model input has {}",
                spec.target,
                info.shape.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::config::parse_config;

    const RAGGED: &str = r#"
        name: "m" max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
        output [ { name: "sums" data_type: TYPE_FP32 dims: [ 1 ] },
                 { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "index"
                        data_type: TYPE_INT32 source_input: "x" } ]
        batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "y" source_input: "x" } ]
    "#;

    #[test]
    fn a_ragged_config_becomes_its_layout() {
        let layout = layout(&parse_config(RAGGED).unwrap()).unwrap();
        assert_eq!(layout.ragged, ["x"]);
        assert_eq!(
            layout.batch_inputs,
            [BatchInput {
                kind: BatchInputKind::AccumulatedElementCountWithZero,
                target: "index".into(),
                datatype: DataType::Int32,
                source: "x".into(),
            }]
        );
        assert_eq!(layout.scatter[0].output, "y");
        let plain = parse_config(
            r#"name: "p" max_batch_size: 2 input [{name: "a" data_type: TYPE_FP32 dims: [1]}]"#,
        );
        assert!(super::layout(&plain.unwrap()).unwrap().is_plain());
    }

    #[test]
    fn inconsistent_ragged_configs_are_refused_by_name() {
        for (from, to, needle) in [
            (
                "max_batch_size: 8",
                "max_batch_size: 0",
                "needs max_batch_size > 0",
            ),
            (
                r#"target_name: "index""#,
                r#"target_name: "x""#,
                "also a configuration input",
            ),
            (
                r#"target_name: "index""#,
                r#"target_name: ["a", "b"]"#,
                "exactly one",
            ),
            (
                r#"data_type: TYPE_INT32 source_input: "x""#,
                r#"data_type: TYPE_INT64 source_input: "x""#,
                "TYPE_INT32 or TYPE_FP32",
            ),
            (
                r#"data_type: TYPE_INT32 source_input: "x""#,
                r#"data_type: TYPE_INT32 source_input: "nope""#,
                "source_input 'nope' is not an input",
            ),
            (
                r#"target_name: "y" source_input"#,
                r#"target_name: "z" source_input"#,
                "'z' of model 'm' is not a configuration output",
            ),
        ] {
            let text = RAGGED.replace(from, to);
            let error = layout(&parse_config(&text).unwrap()).unwrap_err();
            assert!(error.contains(needle), "{to}: {error}");
        }
    }

    #[test]
    fn graphs_must_shape_ragged_tensors_and_batch_inputs_as_they_arrive() {
        assert!(check_flat("m", "input", "x", &[-1]).is_ok());
        let error = check_flat("m", "input", "x", &[-1, -1]).unwrap_err();
        assert!(error.contains("one dimension"), "{error}");
        let layout = layout(&parse_config(RAGGED).unwrap()).unwrap();
        let info = |datatype, shape: &[i64]| TensorInfo {
            name: "index".into(),
            datatype: Some(datatype),
            shape: shape.to_vec(),
        };
        assert!(check_batch_inputs("m", &layout, &[info(DataType::Int32, &[-1])]).is_ok());
        for (graph, needle) in [
            (vec![], "is not a model input"),
            (
                vec![info(DataType::Int64, &[-1])],
                "INT32 but the model input is INT64",
            ),
            (vec![info(DataType::Int32, &[-1, 2])], "has 2"),
        ] {
            let error = check_batch_inputs("m", &layout, &graph).unwrap_err();
            assert!(error.contains(needle), "{error}");
        }
    }
}
