//! Text embeddings: a text model (one that tokenizes its strings, see
//! [`crate::backend::tokenize`]) asked for the vectors of many texts at once, as OpenAI's
//! `/v1/embeddings` asks. The texts go to the model as ordinary inference requests of at most
//! `max_batch_size` texts each, all at once, so that the scheduler batches them as it batches
//! any client's; the vectors come back in the texts' order with the tokens they cost.

use super::context::{Context, Scope};
use super::Engine;
use crate::core::tensor::frame_bytes;
use crate::core::{DataType, Error, InferRequest, RequestedOutput, Tensor};
use crate::invalid_arg;
use crate::repository::Executor;
use crate::repository::{IoSpec, TensorSpec};
use std::sync::Arc;

/// Most texts one embeddings request may hold (OpenAI's bound).
pub const MAX_TEXTS: usize = 2048;

/// Output names taken for the embedding when a model has several floating-point outputs.
const CONVENTIONAL_OUTPUTS: [&str; 4] = [
    "embedding",
    "embeddings",
    "sentence_embedding",
    "sentence_embeddings",
];

/// The vectors of an embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// The model that answered.
    pub model: String,
    /// One vector per text, in the texts' order, row after row.
    pub values: Vec<f32>,
    /// Length of each vector.
    pub dimensions: usize,
    /// Tokens the texts became, in all.
    pub prompt_tokens: usize,
}

impl Embeddings {
    /// The vectors, one per text.
    pub fn vectors(&self) -> impl Iterator<Item = &[f32]> {
        self.values.chunks(self.dimensions.max(1))
    }
}

/// How a text model is asked for embeddings, read from its contract.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    text_input: String,
    output: String,
    /// Most texts one inference request carries.
    per_request: usize,
    /// The text input's shape without the batch dimension (one element); a model that does not
    /// batch but takes a variable number of texts in its first dimension has `None` here and
    /// takes `[n, ...]` whole.
    row: Vec<i64>,
    /// Whether the texts go along a batch dimension (`max_batch_size` > 0) or along the first
    /// dimension of a model that does not batch.
    leading: bool,
    /// The vector length, when the output's shape fixes it.
    dimensions: Option<usize>,
}

impl Plan {
    /// The plan for model `name`'s contract `io`.
    fn of(name: &str, io: &IoSpec) -> Result<Plan, Error> {
        let not_text = || {
            invalid_arg!(
                "model '{name}' does not take text: embeddings come from models with a tokenizer \
                 (tokenizer_text_input and a tokenizer.json)"
            )
        };
        let text = io.inputs.iter().find(|i| i.text).ok_or_else(not_text)?;
        if let Some(other) = io.inputs.iter().find(|i| !i.text && !i.optional) {
            return Err(invalid_arg!(
                "model '{name}' needs input '{}' besides its text: embeddings come from models \
                 whose only required input is the text",
                other.name
            ));
        }
        // -1 takes one text; anything else must hold one element.
        let one = |dims: &[i64]| dims.iter().map(|&d| if d == -1 { 1 } else { d }).collect();
        let single = |dims: &Vec<i64>| dims.iter().all(|&d| d == 1);
        let (per_request, row, leading) = if io.max_batch_size > 0 {
            let row: Vec<i64> = one(&text.dims);
            (io.max_batch_size, row, true)
        } else if text.dims.first() == Some(&-1) {
            (MAX_TEXTS, one(&text.dims[1..]), true)
        } else {
            (1, one(&text.dims), false)
        };
        if !single(&row) {
            return Err(invalid_arg!(
                "model '{name}' takes text input '{}' of shape {:?}: embeddings come from models \
                 that take one text per row",
                text.name,
                text.dims
            ));
        }
        let floating: Vec<&TensorSpec> = io
            .outputs
            .iter()
            .filter(|o| {
                matches!(
                    o.datatype,
                    DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64
                )
            })
            .collect();
        // The dims of one text's vector: without the leading dimension that counts texts.
        let vector_dims = |o: &TensorSpec| -> Vec<i64> {
            match (io.max_batch_size, leading) {
                (0, true) => o.dims.get(1..).unwrap_or_default().to_vec(),
                _ => o.dims.clone(),
            }
        };
        let fixed = |o: &&TensorSpec| vector_dims(o).iter().all(|&d| d > 0);
        let output = match floating.as_slice() {
            [only] => *only,
            [] => {
                return Err(invalid_arg!(
                    "model '{name}' has no floating-point output to take embeddings from"
                ))
            }
            several => {
                let candidates: Vec<&TensorSpec> = several.iter().copied().filter(fixed).collect();
                match candidates.as_slice() {
                    [only] => *only,
                    _ => CONVENTIONAL_OUTPUTS
                        .iter()
                        .find_map(|c| candidates.iter().find(|o| o.name == *c))
                        .copied()
                        .ok_or_else(|| {
                            let names: Vec<&str> =
                                several.iter().map(|o| o.name.as_str()).collect();
                            invalid_arg!(
                                "model '{name}' has several floating-point outputs ({}): name \
                                 the embedding one 'embedding'",
                                names.join(", ")
                            )
                        })?,
                }
            }
        };
        let dimensions =
            fixed(&output).then(|| vector_dims(output).iter().map(|&d| d as usize).product());
        Ok(Plan {
            text_input: text.name.clone(),
            output: output.name.clone(),
            per_request,
            row,
            leading,
            dimensions,
        })
    }

