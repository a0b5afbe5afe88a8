//! Scripted replies of the mock model ([`Reply`], [`Call`], [`StreamMode`]) and their wire encoding.

use std::time::Duration;

use serde_json::{json, Map, Value};

/// How a streamed reply is cut into Server-Sent-Events chunks.
///
/// Only matters when the request has `"stream": true`; non-streaming requests always get one
/// well-formed `chat.completion` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamMode {
    /// Like OpenAI: text in ~3 deltas; per tool call a head delta (index, id, type, name,
    /// `arguments: ""`) then 2–3 argument fragments; a finish chunk; a usage chunk when
    /// `stream_options.include_usage` is true; `data: [DONE]`.
    #[default]
    Normal,
    /// Every tool call complete (id, name, all arguments) in a single chunk; several calls share
    /// that one chunk.
    WholeCallsInOneChunk,
    /// Tool call deltas carry no `index` key.
    MissingIndex,
    /// The name comes in its own delta (without `arguments`), the arguments in later deltas;
    /// `id`, `type` and `name` are repeated in every delta of the call.
    NameAndArgsSeparate,
    /// After the first content chunk, send
    /// `data: {"error":{"message":"upstream exploded","type":"server_error"}}` and end the
    /// response without `[DONE]`.
    ErrorMidStream,
    /// Drop the connection after the first chunk, without `[DONE]` (the client sees a body error). A
    /// non-streamed answer is cut too: half of its JSON, then the connection drops.
    CutMidStream,
    /// After the first chunk, send nothing more and keep the connection open: an upstream that stalled.
    StallMidStream,
    /// Never send the usage chunk, even when `stream_options.include_usage` is true.
    NoUsageChunk,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum CallId {
    Auto,
    Given(String),
    Missing,
    Empty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgsEncoding {
    JsonString,
    Object,
    Raw(String),
}

/// One tool call the mock model asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    name: String,
    arguments: Value,
    id: CallId,
    encoding: ArgsEncoding,
}

impl Call {
    /// A call of tool `name` with `arguments`, sent (like OpenAI) as a JSON-encoded string.
    ///
    /// The id defaults to `call_<n>`, with `n` unique per server (1, 2, 3, … in serving order).
    pub fn new(name: &str, arguments: Value) -> Call {
        Call {
            name: name.to_owned(),
            arguments,
            id: CallId::Auto,
            encoding: ArgsEncoding::JsonString,
        }
    }

    /// Uses this exact id.
    pub fn with_id(mut self, id: &str) -> Call {
        self.id = CallId::Given(id.to_owned());
        self
    }

    /// Omits the `"id"` key entirely.
    pub fn without_id(mut self) -> Call {
        self.id = CallId::Missing;
        self
    }

    /// Sends `"id": ""`.
    pub fn with_empty_id(mut self) -> Call {
        self.id = CallId::Empty;
        self
    }

    /// Sends `"arguments"` as a JSON value (normally an object) instead of a string.
    ///
    /// When streaming, the whole value is sent in a single arguments delta.
    pub fn arguments_as_object(mut self) -> Call {
        self.encoding = ArgsEncoding::Object;
        self
    }

    /// Sends exactly this string as `"arguments"` (e.g. `""` or invalid JSON).
    pub fn raw_arguments(mut self, s: &str) -> Call {
        self.encoding = ArgsEncoding::Raw(s.to_owned());
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt: u64,
    pub(crate) completion: u64,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt.saturating_add(self.completion),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Completion {
        text: Option<String>,
        calls: Vec<Call>,
    },
    Error {
        status: u16,
        message: String,
    },
}

/// One scripted answer of the mock model (a builder).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    kind: Kind,
    /// Reasoning before the answer: `(text, token)`, an Anthropic `thinking` block with its signature, or a
    /// Responses `reasoning` item with its summary and `encrypted_content`. Chat answers leave it out.
    thinking: Option<(String, String)>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    delay: Option<Duration>,
    stream_mode: StreamMode,
}

