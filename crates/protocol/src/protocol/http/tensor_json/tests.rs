use super::*;

fn ok(datatype: DataType, count: usize, src: &str) -> Vec<u8> {
    decode("x", datatype, count, src.as_bytes())
        .unwrap()
        .to_vec()
}

fn err(datatype: DataType, count: usize, src: &str) -> String {
    decode("x", datatype, count, src.as_bytes())
        .unwrap_err()
        .message()
        .to_string()
}

fn encoded(datatype: DataType, data: Vec<u8>) -> Result<String, Error> {
    let tensor = Tensor::new("y", datatype, vec![], Bytes::from(data));
    let mut out = Vec::new();
    encode(&mut out, &tensor).map(|()| String::from_utf8(out).unwrap())
}

#[test]
fn every_json_datatype_decodes() {
    assert_eq!(ok(DataType::Bool, 2, "[true, false]"), [1, 0]);
    assert_eq!(ok(DataType::Uint8, 2, "[0, 255]"), [0, 255]);
    assert_eq!(ok(DataType::Uint16, 1, "[258]"), [2, 1]);
    assert_eq!(ok(DataType::Uint32, 1, "[4294967295]"), [255; 4]);
    assert_eq!(ok(DataType::Uint64, 1, "[18446744073709551615]"), [255; 8]);
    assert_eq!(ok(DataType::Int8, 2, "[-128, 127]"), [128, 127]);
    assert_eq!(ok(DataType::Int16, 1, "[-2]"), [254, 255]);
    assert_eq!(ok(DataType::Int32, 1, "[-1]"), [255; 4]);
    assert_eq!(
        ok(DataType::Int64, 1, "[-9223372036854775808]"),
        i64::MIN.to_le_bytes()
    );
    assert_eq!(
        ok(DataType::Fp32, 2, "[1, 0.5]"),
        [0, 0, 128, 63, 0, 0, 0, 63]
    );
    assert_eq!(ok(DataType::Fp64, 1, "[-2.5]"), (-2.5f64).to_le_bytes());
    assert_eq!(
        ok(DataType::Bytes, 2, r#"["ab", "\u00e9"]"#),
        [2, 0, 0, 0, b'a', b'b', 2, 0, 0, 0, 0xc3, 0xa9]
    );
}

#[test]
fn nested_data_is_flattened_row_major() {
    let flat = ok(DataType::Int32, 4, "[1, 2, 3, 4]");
    assert_eq!(ok(DataType::Int32, 4, "[[1, 2], [3, 4]]"), flat);
    assert_eq!(ok(DataType::Int32, 4, "[[[1]], [[2], [3, 4]]]"), flat);
    assert_eq!(ok(DataType::Int32, 0, "[]"), Vec::<u8>::new());
    assert_eq!(ok(DataType::Int32, 0, "[[], []]"), Vec::<u8>::new());
}

#[test]
fn nan_and_infinity_tokens_for_floats() {
    let bytes = ok(DataType::Fp32, 3, "[NaN, Infinity, -Infinity]");
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(values[0].is_nan());
    assert_eq!(&values[1..], &[f32::INFINITY, f32::NEG_INFINITY]);
    let bytes = ok(DataType::Fp64, 1, "[-Infinity]");
    assert_eq!(
        f64::from_le_bytes(bytes.try_into().unwrap()),
        f64::NEG_INFINITY
    );
}

#[test]
fn element_count_must_match_the_shape() {
    let message = err(DataType::Fp32, 3, "[1, 2]");
    assert!(message
        .starts_with("Unable to parse 'data': Shape does not match true shape of 'data' field"));
    assert!(err(DataType::Fp32, 1, "[1, 2]").contains("Shape does not match"));
    assert!(err(DataType::Bytes, 1, r#"["a", "b"]"#).contains("Shape does not match"));
}

#[test]
fn a_huge_declared_shape_allocates_nothing_big() {
    // The shape claims 2^50 elements; the text holds one. Failing must be quick and small.
    let message = err(DataType::Fp64, 1 << 50, "[1]");
    assert!(message.contains("Shape does not match"));
}

#[test]
fn wrong_kinds_and_ranges_are_rejected() {
    assert!(
        err(DataType::Bool, 1, "[1]").contains("expected true or false for BOOL input 'x', got 1")
    );
    assert!(err(DataType::Uint8, 1, "[256]").contains("unsigned integer in range"));
    assert!(err(DataType::Uint8, 1, "[-1]").contains("got -1"));
    assert!(err(DataType::Uint32, 1, "[1.5]").contains("got 1.5"));
    assert!(err(DataType::Int8, 1, "[128]").contains("signed integer in range"));
    assert!(err(DataType::Int64, 1, "[9223372036854775808]").contains("signed integer"));
    assert!(err(DataType::Int32, 1, "[\"1\"]").contains("got a string"));
    assert!(
        err(DataType::Fp32, 1, "[null]").contains("expected a number for FP32 input 'x', got null")
    );
    assert!(err(DataType::Fp64, 1, "[true]").contains("got true"));
    assert!(err(DataType::Bytes, 1, "[1]").contains("expected a string"));
}

#[test]
fn half_precision_needs_binary_data() {
    for datatype in [DataType::Fp16, DataType::Bf16] {
        assert_eq!(
            err(datatype, 1, "[1]"),
            format!(
                "receiving {datatype} data via JSON is not supported. Please use the binary data format for input x"
            )
        );
    }
}

#[test]
fn syntax_errors_name_the_input() {
    assert!(err(DataType::Int32, 1, "5").contains("Unable to parse 'data' for input 'x'"));
    assert!(err(DataType::Int32, 1, r#"[{"a": 1}]"#).contains("objects are not allowed"));
}

#[test]
fn encode_every_json_datatype_flat() {
    assert_eq!(
        encoded(DataType::Bool, vec![1, 0, 2]).unwrap(),
        "[true,false,true]"
    );
    assert_eq!(encoded(DataType::Uint8, vec![255]).unwrap(), "[255]");
    assert_eq!(encoded(DataType::Uint16, vec![2, 1]).unwrap(), "[258]");
    assert_eq!(
        encoded(DataType::Uint32, u32::MAX.to_le_bytes().to_vec()).unwrap(),
        "[4294967295]"
    );
    assert_eq!(
        encoded(DataType::Uint64, u64::MAX.to_le_bytes().to_vec()).unwrap(),
        format!("[{}]", u64::MAX)
    );
    assert_eq!(encoded(DataType::Int8, vec![0xff, 1]).unwrap(), "[-1,1]");
    assert_eq!(encoded(DataType::Int16, vec![0xfe, 0xff]).unwrap(), "[-2]");
    assert_eq!(
        encoded(DataType::Int32, (-7i32).to_le_bytes().to_vec()).unwrap(),
        "[-7]"
    );
    assert_eq!(
        encoded(DataType::Int64, i64::MIN.to_le_bytes().to_vec()).unwrap(),
        format!("[{}]", i64::MIN)
    );
    let floats: Vec<u8> = [0.1f32, f32::NAN, f32::INFINITY]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(
        encoded(DataType::Fp32, floats).unwrap(),
        "[0.1,NaN,Infinity]"
    );
    assert_eq!(
        encoded(DataType::Fp64, f64::NEG_INFINITY.to_le_bytes().to_vec()).unwrap(),
        "[-Infinity]"
    );
    // BYTES as Triton writes them: escaped where JSON needs it, any other byte as it is.
    let strings = crate::core::tensor::frame_bytes([&b"a\"b"[..], b"", b"\xff\x00"]);
    let tensor = Tensor::new("y", DataType::Bytes, vec![3], strings);
    let mut out = Vec::new();
    encode(&mut out, &tensor).unwrap();
    assert_eq!(out, b"[\"a\\\"b\",\"\",\"\xff\\u0000\"]");
    assert_eq!(encoded(DataType::Fp32, vec![]).unwrap(), "[]");
}

#[test]
fn encode_refuses_half_precision_and_malformed_data() {
    assert!(matches!(
        encoded(DataType::Fp16, vec![0, 0]),
        Err(Error::InvalidArgument(m)) if m.contains("sending FP16 data via JSON is not supported")
    ));
    assert!(matches!(
        encoded(DataType::Bf16, vec![0, 0]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        encoded(DataType::Fp32, vec![0; 3]),
        Err(Error::Internal(_))
    ));
    assert!(matches!(
        encoded(DataType::Bytes, vec![9, 0, 0, 0]),
        Err(Error::Internal(_))
    ));
}

#[test]
fn round_trip_through_json() {
    let values: Vec<f32> = vec![0.1, -3.25e-20, 1.0e30, f32::MIN_POSITIVE];
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let text = encoded(DataType::Fp32, raw.clone()).unwrap();
    assert_eq!(ok(DataType::Fp32, values.len(), &text), raw);
    let ints: Vec<u8> = [i64::MIN, -1, 0, i64::MAX]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let text = encoded(DataType::Int64, ints.clone()).unwrap();
    assert_eq!(ok(DataType::Int64, 4, &text), ints);
}
