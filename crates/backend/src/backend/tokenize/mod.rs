//! Server-side tokenization: a text model takes strings in one BYTES input, and its ONNX graph
//! takes token tensors (`input_ids`, `attention_mask`, `token_type_ids`). [`TextSpec`] names the
//! text input and the graph inputs the tokenizer feeds; [`TextSpec::bind`] checks them against a
//! graph ([`TextInput`]); [`TextModel`] wraps an instance's backend so that each batch the
//! scheduler merged — one string per row — is tokenized once, on the instance's own thread (never
//! inline on a network thread), padded to its longest text and run. Clients never see the token
//! tensors.

mod encode;

pub use encode::{Padding, TextTokenizer, TokenRows, TokenizerOptions, DEFAULT_MAX_LENGTH};

use super::{Backend, BackendError, TensorInfo};
use crate::core::tensor::BytesElements;
use crate::core::{DataType, Tensor};
use bytes::Bytes;
use std::sync::Arc;

/// Which graph input one token tensor goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSlot {
    /// The named input when the graph has one (the default, under the conventional name).
    IfPresent(String),
    /// The named input, which the graph must have.
    Named(String),
    /// Not fed.
    Unused,
}

/// A text model's tokenizer and the inputs it connects, not yet checked against a graph.
#[derive(Debug, Clone)]
pub struct TextSpec {
    /// The BYTES input clients send, one text per row.
    pub text_input: String,
    pub input_ids: String,
    pub attention_mask: TokenSlot,
    pub token_type_ids: TokenSlot,
    pub tokenizer: Arc<TextTokenizer>,
}

/// A graph input fed from the token rows, with the graph's integer type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TokenTensor {
    name: String,
    datatype: DataType,
}

/// A [`TextSpec`] checked against a graph: what [`TextModel`] needs to build the token tensors.
#[derive(Debug)]
pub struct TextInput {
    text_input: String,
    input_ids: TokenTensor,
    attention_mask: Option<TokenTensor>,
    token_type_ids: Option<TokenTensor>,
    tokenizer: Arc<TextTokenizer>,
}

impl TextSpec {
    /// Resolves the token inputs in `graph_inputs` and checks their types and shapes.
    ///
    /// # Errors
    /// [`BackendError::Load`] naming the input that is missing or does not fit, and what would.
    pub fn bind(&self, graph_inputs: &[TensorInfo]) -> Result<TextInput, BackendError> {
        let known = || {
            let names: Vec<&str> = graph_inputs.iter().map(|t| t.name.as_str()).collect();
            names.join(", ")
        };
        if graph_inputs.iter().any(|t| t.name == self.text_input) {
            return Err(BackendError::Load(format!(
                "the text input '{}' has the name of a graph input; choose another tokenizer_text_input",
                self.text_input
            )));
        }
        let resolve = |slot: &TokenSlot| -> Result<Option<TokenTensor>, BackendError> {
            let (name, required) = match slot {
                TokenSlot::IfPresent(name) => (name, false),
                TokenSlot::Named(name) => (name, true),
                TokenSlot::Unused => return Ok(None),
            };
            match graph_inputs.iter().find(|t| &t.name == name) {
                Some(info) => self.token_tensor(info).map(Some),
                None if required => Err(BackendError::Load(format!(
                    "the tokenizer feeds '{name}', which is not a graph input; the graph has inputs [{}]",
                    known()
                ))),
                None => Ok(None),
            }
        };
        let input_ids = resolve(&TokenSlot::Named(self.input_ids.clone()))?
            .expect("a required slot resolves or fails");
        let attention_mask = resolve(&self.attention_mask)?;
        let token_type_ids = resolve(&self.token_type_ids)?;
        let names = [
            Some(&input_ids),
            attention_mask.as_ref(),
            token_type_ids.as_ref(),
        ];
        let fed: Vec<&str> = names.iter().flatten().map(|t| t.name.as_str()).collect();
        if let Some(twice) = (1..fed.len()).find(|&i| fed[..i].contains(&fed[i])) {
            return Err(BackendError::Load(format!(
                "graph input '{}' is named for two token tensors",
                fed[twice]
            )));
        }
        Ok(TextInput {
            text_input: self.text_input.clone(),
            input_ids,
            attention_mask,
            token_type_ids,
            tokenizer: Arc::clone(&self.tokenizer),
        })
    }