impl Reply {
    fn completion(text: Option<String>, calls: Vec<Call>) -> Reply {
        Reply {
            kind: Kind::Completion { text, calls },
            thinking: None,
            finish_reason: None,
            usage: Some(Usage {
                prompt: 10,
                completion: 5,
            }),
            delay: None,
            stream_mode: StreamMode::Normal,
        }
    }

    /// An assistant message with this text; `finish_reason` `"stop"`.
    pub fn text(t: impl Into<String>) -> Reply {
        Reply::completion(Some(t.into()), Vec::new())
    }

    /// An assistant message with `content: null` and these tool calls; `finish_reason` `"tool_calls"`.
    pub fn tool_calls(calls: Vec<Call>) -> Reply {
        Reply::completion(None, calls)
    }

    /// An assistant message with both content text and tool calls; `finish_reason` `"tool_calls"`.
    pub fn text_and_tool_calls(t: impl Into<String>, calls: Vec<Call>) -> Reply {
        Reply::completion(Some(t.into()), calls)
    }

    /// An HTTP error with this status (500 if the code is not a valid status) and the OpenAI error
    /// body `{"error":{"message","type","param":null,"code":null}}`; `type` is
    /// `"invalid_request_error"` below 500 and `"server_error"` from 500. Also used for streaming
    /// requests.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply {
            kind: Kind::Error {
                status,
                message: message.to_owned(),
            },
            thinking: None,
            finish_reason: None,
            usage: None,
            delay: None,
            stream_mode: StreamMode::Normal,
        }
    }

    /// Thinking before the answer, with its signature (Anthropic) or `encrypted_content` (Responses); Chat
    /// Completions answers leave it out.
    pub fn with_thinking(mut self, text: &str, token: &str) -> Reply {
        self.thinking = Some((text.to_owned(), token.to_owned()));
        self
    }

    /// Overrides `finish_reason` (e.g. `"stop"` with tool calls, `"length"`, `"content_filter"`).
    pub fn with_finish_reason(mut self, r: &str) -> Reply {
        self.finish_reason = Some(r.to_owned());
        self
    }

    /// Omits `usage` (and the streamed usage chunk).
    pub fn without_usage(mut self) -> Reply {
        self.usage = None;
        self
    }

    /// Sets the usage; the default is prompt 10, completion 5, total 15.
    pub fn with_usage(mut self, prompt: u64, completion: u64) -> Reply {
        self.usage = Some(Usage { prompt, completion });
        self
    }

    /// Waits this long before answering (before the status line, also for errors).
    pub fn with_delay(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }

    /// Chooses how a streamed answer is chunked (see [`StreamMode`]).
    pub fn stream_mode(mut self, m: StreamMode) -> Reply {
        self.stream_mode = m;
        self
    }

    pub(crate) fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// Whether the answer is cut mid-body ([`StreamMode::CutMidStream`]).
    pub(crate) fn cuts_body(&self) -> bool {
        self.stream_mode == StreamMode::CutMidStream
    }

    /// Splits into an error (status, message) or a completion ready to encode, assigning call ids.
    pub(crate) fn resolve(
        self,
        mut next_call_id: impl FnMut() -> String,
    ) -> Result<Resolved, (u16, String)> {
        let (text, calls) = match self.kind {
            Kind::Error { status, message } => return Err((status, message)),
            Kind::Completion { text, calls } => (text, calls),
        };
        let calls: Vec<WireCall> = calls
            .into_iter()
            .map(|c| WireCall {
                id: match c.id {
                    CallId::Auto => Some(next_call_id()),
                    CallId::Given(id) => Some(id),
                    CallId::Missing => None,
                    CallId::Empty => Some(String::new()),
                },
                arguments: match c.encoding {
                    ArgsEncoding::JsonString => Value::String(c.arguments.to_string()),
                    ArgsEncoding::Object => c.arguments,
                    ArgsEncoding::Raw(s) => Value::String(s),
                },
                name: c.name,
            })
            .collect();
        let finish_reason = self.finish_reason.unwrap_or_else(|| {
            if calls.is_empty() {
                "stop".to_owned()
            } else {
                "tool_calls".to_owned()
            }
        });
        Ok(Resolved {
            thinking: self.thinking,
            text,
            calls,
            finish_reason,
            usage: self.usage,
            mode: self.stream_mode,
        })
    }
}

