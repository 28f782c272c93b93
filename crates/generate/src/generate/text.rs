//! Text in and out of a generation model: the tokenizer ([`TextCodec`]), incremental
//! detokenization that never emits half a character ([`IncrementalDecoder`]), and stop strings
//! that are never streamed in part ([`StopMatcher`]).

use std::path::Path;
use tokenizers::Tokenizer;

/// End-of-sequence tokens looked for in the tokenizer when the config names none.
const EOS_CANDIDATES: &[&str] = &[
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
];

/// The tokenizer of a generation model and its end-of-sequence token.
pub struct TextCodec {
    tokenizer: Tokenizer,
    eos: Option<u32>,
    /// Ids of the tokenizer's special tokens.
    special: std::collections::HashSet<u32>,
}

impl TextCodec {
    /// Reads `tokenizer.json`; `eos` names the end-of-sequence token (else the first of the usual
    /// names the tokenizer knows, if any).
    ///
    /// # Errors
    /// A message naming the file, or the unknown `eos` token.
    pub fn load(path: &Path, eos: Option<&str>) -> Result<TextCodec, String> {
        let tokenizer = Tokenizer::from_file(path)
            .map_err(|e| format!("failed to read tokenizer {}: {e}", path.display()))?;
        let eos = match eos {
            Some(name) => Some(
                tokenizer
                    .token_to_id(name)
                    .ok_or_else(|| format!("eos_token '{name}' is not in {}", path.display()))?,
            ),
            None => EOS_CANDIDATES
                .iter()
                .find_map(|name| tokenizer.token_to_id(name)),
        };
        let special = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        Ok(TextCodec {
            tokenizer,
            eos,
            special,
        })
    }

    /// The end-of-sequence token, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Token ids of a prompt (with the special tokens the tokenizer adds, e.g. a BOS).
    ///
    /// # Errors
    /// The tokenizer's message.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("failed to tokenize the prompt: {e}"))
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// The token `id` alone as text (a special token as its name), and whether it is special.
    pub fn token(&self, id: u32) -> (String, bool) {
        let text = self.tokenizer.decode(&[id], false).unwrap_or_default();
        (text, self.special.contains(&id))
    }
}

/// Turns tokens into text as they come. Decoding a token alone can be wrong (a byte-level token
/// may hold part of a UTF-8 character; SentencePiece drops a leading space at the start of a
/// text), so each step decodes a short window ending at the new token and emits only what the
/// window added, once it no longer ends in a replacement character.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokens: Vec<u32>,
    /// Start of the window already turned into text.
    prefix: usize,
    /// End of that window: tokens from here on are not emitted yet.
    read: usize,
}

/// Prompt tokens kept as context for the first generated tokens.
const CONTEXT: usize = 5;

impl IncrementalDecoder {
    /// Starts after `prompt`, of which the last few tokens give the first tokens their context.
    pub fn new(prompt: &[u32]) -> IncrementalDecoder {
        let tokens = prompt[prompt.len().saturating_sub(CONTEXT)..].to_vec();
        let read = tokens.len();
        IncrementalDecoder {
            tokens,
            prefix: 0,
            read,
        }
    }

    /// Adds a token and returns the text it completes (often empty for a partial character).
    pub fn push(&mut self, token: u32, decode: impl Fn(&[u32]) -> String) -> String {
        self.tokens.push(token);
        let before = decode(&self.tokens[self.prefix..self.read]);
        let after = decode(&self.tokens[self.prefix..]);
        if after.len() > before.len() && !after.ends_with('\u{FFFD}') {
            let text = match after.get(before.len()..) {
                Some(added) if after.starts_with(&before) => added.to_string(),
                // The window decoded differently as a whole: emit what follows the common part.
                _ => after[common_prefix(&before, &after)..].to_string(),
            };
            self.prefix = self.read;
            self.read = self.tokens.len();
            text
        } else {
            String::new()
        }
    }

    /// Whatever is still held back at the end of generation (an incomplete character becomes a
    /// replacement character, as a full decode would give).
    pub fn finish(&mut self, decode: impl Fn(&[u32]) -> String) -> String {
        if self.read == self.tokens.len() {
            return String::new();
        }
        let before = decode(&self.tokens[self.prefix..self.read]);
        let after = decode(&self.tokens[self.prefix..]);
        self.prefix = self.read;
        self.read = self.tokens.len();
        after[common_prefix(&before, &after)..].to_string()
    }
}

