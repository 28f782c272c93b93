//! Decoder-only language models exported with Hugging Face Optimum's text-generation convention:
//! inputs `input_ids` `[batch, seq]`, `attention_mask` `[batch, past + seq]`, optional
//! `position_ids` `[batch, seq]` and `past_key_values.{i}.key/value` `[batch, heads, past, head_dim]`;
//! outputs `logits` `[batch, seq, vocab]` and `present.{i}.key/value` `[batch, heads, past + seq,
//! head_dim]`. One [`DecoderSession`] runs one forward pass over a batch of rows; the
//! [`KvCache`] of a batch is kept as ONNX Runtime's own output values, so a decode step feeds the
//! previous step's `present` tensors back without copying them. Rows are left-padded: row `r`
//! holds its `len` cached positions at the end of the cache, and `attention_mask` hides the rest.

use super::{BackendError, OnnxRuntime, SessionOptions};
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{DynValue, TensorElementType, ValueType};
use std::borrow::Cow;
use std::path::Path;

/// The cached keys and values of every layer for a batch of rows.
pub struct KvCache {
    /// `[key, value]` of layer 0, then layer 1, ...; each `[rows, heads, len, head_dim]`.
    values: Vec<DynValue>,
    rows: usize,
    /// Cached positions (the same for every row; shorter rows are left-padded).
    len: usize,
}

impl KvCache {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Cached positions per row, padding included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One row of a new cache: `len` positions taken from the end of row `row` of `source`.
#[derive(Clone, Copy)]
pub struct RowSource<'a> {
    pub source: &'a KvCache,
    pub row: usize,
    pub len: usize,
}

/// One forward pass: `rows` rows of `seq` new tokens each, after `cache.len()` cached positions.
pub struct Forward<'a> {
    pub input_ids: &'a [i64],
    /// `[rows, cache.len() + seq]`: 1 for real positions, 0 for padding.
    pub attention_mask: &'a [i64],
    pub position_ids: &'a [i64],
    pub seq: usize,
}

/// Inputs of one forward pass over a batch, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    pub position_ids: Vec<i64>,
    /// New tokens per row.
    pub seq: usize,
}

/// Inputs of a prefill over `prompts` (none empty), left-padded to the longest.
pub fn prefill_inputs(prompts: &[&[u32]]) -> Inputs {
    let seq = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let mut inputs = Inputs {
        input_ids: Vec::with_capacity(prompts.len() * seq),
        attention_mask: Vec::with_capacity(prompts.len() * seq),
        position_ids: Vec::with_capacity(prompts.len() * seq),
        seq,
    };
    for prompt in prompts {
        let padding = seq - prompt.len();
        inputs.input_ids.extend(std::iter::repeat_n(0, padding));
        inputs
            .input_ids
            .extend(prompt.iter().map(|&t| i64::from(t)));
        inputs
            .attention_mask
            .extend(std::iter::repeat_n(0, padding));
        inputs
            .attention_mask
            .extend(std::iter::repeat_n(1, prompt.len()));
        inputs.position_ids.extend(std::iter::repeat_n(0, padding));
        inputs.position_ids.extend(0..prompt.len() as i64);
    }
    inputs
}

/// What a forward pass returns: the logits of each row's last position and the grown cache.
pub struct Step {
    /// `[rows, vocab]`, row-major.
    pub logits: Vec<f32>,
    pub cache: KvCache,
}

/// An ONNX Runtime session over a decoder graph, with the shape facts read from the graph.
pub struct DecoderSession {
    session: Session,
    /// Options for every run, when the config asks for any (arena shrinkage).
    run_options: Option<RunOptions>,
    layers: usize,
    heads: usize,
    head_dim: usize,
    vocab: usize,
    /// Some exports (e.g. older GPT-2 ones) compute positions themselves.
    position_ids: bool,
    /// Input names in graph order, as `run` wants them.
    cache_inputs: Vec<String>,
    cache_outputs: Vec<String>,
}

