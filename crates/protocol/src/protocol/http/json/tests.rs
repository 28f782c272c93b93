use super::*;

fn doc(text: &str) -> Value<'_> {
    parse(text.as_bytes(), None).unwrap()
}

fn error(text: &str) -> String {
    parse(text.as_bytes(), None).unwrap_err().to_string()
}

#[test]
fn values_of_every_kind() {
    let v = doc(r#" {"a": [1, -2, 3.5, true, false, null, "s"], "b": {}} "#);
    let a = v.get("a").unwrap().as_array().unwrap();
    assert_eq!(a[0], Value::Number(Number::Unsigned(1)));
    assert_eq!(a[1], Value::Number(Number::Negative(-2)));
    assert_eq!(a[2], Value::Number(Number::Float(3.5)));
    assert_eq!(a[3], Value::Bool(true));
    assert_eq!(a[4].as_bool(), Some(false));
    assert_eq!(a[5], Value::Null);
    assert_eq!(a[6].as_str(), Some("s"));
    assert_eq!(v.get("b").unwrap().as_object().unwrap().len(), 0);
    assert!(v.get("c").is_none());
    assert_eq!(doc("[]"), Value::Array(vec![]));
}

#[test]
fn first_duplicate_key_wins() {
    let v = doc(r#"{"k": 1, "k": 2}"#);
    assert_eq!(v.get("k").unwrap().as_u64(), Some(1));
}

#[test]
fn integers_stay_exact() {
    let v = doc("[18446744073709551615, -9223372036854775808, 18446744073709551616, -0]");
    let a = v.as_array().unwrap();
    assert_eq!(a[0].as_u64(), Some(u64::MAX));
    assert_eq!(a[1], Value::Number(Number::Negative(i64::MIN)));
    assert_eq!(a[2], Value::Number(Number::Float(18446744073709551616.0)));
    assert_eq!(a[3], Value::Number(Number::Negative(0)));
    assert_eq!(Number::Unsigned(u64::MAX).as_i64(), None);
    assert_eq!(Number::Unsigned(5).as_i64(), Some(5));
    assert_eq!(Number::Float(1.0).as_i64(), None);
}

#[test]
fn nan_and_infinity_tokens() {
    let v = doc("[NaN, -NaN, Infinity, -Infinity, Inf, -Inf, 1e400]");
    let values: Vec<f64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| match x {
            Value::Number(n) => n.as_f64(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(values[0].is_nan() && values[1].is_nan());
    assert_eq!(
        &values[2..],
        &[
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY
        ]
    );
    for bad in ["[nan]", "[Infin]", "[NaNa]", "[-]", "[+1]", "[Infinityy]"] {
        assert!(parse(bad.as_bytes(), None).is_err(), "{bad}");
    }
}

#[test]
fn number_grammar_is_strict() {
    for bad in [
        "[01]", "[1.]", "[.5]", "[1e]", "[1e+]", "[0x10]", "[- 1]", "[nan]", "[Infin]", "[-]",
    ] {
        let eager = parse(bad.as_bytes(), None).unwrap_err();
        // Tensor data is skipped first and converted later: the skip checks the same grammar
        // and fails at the same place with the same message.
        let wrapped = format!(r#"{{"data": {bad}}}"#);
        let skipped = parse(wrapped.as_bytes(), Some("data")).unwrap_err();
        assert_eq!(skipped.message, eager.message, "{bad}");
        assert_eq!(skipped.offset, eager.offset + r#"{"data": "#.len(), "{bad}");
    }
    assert_eq!(
        doc("[0, 0.5, 1E3, 2e-2]"),
        Value::Array(vec![
            Value::Number(Number::Unsigned(0)),
            Value::Number(Number::Float(0.5)),
            Value::Number(Number::Float(1000.0)),
            Value::Number(Number::Float(0.02)),
        ])
    );
}

/// A reproducible stream of pseudo-random words (xorshift64).
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The parser's own conversions (exact integers, Clinger's fast path, the 128-bit product and
/// reciprocal) must agree bit for bit with the standard library's correctly rounded one, on their
/// paths and around their edges.
#[test]
fn numbers_convert_exactly_as_the_standard_parser() {
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    let mut texts: Vec<String> = [
        "0",
        "-0",
        "0.0",
        "-0.0",
        "1",
        "9007199254740992",
        "9007199254740993",
        "0.1",
        "1e22",
        "1e23",
        "1e-22",
        "1e-23",
        "123456789012345678e-5",
        "1234567890123456789e-3",
        "12345678901234567890e-3",
        "0.30000000000000004",
        "4.9e-324",
        "1.7976931348623157e308",
        "2.2250738585072014e-308",
        "-1e0",
        "1E+2",
        "0.000000000000000000001234",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "1e1000000000000",
        // Halfway between two doubles, and a hair above or below it.
        "9007199254740993.001",
        "9007199254740992.999",
        "9007199254740995.0001",
        "9007199254740993.0000",
        "9007199254740993e0",
        "9007199254740995e1",
        "1e-27",
        "3e-28",
        // The division's truncated quotient sits exactly halfway: its remainder decides.
        "7363203552012.826661",
        "0.000024608926028991214",
        "0.0000090146988899199150",
        "0.000000000541882289294974846",
        "0.00005963420285600974942",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    for _ in 0..20_000 {
        let bits = next();
        let f32_value = f32::from_bits(bits as u32);
        let f64_value = f64::from_bits(bits);
        for value in [f64::from(f32_value), f64_value] {
            if value.is_finite() {
                texts.push(format!("{value}"));
                texts.push(format!("{value:e}"));
            }
        }
        texts.push(format!("{}", f32_value / 1e30));
        // What clients send most: floats in everyday ranges, as f32 widened or as f64.
        texts.push(format!(
            "{}",
            f64::from((bits >> 40) as f32 / (1u64 << 24) as f32)
        ));
        texts.push(format!(
            "{}",
            (bits >> 11) as f64 / (1u64 << 53) as f64 * 1000.0
        ));
        let digits = next() % 10_u64.pow((next() % 20) as u32).max(1);
        let exponent = (next() % 60) as i64 - 30;
        texts.push(format!("{digits}e{exponent}"));
        texts.push(format!("-{digits}.{}E{exponent}", next() % 1000));
    }
    for text in &texts {
        let parsed = match doc(text) {
            Value::Number(n) => n,
            other => panic!("{text}: {other:?}"),
        };
        let integer = !text.contains(['.', 'e', 'E']);
        let expected = match (integer, text.parse::<u64>(), text.parse::<i64>()) {
            (true, Ok(v), _) if !text.starts_with('-') => Number::Unsigned(v),
            (true, _, Ok(v)) if text.starts_with('-') => Number::Negative(v),
            _ => Number::Float(text.parse::<f64>().unwrap()),
        };
        match (parsed, expected) {
            (Number::Float(a), Number::Float(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{text}"),
            (a, b) => assert_eq!(a, b, "{text}"),
        }
    }
}

/// The 128-bit reciprocal division against the standard parser on every divisor it serves: random
/// mantissas of every length, and the quotients that fall exactly halfway between two doubles
/// (only 10^1..10^4 can produce them with a 64-bit mantissa), with their neighbours.
#[test]
fn division_by_powers_of_ten_rounds_exactly() {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    let mut cases: Vec<(u64, u32)> = Vec::new();
    for k in 1..=27 {
        for _ in 0..3_000 {
            let mantissa = next() >> (next() % 64);
            cases.push((mantissa.max(1), k));
        }
        cases.push((u64::MAX, k));
        cases.push((1, k));
    }
    for k in 1..=4u32 {
        for _ in 0..500 {
            // An odd 54-bit integer over 2^t is halfway between two doubles; times 10^k it is an
            // integer for t ≤ k.
            let odd = (1u64 << 53) + (next() % (1 << 52)) * 2 + 1;
            for t in 1..=k {
                if let Some(mantissa) = odd
                    .checked_mul(5u64.pow(k))
                    .and_then(|m| m.checked_mul(1 << (k - t)))
                {
                    cases.extend([(mantissa - 1, k), (mantissa, k), (mantissa + 1, k)]);
                }
            }
        }
    }
    for (mantissa, k) in cases {
        let expected: f64 = format!("{mantissa}e-{k}").parse().unwrap();
        let got = reader::divide_by_power_of_ten(mantissa, k);
        assert_eq!(got.to_bits(), expected.to_bits(), "{mantissa}e-{k}");
    }
}

#[test]
fn strings_unescape() {
    let v = doc(r#"["a\"b\\c\/d\b\f\n\r\t", "\u00e9\u2603", "\ud83d\ude00", "héllo"]"#);
    let a = v.as_array().unwrap();
    assert_eq!(a[0].as_str(), Some("a\"b\\c/d\u{8}\u{c}\n\r\t"));
    assert_eq!(a[1].as_str(), Some("é☃"));
    assert_eq!(a[2].as_str(), Some("😀"));
    assert_eq!(a[3].as_str(), Some("héllo"));
    for bad in [
        r#"["\ud83d"]"#,
        r#"["\ude00"]"#,
        r#"["\ud83d\u0041"]"#,
        r#"["\x"]"#,
        r#"["\u12"]"#,
        "[\"tab\there\"]",
        r#"["open"#,
    ] {
        assert!(parse(bad.as_bytes(), None).is_err(), "{bad}");
    }
    assert!(parse(b"[\"\xff\"]", None).is_err(), "strings must be UTF-8");
}

/// Strings and member names without escapes are borrowed from the source (no allocation per
/// key of every request header); escaped ones are unescaped into their own.
#[test]
fn plain_strings_are_borrowed() {
    use std::borrow::Cow;
    let v = doc(r#"{"name": "INPUT0", "n\u0061me": "a\nb", "": ""}"#);
    let members = v.as_object().unwrap();
    assert!(matches!(&members[0].0, Cow::Borrowed("name")));
    assert!(matches!(
        &members[0].1,
        Value::String(Cow::Borrowed("INPUT0"))
    ));
    assert!(matches!(&members[1].0, Cow::Owned(k) if k == "name"));
    assert!(matches!(&members[1].1, Value::String(Cow::Owned(s)) if s == "a\nb"));
    assert!(matches!(
        &members[2],
        (Cow::Borrowed(""), Value::String(Cow::Borrowed("")))
    ));
    // Invalid UTF-8 is refused at the same offset on either path.
    assert_eq!(
        parse(b"[\"\xff\"]", None).unwrap_err().offset,
        parse(b"[\"\xff\\n\"]", None).unwrap_err().offset - 2
    );
}

#[test]
fn structural_errors_have_offsets() {
    assert_eq!(error(""), "The document is empty. at 0");
    assert_eq!(error("   "), "The document is empty. at 3");
    assert!(error("{} {}").starts_with("The document root must not be followed"));
    assert!(error("[1 2]").starts_with("Missing a comma or ']'"));
    assert!(error(r#"{"a" 1}"#).starts_with("Missing a colon"));
    assert!(error(r#"{"a": 1,}"#).starts_with("Missing a name"));
    assert!(error("[1,]").starts_with("Invalid value."));
    assert!(error("{1: 2}").starts_with("Missing a name"));
    assert!(error("tru").starts_with("Invalid value."));
    assert!(error("[").starts_with("Invalid value."));
    assert!(error("garbage").starts_with("Invalid value."));
}

#[test]
fn any_depth_is_read_without_recursing_past_the_tree() {
    // The tree stops at MAX_DEPTH; below it a value is validated and kept as its text.
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let tree = parse(deep.as_bytes(), None).unwrap();
    let mut at = &tree;
    for _ in 1..MAX_DEPTH {
        at = &at.as_array().unwrap()[0];
    }
    assert_eq!(at.as_array().unwrap(), [Value::Raw(b"[]")]);
    // A million levels: no stack overflow, and rapidjson's words for what is wrong at the bottom.
    let fine = format!("{}1{}", "[".repeat(1_000_000), "]".repeat(1_000_000));
    assert!(parse(fine.as_bytes(), None).is_ok());
    assert!(error(&"[".repeat(1_000_000)).starts_with("Invalid value."));
    let objects = format!("{}1{}", r#"{"a":"#.repeat(200_000), "}".repeat(200_000));
    assert!(parse(objects.as_bytes(), None).is_ok());
    let no_colon = format!("{}{{\"b\" 1}}{}", r#"{"a":"#.repeat(100), "}".repeat(100));
    assert!(error(&no_colon).starts_with("Missing a colon after a name of object member."));
    let unclosed = format!("{}1,{}", "[".repeat(100), "]".repeat(99));
    assert!(error(&unclosed).starts_with("Invalid value."));
    let trailing = format!("{}1{}]", "[".repeat(100), "]".repeat(100));
    assert!(error(&trailing).starts_with("The document root must not be followed by other values."));
}

#[test]
fn lazy_members_are_validated_but_kept_raw() {
    let src = br#"{"data": [[1, 2], [3, NaN]], "x": {"data": "s"}}"#;
    let v = parse(src, Some("data")).unwrap();
    assert_eq!(v.get("data"), Some(&Value::Raw(b"[[1, 2], [3, NaN]]")));
    assert_eq!(v.get("x").unwrap().get("data"), Some(&Value::Raw(b"\"s\"")));
    assert!(parse(br#"{"data": [1, 2,]}"#, Some("data")).is_err());
    assert!(parse(br#"{"data": [{"a" 1}]}"#, Some("data")).is_err());
    let nested = format!("{}1{}", "[".repeat(1000), "]".repeat(1000));
    let deep = format!(r#"{{"data": {nested}}}"#);
    let v = parse(deep.as_bytes(), Some("data")).unwrap();
    assert_eq!(v.get("data"), Some(&Value::Raw(nested.as_bytes())));
}

#[test]
fn data_nests_at_most_tritons_limit() {
    let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let mut seen = 0;
    visit_scalars(nested(MAX_DATA_DEPTH).as_bytes(), |_| {
        seen += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, 1);
    let err = visit_scalars(nested(MAX_DATA_DEPTH + 1).as_bytes(), |_| Ok(())).unwrap_err();
    assert_eq!(err, VisitError::TooDeep);
}

#[test]
fn visiting_flattens_row_major() {
    let mut seen = Vec::new();
    visit_scalars(br#"[[1, -2], [], [[3.5]], "s\u0041", true, null]"#, |s| {
        seen.push(match s {
            Scalar::Number(n) => n.to_string(),
            Scalar::String(b) => String::from_utf8(b.to_vec()).unwrap(),
            Scalar::Bool(b) => b.to_string(),
            Scalar::Null => "null".into(),
        });
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, ["1", "-2", "3.5", "sA", "true", "null"]);
}

#[test]
fn visiting_stops_on_errors() {
    let mut count = 0;
    let err = visit_scalars(b"[1, 2, 3]", |_| {
        count += 1;
        if count == 2 {
            Err("enough".into())
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert_eq!((err, count), (VisitError::Visitor("enough".into()), 2));
    let syntax = |src: &[u8]| match visit_scalars(src, |_| Ok(())) {
        Err(VisitError::Syntax(e)) => e.message,
        other => panic!("{other:?}"),
    };
    assert!(syntax(b"1").contains("must be an array"));
    assert!(syntax(br#"[{"a": 1}]"#).contains("objects are not allowed"));
    assert!(syntax(b"[1 2]").starts_with("Missing a comma"));
    // Strings in data are bytes: no UTF-8 requirement.
    let mut got = Vec::new();
    visit_scalars(b"[\"\xff\"]", |s| {
        if let Scalar::String(b) = s {
            got.extend_from_slice(b);
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(got, [0xff]);
}

#[test]
fn writing_escapes_and_special_numbers() {
    let mut out = Vec::new();
    write_str(&mut out, "a\"b\\c\nd\u{1}é");
    assert_eq!(out, "\"a\\\"b\\\\c\\nd\\u0001é\"".as_bytes());
    let mut out = Vec::new();
    write_bytes_str(&mut out, b"ok\xff\x00\xc3(\"\x08\x0c\x1f\x7f");
    // As Triton's rapidjson writes them: bytes that are not UTF-8 as they are, control
    // characters escaped (short forms, else upper-case hex).
    assert_eq!(out, b"\"ok\xff\\u0000\xc3(\\\"\\b\\f\\u001F\x7f\"");
    let mut out = Vec::new();
    for v in [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.1,
        1e300,
        -2.0,
        1e-7,
    ] {
        write_f64(&mut out, v);
        out.push(b',');
    }
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "NaN,Infinity,-Infinity,0.1,1e300,-2.0,1e-7,"
    );
    let mut out = Vec::new();
    write_f32(&mut out, 0.1);
    out.push(b',');
    write_f32(&mut out, f32::NEG_INFINITY);
    out.push(b',');
    write_number(&mut out, Number::Unsigned(u64::MAX));
    out.push(b',');
    write_number(&mut out, Number::Negative(-3));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        format!("0.1,-Infinity,{},-3", u64::MAX)
    );
}

#[test]
fn written_numbers_parse_back_exactly() {
    let values = [
        0.1f64,
        -1.5e-300,
        123456789.123,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
    ];
    let mut out = b"[".to_vec();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_f64(&mut out, *v);
    }
    out.push(b']');
    let parsed = parse(&out, None).unwrap();
    let back: Vec<f64> = parsed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| match v {
            Value::Number(n) => n.as_f64(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(back, values);
}

#[test]
fn value_count_is_limited_outside_lazy_members() {
    let many = format!("[{}0]", "0,".repeat(MAX_VALUES));
    assert!(error(&many).contains("more than 1000000 values"));
    let few = format!("[{}0]", "0,".repeat(MAX_VALUES - 2));
    assert!(parse(few.as_bytes(), None).is_ok());
    // Raw members are validated without building values, so they do not count.
    let lazy = format!(r#"{{"data": [{}0]}}"#, "0,".repeat(MAX_VALUES));
    assert!(parse(lazy.as_bytes(), Some("data")).is_ok());
}

#[test]
fn eight_digit_words_read_as_numbers() {
    let word = |text: &[u8; 8]| reader::eight_digits(u64::from_le_bytes(*text));
    assert_eq!(word(b"00000000"), Some(0));
    assert_eq!(word(b"12345678"), Some(12_345_678));
    assert_eq!(word(b"99999999"), Some(99_999_999));
    assert_eq!(word(b"10000001"), Some(10_000_001));
    for bad in [
        b"1234567.",
        b"/2345678",
        b":2345678",
        b"1234567a",
        b"1234 678",
        b"\x0012345678"[..8].try_into().unwrap(),
    ] {
        assert_eq!(word(bad), None, "{bad:?}");
    }
    let mut n = 0u64;
    while n < 100_000_000 {
        assert_eq!(
            word(format!("{n:08}").as_bytes().try_into().unwrap()),
            Some(n)
        );
        n += 7_919;
    }
}

#[test]
fn small_documents_report_syntax_errors_in_rapidjsons_words() {
    let message = |src: &[u8]| super::document(src).unwrap_err().message().to_string();
    assert_eq!(
        message(b"garbage"),
        "failed to parse the request JSON buffer: Invalid value. at 0"
    );
    assert_eq!(
        message(b""),
        "failed to parse the request JSON buffer: The document is empty. at 0"
    );
    assert_eq!(
        super::document(br#"{"ready": true}"#).unwrap()["ready"],
        serde_json::json!(true)
    );
}

#[test]
fn small_documents_read_what_serde_json_stops_at() {
    // Past serde_json's 128 levels: read, the deep value as null (Triton reads any depth).
    let deep = format!(
        r#"{{"ready": true, "x": {}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let doc = super::document(deep.as_bytes()).unwrap();
    // "x" is at depth 2: arrays down to MAX_DEPTH, then the rest as null.
    let mut x = serde_json::Value::Null;
    for _ in 2..=MAX_DEPTH {
        x = serde_json::Value::Array(vec![x]);
    }
    assert_eq!(doc, serde_json::json!({"ready": true, "x": x}));
    // Non-finite numbers, which rapidjson reads and serde_json does not, as null.
    let doc = super::document(br#"{"ready": false, "n": NaN}"#).unwrap();
    assert_eq!(doc, serde_json::json!({"ready": false, "n": null}));
}

#[test]
fn bodies_of_many_tiny_values_are_refused_before_they_become_trees() {
    // Commas and openings bound the values from above; strings hide theirs.
    assert!(!super::more_values_than(b"[0,0,0]", 4));
    assert!(super::more_values_than(b"[0,0,0]", 3));
    assert!(!super::more_values_than(br#"{"a":"x,y,[z\",{"}"#, 2));
    let zeros = [b"[".as_slice(), &b"0,".repeat(70_000), b"0]"].concat();
    let refused = super::document(&zeros).unwrap_err();
    assert_eq!(
        refused.message(),
        "failed to parse the request JSON buffer: JSON has more than 65536 values"
    );
    // The array and its 70,001 zeros.
    let value = super::TREE_VALUE_BYTES;
    assert!(super::bounded_value(&zeros, 70_002 * value).is_ok());
    assert!(super::bounded_value(&zeros, 70_002 * value - 1).is_err());
    // The default tree budget holds a generate body of two million values (Triton answers it);
    // 66 MB of `0,` (33 million values, 2 GiB as a tree) is refused before anything is built.
    assert!(super::MAX_TREE_BYTES / value > 3_000_000);
    let many = [b"[".as_slice(), &b"0,".repeat(2_000_000), b"0]"].concat();
    assert!(super::bounded_value(&many, super::MAX_TREE_BYTES).is_ok());
    let bomb = [b"[".as_slice(), &b"0,".repeat(33_000_000), b"0]"].concat();
    let refused = super::bounded_value(&bomb, super::MAX_TREE_BYTES).unwrap_err();
    assert!(refused.contains("values"), "{refused}");
}
