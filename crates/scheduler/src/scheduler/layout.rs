//! Triton's ragged batching: how a batch is laid out when the model asks for more than plain
//! concatenation along the batch dimension.
//!
//! - A **ragged input** (`allow_ragged_batch`) may have a different shape in each request of a
//!   batch: it is left out of the batch signature, and the requests' elements are concatenated
//!   into one 1-D tensor, as Triton's ONNX Runtime backend gives it to the model.
//! - A **batch input** is a tensor the server adds, computed from a source input's shape in each
//!   request, so the model can find each request's elements: element counts, accumulated counts
//!   (with or without a leading zero), the largest count as a shape, item shapes.
//! - A **scatter output** (`BATCH_SCATTER_WITH_INPUT_SHAPE`) is a 1-D output split back by the
//!   source input's element counts, each piece taking that request's source shape.
//!
//! A model without any of these has the plain layout, and batches exactly as before.

use super::batch;
use crate::core::{DataType, Tensor};
use bytes::{BufMut, Bytes, BytesMut};
use std::borrow::Cow;
use std::hash::{Hash, Hasher};

/// Triton's `BatchInput.Kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchInputKind {
    /// Each request's element count of the source: shape `[requests]`.
    ElementCount,
    /// Running totals of those counts (where each request's elements end): `[requests]`.
    AccumulatedElementCount,
    /// The same with a leading 0 (where each starts, then the end): `[requests + 1]`.
    AccumulatedElementCountWithZero,
    /// The largest count, as the tensor's shape `[max]` (its data is zeros).
    MaxElementCountAsShape,
    /// Each batch row's source shape without the batch dimension: `[rows, rank - 1]`.
    ItemShape,
    /// The same, flattened: `[rows * (rank - 1)]`.
    ItemShapeFlatten,
}

/// One tensor the server adds to every batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInput {
    pub kind: BatchInputKind,
    /// The model input it feeds.
    pub target: String,
    /// INT32 or FP32.
    pub datatype: DataType,
    /// The request input whose shapes it describes.
    pub source: String,
}

/// A 1-D output split back by a source input's element counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScatterOutput {
    pub output: String,
    pub source: String,
}

/// How batches of one model are laid out (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchLayout {
    pub ragged: Vec<String>,
    pub batch_inputs: Vec<BatchInput>,
    pub scatter: Vec<ScatterOutput>,
}

impl BatchLayout {
    /// Plain concatenation along the batch dimension.
    pub fn is_plain(&self) -> bool {
        self.ragged.is_empty() && self.batch_inputs.is_empty() && self.scatter.is_empty()
    }

    fn is_ragged(&self, input: &str) -> bool {
        self.ragged.iter().any(|name| name == input)
    }

    /// What must be equal for requests to share a batch: each input's name and datatype, and
    /// the non-batch dims of those that are not ragged.
    pub fn signature(&self, inputs: &[Tensor]) -> u64 {
        if self.ragged.is_empty() {
            return batch::signature(inputs);
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for input in inputs {
            input.name.hash(&mut hasher);
            input.datatype.hash(&mut hasher);
            if !self.is_ragged(&input.name) {
                input.shape.get(1..).unwrap_or_default().hash(&mut hasher);
            }
        }
        hasher.finish()
    }

    /// The model's inputs for a batch of requests: their inputs concatenated (ragged ones as
    /// 1-D), then the batch inputs.
    pub fn assemble<'a>(&self, requests: &[&'a [Tensor]]) -> Cow<'a, [Tensor]> {
        if self.is_plain() {
            return batch::concat(requests);
        }
        let mut inputs = batch::concat(requests).into_owned();
        for input in &mut inputs {
            if self.is_ragged(&input.name) {
                let elements: i64 = requests
                    .iter()
                    .map(|request| source_shape(request, &input.name).iter().product::<i64>())
                    .sum();
                input.shape = vec![elements];
            }
        }
        for spec in &self.batch_inputs {
            inputs.push(batch_input(spec, requests));
        }
        Cow::Owned(inputs)
    }

    /// Splits a batch's outputs back per request: scatter outputs by the source input's element
    /// counts (each piece shaped as that request's source), the others along the batch
    /// dimension by `rows`.
    ///
    /// # Errors
    /// As [`batch::split`], and a scatter output without as many elements as its source.
    pub fn split(
        &self,
        outputs: Vec<Tensor>,
        rows: &[usize],
        requests: &[&[Tensor]],
    ) -> Result<Vec<Vec<Tensor>>, String> {
        if self.scatter.is_empty() {
            return batch::split(outputs, rows);
        }
        let mut per_request: Vec<Vec<Tensor>> = rows
            .iter()
            .map(|_| Vec::with_capacity(outputs.len()))
            .collect();
        for output in outputs {
            let pieces = match self.scatter.iter().find(|s| s.output == output.name) {
                Some(scatter) => {
                    let shapes: Vec<Vec<i64>> = requests
                        .iter()
                        .map(|request| source_shape(request, &scatter.source).to_vec())
                        .collect();
                    let counts: Vec<usize> = shapes
                        .iter()
                        .map(|shape| shape.iter().map(|&d| d.max(0) as usize).product())
                        .collect();
                    let total: usize = counts.iter().sum();
                    if output.shape.len() != 1 || output.shape[0] != total as i64 {
                        return Err(format!(
                            "output '{}' has shape {:?}, but scattering it by input '{}' needs \
                             {total} elements in one dimension",
                            output.name, output.shape, scatter.source
                        ));
                    }
                    batch::pieces(&output, &counts, shapes.into_iter())?
                }
                None if rows.len() == 1 => vec![output],
                None => batch::split_rows(&output, rows)?,
            };
            for (request, piece) in per_request.iter_mut().zip(pieces) {
                request.push(piece);
            }
        }
        Ok(per_request)
    }
}

