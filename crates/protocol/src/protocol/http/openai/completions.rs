//! `/v1/completions` and `/v1/chat/completions`: a prompt, or messages laid out by the model's
//! chat template, generated from by a generation model (or by a model that takes Triton's LLM
//! tensors: [`super::llm`]), answered whole or streamed as server-sent events.

use super::super::body;
use super::llm;
use super::{completion_id, now_secs, read_model, read_object, AppState, OpenAiError};
use crate::core::tensor::frame_bytes;
use crate::core::{DataType, Error, InferRequest, ParamValue, Tensor};
use crate::engine::generate::{Chunk, Finish, Finished, Generation, Message};
use crate::engine::{Answers, Failed, Reply};
use crate::protocol::lifecycle::{Lifecycle, Wire};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: i64 = 16;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `/v1/completions`: a prompt, text out.
    Text,
    /// `/v1/chat/completions`: messages, an assistant message out.
    Chat,
}

/// A request, read.
#[derive(Debug, PartialEq)]
struct Completion {
    kind: Kind,
    /// The answer's id (`cmpl-...`, `chatcmpl-...`), also the generation request's id, so that
    /// errors and traces name it.
    id: String,
    model: String,
    /// The prompt (`Text`); empty for a chat until its template renders the messages.
    prompt: String,
    messages: Vec<Message>,
    echo: bool,
    stream: bool,
    include_usage: bool,
    /// Settings for the generation model, by Triton's names.
    parameters: Vec<(&'static str, ParamValue)>,
    stop: Vec<String>,
}

/// Reads a request to the `kind` endpoint.
fn read_request(kind: Kind, body: &[u8]) -> Result<Completion, OpenAiError> {
    let fields = read_object(body)?;
    let model = read_model(&fields)?;
    let (prompt, messages) = match kind {
        Kind::Text => (read_prompt(&fields)?, Vec::new()),
        Kind::Chat => (String::new(), read_messages(&fields)?),
    };
    refuse_unsupported(kind, &fields)?;
    let integer = |key: &'static str| -> Result<Option<i64>, OpenAiError> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_i64()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(key, format!("'{key}' must be an integer"))),
        }
    };
    let number = |key: &'static str| -> Result<Option<f64>, OpenAiError> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_f64()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(key, format!("'{key}' must be a number"))),
        }
    };
    let flag = |key: &'static str| -> Result<bool, OpenAiError> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(OpenAiError::invalid(
                key,
                format!("'{key}' must be a boolean"),
            )),
        }
    };
    let mut parameters = Vec::new();
    // Completions default to OpenAI's 16 tokens; a chat without a limit gets the model's default.
    let max_tokens = match (
        integer("max_completion_tokens")?,
        integer("max_tokens")?,
        kind,
    ) {
        (Some(tokens), _, _) | (None, Some(tokens), _) => Some(tokens),
        (None, None, Kind::Text) => Some(DEFAULT_MAX_TOKENS),
        (None, None, Kind::Chat) => None,
    };
    if let Some(max_tokens) = max_tokens {
        parameters.push(("max_tokens", ParamValue::Int64(max_tokens)));
    }
    if let Some(temperature) = number("temperature")? {
        parameters.push(("temperature", ParamValue::Double(temperature)));
    }
    if let Some(top_p) = number("top_p")? {
        parameters.push(("top_p", ParamValue::Double(top_p)));
    }
    // vLLM's extension, which its benchmarks send.
    if let Some(top_k) = integer("top_k")? {
        parameters.push(("top_k", ParamValue::Int64(top_k)));
    }
    if let Some(seed) = integer("seed")? {
        let seed = u64::try_from(seed)
            .map_err(|_| OpenAiError::invalid("seed", "'seed' must not be negative"))?;
        parameters.push(("seed", ParamValue::Uint64(seed)));
    }
    if flag("ignore_eos")? {
        parameters.push(("ignore_eos", ParamValue::Bool(true)));
    }
    let stop = match fields.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(stop)) => vec![stop.clone()],
        Some(Value::Array(stops)) => stops
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                OpenAiError::invalid("stop", "'stop' must be a string or a list of strings")
            })?,
        Some(_) => {
            return Err(OpenAiError::invalid(
                "stop",
                "'stop' must be a string or a list of strings",
            ))
        }
    };
    let include_usage = match fields.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => options
            .get("include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        Some(_) => {
            return Err(OpenAiError::invalid(
                "stream_options",
                "'stream_options' must be an object",
            ))
        }
    };
    let id = completion_id(match kind {
        Kind::Text => "cmpl",
        Kind::Chat => "chatcmpl",
    });
    Ok(Completion {
        kind,
        id,
        model,
        prompt,
        messages,
        echo: kind == Kind::Text && flag("echo")?,
        stream: flag("stream")?,
        include_usage,
        parameters,
        stop,
    })
}

