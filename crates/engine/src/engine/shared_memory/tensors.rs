//! Tensors in shared memory, around one request: the three parameters of an input or a
//! requested output read as Triton reads them; an input's bytes copied out of its region before
//! validation; an output's bytes copied into its region after the run, the response then
//! carrying the output's name, datatype and shape but no data.

use super::window::AccessError;
use super::{Region, SharedMemory};
use crate::core::tensor::element_count;
use crate::core::{Error, InferRequest, InferResponse, ParamValue, Parameters};
use crate::engine::{classification, validate};
use crate::invalid_arg;
use bytes::Bytes;
use std::sync::Arc;

pub const REGION: &str = "shared_memory_region";
pub const BYTE_SIZE: &str = "shared_memory_byte_size";
pub const OFFSET: &str = "shared_memory_offset";

/// A tensor's window of a registered region, checked to lie inside it.
#[derive(Debug)]
pub struct Slot {
    region: Arc<Region>,
    offset: usize,
    byte_size: usize,
}

/// The outputs of one request that go to shared memory, by output name.
pub type OutputSlots = Vec<(String, Slot)>;

/// The slot a tensor's parameters name, if any.
///
/// # Errors
/// INVALID_ARGUMENT with Triton's texts for parameters of the wrong type or given without a
/// region (or a region without a byte size), and for windows outside the region; NOT_FOUND for a
/// region that is not registered.
fn slot(
    memory: &SharedMemory,
    tensor: &str,
    parameters: &Parameters,
) -> Result<Option<Slot>, Error> {
    let region = match parameters.get(REGION) {
        None => None,
        Some(ParamValue::String(name)) => Some(name.as_str()),
        Some(_) => {
            return Err(invalid_arg!(
                "invalid value type for '{REGION}' parameter for tensor '{tensor}', expected \
                 string_param."
            ))
        }
    };
    let number = |key: &str| -> Result<Option<u64>, Error> {
        let Some(value) = parameters.get(key) else {
            return Ok(None);
        };
        if region.is_none() {
            return Err(invalid_arg!(
                "'{key}' can not be specified without '{REGION}' parameter for tensor '{tensor}'"
            ));
        }
        match value {
            ParamValue::Int64(n) => u64::try_from(*n).map(Some).map_err(|_| {
                invalid_arg!("invalid value {n} for '{key}' parameter for tensor '{tensor}'")
            }),
            ParamValue::Uint64(n) => Ok(Some(*n)),
            _ => Err(invalid_arg!(
                "invalid value type for '{key}' parameter for tensor '{tensor}', expected \
                 int64_param."
            )),
        }
    };
    let offset = number(OFFSET)?.unwrap_or(0);
    let byte_size = number(BYTE_SIZE)?;
    let Some(name) = region else {
        return Ok(None);
    };
    let Some(byte_size) = byte_size else {
        return Err(invalid_arg!(
            "'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{tensor}'"
        ));
    };
    let region = memory.region(name)?;
    let size = region.window.len() as u64;
    if offset >= size {
        return Err(invalid_arg!(
            "Invalid offset for shared memory region: '{name}'"
        ));
    }
    if byte_size > size - offset {
        return Err(invalid_arg!(
            "Invalid offset + byte size for shared memory region: '{name}'"
        ));
    }
    // Both fit in the window, whose length is a `usize`.
    Ok(Some(Slot {
        region,
        offset: offset as usize,
        byte_size: byte_size as usize,
    }))
}

/// Fills the data of every input that names a region, from that region, and removes the
/// shared-memory parameters. A fixed-size input whose byte size does not fit its shape fails
/// here, before anything is copied.
///
/// # Errors
/// As [`slot`]; INVALID_ARGUMENT for a byte size that does not match the input's shape.
pub fn read_inputs(
    memory: &SharedMemory,
    model: &str,
    prefix: &str,
    request: &mut InferRequest,
) -> Result<(), Error> {
    for input in &mut request.inputs {
        let Some(slot) = slot(memory, &input.name, &input.parameters)? else {
            continue;
        };
        let count = element_count(&input.shape);
        if let (Some(size), Ok(count)) = (input.datatype.element_size(), &count) {
            let expected = *count as u64 * size as u64;
            if expected != slot.byte_size as u64 {
                return Err(validate::byte_size_mismatch(
                    prefix,
                    &input.name,
                    model,
                    expected,
                    slot.byte_size as u64,
                ));
            }
        }
        // A shape that overflows is left to validation, with no data read for it.
        if count.is_ok() {
            let data = slot
                .region
                .window
                .read(slot.offset, slot.byte_size)
                .map_err(|e| access_error(e, &slot.region))?;
            input.data = Bytes::from(data);
        }
        for key in [REGION, BYTE_SIZE, OFFSET] {
            input.parameters.shift_remove(key);
        }
    }
    Ok(())
}

