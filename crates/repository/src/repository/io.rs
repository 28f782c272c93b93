//! The input/output contract of a loaded model version: what the config promises clients, and how
//! each tensor's shape maps onto the ONNX graph (`reshape`, or a rank-0 tensor declared as `[1]`).

use super::config::datatype_from_config;
use crate::backend::TensorInfo;
use crate::core::DataType;
use crate::proto::inference::ModelConfig;
use crate::scheduler::layout::BatchLayout;

/// One input or output as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    /// Config dims without the batch dimension; -1 is variable.
    pub dims: Vec<i64>,
    /// The shape the model itself uses (without batch), when it differs from `dims`.
    pub model_dims: Option<Vec<i64>>,
    /// The text input of a text model: every element must be UTF-8, checked before the request
    /// joins a batch (so that one bad text fails its own request only).
    pub text: bool,
    /// An input requests may leave out (`optional: true`): the model has a default for it.
    pub optional: bool,
}

impl TensorSpec {
    /// A tensor whose model shape is the shape clients send (no reshape).
    pub fn new(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            datatype,
            dims: dims.to_vec(),
            model_dims: None,
            text: false,
            optional: false,
        }
    }
}

/// Inputs and outputs of a model version, in config order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoSpec {
    /// 0 means the model does not batch: shapes are exactly `dims`.
    pub max_batch_size: usize,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// A tensor as the config declares it: an input or output (`kind`), with its reshape.
struct Declared<'a> {
    kind: &'a str,
    name: &'a str,
    data_type: i32,
    dims: &'a [i64],
    reshape: Option<&'a Vec<i64>>,
}

/// The spec of a `declared` tensor of `model`, checked against the graph's tensors of its kind:
/// present, of the same type, with dimensions that fit (a ragged input or scattered output of
/// `layout` is one dimension in the graph).
fn tensor_spec(
    model: &str,
    batched: bool,
    layout: &BatchLayout,
    declared: Declared<'_>,
    graph: &[TensorInfo],
) -> Result<TensorSpec, String> {
    let Declared {
        kind,
        name,
        data_type,
        dims,
        reshape,
    } = declared;
    let Some(info) = graph.iter().find(|t| t.name == name) else {
        let known: Vec<&str> = graph.iter().map(|t| t.name.as_str()).collect();
        return Err(format!(
            "unable to load model '{model}': configuration {kind} '{name}' is not a model {kind}; \
             the model has {kind}s [{}]",
            known.join(", ")
        ));
    };
    let datatype = datatype_from_config(data_type)
        .ok_or_else(|| format!("{kind} '{name}' of model '{model}' has no valid data_type"))?;
    if info.datatype != Some(datatype) {
        return Err(format!(
            "unable to load model '{model}': configuration expects datatype {} for {kind} '{name}', \
             model provides {}",
            datatype,
            info.datatype.map_or("an unsupported type", DataType::as_wire)
        ));
    }
    let model_dims = match reshape {
        Some(shape) => Some(shape.clone()),
        // Triton's ONNX Runtime backend takes any all-ones dims for a scalar (rank-0)
        // tensor of a model without batching; requests and responses keep the config's.
        None if info.shape.is_empty()
            && !dims.is_empty()
            && dims.iter().all(|&d| d == 1)
            && !batched =>
        {
            Some(Vec::new())
        }
        None => None,
    };
    // Ragged inputs and scattered outputs are one dimension in the graph.
    let flat =
        layout.ragged.iter().any(|r| r == name) || layout.scatter.iter().any(|s| s.output == name);
    if flat {
        super::ragged::check_flat(model, kind, name, &info.shape)?;
    } else {
        compare_dims(
            model,
            name,
            &info.shape,
            model_dims.as_deref().unwrap_or(dims),
            batched,
        )?;
    }
    Ok(TensorSpec {
        name: name.to_string(),
        datatype,
        dims: dims.to_vec(),
        model_dims,
        text: false,
        optional: false,
    })
}