/// A completion's `prompt`: one string, or a list of one.
fn read_prompt(fields: &Map<String, Value>) -> Result<String, OpenAiError> {
    match fields.get("prompt") {
        Some(Value::String(prompt)) => Ok(prompt.clone()),
        Some(Value::Array(prompts)) => match prompts.as_slice() {
            [Value::String(prompt)] => Ok(prompt.clone()),
            _ => Err(OpenAiError::invalid(
                "prompt",
                "'prompt' must be one string (a list of one string, not of several or of token \
                 ids)",
            )),
        },
        _ => Err(OpenAiError::invalid("prompt", "'prompt' must be a string")),
    }
}

/// A chat's `messages`: each a `role` and a `content`, text or a list of text parts.
fn read_messages(fields: &Map<String, Value>) -> Result<Vec<Message>, OpenAiError> {
    let bad = |why: &str| OpenAiError::invalid("messages", why.to_string());
    let Some(Value::Array(messages)) = fields.get("messages") else {
        return Err(bad("'messages' must be a list of messages"));
    };
    if messages.is_empty() {
        return Err(bad("'messages' must hold at least one message"));
    }
    messages
        .iter()
        .map(|message| {
            let role = message["role"]
                .as_str()
                .ok_or_else(|| bad("each message needs a 'role' string"))?;
            let content = match &message["content"] {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                Value::Array(parts) => parts
                    .iter()
                    .map(
                        |part| match (part["type"].as_str(), part["text"].as_str()) {
                            (Some("text"), Some(text)) => Ok(text),
                            _ => Err(bad(
                                "only text content parts ({\"type\": \"text\", ...}) are served",
                            )),
                        },
                    )
                    .collect::<Result<String, _>>()?,
                _ => return Err(bad("a message's 'content' must be text")),
            };
            Ok(Message {
                role: role.to_string(),
                content,
            })
        })
        .collect()
}

/// Settings kiln cannot honour, refused with their name rather than ignored.
fn refuse_unsupported(kind: Kind, fields: &Map<String, Value>) -> Result<(), OpenAiError> {
    let set = |key: &str| fields.get(key).filter(|v| !v.is_null());
    if set("n").is_some_and(|n| n.as_i64() != Some(1)) {
        return Err(OpenAiError::invalid(
            "n",
            "only one choice per request ('n': 1) is served",
        ));
    }
    if set("best_of").is_some_and(|n| n.as_i64() != Some(1)) {
        return Err(OpenAiError::invalid(
            "best_of",
            "'best_of' other than 1 is not served",
        ));
    }
    // A chat's `logprobs` is a boolean, false by default; a completion's is a count.
    let logprobs = match kind {
        Kind::Text => set("logprobs").is_some(),
        Kind::Chat => set("logprobs").is_some_and(|l| l.as_bool() != Some(false)),
    };
    if logprobs || set("top_logprobs").is_some() {
        return Err(OpenAiError::invalid("logprobs", "'logprobs' is not served"));
    }
    if set("suffix").is_some_and(|s| s.as_str() != Some("")) {
        return Err(OpenAiError::invalid("suffix", "'suffix' is not served"));
    }
    for penalty in ["presence_penalty", "frequency_penalty"] {
        if set(penalty).is_some_and(|p| p.as_f64() != Some(0.0)) {
            return Err(OpenAiError::invalid(
                penalty,
                format!("'{penalty}' is not served (only 0)"),
            ));
        }
    }
    if set("logit_bias").is_some_and(|b| b.as_object().is_none_or(|m| !m.is_empty())) {
        return Err(OpenAiError::invalid(
            "logit_bias",
            "'logit_bias' is not served",
        ));
    }
    if set("tools").is_some_and(|t| t.as_array().is_none_or(|t| !t.is_empty()))
        || set("functions").is_some()
    {
        return Err(OpenAiError::invalid(
            "tools",
            "tools and functions are not served",
        ));
    }
    if set("response_format").is_some_and(|f| f["type"].as_str() != Some("text")) {
        return Err(OpenAiError::invalid(
            "response_format",
            "only the 'text' response format is served",
        ));
    }
    Ok(())
}

