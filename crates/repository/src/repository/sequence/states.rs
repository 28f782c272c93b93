//! A stateful model's implicit states as its config declares them, checked: each state's shape,
//! type and size, and its initial data.

use crate::core::tensor::element_count;
use crate::core::DataType;
use crate::proto::inference::model_sequence_batching::{
    initial_state::StateData, State as StateConfig,
};
use crate::repository::config::datatype_from_config;
use crate::repository::store::contained;
use bytes::Bytes;
use std::path::Path;

/// Largest state one sequence keeps (one batch row).
const MAX_STATE_BYTES: usize = 64 << 20;

/// One implicit state: `output` of a request becomes `input` of the next.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct State {
    pub(super) input: String,
    pub(super) output: String,
    pub(super) datatype: DataType,
    pub(super) dims: Vec<i64>,
    /// One row of the state at a sequence's start: zeros, or an `initial_state` file's data.
    pub(super) initial: Bytes,
}

/// One state of a stateful model's sequence batching, checked: a fixed shape and a fixed-size
/// type, at most [`MAX_STATE_BYTES`], with its initial state (zeros unless a data file in
/// `model_dir/initial_state/` gives it).
pub(super) fn state_spec(
    model: &str,
    model_dir: &Path,
    state: &StateConfig,
) -> Result<State, String> {
    let datatype = datatype_from_config(state.data_type).ok_or_else(|| {
        format!(
            "sequence batching of model '{model}': state '{}' has no valid data_type",
            state.input_name
        )
    })?;
    if state.dims.iter().any(|&d| d < 1) || datatype == DataType::Bytes {
        return Err(format!(
            "sequence batching of model '{model}': state '{}' must have a fixed shape and a \
             fixed-size type",
            state.input_name
        ));
    }
    let bytes = element_count(&state.dims)
        .ok()
        .and_then(|count| count.checked_mul(datatype.element_size().unwrap_or(1)))
        .filter(|&bytes| bytes <= MAX_STATE_BYTES)
        .ok_or_else(|| {
            format!(
                "sequence batching of model '{model}': state '{}' is larger than the \
                 {MAX_STATE_BYTES} bytes a state may hold",
                state.input_name
            )
        })?;
    let initial = initial_state(model, model_dir, state, bytes)?;
    Ok(State {
        input: state.input_name.clone(),
        output: state.output_name.clone(),
        datatype,
        dims: state.dims.clone(),
        initial: initial.unwrap_or_else(|| Bytes::from(vec![0u8; bytes])),
    })
}

/// A state's initial data from its `initial_state`'s data file, which must hold its `bytes`;
/// `None` for zeros.
fn initial_state(
    model: &str,
    model_dir: &Path,
    state: &StateConfig,
    bytes: usize,
) -> Result<Option<Bytes>, String> {
    Ok(match state.initial_state.as_slice() {
        [] => None,
        [initial] => match &initial.state_data {
            Some(StateData::ZeroData(_)) | None => None,
            Some(StateData::DataFile(file)) => {
                let path = contained(&model_dir.join("initial_state"), file).map_err(|e| {
                    format!(
                        "sequence batching of model '{model}': state '{}': data_file {e}",
                        state.input_name
                    )
                })?;
                let data = std::fs::read(&path).map_err(|e| {
                    format!(
                        "sequence batching of model '{model}': cannot read {}: {e}",
                        path.display()
                    )
                })?;
                if data.len() != bytes {
                    return Err(format!(
                        "sequence batching of model '{model}': {} holds {} bytes, state \
                         '{}' takes {bytes}",
                        path.display(),
                        data.len(),
                        state.input_name
                    ));
                }
                Some(Bytes::from(data))
            }
        },
        _ => {
            return Err(format!(
                "sequence batching of model '{model}': state '{}' has more than one \
                 initial_state",
                state.input_name
            ))
        }
    })
}