impl DecoderSession {
    /// Loads `path` and checks that it follows the convention above with FP32 caches and logits
    /// and INT64 token inputs.
    ///
    /// # Errors
    /// [`BackendError::Load`] naming what does not fit.
    pub fn load(
        runtime: &OnnxRuntime,
        path: &Path,
        options: &SessionOptions,
    ) -> Result<DecoderSession, BackendError> {
        let load_error = |e: String| {
            BackendError::Load(format!("failed to load ONNX model {}: {e}", path.display()))
        };
        let session = super::onnx::build_session(runtime, path, options).map_err(load_error)?;
        let run_options = super::onnx::run_options(&options.tuning).map_err(load_error)?;
        let fail = |m: String| {
            BackendError::Load(format!(
                "{} is not a decoder-only model with Optimum's text-generation inputs and outputs: {m}",
                path.display()
            ))
        };
        let input = |name: &str| {
            session
                .inputs()
                .iter()
                .find(|i| i.name() == name)
                .map(|i| i.dtype().clone())
        };
        let output = |name: &str| {
            session
                .outputs()
                .iter()
                .find(|o| o.name() == name)
                .map(|o| o.dtype().clone())
        };
        for name in ["input_ids", "attention_mask"] {
            match input(name) {
                Some(ty) if element(&ty) == Some(TensorElementType::Int64) => {}
                Some(_) => return Err(fail(format!("input '{name}' must be INT64"))),
                None => return Err(fail(format!("input '{name}' is missing"))),
            }
        }
        let position_ids = input("position_ids").is_some();
        let logits = output("logits").ok_or_else(|| fail("output 'logits' is missing".into()))?;
        let vocab = match dims(&logits).as_deref() {
            Some([_, _, v]) if *v > 0 && element(&logits) == Some(TensorElementType::Float32) => {
                *v as usize
            }
            _ => {
                return Err(fail(
                    "output 'logits' must be FP32 [batch, seq, vocab] with a fixed vocab".into(),
                ))
            }
        };
        let layers = (0..)
            .take_while(|i| input(&format!("past_key_values.{i}.key")).is_some())
            .count();
        if layers == 0 {
            return Err(fail("no 'past_key_values.0.key' input".into()));
        }
        let mut shape = None;
        let mut cache_inputs = Vec::new();
        let mut cache_outputs = Vec::new();
        for layer in 0..layers {
            for kind in ["key", "value"] {
                let (past, present) = (
                    format!("past_key_values.{layer}.{kind}"),
                    format!("present.{layer}.{kind}"),
                );
                let ty = input(&past).ok_or_else(|| fail(format!("input '{past}' is missing")))?;
                if output(&present).is_none() {
                    return Err(fail(format!("output '{present}' is missing")));
                }
                let (heads, head_dim) = match dims(&ty).as_deref() {
                    Some([_, h, _, d])
                        if *h > 0
                            && *d > 0
                            && element(&ty) == Some(TensorElementType::Float32) =>
                    {
                        (*h as usize, *d as usize)
                    }
                    _ => {
                        return Err(fail(format!(
                            "input '{past}' must be FP32 [batch, heads, past, head_dim] with fixed heads and head_dim"
                        )))
                    }
                };
                if *shape.get_or_insert((heads, head_dim)) != (heads, head_dim) {
                    return Err(fail(format!(
                        "input '{past}' differs in shape from layer 0"
                    )));
                }
                cache_inputs.push(past);
                cache_outputs.push(present);
            }
        }
        let (heads, head_dim) = shape.unwrap_or_default();
        Ok(DecoderSession {
            session,
            run_options,
            layers,
            heads,
            head_dim,
            vocab,
            position_ids,
            cache_inputs,
            cache_outputs,
        })
    }

    /// Size of the vocabulary (the last dimension of `logits`).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Number of layers (pairs of cache tensors).
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// A cache with `rows` rows and no position, for a prefill.
    ///
    /// # Errors
    /// [`BackendError::Run`] if ONNX Runtime cannot create the (empty) tensors.
    pub fn empty_cache(&self, rows: usize) -> Result<KvCache, BackendError> {
        let values = (0..self.layers * 2)
            .map(|_| self.tensor(vec![0.0; 0], rows, 0))
            .collect::<Result<_, _>>()?;
        Ok(KvCache {
            values,
            rows,
            len: 0,
        })
    }

