//! Texts → token rows with the `tokenizers` crate: truncation, special tokens and padding to the
//! longest text of the batch (or to a fixed length), as flat row-major `i64` buffers.

use super::super::BackendError;
use std::path::Path;
use tokenizers::{PaddingDirection, PostProcessor, Tokenizer, TruncationParams};

/// Sequence length a tokenizer truncates to when neither the config nor `tokenizer.json` says.
pub const DEFAULT_MAX_LENGTH: usize = 512;

/// How a batch of texts is padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// To the longest text of the batch (the fewest tokens the model has to run).
    Longest,
    /// Always to `max_length` (graphs with a fixed sequence dimension).
    MaxLength,
}

/// The tokenizer settings a model's config chooses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerOptions {
    /// Most tokens per text, special tokens included; `None`: `tokenizer.json`'s truncation
    /// length, else [`DEFAULT_MAX_LENGTH`].
    pub max_length: Option<usize>,
    /// Longer texts are cut to `max_length` (true) or refused (false).
    pub truncate: bool,
    pub padding: Padding,
    /// Add the tokenizer's special tokens (`[CLS]` ... `[SEP]` for BERT).
    pub add_special_tokens: bool,
}

impl Default for TokenizerOptions {
    fn default() -> Self {
        TokenizerOptions {
            max_length: None,
            truncate: true,
            padding: Padding::Longest,
            add_special_tokens: true,
        }
    }
}

/// A batch of texts as token rows of equal length, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRows {
    pub rows: usize,
    /// Tokens per row, padding included.
    pub length: usize,
    pub ids: Vec<i64>,
    /// 1 for a token, 0 for padding.
    pub attention_mask: Vec<i64>,
    pub type_ids: Vec<i64>,
}

/// A loaded `tokenizer.json` with the model's options applied. Shared by the instances of a model
/// version; encoding takes `&self`.
#[derive(Debug)]
pub struct TextTokenizer {
    tokenizer: Tokenizer,
    max_length: usize,
    padding: Padding,
    add_special_tokens: bool,
    pad_id: i64,
    pad_type_id: i64,
    pad_left: bool,
}

impl TextTokenizer {
    /// Loads `path` and applies `options`. The padding of `tokenizer.json` gives the pad token,
    /// its type id and the side (kiln pads each batch itself); without one, `[PAD]` or `<pad>`
    /// pads on the right (id 0 when the vocabulary has neither).
    ///
    /// # Errors
    /// [`BackendError::Load`] when the file is missing or not a tokenizer, or `max_length` cannot
    /// hold the special tokens.
    pub fn load(path: &Path, options: &TokenizerOptions) -> Result<TextTokenizer, BackendError> {
        let load_error = |e: String| {
            BackendError::Load(format!("failed to load tokenizer {}: {e}", path.display()))
        };
        let mut tokenizer = Tokenizer::from_file(path).map_err(|e| load_error(e.to_string()))?;
        let max_length = options
            .max_length
            .or_else(|| tokenizer.get_truncation().map(|t| t.max_length))
            .unwrap_or(DEFAULT_MAX_LENGTH);
        let (pad_id, pad_type_id, pad_left) = match tokenizer.get_padding() {
            Some(p) => (
                p.pad_id,
                p.pad_type_id,
                matches!(p.direction, PaddingDirection::Left),
            ),
            None => {
                let pad = ["[PAD]", "<pad>"]
                    .iter()
                    .find_map(|t| tokenizer.token_to_id(t));
                (pad.unwrap_or(0), 0, false)
            }
        };
        let special = match tokenizer.get_post_processor() {
            Some(processor) if options.add_special_tokens => processor.added_tokens(false),
            _ => 0,
        };
        if max_length <= special {
            return Err(load_error(format!(
                "max length {max_length} leaves no room for text after the {special} special tokens"
            )));
        }
        tokenizer.with_padding(None);
        let truncation = options.truncate.then(|| TruncationParams {
            max_length,
            stride: 0,
            ..tokenizer.get_truncation().cloned().unwrap_or_default()
        });
        tokenizer
            .with_truncation(truncation)
            .map_err(|e| load_error(format!("max length {max_length}: {e}")))?;
        Ok(TextTokenizer {
            tokenizer,
            max_length,
            padding: options.padding,
            add_special_tokens: options.add_special_tokens,
            pad_id: i64::from(pad_id),
            pad_type_id: i64::from(pad_type_id),
            pad_left,
        })
    }

    /// Most tokens per text.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    pub fn padding(&self) -> Padding {
        self.padding
    }

    /// How many tokens `texts` feed the model in all (special tokens included, truncated as
    /// [`TextTokenizer::encode`] truncates): the usage an OpenAI client is told.
    ///
    /// # Errors
    /// As [`TextTokenizer::encode`].
    pub fn count(&self, input: &str, texts: &[&str]) -> Result<usize, BackendError> {
        let mut total = 0;
        for (index, text) in texts.iter().enumerate() {
            total += self.encode_one(input, index, text)?.len();
        }
        Ok(total)
    }

    fn encode_one(
        &self,
        input: &str,
        index: usize,
        text: &str,
    ) -> Result<tokenizers::Encoding, BackendError> {
        let encoding = self
            .tokenizer
            .encode(text, self.add_special_tokens)
            .map_err(|e| {
                BackendError::Input(format!(
                    "failed to tokenize element {index} of input '{input}': {e}"
                ))
            })?;
        if encoding.len() > self.max_length {
            return Err(BackendError::Input(format!(
                "element {index} of input '{input}' has {} tokens, more than the maximum of {} \
                 (the model's tokenizer_truncation is off)",
                encoding.len(),
                self.max_length
            )));
        }
        Ok(encoding)
    }

    /// Tokenizes `texts` (the elements of input `input`, for messages) and pads them into rows.
    ///
    /// # Errors
    /// [`BackendError::Input`] when truncation is off and a text is longer than `max_length`, or
    /// the tokenizer fails on a text.
    pub fn encode(&self, input: &str, texts: &[&str]) -> Result<TokenRows, BackendError> {
        let mut encodings = Vec::with_capacity(texts.len());
        for (index, text) in texts.iter().enumerate() {
            let encoding = self.encode_one(input, index, text)?;
            encodings.push(encoding);
        }
        let length = match self.padding {
            Padding::Longest => encodings.iter().map(|e| e.len()).max().unwrap_or(0),
            Padding::MaxLength => self.max_length,
        };
        let total = texts.len() * length;
        let mut rows = TokenRows {
            rows: texts.len(),
            length,
            ids: Vec::with_capacity(total),
            attention_mask: Vec::with_capacity(total),
            type_ids: Vec::with_capacity(total),
        };
        for encoding in &encodings {
            let pad = length - encoding.len();
            if self.pad_left {
                rows.push_padding(pad, self.pad_id, self.pad_type_id);
            }
            rows.ids
                .extend(encoding.get_ids().iter().map(|&id| i64::from(id)));
            rows.attention_mask
                .extend(std::iter::repeat_n(1, encoding.len()));
            rows.type_ids
                .extend(encoding.get_type_ids().iter().map(|&t| i64::from(t)));
            if !self.pad_left {
                rows.push_padding(pad, self.pad_id, self.pad_type_id);
            }
        }
        Ok(rows)
    }
}

impl TokenRows {
    fn push_padding(&mut self, count: usize, pad_id: i64, pad_type_id: i64) {
        self.ids.extend(std::iter::repeat_n(pad_id, count));
        self.attention_mask.extend(std::iter::repeat_n(0, count));
        self.type_ids
            .extend(std::iter::repeat_n(pad_type_id, count));
    }
}