/// The generation request for `completion`: it always streams, chunk by chunk.
fn generation_request(completion: &Completion) -> InferRequest {
    let mut request = InferRequest {
        model_name: completion.model.clone(),
        id: completion.id.clone(),
        ..Default::default()
    };
    let strings = |name: &str, texts: &[String]| {
        Tensor::new(
            name,
            DataType::Bytes,
            vec![texts.len() as i64],
            frame_bytes(texts),
        )
    };
    request.inputs.push(strings(
        "text_input",
        std::slice::from_ref(&completion.prompt),
    ));
    if !completion.stop.is_empty() {
        request.inputs.push(strings("stop", &completion.stop));
    }
    for (key, value) in &completion.parameters {
        request.parameters.insert((*key).to_string(), value.clone());
    }
    request
        .parameters
        .insert("stream".into(), ParamValue::Bool(true));
    request
}

fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Eos | Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

/// What one answer (or stream) is, shared by its objects.
struct Answer {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Answer {
    fn new(completion: &Completion) -> Answer {
        Answer {
            kind: completion.kind,
            id: completion.id.clone(),
            created: now_secs(),
            model: completion.model.clone(),
        }
    }

    /// A whole answer (`streaming` false) or a stream's chunk: `text`, and `finish` when it is
    /// the last. A chat stream's first chunk (`first`) carries the assistant's role.
    fn object(
        &self,
        streaming: bool,
        first: bool,
        text: &str,
        finish: Option<&str>,
    ) -> Map<String, Value> {
        let (object, choice) = match (self.kind, streaming) {
            (Kind::Text, _) => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
            ),
            (Kind::Chat, false) => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": finish}),
            ),
            (Kind::Chat, true) => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else {
                    json!({ "content": text })
                };
                (
                    "chat.completion.chunk",
                    json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}),
                )
            }
        };
        let mut map = Map::new();
        map.insert("id".into(), json!(self.id));
        map.insert("object".into(), json!(object));
        map.insert("created".into(), json!(self.created));
        map.insert("model".into(), json!(self.model));
        map.insert("choices".into(), json!([choice]));
        map.insert("system_fingerprint".into(), Value::Null);
        map
    }

    /// A stream's usage chunk (`stream_options.include_usage`).
    fn usage_chunk(&self, finished: &Finished) -> Value {
        let mut map = self.object(true, false, "", None);
        map.insert("choices".into(), json!([]));
        map.insert("usage".into(), usage(finished));
        Value::Object(map)
    }
}

fn usage(finished: &Finished) -> Value {
    let (prompt, completion) = (finished.prompt_tokens, finished.generated_tokens);
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

pub(super) async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(Kind::Text, &state, &headers, body).await
}

pub(super) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(Kind::Chat, &state, &headers, body).await
}

/// Where an answer's text comes from.
enum Texts {
    /// kiln's generation loop (a generation model).
    Generation(Generation),
    /// A model that takes Triton's LLM tensors.
    Llm(llm::Texts),
}

impl Texts {
    async fn next(&mut self) -> Option<Result<Chunk, Error>> {
        match self {
            Texts::Generation(generation) => generation.next().await,
            Texts::Llm(texts) => texts.next().await,
        }
    }
}

async fn answer(kind: Kind, state: &AppState, headers: &HeaderMap, body: Body) -> Response {
    match start(kind, state, headers, body).await {
        Ok((completion, generation)) if completion.stream => stream(completion, generation),
        Ok((completion, generation)) => whole(completion, generation)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(error) => error.into_response(),
    }
}

async fn start(
    kind: Kind,
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Completion, Texts), OpenAiError> {
    // Admitted once the body has arrived: a stalled body holds no in-flight slot.
    let body = body::read(body, headers, &state.config).await?;
    let context = Lifecycle::untraced(Wire::Http).admit(&state.engine)?;
    let mut completion = read_request(kind, &body)?;
    let target = state
        .engine
        .target_loading(&completion.model, "")
        .await
        .ok()
        .filter(|target| target.answers() == Answers::Generation || target.takes_llm_tensors());
    let Some(target) = target else {
        return Err(OpenAiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "The model `{}` does not exist or does not generate text.",
                completion.model
            ),
            "invalid_request_error",
        ));
    };
    if kind == Kind::Chat {
        let messages = std::mem::take(&mut completion.messages);
        completion.prompt = target.chat_prompt(messages).await?;
    }
    let request = if target.takes_llm_tensors() {
        let ask = llm::Ask {
            id: &completion.id,
            prompt: &completion.prompt,
            stream: completion.stream,
            parameters: &completion.parameters,
            stop: &completion.stop,
        };
        llm::request(&target, &ask)?
    } else {
        generation_request(&completion)
    };
    let reply = state.engine.call(target, request, context).await;
    let texts = match reply.map_err(Failed::into_error)? {
        Reply::Generation(generation) => Texts::Generation(generation),
        Reply::Stream(responses) => Texts::Llm(llm::Texts::streamed(responses)),
        Reply::Once(response) => Texts::Llm(llm::Texts::once(response)),
    };
    Ok((completion, texts))
}