/// A request's shape of input `name` (empty when it lacks it: every request has been checked to
/// carry every input by then).
fn source_shape<'a>(request: &'a [Tensor], name: &str) -> &'a [i64] {
    request
        .iter()
        .find(|t| t.name == name)
        .map_or(&[], |t| t.shape.as_slice())
}

fn batch_input(spec: &BatchInput, requests: &[&[Tensor]]) -> Tensor {
    let shapes: Vec<&[i64]> = requests
        .iter()
        .map(|r| source_shape(r, &spec.source))
        .collect();
    let counts: Vec<i64> = shapes.iter().map(|s| s.iter().product()).collect();
    let running = counts.iter().scan(0, |total, &n| {
        *total += n;
        Some(*total)
    });
    let (shape, values): (Vec<i64>, Vec<i64>) = match spec.kind {
        BatchInputKind::ElementCount => (vec![counts.len() as i64], counts.clone()),
        BatchInputKind::AccumulatedElementCount => (vec![counts.len() as i64], running.collect()),
        BatchInputKind::AccumulatedElementCountWithZero => (
            vec![counts.len() as i64 + 1],
            std::iter::once(0).chain(running).collect(),
        ),
        BatchInputKind::MaxElementCountAsShape => {
            let max = counts.iter().copied().max().unwrap_or(0);
            (vec![max], vec![0; max.max(0) as usize])
        }
        BatchInputKind::ItemShape | BatchInputKind::ItemShapeFlatten => {
            let rank = shapes.first().map_or(0, |s| s.len().saturating_sub(1));
            let mut values = Vec::new();
            let mut items = 0;
            for shape in &shapes {
                let rows = shape.first().copied().unwrap_or(0).max(0);
                for _ in 0..rows {
                    values.extend_from_slice(shape.get(1..).unwrap_or_default());
                    items += 1;
                }
            }
            let shape = if spec.kind == BatchInputKind::ItemShape {
                vec![items, rank as i64]
            } else {
                vec![items * rank as i64]
            };
            (shape, values)
        }
    };
    let mut data = BytesMut::with_capacity(values.len() * 4);
    for value in values {
        match spec.datatype {
            DataType::Fp32 => data.put_f32_le(value as f32),
            // A dimension past i32 (possible beside a zero one) saturates rather than wraps.
            _ => data.put_i32_le(value.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32),
        }
    }
    Tensor::new(spec.target.clone(), spec.datatype, shape, Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DataType::Fp32, shape.to_vec(), data.into())
    }

    fn numbers(t: &Tensor) -> Vec<f64> {
        t.data
            .chunks_exact(4)
            .map(|c| match t.datatype {
                DataType::Fp32 => f64::from(f32::from_le_bytes(c.try_into().unwrap())),
                _ => f64::from(i32::from_le_bytes(c.try_into().unwrap())),
            })
            .collect()
    }

    fn layout(kind: BatchInputKind, datatype: DataType) -> BatchLayout {
        BatchLayout {
            ragged: vec!["x".into()],
            batch_inputs: vec![BatchInput {
                kind,
                target: "index".into(),
                datatype,
                source: "x".into(),
            }],
            scatter: Vec::new(),
        }
    }

    /// Three requests of shapes [1, 3], [1, 4], [1, 5], as in Triton's guide.
    fn guide_requests() -> Vec<Vec<Tensor>> {
        [3, 4, 5]
            .iter()
            .map(|&n| vec![f32s("x", &[1, n], &vec![n as f32; n as usize])])
            .collect()
    }

    #[test]
    fn ragged_inputs_leave_the_signature_and_concatenate_flat() {
        let requests = guide_requests();
        let layout = layout(BatchInputKind::AccumulatedElementCount, DataType::Fp32);
        assert_eq!(
            layout.signature(&requests[0]),
            layout.signature(&requests[1])
        );
        assert_ne!(
            batch::signature(&requests[0]),
            batch::signature(&requests[1])
        );
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        let inputs = layout.assemble(&refs);
        assert_eq!(inputs[0].shape, [12]);
        assert_eq!(inputs[0].data.len(), 48);
        assert_eq!(inputs[1].name, "index");
        assert_eq!(inputs[1].shape, [3]);
        assert_eq!(numbers(&inputs[1]), [3.0, 7.0, 12.0]);
    }

    #[test]
    fn every_batch_input_kind_follows_tritons_definition() {
        let requests = guide_requests();
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        for (kind, shape, values) in [
            (BatchInputKind::ElementCount, vec![3], vec![3.0, 4.0, 5.0]),
            (
                BatchInputKind::AccumulatedElementCountWithZero,
                vec![4],
                vec![0.0, 3.0, 7.0, 12.0],
            ),
            (
                BatchInputKind::MaxElementCountAsShape,
                vec![5],
                vec![0.0; 5],
            ),
            (BatchInputKind::ItemShape, vec![3, 1], vec![3.0, 4.0, 5.0]),
            (
                BatchInputKind::ItemShapeFlatten,
                vec![3],
                vec![3.0, 4.0, 5.0],
            ),
        ] {
            let inputs = layout(kind, DataType::Int32).assemble(&refs);
            assert_eq!(inputs[1].datatype, DataType::Int32);
            assert_eq!(inputs[1].shape, shape, "{kind:?}");
            assert_eq!(numbers(&inputs[1]), values, "{kind:?}");
        }
        // Triton's item-shape example: a batch-2 request of [3, 1] items and a batch-1 one of
        // [2, 2] give [[3, 1], [3, 1], [2, 2]].
        let requests = [
            vec![f32s("x", &[2, 3, 1], &[0.0; 6])],
            vec![f32s("x", &[1, 2, 2], &[0.0; 4])],
        ];
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        let inputs = layout(BatchInputKind::ItemShape, DataType::Int32).assemble(&refs);
        assert_eq!(inputs[1].shape, [3, 2]);
        assert_eq!(numbers(&inputs[1]), [3.0, 1.0, 3.0, 1.0, 2.0, 2.0]);
        let inputs = layout(BatchInputKind::ItemShapeFlatten, DataType::Int32).assemble(&refs);
        assert_eq!(inputs[1].shape, [6]);
    }

    #[test]
    fn a_lone_request_gets_the_same_layout() {
        let request = vec![f32s("x", &[1, 4], &[1.0; 4])];
        let layout = layout(
            BatchInputKind::AccumulatedElementCountWithZero,
            DataType::Int32,
        );
        let inputs = layout.assemble(&[&request]);
        assert_eq!(inputs[0].shape, [4]);
        assert_eq!(numbers(&inputs[1]), [0.0, 4.0]);
        assert!(matches!(
            BatchLayout::default().assemble(&[&request]),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn scatter_outputs_take_each_requests_source_shape() {
        let requests = guide_requests();
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        let layout = BatchLayout {
            ragged: vec!["x".into()],
            batch_inputs: Vec::new(),
            scatter: vec![ScatterOutput {
                output: "y".into(),
                source: "x".into(),
            }],
        };
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let sums = f32s("sums", &[3, 1], &[3.0, 7.0, 12.0]);
        let outputs = vec![f32s("y", &[12], &values), sums];
        let pieces = layout.split(outputs, &[1, 1, 1], &refs).unwrap();
        assert_eq!(pieces[1][0].shape, [1, 4]);
        assert_eq!(numbers(&pieces[1][0]), [3.0, 4.0, 5.0, 6.0]);
        assert_eq!(pieces[2][0].shape, [1, 5]);
        // The other outputs split along the batch dimension as usual.
        assert_eq!(pieces[2][1].shape, [1, 1]);
        assert_eq!(numbers(&pieces[2][1]), [12.0]);
        // One request: the scatter output still takes the request's shape.
        let pieces = layout
            .split(vec![f32s("y", &[3], &[1.0, 2.0, 3.0])], &[1], &refs[..1])
            .unwrap();
        assert_eq!(pieces[0][0].shape, [1, 3]);
        let short = layout.split(vec![f32s("y", &[11], &values[..11])], &[1, 1, 1], &refs);
        assert!(short.unwrap_err().contains("needs 12 elements"));
    }
}