/// The OpenAI error body for `status` and `message`.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    let kind = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

/// A tool call with its id assigned and its arguments encoded for the wire.
#[derive(Debug, Clone)]
pub(crate) struct WireCall {
    pub(crate) id: Option<String>,
    pub(crate) name: String,
    /// A string, or any JSON value for [`Call::arguments_as_object`].
    pub(crate) arguments: Value,
}

/// Per-response values shared by every chunk.
#[derive(Debug, Clone)]
pub(crate) struct Envelope {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) include_usage: bool,
}

/// One server-sent event of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    /// `data: <payload>\n\n`
    Data(String),
    /// `event: <name>\ndata: <payload>\n\n`
    Event(&'static str, String),
    /// Abort the connection.
    Abort,
    /// Send nothing more, and keep the connection open until the client leaves.
    Stall,
}

/// A completion reply with ids assigned, ready to encode.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) thinking: Option<(String, String)>,
    pub(crate) text: Option<String>,
    pub(crate) calls: Vec<WireCall>,
    pub(crate) finish_reason: String,
    pub(crate) usage: Option<Usage>,
    pub(crate) mode: StreamMode,
}

/// Splits `s` into at most `n` pieces of about equal length, at char boundaries.
pub(crate) fn split_pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(n.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn object(pairs: Vec<(&str, Value)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Map<_, _>>(),
    )
}