impl IoSpec {
    /// The contract clients see when there is no graph behind it (generation models,
    /// ensembles, Python models): the config's tensors as declared, `optional` inputs included.
    ///
    /// # Errors
    /// A message naming a tensor without a valid data type.
    pub fn from_config(config: &ModelConfig) -> Result<IoSpec, String> {
        let spec = |name: &str, data_type: i32, dims: &[i64]| -> Result<TensorSpec, String> {
            let datatype: DataType = crate::repository::config::datatype_from_config(data_type)
                .ok_or_else(|| format!("tensor '{name}' has no valid data_type"))?;
            Ok(TensorSpec::new(name, datatype, dims))
        };
        Ok(IoSpec {
            max_batch_size: config.max_batch_size.max(0) as usize,
            inputs: config
                .input
                .iter()
                .map(|i| {
                    spec(&i.name, i.data_type, &i.dims).map(|spec| TensorSpec {
                        optional: i.optional,
                        ..spec
                    })
                })
                .collect::<Result<_, _>>()?,
            outputs: config
                .output
                .iter()
                .map(|o| spec(&o.name, o.data_type, &o.dims))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether this is Triton's LLM contract: a BYTES `text_input` input and a BYTES
    /// `text_output` output (what vLLM's and TensorRT-LLM's models take and give).
    pub fn is_llm(&self) -> bool {
        let bytes = |specs: &[TensorSpec], name: &str| {
            specs
                .iter()
                .any(|s| s.name == name && s.datatype == DataType::Bytes)
        };
        bytes(&self.inputs, "text_input") && bytes(&self.outputs, "text_output")
    }

    /// Checks the config against the graph and records the shape mapping.
    ///
    /// # Errors
    /// A message naming the first tensor where config and graph disagree.
    pub fn new(
        config: &ModelConfig,
        graph_inputs: &[TensorInfo],
        graph_outputs: &[TensorInfo],
    ) -> Result<IoSpec, String> {
        let layout = super::ragged::layout(config)?;
        IoSpec::with_defaults(config, &layout, graph_inputs, &[], graph_outputs)
    }

    /// As [`IoSpec::new`], with the config's checked batch `layout`, for a graph with inputs that
    /// have a default value (ONNX Runtime's overridable initializers): a config input may name
    /// one of them, and only such an input may be `optional`.
    ///
    /// # Errors
    /// As [`IoSpec::new`], and an optional config input the model requires.
    pub fn with_defaults(
        config: &ModelConfig,
        layout: &BatchLayout,
        graph_inputs: &[TensorInfo],
        defaults: &[TensorInfo],
        graph_outputs: &[TensorInfo],
    ) -> Result<IoSpec, String> {
        let model = &config.name;
        let with_defaults: Vec<TensorInfo> = graph_inputs.iter().chain(defaults).cloned().collect();
        for input in config.input.iter().filter(|input| input.optional) {
            if graph_inputs.iter().any(|g| g.name == input.name) {
                return Err(format!(
                    "unable to load model '{model}': input '{}' is optional in the configuration, \
                     but the model requires it (only an input the model gives a default value, an \
                     initializer, can be left out)",
                    input.name
                ));
            }
        }
        let batched = config.max_batch_size > 0;
        let inputs = config
            .input
            .iter()
            .map(|i| {
                let declared = Declared {
                    kind: "input",
                    name: &i.name,
                    data_type: i.data_type,
                    dims: &i.dims,
                    reshape: i.reshape.as_ref().map(|r| &r.shape),
                };
                tensor_spec(model, batched, layout, declared, &with_defaults).map(|spec| {
                    TensorSpec {
                        optional: i.optional,
                        ..spec
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        super::ragged::check_batch_inputs(model, layout, graph_inputs)?;
        let server_made = |name: &str| layout.batch_inputs.iter().any(|b| b.target == name);
        if let Some(missing) = graph_inputs
            .iter()
            .find(|g| !inputs.iter().any(|i| i.name == g.name) && !server_made(&g.name))
        {
            return Err(format!(
                "unable to load model '{model}': model input '{}' is missing from the configuration",
                missing.name
            ));
        }
        let outputs = config
            .output
            .iter()
            .map(|o| {
                let declared = Declared {
                    kind: "output",
                    name: &o.name,
                    data_type: o.data_type,
                    dims: &o.dims,
                    reshape: o.reshape.as_ref().map(|r| &r.shape),
                };
                tensor_spec(model, batched, layout, declared, graph_outputs)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IoSpec {
            max_batch_size: config.max_batch_size.max(0) as usize,
            inputs,
            outputs,
        })
    }

    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|t| t.name == name)
    }

    pub fn output(&self, name: &str) -> Option<&TensorSpec> {
        self.outputs.iter().find(|t| t.name == name)
    }
}

/// Checks the config's dims (its `reshape` when it has one) against the graph's shape, as Triton's
/// ONNX Runtime backend does: when batching, the graph's first dimension must be variable (the
/// batch); then the same rank, and wherever the graph fixes a size the config must state that
/// size (a variable config dimension against a fixed graph one is refused: requests of other
/// sizes would only fail in the graph). A variable graph dimension takes any config value.
fn compare_dims(
    model: &str,
    tensor: &str,
    graph: &[i64],
    dims: &[i64],
    batched: bool,
) -> Result<(), String> {
    if batched && graph.first().is_none_or(|&batch| batch >= 0) {
        return Err(format!(
            "model '{model}', tensor '{tensor}': for the model to support batching the shape \
             should have at least 1 dimension and the first dimension must be -1; but shape \
             expected by the model is {}",
            shape_text(graph)
        ));
    }
    let graph_dims = if batched { &graph[1..] } else { graph };
    let matches = graph_dims.len() == dims.len()
        && graph_dims.iter().zip(dims).all(|(&g, &d)| g < 0 || g == d);
    if matches {
        return Ok(());
    }
    let specified = if batched {
        let full: Vec<i64> = std::iter::once(-1).chain(dims.iter().copied()).collect();
        format!(
            "{} dimensions (an initial batch dimension because max_batch_size > 0 followed by \
             the explicit tensor shape, making complete shape {})",
            full.len(),
            shape_text(&full)
        )
    } else {
        format!("{} dimensions (shape {})", dims.len(), shape_text(dims))
    };
    Err(format!(
        "model '{model}', tensor '{tensor}': the model expects {} dimensions (shape {}) but the model configuration specifies {specified}",
        graph.len(),
        shape_text(graph)
    ))
}

/// A shape as Triton prints it: `[-1,16]`.
fn shape_text(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::config::parse_config;

    fn info(name: &str, datatype: DataType, shape: &[i64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            datatype: Some(datatype),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn batched_config_matches_graph_with_batch_dim() {
        let config = parse_config(
            "name: \"m\" max_batch_size: 8 input [{name: \"a\" data_type: TYPE_FP32 dims: [16]}] \
             output [{name: \"b\" data_type: TYPE_FP32 dims: [16]}]",
        )
        .unwrap();
        let io = IoSpec::new(
            &config,
            &[info("a", DataType::Fp32, &[-1, 16])],
            &[info("b", DataType::Fp32, &[-1, 16])],
        )
        .unwrap();
        assert_eq!(io.max_batch_size, 8);
        assert_eq!(io.input("a").unwrap().dims, vec![16]);
        assert_eq!(io.input("a").unwrap().model_dims, None);
        assert!(io.output("b").is_some());
        assert!(io.input("b").is_none());
    }

    #[test]
    fn scalar_declared_as_one() {
        let config = parse_config(
            "name: \"m\" input [{name: \"x\" data_type: TYPE_FP32 dims: [1]}] \
             output [{name: \"y\" data_type: TYPE_FP32 dims: [1]}]",
        )
        .unwrap();
        let io = IoSpec::new(
            &config,
            &[info("x", DataType::Fp32, &[])],
            &[info("y", DataType::Fp32, &[])],
        )
        .unwrap();
        assert_eq!(io.input("x").unwrap().model_dims, Some(vec![]));
        assert_eq!(io.output("y").unwrap().model_dims, Some(vec![]));
    }

    #[test]
    fn scalar_declared_with_any_all_ones_dims() {
        let config = |dims: &str| {
            parse_config(&format!(
                "name: \"m\" input [{{name: \"x\" data_type: TYPE_FP32 dims: {dims}}}] \
                 output [{{name: \"y\" data_type: TYPE_FP32 dims: {dims}}}]"
            ))
            .unwrap()
        };
        let (x, y) = (
            [info("x", DataType::Fp32, &[])],
            [info("y", DataType::Fp32, &[])],
        );
        for dims in ["[1, 1]", "[1, 1, 1]"] {
            let io = IoSpec::new(&config(dims), &x, &y).unwrap();
            assert_eq!(io.input("x").unwrap().model_dims, Some(vec![]), "{dims}");
            assert_eq!(
                io.output("y").unwrap().dims,
                vec![1; dims.matches('1').count()]
            );
        }
        for dims in ["[2]", "[1, 2]", "[-1]"] {
            let err = IoSpec::new(&config(dims), &x, &y).unwrap_err();
            assert!(
                err.contains("the model expects 0 dimensions (shape [])"),
                "{dims}: {err}"
            );
        }
    }

    #[test]
    fn config_dims_must_fit_the_graph() {
        let config = |dims: &str| {
            parse_config(&format!(
                "name: \"m\" max_batch_size: 8 input [{{name: \"x\" data_type: TYPE_FP32 dims: {dims}}}] \
                 output [{{name: \"y\" data_type: TYPE_FP32 dims: [16]}}]"
            ))
            .unwrap()
        };
        let y = [info("y", DataType::Fp32, &[-1, 16])];
        let x = |shape: &[i64]| [info("x", DataType::Fp32, shape)];
        // A variable graph dimension takes anything; a fixed one must be stated as it is.
        assert!(IoSpec::new(&config("[16]"), &x(&[-1, 16]), &y).is_ok());
        assert_eq!(
            IoSpec::new(&config("[-1]"), &x(&[-1, 16]), &y).unwrap_err(),
            "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,16]) but the model \
             configuration specifies 2 dimensions (an initial batch dimension because \
             max_batch_size > 0 followed by the explicit tensor shape, making complete shape \
             [-1,-1])"
        );
        assert!(IoSpec::new(&config("[1099511627776]"), &x(&[-1, -1]), &y).is_ok());
        assert_eq!(
            IoSpec::new(&config("[1099511627776]"), &x(&[-1, 16]), &y).unwrap_err(),
            "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,16]) but the model \
             configuration specifies 2 dimensions (an initial batch dimension because \
             max_batch_size > 0 followed by the explicit tensor shape, making complete shape \
             [-1,1099511627776])"
        );
        // A batching model needs a batch dimension in the graph.
        assert_eq!(
            IoSpec::new(&config("[1]"), &x(&[]), &y).unwrap_err(),
            "model 'm', tensor 'x': for the model to support batching the shape should have at \
             least 1 dimension and the first dimension must be -1; but shape expected by the \
             model is []"
        );
        assert_eq!(
            IoSpec::new(&config("[16, 16]"), &x(&[-1, 16]), &y).unwrap_err(),
            "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,16]) but the model \
             configuration specifies 3 dimensions (an initial batch dimension because \
             max_batch_size > 0 followed by the explicit tensor shape, making complete shape \
             [-1,16,16])"
        );
    }

    #[test]
    fn reshape_is_recorded() {
        let config = parse_config(
            "name: \"m\" max_batch_size: 4 input [{name: \"x\" data_type: TYPE_FP32 dims: [2, 2] reshape: { shape: [4] }}] \
             output [{name: \"y\" data_type: TYPE_FP32 dims: [4]}]",
        )
        .unwrap();
        let io = IoSpec::new(
            &config,
            &[info("x", DataType::Fp32, &[-1, 4])],
            &[info("y", DataType::Fp32, &[-1, 4])],
        )
        .unwrap();
        assert_eq!(io.input("x").unwrap().model_dims, Some(vec![4]));
    }

    #[test]
    fn batching_needs_a_variable_first_graph_dimension() {
        let config = |batch: i32, dims: &str| {
            parse_config(&format!(
                "name: \"m\" max_batch_size: {batch} \
                 input [{{name: \"x\" data_type: TYPE_FP32 dims: {dims}}}] \
                 output [{{name: \"y\" data_type: TYPE_FP32 dims: [-1]}}]"
            ))
            .unwrap()
        };
        let y = [info("y", DataType::Fp32, &[-1, -1])];
        let x = |shape: &[i64]| [info("x", DataType::Fp32, shape)];
        assert_eq!(
            IoSpec::new(&config(8, "[4]"), &x(&[8, 4]), &y).unwrap_err(),
            "model 'm', tensor 'x': for the model to support batching the shape should have at \
             least 1 dimension and the first dimension must be -1; but shape expected by the \
             model is [8,4]"
        );
        assert!(IoSpec::new(&config(8, "[4]"), &x(&[]), &y)
            .unwrap_err()
            .contains("first dimension must be -1"));
        let y = [info("y", DataType::Fp32, &[-1])];
        assert!(IoSpec::new(&config(0, "[8, 4]"), &x(&[8, 4]), &y).is_ok());
        assert!(IoSpec::new(&config(0, "[-1, 4]"), &x(&[8, 4]), &y)
            .unwrap_err()
            .contains("the model expects 2 dimensions (shape [8,4])"));
    }

    #[test]
    fn mismatches_are_load_errors() {
        let config = parse_config(
            "name: \"m\" input [{name: \"x\" data_type: TYPE_INT32 dims: [3]}] \
             output [{name: \"y\" data_type: TYPE_FP32 dims: [3]}]",
        )
        .unwrap();
        let y = [info("y", DataType::Fp32, &[3])];
        assert!(IoSpec::new(&config, &[info("x", DataType::Fp32, &[3])], &y)
            .unwrap_err()
            .contains("datatype"));
        assert!(
            IoSpec::new(&config, &[info("z", DataType::Int32, &[3])], &y)
                .unwrap_err()
                .contains("not a model input")
        );
        assert_eq!(
            IoSpec::new(&config, &[info("x", DataType::Int32, &[3, 1])], &y).unwrap_err(),
            "model 'm', tensor 'x': the model expects 2 dimensions (shape [3,1]) but the model \
             configuration specifies 1 dimensions (shape [3])"
        );
        assert!(
            IoSpec::new(&config, &[info("x", DataType::Int32, &[4])], &y)
                .unwrap_err()
                .contains("the model expects 1 dimensions (shape [4])")
        );
        let extra = [
            info("x", DataType::Int32, &[3]),
            info("w", DataType::Int32, &[3]),
        ];
        assert!(IoSpec::new(&config, &extra, &y)
            .unwrap_err()
            .contains("missing from the configuration"));
    }

    #[test]
    fn only_inputs_with_a_default_may_be_optional() {
        let config = parse_config(
            r#"name: "m"
               input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] },
                       { name: "bias" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ]
               output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]"#,
        )
        .unwrap();
        let x = [info("x", DataType::Fp32, &[2])];
        let bias = [info("bias", DataType::Fp32, &[2])];
        let y = [info("y", DataType::Fp32, &[2])];
        let io = IoSpec::with_defaults(&config, &BatchLayout::default(), &x, &bias, &y).unwrap();
        assert!(!io.inputs[0].optional && io.inputs[1].optional);
        // Without a graph (a Python model, an ensemble) the config's word is final.
        let io = IoSpec::from_config(&config).unwrap();
        assert!(!io.inputs[0].optional && io.inputs[1].optional);
        // Without the default the model requires 'bias'.
        let both = [x[0].clone(), bias[0].clone()];
        let error =
            IoSpec::with_defaults(&config, &BatchLayout::default(), &both, &[], &y).unwrap_err();
        assert!(
            error.contains(
                "input 'bias' is optional in the configuration, but the model requires it"
            ),
            "{error}"
        );
        // An initializer the config does not list stays the model's own.
        let required = parse_config(
            r#"name: "m" input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
               output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]"#,
        )
        .unwrap();
        assert!(IoSpec::with_defaults(&required, &BatchLayout::default(), &x, &bias, &y).is_ok());
    }
}