    /// Runs one forward pass and returns the last position's logits of each row and the cache
    /// grown by `seq` positions. The cache passed in is consumed: its tensors are fed to ONNX
    /// Runtime as they are.
    ///
    /// # Errors
    /// [`BackendError::Input`] when the slices do not fit the cache; [`BackendError::Run`] when
    /// ONNX Runtime fails.
    pub fn forward(&mut self, step: Forward<'_>, cache: KvCache) -> Result<Step, BackendError> {
        let rows = cache.rows;
        let tokens = rows * step.seq;
        if step.seq == 0
            || step.input_ids.len() != tokens
            || step.position_ids.len() != tokens
            || step.attention_mask.len() != rows * (cache.len + step.seq)
        {
            return Err(BackendError::Input(
                "forward pass inputs do not match the cache".into(),
            ));
        }
        let ids = int_tensor(step.input_ids, rows, step.seq)?;
        let mask = int_tensor(step.attention_mask, rows, cache.len + step.seq)?;
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = vec![
            (Cow::Borrowed("input_ids"), ids.into()),
            (Cow::Borrowed("attention_mask"), mask.into()),
        ];
        if self.position_ids {
            let positions = int_tensor(step.position_ids, rows, step.seq)?;
            inputs.push((Cow::Borrowed("position_ids"), positions.into()));
        }
        for (name, value) in self.cache_inputs.iter().zip(cache.values) {
            inputs.push((Cow::Borrowed(name.as_str()), value.into()));
        }
        let mut outputs = match &self.run_options {
            None => self.session.run(inputs),
            Some(options) => self.session.run_with_options(inputs, options),
        }
        .map_err(|e| BackendError::Run(format!("onnx runtime error: {e}")))?;
        let logits = outputs
            .get("logits")
            .ok_or_else(|| BackendError::Run("the model returned no logits".into()))?;
        let (shape, data) = logits.try_extract_tensor::<f32>().map_err(read_error)?;
        if shape[..] != [rows as i64, step.seq as i64, self.vocab as i64] {
            return Err(BackendError::Run(format!(
                "logits have shape {:?}, expected [{rows}, {}, {}]",
                &shape[..],
                step.seq,
                self.vocab
            )));
        }
        let last = (0..rows)
            .flat_map(|r| {
                let start = (r * step.seq + step.seq - 1) * self.vocab;
                data[start..start + self.vocab].iter().copied()
            })
            .collect();
        let len = cache.len + step.seq;
        let mut values = Vec::with_capacity(self.cache_outputs.len());
        for name in &self.cache_outputs {
            let value = outputs
                .remove(name.as_str())
                .ok_or_else(|| BackendError::Run(format!("the model returned no '{name}'")))?;
            let expected = [rows, self.heads, len, self.head_dim].map(|d| d as i64);
            if value.shape()[..] != expected {
                return Err(BackendError::Run(format!(
                    "'{name}' has shape {:?}, expected {expected:?}",
                    &value.shape()[..]
                )));
            }
            values.push(value);
        }
        Ok(Step {
            logits: last,
            cache: KvCache { values, rows, len },
        })
    }