/// Length in bytes of the longest common prefix, on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// Holds back text that could be the start of a stop string, and cuts the output where one
/// appears (the stop string itself is not part of the output, as in vLLM).
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds `text`; returns the text that can be emitted now and whether a stop string matched
    /// (then nothing after it is ever emitted).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first {
            let emitted = self.held[..at].to_string();
            self.held.clear();
            return (emitted, true);
        }
        let keep = self.held_suffix();
        let emit_to = self.held.len() - keep;
        let emitted = self.held[..emit_to].to_string();
        self.held.drain(..emit_to);
        (emitted, false)
    }

    /// The held text, once generation ends without a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn held_suffix(&self) -> usize {
        let held = &self.held;
        held.char_indices()
            .map(|(i, _)| &held[i..])
            .find(|suffix| self.stops.iter().any(|stop| stop.starts_with(suffix)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level "tokenizer": token n is byte n; decoding is lossy UTF-8, as real byte-level
    /// BPE decoders are.
    fn bytes(ids: &[u32]) -> String {
        let raw: Vec<u8> = ids.iter().map(|&t| t as u8).collect();
        String::from_utf8_lossy(&raw).into_owned()
    }

    fn stream(text: &str) -> Vec<String> {
        let mut decoder = IncrementalDecoder::new(&[]);
        let mut out: Vec<String> = text
            .bytes()
            .map(|b| decoder.push(u32::from(b), bytes))
            .collect();
        out.push(decoder.finish(bytes));
        out
    }

    #[test]
    fn multi_byte_characters_are_emitted_whole() {
        let pieces = stream("é🔥a");
        assert_eq!(pieces, vec!["", "é", "", "", "", "🔥", "a", ""]);
        assert_eq!(pieces.concat(), "é🔥a");
    }

    #[test]
    fn an_incomplete_character_at_the_end_becomes_a_replacement() {
        let mut decoder = IncrementalDecoder::new(&[]);
        assert_eq!(decoder.push(0xF0, bytes), "");
        assert_eq!(decoder.push(0x9F, bytes), "");
        assert_eq!(decoder.finish(bytes), "\u{FFFD}");
    }

    #[test]
    fn prompt_context_is_not_repeated() {
        let prompt: Vec<u32> = "hello ".bytes().map(u32::from).collect();
        let mut decoder = IncrementalDecoder::new(&prompt);
        let out: String = "wörld"
            .bytes()
            .map(|b| decoder.push(u32::from(b), bytes))
            .collect();
        assert_eq!(out, "wörld");
    }

    #[test]
    fn context_sensitive_decoders_keep_their_spaces() {
        // A SentencePiece-like decoder: "_x" is " x", but a leading space of the whole text is
        // dropped. Decoding the new token alone would lose the space.
        let vocab = ["_Hello", "_world", "!"];
        let decode = |ids: &[u32]| -> String {
            let text: String = ids
                .iter()
                .map(|&i| vocab[i as usize].replace('_', " "))
                .collect();
            text.strip_prefix(' ').unwrap_or(&text).to_string()
        };
        let mut decoder = IncrementalDecoder::new(&[0]);
        assert_eq!(decoder.push(1, decode), " world");
        assert_eq!(decoder.push(2, decode), "!");
    }

    #[test]
    fn stop_strings_cut_the_output_and_are_never_streamed_in_part() {
        let mut stop = StopMatcher::new(vec!["END".into(), "".into()]);
        assert_eq!(stop.push("abc E"), ("abc ".into(), false));
        assert_eq!(stop.push("N"), ("".into(), false));
        assert_eq!(stop.push("x"), ("ENx".into(), false));
        assert_eq!(stop.push("yyEN"), ("yy".into(), false));
        assert_eq!(stop.push("Dzzz"), ("".into(), true));
    }

    #[test]
    fn the_earliest_stop_string_wins_and_held_text_is_flushed() {
        let mut stop = StopMatcher::new(vec!["world".into(), "o w".into()]);
        assert_eq!(stop.push("hello world"), ("hell".into(), true));
        let mut stop = StopMatcher::new(vec!["日本".into()]);
        assert_eq!(stop.push("x日"), ("x".into(), false));
        assert_eq!(stop.flush(), "日");
        let mut none = StopMatcher::new(Vec::new());
        assert_eq!(none.push("anything"), ("anything".into(), false));
    }

    #[test]
    fn the_bundled_tokenizer_round_trips_through_the_incremental_decoder() {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("model_repository/tiny_decoder/tokenizer.json");
        let codec = TextCodec::load(&path, None).unwrap();
        assert_eq!(codec.eos(), Some(0));
        let text = "The kiln 日本の陶磁器 🔥 très belle";
        let ids = codec.encode(text).unwrap();
        let mut decoder = IncrementalDecoder::new(&[]);
        let mut out: String = ids
            .iter()
            .map(|&t| decoder.push(t, |w| codec.decode(w)))
            .collect();
        out.push_str(&decoder.finish(|w| codec.decode(w)));
        assert_eq!(out, text);
        assert!(TextCodec::load(&path, Some("<nope>"))
            .err()
            .unwrap()
            .contains("eos_token '<nope>'"));
    }
}