impl Resolved {
    /// The non-streaming `chat.completion` object.
    pub(crate) fn completion_json(&self, env: &Envelope) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(self.text));
        if !self.calls.is_empty() {
            let calls = self
                .calls
                .iter()
                .map(|c| self.call_json(c, None, true, Some(c.arguments.clone())))
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        let mut body = object(vec![
            ("id", json!(env.id)),
            ("object", json!("chat.completion")),
            ("created", json!(env.created)),
            ("model", json!(env.model)),
            (
                "choices",
                json!([{
                    "index": 0,
                    "message": Value::Object(message),
                    "logprobs": null,
                    "finish_reason": self.finish_reason,
                }]),
            ),
        ]);
        if let (Some(usage), Value::Object(map)) = (self.usage, &mut body) {
            map.insert("usage".into(), usage.json());
        }
        body
    }

    /// A tool call object: `{index?, id?, type?, function: {name?, arguments?}}`.
    fn call_json(
        &self,
        c: &WireCall,
        index: Option<usize>,
        head: bool,
        arguments: Option<Value>,
    ) -> Value {
        let mut call = Map::new();
        if let Some(i) = index {
            call.insert("index".into(), json!(i));
        }
        if head {
            if let Some(id) = &c.id {
                call.insert("id".into(), json!(id));
            }
            call.insert("type".into(), json!("function"));
        }
        let mut function = Map::new();
        if head {
            function.insert("name".into(), json!(c.name));
        }
        if let Some(a) = arguments {
            function.insert("arguments".into(), a);
        }
        call.insert("function".into(), Value::Object(function));
        Value::Object(call)
    }

    /// The deltas of the tool calls, each a `{"tool_calls": [...]}` delta object.
    fn call_deltas(&self) -> Vec<Value> {
        let mut deltas = Vec::new();
        if self.mode == StreamMode::WholeCallsInOneChunk {
            if !self.calls.is_empty() {
                let calls: Vec<Value> = self
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| self.call_json(c, Some(i), true, Some(c.arguments.clone())))
                    .collect();
                deltas.push(json!({ "tool_calls": calls }));
            }
            return deltas;
        }
        for (i, c) in self.calls.iter().enumerate() {
            let index = (self.mode != StreamMode::MissingIndex).then_some(i);
            let fragments: Vec<Value> = match &c.arguments {
                Value::String(s) => split_pieces(s, 3).into_iter().map(Value::String).collect(),
                other => vec![other.clone()],
            };
            if self.mode == StreamMode::NameAndArgsSeparate {
                deltas.push(json!({ "tool_calls": [self.call_json(c, index, true, None)] }));
                for f in fragments {
                    deltas.push(json!({ "tool_calls": [self.call_json(c, index, true, Some(f))] }));
                }
            } else {
                deltas.push(
                    json!({ "tool_calls": [self.call_json(c, index, true, Some(json!("")))] }),
                );
                for f in fragments {
                    deltas
                        .push(json!({ "tool_calls": [self.call_json(c, index, false, Some(f))] }));
                }
            }
        }
        deltas
    }

    fn chunk(&self, env: &Envelope, choices: Value, usage: Option<Value>) -> String {
        let mut chunk = object(vec![
            ("id", json!(env.id)),
            ("object", json!("chat.completion.chunk")),
            ("created", json!(env.created)),
            ("model", json!(env.model)),
            ("choices", choices),
        ]);
        if env.include_usage {
            if let Value::Object(map) = &mut chunk {
                map.insert("usage".into(), usage.unwrap_or(Value::Null));
            }
        }
        chunk.to_string()
    }

    fn delta_chunk(&self, env: &Envelope, delta: Value, finish_reason: Option<&str>) -> String {
        let choices = json!([{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }]);
        self.chunk(env, choices, None)
    }

    /// The server-sent events of a streamed answer, per [`StreamMode`].
    pub(crate) fn stream_frames(&self, env: &Envelope) -> Vec<Frame> {
        let mut deltas: Vec<Value> = Vec::new();
        if let Some(text) = &self.text {
            let pieces = split_pieces(text, 3);
            if pieces.is_empty() {
                deltas.push(json!({ "content": "" }));
            }
            deltas.extend(pieces.into_iter().map(|p| json!({ "content": p })));
        }
        deltas.extend(self.call_deltas());
        if deltas.is_empty() {
            deltas.push(json!({}));
        }
        if let Some(Value::Object(first)) = deltas.first_mut() {
            first.insert("role".into(), json!("assistant"));
        }
        let chunks: Vec<String> = deltas
            .into_iter()
            .map(|d| self.delta_chunk(env, d, None))
            .collect();

        let mut frames: Vec<Frame> = Vec::new();
        match self.mode {
            StreamMode::CutMidStream => {
                frames.extend(chunks.into_iter().take(1).map(Frame::Data));
                frames.push(Frame::Abort);
            }
            StreamMode::StallMidStream => {
                frames.extend(chunks.into_iter().take(1).map(Frame::Data));
                frames.push(Frame::Stall);
            }
            StreamMode::ErrorMidStream => {
                // The first chunk carries the first text piece when there is text.
                frames.extend(chunks.into_iter().take(1).map(Frame::Data));
                frames.push(Frame::Data(
                    json!({"error": {"message": "upstream exploded", "type": "server_error"}})
                        .to_string(),
                ));
            }
            _ => {
                frames.extend(chunks.into_iter().map(Frame::Data));
                frames.push(Frame::Data(self.delta_chunk(
                    env,
                    json!({}),
                    Some(&self.finish_reason),
                )));
                if let (true, false, Some(usage)) = (
                    env.include_usage,
                    self.mode == StreamMode::NoUsageChunk,
                    self.usage,
                ) {
                    frames.push(Frame::Data(self.chunk(env, json!([]), Some(usage.json()))));
                }
                frames.push(Frame::Data("[DONE]".to_owned()));
            }
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_pieces_cuts_into_at_most_n_pieces_at_char_boundaries() {
        assert_eq!(split_pieces("", 3), Vec::<String>::new());
        assert_eq!(split_pieces("ab", 3), vec!["a", "b"]);
        assert_eq!(split_pieces("héllo wörld", 3), vec!["héll", "o wö", "rld"]);
        assert_eq!(split_pieces("héllo wörld", 3).concat(), "héllo wörld");
    }
}