    fn token_tensor(&self, info: &TensorInfo) -> Result<TokenTensor, BackendError> {
        let name = &info.name;
        let datatype = match info.datatype {
            Some(dt @ (DataType::Int64 | DataType::Int32)) => dt,
            other => {
                return Err(BackendError::Load(format!(
                    "graph input '{name}' is {}, but token tensors must be INT64 or INT32",
                    other.map_or("an unsupported type", DataType::as_wire)
                )))
            }
        };
        let [_, sequence] = info.shape[..] else {
            return Err(BackendError::Load(format!(
                "graph input '{name}' has rank {}, but token tensors are [batch, sequence]",
                info.shape.len()
            )));
        };
        let max_length = self.tokenizer.max_length();
        let fits = sequence == -1
            || (self.tokenizer.padding() == Padding::MaxLength
                && usize::try_from(sequence) == Ok(max_length));
        if !fits {
            return Err(BackendError::Load(format!(
                "graph input '{name}' has a fixed sequence length of {sequence}: set tokenizer_padding \
                 to \"max_length\" and tokenizer_max_length to {sequence}"
            )));
        }
        Ok(TokenTensor {
            name: name.clone(),
            datatype,
        })
    }
}

impl TextInput {
    /// The name of the BYTES input clients send.
    pub fn text_input(&self) -> &str {
        &self.text_input
    }

    /// The inputs clients see: the graph's, with the token tensors replaced by the text input
    /// (BYTES, one text per row: `[batch, 1]`) where `input_ids` was.
    pub fn client_inputs(&self, graph_inputs: &[TensorInfo]) -> Vec<TensorInfo> {
        let mut inputs = Vec::with_capacity(graph_inputs.len());
        for info in graph_inputs {
            if info.name == self.input_ids.name {
                inputs.push(TensorInfo {
                    name: self.text_input.clone(),
                    datatype: Some(DataType::Bytes),
                    shape: vec![info.shape.first().copied().unwrap_or(-1), 1],
                });
            } else if !self.feeds(&info.name) {
                inputs.push(info.clone());
            }
        }
        inputs
    }

    pub fn tokenizer(&self) -> &Arc<TextTokenizer> {
        &self.tokenizer
    }

    /// The graph inputs the tokenizer feeds.
    pub fn token_inputs(&self) -> impl Iterator<Item = &str> {
        [
            Some(&self.input_ids),
            self.attention_mask.as_ref(),
            self.token_type_ids.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| t.name.as_str())
    }

    fn feeds(&self, name: &str) -> bool {
        self.token_inputs().any(|t| t == name)
    }

    /// Tokenizes the text tensor (every element one text) into the graph's token tensors.
    ///
    /// # Errors
    /// [`BackendError::Input`] for malformed BYTES, text that is not UTF-8 or does not fit.
    pub fn encode(&self, text: &Tensor) -> Result<Vec<Tensor>, BackendError> {
        let name = &self.text_input;
        let texts = BytesElements::new(&text.data)
            .enumerate()
            .map(|(index, element)| {
                let element = element.map_err(|e| BackendError::Input(e.to_string()))?;
                std::str::from_utf8(element).map_err(|e| {
                    BackendError::Input(format!(
                        "element {index} of input '{name}' is not valid UTF-8 text: {e}"
                    ))
                })
            })
            .collect::<Result<Vec<&str>, _>>()?;
        let rows = self.tokenizer.encode(name, &texts)?;
        let shape = vec![rows.rows as i64, rows.length as i64];
        let mut tensors = vec![token_tensor(&self.input_ids, &shape, &rows.ids)];
        if let Some(mask) = &self.attention_mask {
            tensors.push(token_tensor(mask, &shape, &rows.attention_mask));
        }
        if let Some(types) = &self.token_type_ids {
            tensors.push(token_tensor(types, &shape, &rows.type_ids));
        }
        Ok(tensors)
    }
}

fn token_tensor(tensor: &TokenTensor, shape: &[i64], values: &[i64]) -> Tensor {
    let data = match tensor.datatype {
        // Token ids and type ids come from u32 values; they fit in i32 for any real vocabulary.
        DataType::Int32 => values
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect(),
        _ => bytemuck::cast_slice::<i64, u8>(values).to_vec(),
    };
    Tensor::new(
        tensor.name.clone(),
        tensor.datatype,
        shape.to_vec(),
        Bytes::from(data),
    )
}

/// A model instance that takes text: tokenizes the text input of each batch, then runs the
/// wrapped backend on the token tensors and the other inputs.
pub struct TextModel {
    text: Arc<TextInput>,
    inner: Box<dyn Backend>,
}

impl TextModel {
    pub fn new(text: Arc<TextInput>, inner: Box<dyn Backend>) -> TextModel {
        TextModel { text, inner }
    }
}

impl Backend for TextModel {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let mut model_inputs = Vec::with_capacity(inputs.len() + 2);
        let mut found = false;
        for input in inputs {
            if input.name == self.text.text_input {
                model_inputs.extend(self.text.encode(input)?);
                found = true;
            } else {
                model_inputs.push(input.clone());
            }
        }
        if !found {
            return Err(BackendError::Input(format!(
                "missing text input '{}'",
                self.text.text_input
            )));
        }
        self.inner.run(&model_inputs)
    }

    /// Tokenization never runs on the network threads, however quick the model.
    fn may_run_inline(&self) -> bool {
        false
    }

    fn gpu(&self) -> Option<i32> {
        self.inner.gpu()
    }
}

#[cfg(test)]
mod tests;
