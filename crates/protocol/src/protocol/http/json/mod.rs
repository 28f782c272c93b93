//! A small JSON reader and writer for inference headers.
//!
//! Why not serde_json: Triton (rapidjson with `kParseNanAndInfFlag` / `kWriteNanAndInfFlag`) reads
//! and writes the tokens `NaN`, `Infinity` and `-Infinity`, which serde_json can neither parse nor
//! print; and tensor `data` arrays are kept here as source text ([`Value::Raw`]) and decoded
//! straight into raw tensor bytes by `tensor_json`, instead of first becoming a tree with one node
//! per element. Any depth is read, as Triton reads it (rapidjson's iterative mode since common
//! PR #156), without recursing past [`MAX_DEPTH`], so a hostile body cannot exhaust the stack;
//! tensor `data` nests at most [`MAX_DATA_DEPTH`] levels, Triton's limit. Everything else follows
//! RFC 8259 strictly (no comments, no trailing commas).

mod reader;
#[cfg(test)]
mod tests;
mod write;

use reader::Reader;
use std::borrow::Cow;
use std::fmt;

pub use write::{write_bytes_str, write_f32, write_f64, write_integer, write_number, write_str};

/// Deepest nesting of arrays and objects built into a tree; a deeper value is validated and kept
/// as its source text ([`Value::Raw`]). Request handlers read 4 levels at most.
pub const MAX_DEPTH: usize = 64;

/// Deepest nesting of a tensor's `data` arrays: Triton's limit (server PR #8172,
/// `ReadDataFromJsonHelper` and `JsonBytesArrayByteSize` in src/http_server.cc), which refuses
/// deeper data with "JSON nesting depth exceeds maximum allowed limit (100)".
pub const MAX_DATA_DEPTH: usize = 100;

/// Most values [`parse`] builds (members kept raw do not count). A request header holds a few
/// dozen; the cap keeps a hostile body of tiny values from growing a tree many times its size.
pub const MAX_VALUES: usize = 1_000_000;

/// What one value of a `serde_json` tree costs: the `Value`, and as much again for the `Vec` or
/// map that holds it while it grows.
pub const TREE_VALUE_BYTES: usize = 2 * std::mem::size_of::<serde_json::Value>();

/// The memory a generate, OpenAI or SageMaker inference body may take as a `serde_json` tree
/// ([`bounded_value`]): 512 MiB, 3.7 million values of 144 bytes (a prompt of three million
/// token ids, say), while a body of the 64 MiB that `--http-max-input-size` lets in could hold
/// 33 million (4.7 GB as a tree).
pub const MAX_TREE_BYTES: usize = 512 * 1024 * 1024;

/// Most values a management body (repository, settings, logging, trace, shared memory) may hold
/// when it is read into a `serde_json` tree ([`document`]): they hold a few dozen; a model file
/// sent with a load is one string.
pub const MAX_DOCUMENT_VALUES: usize = 65_536;

/// A JSON number, kept exact: integers stay integers so INT64 and UINT64 data round-trip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer ≥ 0.
    Unsigned(u64),
    /// An integer < 0 (or `-0`).
    Negative(i64),
    /// A number with a fraction or exponent, an integer too large for 64 bits, `NaN` or an
    /// infinity.
    Float(f64),
}

impl Number {
    pub fn as_u64(self) -> Option<u64> {
        match self {
            Number::Unsigned(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i64(self) -> Option<i64> {
        match self {
            Number::Unsigned(v) => i64::try_from(v).ok(),
            Number::Negative(v) => Some(v),
            Number::Float(_) => None,
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Number::Unsigned(v) => v as f64,
            Number::Negative(v) => v as f64,
            Number::Float(v) => v,
        }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Unsigned(v) => write!(f, "{v}"),
            Number::Negative(v) => write!(f, "{v}"),
            Number::Float(v) => write!(f, "{v}"),
        }
    }
}

/// A parsed JSON value. Objects keep their members in order; lookups return the first match,
/// as rapidjson's `FindMember` does.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Number(Number),
    /// Borrowed from the source unless it holds escapes.
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    /// Member names are borrowed from the source unless they hold escapes.
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
    /// The validated source text of a value left unparsed: the `data` of request tensors, and any
    /// value nested deeper than [`MAX_DEPTH`].
    Raw(&'a [u8]),
}

impl<'a> Value<'a> {
    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&[(Cow<'a, str>, Value<'a>)]> {
        match self {
            Value::Object(members) => Some(members),
            _ => None,
        }
    }
}

/// A syntax error with the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub message: String,
    pub offset: usize,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.message, self.offset)
    }
}

/// Parses one JSON document. Members named `lazy_key` are validated but kept as [`Value::Raw`].
///
/// # Errors
/// [`ParseError`] for malformed JSON, more than [`MAX_VALUES`] values, strings that are not
/// UTF-8, or trailing content.
pub fn parse<'a>(src: &'a [u8], lazy_key: Option<&str>) -> Result<Value<'a>, ParseError> {
    let mut reader = Reader {
        src,
        pos: 0,
        budget: MAX_VALUES,
    };
    reader.skip_ws();
    if reader.pos == src.len() {
        return Err(reader.error("The document is empty."));
    }
    let value = reader.value(1, lazy_key)?;
    reader.skip_ws();
    if reader.pos != src.len() {
        return Err(reader.error("The document root must not be followed by other values."));
    }
    Ok(value)
}