async fn whole(completion: Completion, mut generation: Texts) -> Result<Response, OpenAiError> {
    let mut text = if completion.echo {
        completion.prompt.clone()
    } else {
        String::new()
    };
    let mut finished = None;
    while let Some(chunk) = generation.next().await {
        let chunk = chunk?;
        text.push_str(&chunk.text);
        finished = chunk.finished.or(finished);
    }
    let finished = finished.ok_or_else(|| {
        OpenAiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "generation ended without its last token",
            "server_error",
        )
    })?;
    let answer = Answer::new(&completion);
    let mut object = answer.object(false, true, &text, Some(finish_reason(finished.reason)));
    object.insert("usage".into(), usage(&finished));
    Ok(Json(Value::Object(object)).into_response())
}

/// Server-sent events: a chunk per generated piece of text (the prompt first with `echo`; a
/// chat's first chunk carries the assistant's role), the last with its `finish_reason`, a usage
/// chunk when asked, then `[DONE]`.
fn stream(completion: Completion, generation: Texts) -> Response {
    let answer = Answer::new(&completion);
    let event =
        |data: String| Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {data}\n\n")));
    let echo = completion.echo.then(|| {
        event(Value::Object(answer.object(true, false, &completion.prompt, None)).to_string())
    });
    struct Streaming {
        generation: Texts,
        answer: Answer,
        include_usage: bool,
        first: bool,
        done: bool,
    }
    let streaming = Streaming {
        generation,
        answer,
        include_usage: completion.include_usage,
        first: true,
        done: false,
    };
    let chunks = futures_util::stream::unfold(Some(streaming), move |state| async move {
        let mut state = state?;
        if state.done {
            return Some((event("[DONE]".into()), None));
        }
        let data = match state.generation.next().await {
            Some(Ok(chunk)) => {
                let reason = chunk.finished.map(|f| finish_reason(f.reason));
                let object = state.answer.object(true, state.first, &chunk.text, reason);
                state.first = false;
                let mut data = Value::Object(object).to_string();
                if let (Some(finished), true) = (&chunk.finished, state.include_usage) {
                    data = format!("{data}\n\ndata: {}", state.answer.usage_chunk(finished));
                }
                state.done = chunk.last();
                data
            }
            Some(Err(error)) => {
                state.done = true;
                json!({"error": {"message": error.message(), "type": "server_error",
                                 "param": null, "code": null}})
                .to_string()
            }
            None => {
                state.done = true;
                return Some((event("[DONE]".into()), None));
            }
        };
        Some((event(data), Some(state)))
    });
    let events = futures_util::StreamExt::chain(futures_util::stream::iter(echo), chunks);
    (
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<Completion, OpenAiError> {
        read_request(Kind::Text, body.as_bytes())
    }

    #[test]
    fn completion_requests_become_generation_settings() {
        let completion = read(
            r#"{"model": "m", "prompt": ["hello"], "max_tokens": 4, "temperature": 0.5,
                "top_p": 0.9, "seed": 7, "stop": "\n", "stream": true, "echo": true, "n": 1,
                "stream_options": {"include_usage": true}, "user": "ignored", "logprobs": null}"#,
        )
        .unwrap();
        assert_eq!(completion.model, "m");
        assert_eq!(completion.prompt, "hello");
        assert!(completion.stream && completion.echo && completion.include_usage);
        assert_eq!(completion.stop, ["\n"]);
        assert_eq!(
            completion.parameters,
            [
                ("max_tokens", ParamValue::Int64(4)),
                ("temperature", ParamValue::Double(0.5)),
                ("top_p", ParamValue::Double(0.9)),
                ("seed", ParamValue::Uint64(7)),
            ]
        );
        let request = generation_request(&completion);
        assert_eq!(request.parameters["stream"], ParamValue::Bool(true));
        assert_eq!(request.inputs[0].data, frame_bytes(["hello"]));
        assert_eq!(request.inputs[1].name, "stop");
        // OpenAI's default length.
        let plain = read(r#"{"model": "m", "prompt": "x"}"#).unwrap();
        assert_eq!(plain.parameters, [("max_tokens", ParamValue::Int64(16))]);
        assert!(!plain.stream && !plain.echo);
    }

    #[test]
    fn what_kiln_cannot_honour_is_refused_by_name() {
        for (body, param) in [
            (r#"{"prompt": "x"}"#, "model"),
            (r#"{"model": "m"}"#, "prompt"),
            (r#"{"model": "m", "prompt": ["a", "b"]}"#, "prompt"),
            (r#"{"model": "m", "prompt": [1, 2]}"#, "prompt"),
            (r#"{"model": "m", "prompt": "x", "n": 2}"#, "n"),
            (
                r#"{"model": "m", "prompt": "x", "logprobs": 2}"#,
                "logprobs",
            ),
            (
                r#"{"model": "m", "prompt": "x", "presence_penalty": 0.5}"#,
                "presence_penalty",
            ),
            (
                r#"{"model": "m", "prompt": "x", "logit_bias": {"1": 2}}"#,
                "logit_bias",
            ),
            (r#"{"model": "m", "prompt": "x", "suffix": "y"}"#, "suffix"),
            (
                r#"{"model": "m", "prompt": "x", "max_tokens": "4"}"#,
                "max_tokens",
            ),
            (r#"{"model": "m", "prompt": "x", "seed": -1}"#, "seed"),
            (r#"{"model": "m", "prompt": "x", "stop": [1]}"#, "stop"),
            (
                r#"{"model": "m", "prompt": "x", "stream": "yes"}"#,
                "stream",
            ),
        ] {
            let error = read(body).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(error.param, Some(param), "{body}: {}", error.message);
        }
        assert!(read("[]").is_err() && read("{").is_err());
        // Zero penalties and an empty bias are what clients send by default.
        assert!(read(
            r#"{"model": "m", "prompt": "x", "presence_penalty": 0, "frequency_penalty": 0.0,
                "logit_bias": {}, "best_of": 1, "suffix": null}"#
        )
        .is_ok());
    }

    #[test]
    fn chat_requests_read_messages_and_their_own_settings() {
        let chat = read_request(
            Kind::Chat,
            br#"{"model": "m", "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                    {"role": "assistant", "content": null}],
                 "max_completion_tokens": 5, "logprobs": false, "tools": [], "echo": true,
                 "response_format": {"type": "text"}}"#,
        )
        .unwrap();
        let roles: Vec<_> = chat
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            roles,
            [
                ("system", "Be brief."),
                ("user", "Hi there"),
                ("assistant", "")
            ]
        );
        assert_eq!(chat.parameters, [("max_tokens", ParamValue::Int64(5))]);
        assert!(!chat.echo, "a chat does not echo");
        // No limit: the model's own default, not OpenAI's 16 for completions.
        let open = read_request(
            Kind::Chat,
            br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#,
        )
        .unwrap();
        assert!(open.parameters.is_empty());
        for (body, param) in [
            (r#"{"model": "m"}"#, "messages"),
            (r#"{"model": "m", "messages": []}"#, "messages"),
            (
                r#"{"model": "m", "messages": [{"content": "x"}]}"#,
                "messages",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true}"#,
                "logprobs",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
                "tools",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#,
                "response_format",
            ),
        ] {
            let error = read_request(Kind::Chat, body.as_bytes()).unwrap_err();
            assert_eq!(error.param, Some(param), "{body}: {}", error.message);
        }
    }

    #[test]
    fn chat_answers_have_chats_shape() {
        let chat = read_request(
            Kind::Chat,
            br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#,
        )
        .unwrap();
        let answer = Answer::new(&chat);
        assert_eq!(generation_request(&chat).id, answer.id);
        assert!(answer.id.starts_with("chatcmpl-"));
        let whole = Value::Object(answer.object(false, true, "hi", Some("stop")));
        assert_eq!(whole["object"], "chat.completion");
        assert_eq!(
            whole["choices"][0]["message"],
            json!({"role": "assistant", "content": "hi"})
        );
        let first = Value::Object(answer.object(true, true, "h", None));
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            first["choices"][0]["delta"],
            json!({"role": "assistant", "content": "h"})
        );
        let next = Value::Object(answer.object(true, false, "i", Some("length")));
        assert_eq!(next["choices"][0]["delta"], json!({"content": "i"}));
        assert_eq!(next["choices"][0]["finish_reason"], "length");
    }
}