/// The requested outputs that go to shared memory, checked before the model runs.
///
/// # Errors
/// As [`slot`]; INVALID_ARGUMENT for an output that asks for classification as well.
pub fn output_slots(memory: &SharedMemory, request: &InferRequest) -> Result<OutputSlots, Error> {
    let mut slots = Vec::new();
    for output in &request.outputs {
        if let Some(slot) = slot(memory, &output.name, &output.parameters)? {
            if output
                .parameters
                .contains_key(classification::CLASSIFICATION)
            {
                return Err(invalid_arg!(
                    "output can't set both '{REGION}' and 'classification'"
                ));
            }
            slots.push((output.name.clone(), slot));
        }
    }
    Ok(slots)
}

/// Copies each output that has a slot into it; the response keeps the output's name, datatype
/// and shape, with no data. Its only parameter, the region's name, marks it for the protocols,
/// which write such an output without data and without parameters, as Triton does.
///
/// # Errors
/// INTERNAL (Triton's code and text) when an output is larger than its slot.
pub fn write_outputs(slots: &OutputSlots, response: &mut InferResponse) -> Result<(), Error> {
    for output in &mut response.outputs {
        let Some((_, slot)) = slots.iter().find(|(name, _)| *name == output.name) else {
            continue;
        };
        if output.data.len() > slot.byte_size {
            return Err(Error::Internal(format!(
                "shared memory size specified with the request for output '{}' ({} bytes) should \
                 be at least {} bytes to hold the results",
                output.name,
                slot.byte_size,
                output.data.len()
            )));
        }
        slot.region
            .window
            .write(slot.offset, &output.data)
            .map_err(|e| access_error(e, &slot.region))?;
        output.parameters = Parameters::from([(
            REGION.to_string(),
            ParamValue::String(slot.region.name.clone()),
        )]);
        output.data = Bytes::new();
    }
    Ok(())
}

