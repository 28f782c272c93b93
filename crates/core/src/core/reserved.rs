//! The request parameters that are Triton's, not the model's: one table for every protocol and
//! layer (Triton's parameters extension, `docs/protocol/extension_parameters.md`, and its front
//! ends' checks). Each protocol spells a key's wire types and its refusals in its own words (the
//! gRPC codec, REST's request parser); the engine refuses the `triton_` prefix; a Python model's
//! `parameters()` leaves these keys out, as Triton's takes them out.

/// What a reserved key sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// `sequence_id`: the correlation ID (an integer or a string).
    SequenceId,
    /// `sequence_start`, `sequence_end`: the sequence's flags (booleans).
    SequenceFlag,
    /// `priority`: the request's priority level (an unsigned integer).
    Priority,
    /// `timeout`: the request's timeout in microseconds (an integer).
    Timeout,
    /// `triton_enable_empty_final_response`: a decoupled stream ends with an empty response
    /// flagged final (a boolean; gRPC only: Triton's REST front end refuses every `triton_` key).
    EmptyFinal,
}

/// The prefix of the keys Triton reserves for itself.
pub const TRITON_PREFIX: &str = "triton_";

/// The one `triton_` key a client may send (on gRPC).
pub const EMPTY_FINAL_RESPONSE: &str = "triton_enable_empty_final_response";

/// Every reserved key a client may send, and what it sets.
pub const RESERVED: &[(&str, Reserved)] = &[
    ("sequence_id", Reserved::SequenceId),
    ("sequence_start", Reserved::SequenceFlag),
    ("sequence_end", Reserved::SequenceFlag),
    ("priority", Reserved::Priority),
    ("timeout", Reserved::Timeout),
    (EMPTY_FINAL_RESPONSE, Reserved::EmptyFinal),
];

/// What `key` sets, when it is one of [`RESERVED`].
pub fn reserved(key: &str) -> Option<Reserved> {
    RESERVED
        .iter()
        .find(|(name, _)| *name == key)
        .map(|(_, what)| *what)
}

/// Whether `key` has Triton's prefix (reserved, whether a client may send it or not).
pub fn has_triton_prefix(key: &str) -> bool {
    key.starts_with(TRITON_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_tritons_keys() {
        assert_eq!(reserved("sequence_end"), Some(Reserved::SequenceFlag));
        assert_eq!(reserved(EMPTY_FINAL_RESPONSE), Some(Reserved::EmptyFinal));
        assert_eq!(reserved("triton_other"), None);
        assert_eq!(reserved("my_parameter"), None);
        assert!(has_triton_prefix("triton_other") && !has_triton_prefix("tritonx"));
        assert!(RESERVED
            .iter()
            .all(|(key, _)| !has_triton_prefix(key) || *key == EMPTY_FINAL_RESPONSE));
    }
}