    /// A new cache whose rows are taken from existing caches, left-padded to the longest: used
    /// when sequences join or leave the batch. An empty `rows` gives an empty cache.
    ///
    /// # Errors
    /// [`BackendError::Input`] when a row or length is out of range.
    pub fn gather(&self, rows: &[RowSource<'_>]) -> Result<KvCache, BackendError> {
        let len = rows.iter().map(|r| r.len).max().unwrap_or(0);
        if let Some(bad) = rows
            .iter()
            .find(|r| r.row >= r.source.rows || r.len > r.source.len)
        {
            return Err(BackendError::Input(format!(
                "cache row {} of length {} is out of range",
                bad.row, bad.len
            )));
        }
        let plane = self.heads * len * self.head_dim;
        let mut values = Vec::with_capacity(self.layers * 2);
        for index in 0..self.layers * 2 {
            let mut data = vec![0.0f32; rows.len() * plane];
            for (r, from) in rows.iter().enumerate() {
                let (_, source) = from.source.values[index]
                    .try_extract_tensor::<f32>()
                    .map_err(read_error)?;
                let source_len = from.source.len;
                for h in 0..self.heads {
                    let src = ((from.row * self.heads + h) * source_len + source_len - from.len)
                        * self.head_dim;
                    let dst = ((r * self.heads + h) * len + len - from.len) * self.head_dim;
                    let count = from.len * self.head_dim;
                    data[dst..dst + count].copy_from_slice(&source[src..src + count]);
                }
            }
            values.push(self.tensor(data, rows.len(), len)?);
        }
        Ok(KvCache {
            values,
            rows: rows.len(),
            len,
        })
    }

    fn tensor(&self, data: Vec<f32>, rows: usize, len: usize) -> Result<DynValue, BackendError> {
        let shape = vec![
            rows as i64,
            self.heads as i64,
            len as i64,
            self.head_dim as i64,
        ];
        ort::value::Tensor::from_array((shape, data))
            .map(|t| t.into_dyn())
            .map_err(|e| BackendError::Run(format!("failed to create a cache tensor: {e}")))
    }
}

fn int_tensor(data: &[i64], rows: usize, cols: usize) -> Result<DynValue, BackendError> {
    ort::value::Tensor::from_array((vec![rows as i64, cols as i64], data.to_vec()))
        .map(|t| t.into_dyn())
        .map_err(|e| BackendError::Input(format!("failed to create an input tensor: {e}")))
}

fn read_error(e: ort::Error) -> BackendError {
    BackendError::Run(format!("failed to read model output: {e}"))
}

fn element(ty: &ValueType) -> Option<TensorElementType> {
    match ty {
        ValueType::Tensor { ty, .. } => Some(*ty),
        _ => None,
    }
}

fn dims(ty: &ValueType) -> Option<Vec<i64>> {
    match ty {
        ValueType::Tensor { shape, .. } => Some(shape.iter().copied().collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> DecoderSession {
        let runtime = OnnxRuntime::get().expect("ONNX Runtime (.ci/setup.sh runtime)");
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("model_repository/tiny_decoder/1/model.onnx");
        DecoderSession::load(
            &runtime,
            &path,
            &SessionOptions {
                intra_op_threads: Some(1),
                device: crate::backend::Device::Cpu,
                tuning: Default::default(),
                pool_name: None,
            },
        )
        .unwrap()
    }

    fn prefill(session: &mut DecoderSession, prompts: &[&[u32]]) -> Step {
        let inputs = prefill_inputs(prompts);
        let empty = session.empty_cache(prompts.len()).unwrap();
        session
            .forward(
                Forward {
                    input_ids: &inputs.input_ids,
                    attention_mask: &inputs.attention_mask,
                    position_ids: &inputs.position_ids,
                    seq: inputs.seq,
                },
                empty,
            )
            .unwrap()
    }

    fn decode(
        session: &mut DecoderSession,
        cache: KvCache,
        tokens: &[i64],
        lens: &[usize],
    ) -> Step {
        let width = cache.len() + 1;
        let mask: Vec<i64> = lens
            .iter()
            .flat_map(|&len| (0..width).map(move |i| i64::from(i >= width - len - 1)))
            .collect();
        let positions: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
        session
            .forward(
                Forward {
                    input_ids: tokens,
                    attention_mask: &mask,
                    position_ids: &positions,
                    seq: 1,
                },
                cache,
            )
            .unwrap()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-4, "logits differ by {worst}");
    }

    #[test]
    fn the_graph_is_read() {
        let session = session();
        assert_eq!((session.layers(), session.vocab()), (2, 512));
        assert_eq!((session.heads, session.head_dim), (4, 16));
    }

    #[test]
    fn left_padded_batches_and_gathered_caches_match_single_sequences() {
        let mut session = session();
        let (long, short): (&[u32], &[u32]) = (&[40, 41, 42, 43], &[50]);
        let alone_long = prefill(&mut session, &[long]);
        let alone_short = prefill(&mut session, &[short]);
        let together = prefill(&mut session, &[long, short]);
        let vocab = session.vocab();
        close(&together.logits[..vocab], &alone_long.logits);
        close(&together.logits[vocab..], &alone_short.logits);

        // One decode step for each alone, and for both in a batch rebuilt from the single caches
        // (short first: the row order of a gathered cache is the plan's).
        let next_long = decode(&mut session, alone_long.cache, &[7], &[4]);
        let next_short = decode(&mut session, alone_short.cache, &[8], &[1]);
        let gathered = session
            .gather(&[
                RowSource {
                    source: &together.cache,
                    row: 1,
                    len: 1,
                },
                RowSource {
                    source: &together.cache,
                    row: 0,
                    len: 4,
                },
            ])
            .unwrap();
        assert_eq!((gathered.rows(), gathered.len()), (2, 4));
        let both = decode(&mut session, gathered, &[8, 7], &[1, 4]);
        close(&both.logits[..vocab], &next_short.logits);
        close(&both.logits[vocab..], &next_long.logits);

        // Dropping the long row trims the padding.
        let trimmed = session
            .gather(&[RowSource {
                source: &both.cache,
                row: 0,
                len: 2,
            }])
            .unwrap();
        assert_eq!((trimmed.rows(), trimmed.len()), (1, 2));
        assert!(session
            .gather(&[RowSource {
                source: &both.cache,
                row: 2,
                len: 1
            }])
            .is_err());
    }

    #[test]
    fn other_graphs_are_refused_with_the_reason() {
        let runtime = OnnxRuntime::get().unwrap();
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("model_repository/add_sub/1/model.onnx");
        let refused = DecoderSession::load(
            &runtime,
            &path,
            &SessionOptions {
                intra_op_threads: Some(1),
                device: crate::backend::Device::Cpu,
                tuning: Default::default(),
                pool_name: None,
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            refused.contains("is not a decoder-only model")
                && refused.contains("'input_ids' is missing"),
            "{refused}"
        );
    }

    #[test]
    fn inputs_that_do_not_fit_the_cache_are_refused() {
        let mut session = session();
        let cache = session.empty_cache(1).unwrap();
        let refused = session.forward(
            Forward {
                input_ids: &[1, 2],
                attention_mask: &[1],
                position_ids: &[0, 1],
                seq: 2,
            },
            cache,
        );
        assert!(matches!(refused, Err(BackendError::Input(_))));
    }
}