/// A failed copy: a client that shrank its object under the region is told so.
fn access_error(error: AccessError, region: &Region) -> Error {
    match error {
        AccessError::Shrunk => invalid_arg!(
            "shared memory region '{}' is smaller than when it was registered (key '{}')",
            region.name,
            region.key
        ),
        AccessError::OutOfWindow => Error::Internal(format!(
            "a tensor's range fell outside shared memory region '{}'",
            region.name
        )),
        AccessError::Io(why) => Error::Internal(format!(
            "failed to access shared memory region '{}': {why}",
            region.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::window::tests::Object;
    use super::*;
    use crate::core::{DataType, RequestedOutput, Tensor};

    fn params(pairs: &[(&str, ParamValue)]) -> Parameters {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn text(value: &str) -> ParamValue {
        ParamValue::String(value.into())
    }

    fn setup() -> (Object, SharedMemory) {
        let object = Object::new("tensors", 4096);
        let memory = SharedMemory::new(super::super::ShmPolicy::allowing());
        memory.register("r", &object.key, 0, 64).unwrap();
        (object, memory)
    }

    fn message(result: Result<Option<Slot>, Error>) -> String {
        result.unwrap_err().message().to_string()
    }

    #[test]
    fn parameters_are_read_as_triton_reads_them() {
        let (_object, memory) = setup();
        assert!(slot(&memory, "x", &Parameters::new()).unwrap().is_none());
        let found = slot(
            &memory,
            "x",
            &params(&[
                (REGION, text("r")),
                (BYTE_SIZE, ParamValue::Int64(16)),
                (OFFSET, ParamValue::Uint64(8)),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((found.offset, found.byte_size), (8, 16));

        let cases = [
            (
                params(&[(REGION, ParamValue::Int64(1)), (BYTE_SIZE, ParamValue::Int64(4))]),
                "invalid value type for 'shared_memory_region' parameter for tensor 'x', expected string_param.",
            ),
            (
                params(&[(BYTE_SIZE, ParamValue::Int64(4))]),
                "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'x'",
            ),
            (
                params(&[(OFFSET, ParamValue::Int64(4))]),
                "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'x'",
            ),
            (
                params(&[(REGION, text("r"))]),
                "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'x'",
            ),
            (
                params(&[(REGION, text("r")), (BYTE_SIZE, text("4"))]),
                "invalid value type for 'shared_memory_byte_size' parameter for tensor 'x', expected int64_param.",
            ),
            (
                params(&[(REGION, text("r")), (BYTE_SIZE, ParamValue::Int64(-4))]),
                "invalid value -4 for 'shared_memory_byte_size' parameter for tensor 'x'",
            ),
            (
                params(&[(REGION, text("r")), (BYTE_SIZE, ParamValue::Int64(4)), (OFFSET, ParamValue::Int64(64))]),
                "Invalid offset for shared memory region: 'r'",
            ),
            (
                params(&[(REGION, text("r")), (BYTE_SIZE, ParamValue::Int64(60)), (OFFSET, ParamValue::Int64(8))]),
                "Invalid offset + byte size for shared memory region: 'r'",
            ),
            (
                params(&[(REGION, text("r")), (BYTE_SIZE, ParamValue::Uint64(u64::MAX)), (OFFSET, ParamValue::Int64(1))]),
                "Invalid offset + byte size for shared memory region: 'r'",
            ),
            (
                params(&[(REGION, text("gone")), (BYTE_SIZE, ParamValue::Int64(4))]),
                "Unable to find shared memory region: 'gone'",
            ),
        ];
        for (parameters, expected) in cases {
            assert_eq!(message(slot(&memory, "x", &parameters)), expected);
        }
    }

    fn fp32_input(count: i64, byte_size: i64, offset: i64) -> Tensor {
        let mut input = Tensor::new("x", DataType::Fp32, vec![count], Bytes::new());
        input.parameters = params(&[
            (REGION, text("r")),
            (BYTE_SIZE, ParamValue::Int64(byte_size)),
            (OFFSET, ParamValue::Int64(offset)),
        ]);
        input
    }

    #[test]
    fn inputs_are_copied_out_of_their_region() {
        let (object, memory) = setup();
        let writer = super::super::window::Window::open(&object.key, 0, 64, None).unwrap();
        let values: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        writer.write(8, &values).unwrap();
        let mut request = InferRequest {
            inputs: vec![fp32_input(2, 8, 8)],
            ..Default::default()
        };
        read_inputs(&memory, "m", "", &mut request).unwrap();
        assert_eq!(request.inputs[0].data, values);
        assert!(request.inputs[0].parameters.is_empty());
        // The copy is the request's own: later writes by the client do not change it.
        writer.write(8, &[0; 8]).unwrap();
        assert_eq!(request.inputs[0].data, values);

        let mut wrong = InferRequest {
            inputs: vec![fp32_input(2, 12, 0)],
            ..Default::default()
        };
        assert_eq!(
            read_inputs(&memory, "m", "", &mut wrong).unwrap_err(),
            invalid_arg!(
                "input byte size mismatch for input 'x' for model 'm'. Expected 8, got 12"
            )
        );
    }

    #[test]
    fn outputs_go_to_their_region_and_leave_no_data_behind() {
        let (object, memory) = setup();
        let output = |name: &str, extra: &[(&str, ParamValue)]| {
            let mut parameters = params(&[(REGION, text("r")), (BYTE_SIZE, ParamValue::Int64(8))]);
            parameters.extend(params(extra));
            RequestedOutput {
                name: name.into(),
                parameters,
            }
        };
        let request = InferRequest {
            outputs: vec![output("y", &[(OFFSET, ParamValue::Int64(16))])],
            ..Default::default()
        };
        let slots = output_slots(&memory, &request).unwrap();
        let mut response = InferResponse {
            outputs: vec![
                Tensor::new(
                    "y",
                    DataType::Uint8,
                    vec![4],
                    Bytes::from_static(&[5, 6, 7, 8]),
                ),
                Tensor::new("z", DataType::Uint8, vec![1], Bytes::from_static(&[9])),
            ],
            ..Default::default()
        };
        write_outputs(&slots, &mut response).unwrap();
        let reader = super::super::window::Window::open(&object.key, 0, 64, None).unwrap();
        assert_eq!(reader.read(16, 4).unwrap(), [5, 6, 7, 8]);
        assert!(response.outputs[0].data.is_empty());
        assert_eq!(
            response.outputs[0].parameters,
            params(&[(REGION, text("r"))])
        );
        assert_eq!(response.outputs[1].data, [9].as_slice());

        let mut large = InferResponse {
            outputs: vec![Tensor::new(
                "y",
                DataType::Uint8,
                vec![9],
                Bytes::from(vec![1; 9]),
            )],
            ..Default::default()
        };
        assert_eq!(
            write_outputs(&slots, &mut large).unwrap_err(),
            Error::Internal(
                "shared memory size specified with the request for output 'y' (8 bytes) should \
                 be at least 9 bytes to hold the results"
                    .into()
            )
        );

        let both = InferRequest {
            outputs: vec![output("y", &[("classification", ParamValue::Int64(1))])],
            ..Default::default()
        };
        assert_eq!(
            output_slots(&memory, &both).unwrap_err(),
            invalid_arg!("output can't set both 'shared_memory_region' and 'classification'")
        );
    }
}