/// A small request body (load and unload, settings, shared-memory APIs) as a `serde_json` tree.
///
/// serde_json stops at 128 levels and at `NaN` / `Infinity`, which Triton's rapidjson reads: such
/// a document is read by [`parse`] instead, its values deeper than [`MAX_DEPTH`] and its
/// non-finite numbers becoming `null` (no handler reads either), so a deeply nested body answers
/// as in Triton. (The repository index reads its body with [`parse`] alone: Triton answers one of
/// any size there, `"ready"` the only member it looks at.)
///
/// A body of more than [`MAX_DOCUMENT_VALUES`] values is refused before any tree is built.
///
/// # Errors
/// INVALID_ARGUMENT "failed to parse the request JSON buffer: ..." with the syntax error as
/// [`parse`] (and so Triton's rapidjson) words it, or the value count.
pub fn document(src: &[u8]) -> Result<serde_json::Value, crate::core::Error> {
    if more_values_than(src, MAX_DOCUMENT_VALUES) {
        return Err(crate::core::Error::InvalidArgument(format!(
            "failed to parse the request JSON buffer: JSON has more than {MAX_DOCUMENT_VALUES} \
             values"
        )));
    }
    serde_json::from_slice(src).or_else(|_| {
        parse(src, None).map(|value| to_serde(&value)).map_err(|e| {
            crate::core::Error::InvalidArgument(format!(
                "failed to parse the request JSON buffer: {e}"
            ))
        })
    })
}

/// [`Value`] as `serde_json` holds it; recursion is bounded by [`MAX_DEPTH`] (deeper is `Raw`).
fn to_serde(value: &Value<'_>) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        Value::Null | Value::Raw(_) => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Number(Number::Unsigned(v)) => Json::from(*v),
        Value::Number(Number::Negative(v)) => Json::from(*v),
        Value::Number(Number::Float(v)) => {
            serde_json::Number::from_f64(*v).map_or(Json::Null, Json::Number)
        }
        Value::String(s) => Json::String(s.to_string()),
        Value::Array(items) => Json::Array(items.iter().map(to_serde).collect()),
        Value::Object(members) => {
            let mut map = serde_json::Map::new();
            for (key, member) in members {
                // The first of duplicate names, as rapidjson's FindMember.
                map.entry(key.to_string())
                    .or_insert_with(|| to_serde(member));
            }
            Json::Object(map)
        }
    }
}

/// A request body as a `serde_json` tree, once a count (which builds nothing) shows that its
/// tree takes at most `max_bytes` ([`TREE_VALUE_BYTES`] a value): a serde_json value costs tens
/// of bytes against the one or two of `0,`, so a body of tiny values would otherwise grow a tree
/// many times its size.
///
/// # Errors
/// The reason, for the caller's own wording: too many values, or serde_json's syntax error.
pub fn bounded_value(src: &[u8], max_bytes: usize) -> Result<serde_json::Value, String> {
    let max_values = max_bytes / TREE_VALUE_BYTES;
    if more_values_than(src, max_values) {
        return Err(format!(
            "JSON has more than {max_values} values ({max_bytes} bytes as a tree)"
        ));
    }
    serde_json::from_slice(src).map_err(|e| e.to_string())
}

/// Whether `src` may hold more than `max` values: one plus its commas and openings outside
/// strings bounds its values from above (every value but the first follows a comma or an
/// opening).
pub fn more_values_than(src: &[u8], max: usize) -> bool {
    let (mut count, mut in_string, mut escaped) = (1usize, false, false);
    for &byte in src {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b',' | b'[' | b'{' => {
                count += 1;
                if count > max {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// One leaf of a nested array, as [`visit_scalars`] reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar<'s> {
    Null,
    Bool(bool),
    Number(Number),
    /// A string's bytes after unescaping (not checked for UTF-8: BYTES elements are bytes).
    String(&'s [u8]),
}

/// Walks a (possibly nested) array in row-major order and hands each non-array element to
/// `visit`, which may stop the walk by returning an error message.
///
/// # Errors
/// [`VisitError::Visitor`] with the message from `visit`; [`VisitError::Syntax`] when `src` is
/// not an array of scalars and arrays.
pub fn visit_scalars(
    src: &[u8],
    mut visit: impl FnMut(Scalar<'_>) -> Result<(), String>,
) -> Result<(), VisitError> {
    // Visiting builds nothing, so it needs no value budget.
    let mut reader = Reader {
        src,
        pos: 0,
        budget: usize::MAX,
    };
    reader.skip_ws();
    if reader.peek() != Some(b'[') {
        return Err(VisitError::Syntax(reader.error("'data' must be an array")));
    }
    let mut scratch = Vec::new();
    reader.visit(1, &mut visit, &mut scratch)
}

/// Why [`visit_scalars`] stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisitError {
    /// The visitor refused an element, with its message.
    Visitor(String),
    /// The text is not an array of arrays and scalars.
    Syntax(ParseError),
    /// The arrays nest deeper than [`MAX_DATA_DEPTH`].
    TooDeep,
}

impl From<ParseError> for VisitError {
    fn from(e: ParseError) -> Self {
        VisitError::Syntax(e)
    }
}