    /// The shape of a request carrying `n` texts.
    fn shape(&self, n: usize) -> Vec<i64> {
        let mut shape = Vec::with_capacity(self.row.len() + 1);
        if self.leading {
            shape.push(n as i64);
        }
        shape.extend(&self.row);
        shape
    }
}

/// An output tensor's values as `f32`.
fn floats(tensor: &Tensor) -> Result<Vec<f32>, Error> {
    let data = &tensor.data;
    let values = match tensor.datatype {
        DataType::Fp32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DataType::Fp64 => data
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        DataType::Fp16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DataType::Bf16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(Error::Internal(format!(
                "output '{}' is {}, not floating-point",
                tensor.name,
                other.as_wire()
            )))
        }
    };
    Ok(values)
}

impl super::Target {
    /// Whether it makes embeddings of text: see [`Engine::embed`].
    pub fn makes_embeddings(&self) -> bool {
        matches!(self.serving.executor, Executor::Batched(_))
            && self.serving.tokenizer.is_some()
            && Plan::of(&self.model.name, &self.serving.io).is_ok()
    }
}

impl Engine {
    /// The embeddings of `texts` from the text model `name` (its newest version). `dimensions`,
    /// when given, must be the vectors' length (kiln does not shorten vectors).
    ///
    /// # Errors
    /// Lookup errors as [`Engine::model_metadata`]; INVALID_ARGUMENT for a model that does not
    /// make embeddings of text, for no texts or more than [`MAX_TEXTS`], for other
    /// `dimensions`; the inference errors of any of the requests the texts become.
    pub async fn embed(
        &self,
        context: &Context,
        name: &str,
        texts: Vec<String>,
        dimensions: Option<usize>,
        id: &str,
    ) -> Result<Embeddings, Error> {
        let (model, serving) = self.resolve(name, "")?;
        let tokenizer = match (&serving.executor, &serving.tokenizer) {
            (Executor::Batched(_), Some(tokenizer)) => Arc::clone(tokenizer),
            _ => {
                return Err(invalid_arg!(
                    "model '{}' does not make embeddings of text (a model with a tokenizer: \
                     tokenizer_text_input and a tokenizer.json)",
                    model.name
                ))
            }
        };
        let plan = Plan::of(&model.name, &serving.io)?;
        if texts.is_empty() || texts.len() > MAX_TEXTS {
            return Err(invalid_arg!(
                "an embeddings request holds 1 to {MAX_TEXTS} texts, not {}",
                texts.len()
            ));
        }
        let wrong_length = |got: usize, asked: usize| {
            invalid_arg!(
                "model '{}' makes vectors of {got} dimensions, not {asked} (kiln does not \
                 shorten them)",
                model.name
            )
        };
        if let (Some(asked), Some(got)) = (dimensions, plan.dimensions) {
            if asked != got {
                return Err(wrong_length(got, asked));
            }
        }
        let texts = Arc::new(texts);
        // Every part runs on the version resolved now, whatever loads meanwhile.
        let version = serving.version.to_string();
        let requests = texts.chunks(plan.per_request).map(|chunk| InferRequest {
            model_name: model.name.clone(),
            model_version: version.clone(),
            id: id.to_string(),
            inputs: vec![Tensor::new(
                plan.text_input.clone(),
                DataType::Bytes,
                plan.shape(chunk.len()),
                frame_bytes(chunk),
            )],
            outputs: vec![RequestedOutput {
                name: plan.output.clone(),
                ..RequestedOutput::default()
            }],
            ..InferRequest::default()
        });
        // Counted on a blocking thread while the model runs.
        let counting = {
            let input = plan.text_input.clone();
            let texts = Arc::clone(&texts);
            tokio::task::spawn_blocking(move || {
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                tokenizer.count(&input, &texts)
            })
        };
        let responses = futures_util::future::try_join_all(requests.map(|request| {
            // Each part traced as a request of its own, as before tracing reached it.
            let scope = Scope {
                trace: None,
                ..context.scope.clone()
            };
            self.run(request, scope)
        }))
        .await?;
        let prompt_tokens = counting
            .await
            .map_err(|e| Error::Internal(format!("token count task failed: {e}")))?
            .map_err(|e| invalid_arg!("{e}"))?;
        let mut values = Vec::new();
        let mut length = None;
        for (response, chunk) in responses.iter().zip(texts.chunks(plan.per_request)) {
            let tensor = response
                .outputs
                .iter()
                .find(|t| t.name == plan.output)
                .ok_or_else(|| {
                    Error::Internal(format!("the model did not answer output '{}'", plan.output))
                })?;
            let rows = floats(tensor)?;
            let fits = !rows.is_empty()
                && rows.len() % chunk.len() == 0
                && *length.get_or_insert(rows.len() / chunk.len()) == rows.len() / chunk.len();
            if !fits {
                return Err(Error::Internal(format!(
                    "output '{}' of model '{}' holds {} values for {} texts: not one vector per \
                     text",
                    plan.output,
                    model.name,
                    rows.len(),
                    chunk.len()
                )));
            }
            values.extend(rows);
        }
        let got = length.unwrap_or_default();
        if let Some(asked) = dimensions.filter(|&asked| asked != got) {
            return Err(wrong_length(got, asked));
        }
        Ok(Embeddings {
            model: model.name.clone(),
            values,
            dimensions: got,
            prompt_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
        TensorSpec::new(name, datatype, dims)
    }

    fn text(dims: &[i64]) -> TensorSpec {
        TensorSpec {
            text: true,
            ..spec("text", DataType::Bytes, dims)
        }
    }

    fn io(max_batch_size: usize, inputs: Vec<TensorSpec>, outputs: Vec<TensorSpec>) -> IoSpec {
        IoSpec {
            max_batch_size,
            inputs,
            outputs,
        }
    }

    #[test]
    fn batching_text_models_take_a_batch_of_texts_per_request() {
        let plan = Plan::of(
            "m",
            &io(
                32,
                vec![text(&[1])],
                vec![spec("embedding", DataType::Fp32, &[384])],
            ),
        )
        .unwrap();
        assert_eq!(plan.per_request, 32);
        assert_eq!(plan.shape(5), [5, 1]);
        assert_eq!(plan.output, "embedding");
        assert_eq!(plan.dimensions, Some(384));
    }

    #[test]
    fn models_without_batching_take_texts_along_their_first_dimension_or_one_at_a_time() {
        let along = Plan::of(
            "m",
            &io(
                0,
                vec![text(&[-1, 1])],
                vec![spec("out", DataType::Fp16, &[-1, 8])],
            ),
        )
        .unwrap();
        assert_eq!((along.per_request, along.shape(7)), (MAX_TEXTS, vec![7, 1]));
        assert_eq!(along.dimensions, Some(8));
        let single = Plan::of(
            "m",
            &io(
                0,
                vec![text(&[1])],
                vec![spec("out", DataType::Fp32, &[1, 8])],
            ),
        )
        .unwrap();
        assert_eq!((single.per_request, single.shape(1)), (1, vec![1]));
        assert_eq!(single.dimensions, Some(8));
    }

    #[test]
    fn the_embedding_output_is_the_only_float_one_the_fixed_one_or_the_conventional_name() {
        let outputs = |names: &[(&str, &[i64])]| {
            names
                .iter()
                .map(|(n, d)| spec(n, DataType::Fp32, d))
                .chain([spec("ids", DataType::Int64, &[4])])
                .collect()
        };
        let pick = |o| Plan::of("m", &io(8, vec![text(&[1])], o)).map(|p| p.output);
        assert_eq!(
            pick(outputs(&[
                ("last_hidden_state", &[-1, 384]),
                ("pooled", &[384])
            ]))
            .unwrap(),
            "pooled"
        );
        assert_eq!(
            pick(outputs(&[
                ("pooler_output", &[384]),
                ("sentence_embedding", &[384])
            ]))
            .unwrap(),
            "sentence_embedding"
        );
        let error = pick(outputs(&[("a", &[4]), ("b", &[4])])).unwrap_err();
        assert!(error.message().contains("(a, b)"), "{}", error.message());
        let plan = Plan::of(
            "m",
            &io(8, vec![text(&[1])], outputs(&[("state", &[-1, 4])])),
        )
        .unwrap();
        assert_eq!((plan.output.as_str(), plan.dimensions), ("state", None));
        assert_eq!(
            pick(vec![spec("ids", DataType::Int64, &[4])]).unwrap_err(),
            Error::InvalidArgument(
                "model 'm' has no floating-point output to take embeddings from".into()
            )
        );
    }

    #[test]
    fn models_that_do_not_take_one_text_alone_are_refused() {
        let float = || vec![spec("e", DataType::Fp32, &[4])];
        for (inputs, why) in [
            (vec![spec("x", DataType::Fp32, &[4])], "does not take text"),
            (
                vec![text(&[1]), spec("x", DataType::Fp32, &[4])],
                "needs input 'x'",
            ),
            (vec![text(&[2])], "one text per row"),
        ] {
            let error = Plan::of("m", &io(8, inputs, float())).unwrap_err();
            assert!(matches!(error, Error::InvalidArgument(_)));
            assert!(error.message().contains(why), "{}", error.message());
        }
        let optional = TensorSpec {
            optional: true,
            ..spec("x", DataType::Fp32, &[4])
        };
        assert!(Plan::of("m", &io(8, vec![text(&[1]), optional], float())).is_ok());
    }

    #[test]
    fn outputs_of_every_float_type_read_as_f32() {
        let tensor = |datatype, data: Vec<u8>| Tensor::new("e", datatype, vec![2], data.into());
        let want = [1.5f32, -2.0];
        let fp32: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
        let fp64: Vec<u8> = want
            .iter()
            .flat_map(|&v| f64::from(v).to_le_bytes())
            .collect();
        let fp16: Vec<u8> = want
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = want
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        for (datatype, data) in [
            (DataType::Fp32, fp32),
            (DataType::Fp64, fp64),
            (DataType::Fp16, fp16),
            (DataType::Bf16, bf16),
        ] {
            assert_eq!(floats(&tensor(datatype, data)).unwrap(), want);
        }
        assert_eq!(
            floats(&tensor(DataType::Int32, vec![0; 8])).unwrap_err(),
            Error::Internal("output 'e' is INT32, not floating-point".into())
        );
    }
}
