//! The bad-input table: malformed or hostile requests over every public and admin endpoint (bodies, paths,
//! queries, headers, auth, tool definitions, items). Each must answer in OpenAI's error shape with the right
//! status, `param` and `x-should-retry`, never a 5xx, and store nothing.

use crate::common::*;
use gateway_e2e::TestGateway;
use gateway_testkit::Reply;
use reqwest::Method;
use serde_json::{json, Value};

/// Who a case authenticates as.
#[derive(Clone, Copy)]
enum Auth {
    /// The first tenant's key.
    Key,
    /// A revoked key of the first tenant.
    Revoked,
    /// The admin token.
    Admin,
    /// No `Authorization` header.
    Nothing,
    /// This exact header value.
    Header(&'static str),
}

/// A request body.
#[derive(Clone)]
enum Body {
    None,
    /// Sent as it is, with `Content-Type: application/json`.
    Raw(String),
    /// Bytes that need not be UTF-8.
    Bytes(Vec<u8>),
    Json(Value),
}

struct Case {
    name: &'static str,
    method: Method,
    /// From the host on; `{R}` is a stored response of the first tenant, `{F}` one of another tenant,
    /// `{M}` its first output message id, `{G}` the first tenant's group.
    path: String,
    auth: Auth,
    body: Body,
    headers: Vec<(&'static str, String)>,
    status: u16,
    /// Expected `param` (`None` = null).
    param: Option<&'static str>,
    /// Expected `code`, when the case pins one.
    code: Option<&'static str>,
    /// Words the message must hold, when the case pins them.
    mentions: Option<&'static str>,
}

fn case(name: &'static str, method: Method, path: &str, auth: Auth, body: Body) -> Case {
    Case {
        name,
        method,
        path: path.to_owned(),
        auth,
        body,
        headers: Vec::new(),
        status: 400,
        param: None,
        code: None,
        mentions: None,
    }
}

impl Case {
    fn status(mut self, status: u16) -> Case {
        self.status = status;
        self
    }
    fn param(mut self, param: &'static str) -> Case {
        self.param = Some(param);
        self
    }
    fn code(mut self, code: &'static str) -> Case {
        self.code = Some(code);
        self
    }
    fn mentions(mut self, words: &'static str) -> Case {
        self.mentions = Some(words);
        self
    }
    fn header(mut self, name: &'static str, value: String) -> Case {
        self.headers.push((name, value));
        self
    }
}

/// `POST /v1/responses` with a JSON body.
fn create(name: &'static str, body: Value) -> Case {
    case(
        name,
        Method::POST,
        "/v1/responses",
        Auth::Key,
        Body::Json(body),
    )
}

/// `POST /v1/responses` with a raw body.
fn create_raw(name: &'static str, body: &str) -> Case {
    case(
        name,
        Method::POST,
        "/v1/responses",
        Auth::Key,
        Body::Raw(body.to_owned()),
    )
}

/// A create body of `{"model": "mock", "input": "x"}` plus `extra`.
fn with(extra: Value) -> Value {
    let mut body = json!({"model": "mock", "input": "x"});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

fn get(name: &'static str, path: &str) -> Case {
    case(name, Method::GET, path, Auth::Key, Body::None)
}

fn admin(name: &'static str, method: Method, path: &str, body: Body) -> Case {
    case(name, method, &format!("/admin/v1{path}"), Auth::Admin, body)
}

fn function(name: &str) -> Value {
    json!({"type": "function", "name": name, "parameters": {"type": "object"}})
}

fn create_cases() -> Vec<Case> {
    let long = "a".repeat(65);
    vec![
        // Bodies that are not one JSON object.
        create_raw("truncated JSON", "{").code("invalid_json"),
        create_raw("empty body", "").code("empty_body"),
        create_raw("blank body", "  \n ").code("empty_body"),
        create_raw("array body", "[]")
            .code("invalid_type")
            .mentions("must be a JSON object, but got an array"),
        create_raw("string body", "\"x\"")
            .code("invalid_type")
            .mentions("must be a JSON object, but got a string"),
        create_raw("null body", "null").code("invalid_type"),
        create_raw("number body", "5").code("invalid_type"),
        create_raw("junk after the JSON", r#"{"model":"mock","input":"x"} xyz"#).code("invalid_json"),
        create_raw("two JSON objects", r#"{"model":"mock","input":"x"}{}"#).code("invalid_json"),
        create_raw("NUL in a string", r#"{"model":"mock","input":"a\u0000b"}"#)
            .code("invalid_nul_character"),
        case(
            "invalid UTF-8",
            Method::POST,
            "/v1/responses",
            Auth::Key,
            Body::Bytes(b"{\"model\":\"mock\",\"input\":\"\xff\xfe\"}".to_vec()),
        )
        .code("invalid_json"),
        create_raw("a NUL byte after the JSON", "{\"model\":\"mock\",\"input\":\"x\"}\u{0}").code("invalid_json"),
        create_raw("single quotes", "{'model':'mock'}").code("invalid_json"),
        create_raw("trailing comma", r#"{"model":"mock","input":"x",}"#).code("invalid_json"),
        create_raw("comment", r#"{"model":"mock", /* c */ "input":"x"}"#).code("invalid_json"),
        create_raw("huge body", &format!(r#"{{"model":"mock","input":"{}"}}"#, "x".repeat(70_000)))
            .status(413)
            .code("request_too_large")
            .mentions("limit of 65536 bytes"),
        // model
        create("no model", json!({"input": "x"}))
            .param("model")
            .code("missing_required_parameter"),
        create("empty object", json!({})).param("model"),
        create("model a number", json!({"model": 5, "input": "x"}))
            .param("model")
            .code("invalid_type"),
        create("model empty", json!({"model": "", "input": "x"})).param("model"),
        create("model blank", json!({"model": "  ", "input": "x"})).param("model"),
        create("unknown model", json!({"model": "nope", "input": "x"}))
            .status(404)
            .param("model")
            .code("model_not_found"),
        create("model with NUL-free control chars", json!({"model": "m\u{1}", "input": "x"}))
            .status(404)
            .param("model"),
        // input
        create("no input", json!({"model": "mock"})).param("input"),
        create("input a number", json!({"model": "mock", "input": 5})).param("input"),
        create("input empty list", json!({"model": "mock", "input": []})).param("input"),
        create("input an object", json!({"model": "mock", "input": {}})).param("input"),
        create("input item a number", json!({"model": "mock", "input": [5]})).param("input[0]"),
        create(
            "input item of unknown type",
            json!({"model": "mock", "input": [{"type": "bogus"}]}),
        )
        .param("input[0]"),
        create(
            "message with unknown role",
            json!({"model": "mock", "input": [{"role": "wizard", "content": "x"}]}),
        )
        .param("input[0]"),
        create(
            "message without content",
            json!({"model": "mock", "input": [{"role": "user"}]}),
        )
        .param("input[0]"),
        create(
            "content part of unknown type",
            json!({"model": "mock", "input": [{"role": "user", "content": [{"type": "bogus"}]}]}),
        )
        .param("input[0]"),
        create(
            "content neither a string nor a list",
            json!({"model": "mock", "input": [{"role": "user", "content": 5}]}),
        )
        .param("input[0]")
        .mentions("'content' must be a string or an array of content parts"),
        create(
            "content part not an object",
            json!({"model": "mock", "input": [{"role": "user", "content": ["x"]}]}),
        )
        .param("input[0]")
        .mentions("'content[0]' must be an object"),
        create(
            "input_text without text",
            json!({"model": "mock", "input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
        )
        .param("input[0]")
        .mentions("needs a string 'text'"),
        create(
            "input_image without image_url",
            json!({"model": "mock", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
        )
        .param("input[0]")
        .mentions("needs an 'image_url'"),
        create(
            "input_file with nothing in it",
            json!({"model": "mock", "input": [{"role": "user", "content": [{"type": "input_file", "filename": "a.pdf"}]}]}),
        )
        .param("input[0]")
        .mentions("needs 'file_data'"),
        create(
            "function_call_output a number",
            json!({"model": "mock", "input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}),
        )
        .param("input[0]")
        .mentions("'output' must be a string or an array"),
        create(
            "metadata with a key of the gateway's",
            with(json!({"metadata": {"gateway_ignored_params": "temperature"}})),
        )
        .param("metadata")
        .mentions("the gateway's own"),
        create(
            "function_call without call_id",
            json!({"model": "mock", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
        )
        .param("input[0]"),
        create(
            "function_call_output without output",
            json!({"model": "mock", "input": [{"type": "function_call_output", "call_id": "c"}]}),
        )
        .param("input[0]"),
        create(
            "second item bad",
            json!({"model": "mock", "input": [{"role": "user", "content": "x"}, {"type": 7}]}),
        )
        .param("input[1]"),
        // sampling and limits
        create("temperature above 2", with(json!({"temperature": 3}))).param("temperature"),
        create("temperature below 0", with(json!({"temperature": -1}))).param("temperature"),
        create("temperature a string", with(json!({"temperature": "hot"})))
            .param("temperature")
            .code("invalid_type"),
        create("top_p above 1", with(json!({"top_p": 2}))).param("top_p"),
        create("top_p a list", with(json!({"top_p": [1]}))).param("top_p"),
        create("max_output_tokens 1", with(json!({"max_output_tokens": 1}))).param("max_output_tokens"),
        create("max_output_tokens negative", with(json!({"max_output_tokens": -5})))
            .param("max_output_tokens"),
        create("max_output_tokens a string", with(json!({"max_output_tokens": "x"})))
            .param("max_output_tokens"),
        create("max_output_tokens a fraction", with(json!({"max_output_tokens": 16.5})))
            .param("max_output_tokens"),
        create("max_tool_calls 0", with(json!({"max_tool_calls": 0}))).param("max_tool_calls"),
        create("top_logprobs 21", with(json!({"top_logprobs": 21}))).param("top_logprobs"),
        create("temperature negative", with(json!({"temperature": -1})))
            .param("temperature")
            .code("decimal_below_min_value"),
        create("top_p above 1, its code", with(json!({"top_p": 1.5})))
            .param("top_p")
            .code("decimal_above_max_value"),
        create("reasoning a string", with(json!({"reasoning": "x"})))
            .param("reasoning")
            .code("invalid_type"),
        create("reasoning.effort unknown", with(json!({"reasoning": {"effort": "bogus"}})))
            .param("reasoning.effort")
            .code("invalid_value"),
        create("reasoning.summary a number", with(json!({"reasoning": {"summary": 7}})))
            .param("reasoning.summary")
            .code("invalid_type"),
        create("presence_penalty above 2", with(json!({"presence_penalty": 2.5})))
            .param("presence_penalty")
            .code("decimal_above_max_value"),
        create("frequency_penalty below -2", with(json!({"frequency_penalty": -3})))
            .param("frequency_penalty")
            .code("decimal_below_min_value"),
        create("presence_penalty a string", with(json!({"presence_penalty": "x"})))
            .param("presence_penalty")
            .code("invalid_type"),
        create("max_output_tokens above 2^32", with(json!({"max_output_tokens": 4294967296_i64})))
            .param("max_output_tokens")
            .code("integer_above_max_value"),
        create("truncation unknown", with(json!({"truncation": "maybe"}))).param("truncation"),
        // text, metadata, misc fields
        create("text a string", with(json!({"text": "x"}))).param("text"),
        create("text format unknown", with(json!({"text": {"format": {"type": "xml"}}})))
            .param("text.format.type"),
        create(
            "json_schema without a name",
            with(json!({"text": {"format": {"type": "json_schema", "schema": {}}}})),
        )
        .param("text.format"),
        create("verbosity unknown", with(json!({"text": {"verbosity": "loud"}}))).param("text.verbosity"),
        create("metadata value a number", with(json!({"metadata": {"k": 5}})))
            .param("metadata.k")
            .code("invalid_type"),
        create("metadata a list", with(json!({"metadata": [1]}))).param("metadata"),
        create(
            "metadata with 17 keys",
            with(json!({"metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()})),
        )
        .param("metadata"),
        create("metadata key too long", with(json!({"metadata": {long.clone(): "v"}}))).param("metadata"),
        create("metadata value too long", with(json!({"metadata": {"k": "v".repeat(513)}}))).param("metadata"),
        create("instructions a number", with(json!({"instructions": 5})))
            .param("instructions")
            .code("invalid_type"),
        create("user a number", with(json!({"user": 5}))).param("user"),
        create("include a string", with(json!({"include": "x"}))).param("include"),
        create("parallel_tool_calls a string", with(json!({"parallel_tool_calls": "yes"})))
            .param("parallel_tool_calls"),
        create("store a string", with(json!({"store": "no"}))).param("store"),
        create("stream a string", with(json!({"stream": "yes"}))).param("stream"),
        create("background a string", with(json!({"background": "x"}))).param("background"),
        create("background without store", with(json!({"background": true, "store": false}))).param("store"),
        create("unknown conversation", with(json!({"conversation": "conv_1"})))
            .status(404)
            .param("conversation")
            .code("conversation_not_found"),
        create(
            "conversation with previous_response_id",
            with(json!({"conversation": "conv_1", "previous_response_id": "{R}"})),
        )
        .param("conversation"),
        create("conversation a number", with(json!({"conversation": 7}))).param("conversation"),
        create("conversation without id", with(json!({"conversation": {}}))).param("conversation"),
        create("prompt template", with(json!({"prompt": {"id": "pmpt_1"}}))).param("prompt"),
        // tools
        create("tools a string", with(json!({"tools": "x"}))).param("tools"),
        create("tool a number", with(json!({"tools": [5]}))).param("tools[0]"),
        create("tool without a type", with(json!({"tools": [{"name": "f"}]}))).param("tools[0].type"),
        create("function without a name", with(json!({"tools": [{"type": "function"}]})))
            .param("tools[0].name"),
        create("function name with a space", with(json!({"tools": [function("a b")]}))).param("tools[0].name"),
        create("function name too long", with(json!({"tools": [function(&long)]}))).param("tools[0].name"),
        create(
            "parameters not a schema",
            with(json!({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nonsense", "properties": 5}}]})),
        )
        .param("tools[0].parameters")
        .code("invalid_function_parameters"),
        create(
            "parameters a string",
            with(json!({"tools": [{"type": "function", "name": "f", "parameters": "x"}]})),
        )
        .param("tools[0].parameters"),
        create(
            "bad regex in a schema",
            with(json!({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string", "pattern": "("}}]})),
        )
        .param("tools[0].parameters"),
        create("strict a string", with(json!({"tools": [{"type": "function", "name": "f", "strict": "yes"}]})))
            .param("tools[0].strict"),
        create("two tools, one name", with(json!({"tools": [function("f"), function("f")]})))
            .param("tools[1].name"),
        create("custom without a name", with(json!({"tools": [{"type": "custom"}]}))).param("tools[0].name"),
        create("mcp without a server_url", with(json!({"tools": [{"type": "mcp", "server_label": "s"}]})))
            .param("tools[0].server_url")
            .code("missing_required_parameter"),
        create(
            "mcp with a connector",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "connector_id": "connector_gmail"}]})),
        )
        .param("tools[0].connector_id"),
        create(
            "mcp label with a space",
            with(json!({"tools": [{"type": "mcp", "server_label": "a b", "server_url": "https://h/"}]})),
        )
        .param("tools[0].server_label"),
        create(
            "mcp approval neither always nor never",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "require_approval": "sometimes"}]})),
        )
        .param("tools[0].require_approval"),
        create(
            "mcp header not a string",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"X-Key": 1}}]})),
        )
        .param("tools[0].headers.X-Key"),
        create(
            "mcp header name not a token",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"X Key": "v"}}]})),
        )
        .param("tools[0].headers"),
        create(
            "mcp header Host that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"Host": "v"}}]})),
        )
        .param("tools[0].headers.Host"),
        create(
            "mcp header content-length that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"content-length": "v"}}]})),
        )
        .param("tools[0].headers.content-length"),
        create(
            "mcp header Transfer-Encoding that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"Transfer-Encoding": "v"}}]})),
        )
        .param("tools[0].headers.Transfer-Encoding"),
        create(
            "mcp header CONNECTION that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"CONNECTION": "v"}}]})),
        )
        .param("tools[0].headers.CONNECTION"),
        create(
            "mcp header Upgrade that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"Upgrade": "v"}}]})),
        )
        .param("tools[0].headers.Upgrade"),
        create(
            "mcp header TE that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"TE": "v"}}]})),
        )
        .param("tools[0].headers.TE"),
        create(
            "mcp header Trailer that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"Trailer": "v"}}]})),
        )
        .param("tools[0].headers.Trailer"),
        create(
            "mcp header Proxy-Authorization that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"Proxy-Authorization": "v"}}]})),
        )
        .param("tools[0].headers.Proxy-Authorization"),
        create(
            "mcp header proxy-connection that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"proxy-connection": "v"}}]})),
        )
        .param("tools[0].headers.proxy-connection"),
        create(
            "mcp header Mcp-Session-Id that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"Mcp-Session-Id": "v"}}]})),
        )
        .param("tools[0].headers.Mcp-Session-Id"),
        create(
            "mcp header mcp-protocol-version that the gateway sets itself",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/",
                                   "headers": {"mcp-protocol-version": "v"}}]})),
        )
        .param("tools[0].headers.mcp-protocol-version"),
        create(
            "two mcp servers, one label",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://h/"},
                                  {"type": "mcp", "server_label": "s", "server_url": "https://i/"}]})),
        )
        .param("tools[1].server_label"),
        create(
            "mcp server the operator does not allow",
            with(json!({"tools": [{"type": "mcp", "server_label": "s", "server_url": "https://mcp.example.com/"}]})),
        )
        .param("tools[0].server_url")
        .code("mcp_server_not_allowed"),
        create(
            "approval response without its request id",
            json!({"model": "mock", "input": [{"type": "mcp_approval_response", "approve": true}]}),
        )
        .param("input[0]"),
        create(
            "approval response to no request",
            json!({"model": "mock", "input": [
                {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": true}]}),
        )
        .param("input[0]")
        .code("mcp_approval_request_not_found"),
        create(
            "grammar without a definition",
            with(json!({"tools": [{"type": "custom", "name": "c", "format": {"type": "grammar", "syntax": "lark"}}]})),
        )
        .param("tools[0].format"),
        create(
            "custom format unknown",
            with(json!({"tools": [{"type": "custom", "name": "c", "format": {"type": "xml"}}]})),
        )
        .param("tools[0].format.type"),
        create(
            "namespace members not a list",
            with(json!({"tools": [{"type": "namespace", "name": "ns", "tools": "x"}]})),
        )
        .param("tools[0].tools"),
        create(
            "namespace holding a hosted tool",
            with(json!({"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]})),
        )
        .param("tools[0].tools[0].type"),
        create("namespace without a name", with(json!({"tools": [{"type": "namespace", "tools": []}]})))
            .param("tools[0].name"),
        create("mcp without server_label", with(json!({"tools": [{"type": "mcp"}]})))
            .param("tools[0].server_label"),
        create("tool named like a server tool", with(json!({"tools": [function("add")]})))
            .param("tools[0].name")
            .code("tool_name_conflict"),
        create("tool_choice unknown word", with(json!({"tool_choice": "sometimes"}))).param("tool_choice"),
        create("tool_choice a number", with(json!({"tool_choice": 5}))).param("tool_choice"),
        create(
            "tool_choice names no offered tool",
            with(json!({"tools": [function("f")], "tool_choice": {"type": "function", "name": "g"}})),
        )
        .param("tool_choice"),
        create(
            "tool_choice function without a name",
            with(json!({"tools": [function("f")], "tool_choice": {"type": "function"}})),
        )
        .param("tool_choice"),
        // chaining and items
        create("previous_response_id empty", with(json!({"previous_response_id": ""})))
            .param("previous_response_id"),
        create("previous_response_id unknown", with(json!({"previous_response_id": "resp_nope"})))
            .param("previous_response_id")
            .code("previous_response_not_found"),
        create("previous_response_id a number", with(json!({"previous_response_id": 5})))
            .param("previous_response_id"),
        create("previous_response_id of another project", with(json!({"previous_response_id": "{F}"})))
            .param("previous_response_id")
            .code("previous_response_not_found"),
        create(
            "output without a call",
            json!({"model": "mock", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
        )
        .param("input[0]")
        .code("function_call_output_without_call"),
        create(
            "an output answered twice",
            json!({"model": "mock", "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "1"},
                {"type": "function_call_output", "call_id": "c", "output": "2"}]}),
        )
        .param("input[2]")
        .code("duplicate_function_call_output"),
        create(
            "two calls with one call_id",
            json!({"model": "mock", "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c", "name": "g", "arguments": "{}"}]}),
        )
        .param("input[1]")
        .code("duplicate_call_id"),
        create(
            "a client call left unanswered",
            json!({"model": "mock", "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}),
        )
        .code("function_call_output_missing")
        .param("input"),
        create(
            "item_reference unknown",
            json!({"model": "mock", "input": [{"type": "item_reference", "id": "msg_nope"}]}),
        )
        .param("input[0]")
        .code("item_not_found"),
        create(
            "item_reference of another project",
            json!({"model": "mock", "input": [{"type": "item_reference", "id": "{M}"}]}),
        )
        .param("input[0]")
        .code("item_not_found"),
        create(
            "item_reference without an id",
            json!({"model": "mock", "input": [{"type": "item_reference"}]}),
        )
        .param("input[0]"),
        // Random, so that it does not compress under an index's size limit.
        create(
            "an item id longer than an id may be",
            json!({"model": "mock", "input": [
                {"type": "message", "role": "user", "content": "x"},
                {"type": "message", "id": long_random_id(), "role": "user", "content": "x"}]}),
        )
        .param("input[1]"),
        create(
            "custom output without a call",
            json!({"model": "mock", "input": [{"type": "custom_tool_call_output", "call_id": "c", "output": "x"}]}),
        )
        .param("input[0]"),
        // headers
        create("Idempotency-Key too long", with(json!({})))
            .header("idempotency-key", "k".repeat(300))
            .code("invalid_idempotency_key"),
        create("Idempotency-Key with a space", with(json!({})))
            .header("idempotency-key", "a b".into())
            .code("invalid_idempotency_key"),
        create("Idempotency-Key empty", with(json!({})))
            .header("idempotency-key", String::new())
            .code("invalid_idempotency_key"),
    ]
}

fn auth_cases() -> Vec<Case> {
    let body = || Body::Json(with(json!({})));
    vec![
        case(
            "no key",
            Method::POST,
            "/v1/responses",
            Auth::Nothing,
            body(),
        )
        .status(401),
        case(
            "unknown key",
            Method::POST,
            "/v1/responses",
            Auth::Header("Bearer sk-nope"),
            body(),
        )
        .status(401)
        .code("invalid_api_key"),
        case(
            "basic auth",
            Method::POST,
            "/v1/responses",
            Auth::Header("Basic dXNlcjpwYXNz"),
            body(),
        )
        .status(401),
        case(
            "empty bearer",
            Method::POST,
            "/v1/responses",
            Auth::Header("Bearer "),
            body(),
        )
        .status(401),
        case(
            "revoked key",
            Method::POST,
            "/v1/responses",
            Auth::Revoked,
            body(),
        )
        .status(401)
        .code("invalid_api_key"),
        case(
            "admin token as an API key",
            Method::POST,
            "/v1/responses",
            Auth::Admin,
            body(),
        )
        .status(401)
        .code("invalid_api_key"),
        case(
            "no key on GET",
            Method::GET,
            "/v1/responses/{R}",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        case(
            "no key on DELETE",
            Method::DELETE,
            "/v1/responses/{R}",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        case(
            "no key on input_items",
            Method::GET,
            "/v1/responses/{R}/input_items",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        case(
            "no key on cancel",
            Method::POST,
            "/v1/responses/{R}/cancel",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        case(
            "no admin token",
            Method::GET,
            "/admin/v1/projects",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        case(
            "wrong admin token",
            Method::GET,
            "/admin/v1/projects",
            Auth::Header("Bearer nope"),
            Body::None,
        )
        .status(401),
        case(
            "API key as admin token",
            Method::GET,
            "/admin/v1/projects",
            Auth::Key,
            Body::None,
        )
        .status(401),
        case(
            "no admin token on a write",
            Method::POST,
            "/admin/v1/projects",
            Auth::Nothing,
            Body::Json(json!({"name": "p"})),
        )
        .status(401),
    ]
}

fn public_path_cases() -> Vec<Case> {
    let long = "r".repeat(300);
    vec![
        get("unknown response", "/v1/responses/resp_nope").status(404),
        get("another project's response", "/v1/responses/{F}").status(404),
        get("NUL in an id", "/v1/responses/resp_%00x").param("response_id"),
        get("control character in an id", "/v1/responses/resp_%01x").param("response_id"),
        get("invalid UTF-8 in an id", "/v1/responses/%FF%FE").code("invalid_path"),
        get("an id of 300 characters", &format!("/v1/responses/{long}")).param("response_id"),
        get(
            "stream neither true nor false",
            "/v1/responses/{R}?stream=maybe",
        )
        .param("stream"),
        get(
            "starting_after negative",
            "/v1/responses/{R}?stream=true&starting_after=-1",
        )
        .param("starting_after"),
        get(
            "starting_after a word",
            "/v1/responses/{R}?stream=true&starting_after=x",
        )
        .param("starting_after"),
        get(
            "stream given twice",
            "/v1/responses/{R}?stream=true&stream=false",
        )
        .param("stream")
        .code("duplicate_parameter"),
        get("NUL in a query value", "/v1/responses/{R}?stream=%00").param("stream"),
        get(
            "a URL of 20 KB",
            &format!("/v1/responses/{{R}}?stream={}", "t".repeat(20_000)),
        )
        .status(414)
        .code("url_too_long"),
        get("headers of 100 KB", "/v1/responses/{R}")
            .header("x-padding", "p".repeat(100_000))
            .status(431)
            .code("headers_too_large"),
        case(
            "DELETE unknown",
            Method::DELETE,
            "/v1/responses/resp_nope",
            Auth::Key,
            Body::None,
        )
        .status(404),
        case(
            "DELETE another project's",
            Method::DELETE,
            "/v1/responses/{F}",
            Auth::Key,
            Body::None,
        )
        .status(404),
        case(
            "DELETE with NUL",
            Method::DELETE,
            "/v1/responses/resp_%00",
            Auth::Key,
            Body::None,
        )
        .param("response_id"),
        case(
            "DELETE invalid UTF-8",
            Method::DELETE,
            "/v1/responses/%C3%28",
            Auth::Key,
            Body::None,
        )
        .code("invalid_path"),
        case(
            "cancel unknown",
            Method::POST,
            "/v1/responses/resp_nope/cancel",
            Auth::Key,
            Body::None,
        )
        .status(404),
        case(
            "cancel with NUL",
            Method::POST,
            "/v1/responses/resp_%00/cancel",
            Auth::Key,
            Body::None,
        )
        .param("response_id"),
        case(
            "cancel another project's",
            Method::POST,
            "/v1/responses/{F}/cancel",
            Auth::Key,
            Body::None,
        )
        .status(404),
        case(
            "cancel a foreground response",
            Method::POST,
            "/v1/responses/{R}/cancel",
            Auth::Key,
            Body::None,
        )
        .code("not_background"),
        get(
            "input_items of an unknown response",
            "/v1/responses/resp_nope/input_items",
        )
        .status(404),
        get(
            "input_items with NUL in the id",
            "/v1/responses/resp_%00/input_items",
        )
        .param("response_id"),
        get(
            "input_items after NUL",
            "/v1/responses/{R}/input_items?after=%00",
        )
        .param("after"),
        get(
            "input_items after an unknown item",
            "/v1/responses/{R}/input_items?after=msg_nope",
        )
        .param("after"),
        get(
            "input_items after 300 characters",
            &format!("/v1/responses/{{R}}/input_items?after={long}"),
        )
        .param("after"),
        get(
            "input_items limit 0",
            "/v1/responses/{R}/input_items?limit=0",
        )
        .param("limit"),
        get(
            "input_items limit 101",
            "/v1/responses/{R}/input_items?limit=101",
        )
        .param("limit"),
        get(
            "input_items limit a word",
            "/v1/responses/{R}/input_items?limit=abc",
        )
        .param("limit"),
        get(
            "input_items limit twice",
            "/v1/responses/{R}/input_items?limit=1&limit=2",
        )
        .param("limit")
        .code("duplicate_parameter"),
        get(
            "input_items order sideways",
            "/v1/responses/{R}/input_items?order=up",
        )
        .param("order"),
        get(
            "input_items of another project",
            "/v1/responses/{F}/input_items",
        )
        .status(404),
        get("unknown public path", "/v1/nothing").status(404),
        get("unknown path outside /v1", "/responses").status(404),
        case(
            "PUT on responses",
            Method::PUT,
            "/v1/responses",
            Auth::Key,
            Body::None,
        )
        .status(405),
        case(
            "PATCH a response",
            Method::PATCH,
            "/v1/responses/{R}",
            Auth::Key,
            Body::None,
        )
        .status(405),
        case(
            "POST a response id",
            Method::POST,
            "/v1/responses/{R}",
            Auth::Key,
            Body::None,
        )
        .status(405),
        case(
            "DELETE input_items",
            Method::DELETE,
            "/v1/responses/{R}/input_items",
            Auth::Key,
            Body::None,
        )
        .status(405),
    ]
}

/// The Conversations API: bodies, ids and pages.
fn conversation_cases() -> Vec<Case> {
    let post =
        |name, path: &str, body: Value| case(name, Method::POST, path, Auth::Key, Body::Json(body));
    vec![
        case(
            "conversation no key",
            Method::POST,
            "/v1/conversations",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        case(
            "conversation malformed body",
            Method::POST,
            "/v1/conversations",
            Auth::Key,
            Body::Raw("{\"items\": [".to_owned()),
        ),
        post(
            "conversation items a string",
            "/v1/conversations",
            json!({"items": "x"}),
        )
        .param("items"),
        post(
            "conversation item without type",
            "/v1/conversations",
            json!({"items": [{"content": "x", "extra": 1}]}),
        )
        .param("items[0]"),
        post(
            "conversation item with an id longer than an id may be",
            "/v1/conversations",
            json!({"items": [{"type": "message", "id": long_random_id(), "role": "user", "content": "x"}]}),
        )
        .param("items[0]"),
        post(
            "conversation item_reference to nothing",
            "/v1/conversations",
            json!({"items": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_nope"}]}),
        )
        .param("items[1]")
        .code("item_not_found"),
        post(
            "conversation with a compaction it cannot open",
            "/v1/conversations",
            json!({"items": [{"role": "user", "content": "x"}, {"type": "compaction", "encrypted_content": "gwc1.tampered"}]}),
        )
        .param("items[1]")
        .code("invalid_encrypted_content"),
        post(
            "conversation with a compaction after a hosted call it drops",
            "/v1/conversations",
            json!({"items": [{"type": "web_search_call", "id": "ws_unknown"}, {"type": "compaction", "encrypted_content": "gwc1.tampered"}]}),
        )
        .param("items[1]")
        .code("invalid_encrypted_content"),
        post(
            "conversation 21 items",
            "/v1/conversations",
            json!({"items": vec![json!({"role": "user", "content": "x"}); 21]}),
        )
        .param("items"),
        post(
            "conversation metadata a list",
            "/v1/conversations",
            json!({"metadata": ["x"]}),
        )
        .param("metadata"),
        post(
            "conversation metadata long key",
            "/v1/conversations",
            json!({"metadata": {"k".repeat(65): "v"}}),
        )
        .param("metadata"),
        post(
            "count without model",
            "/v1/responses/input_tokens",
            json!({"input": "x"}),
        )
        .param("model")
        .code("missing_required_parameter"),
        post(
            "count a bad input item",
            "/v1/responses/input_tokens",
            json!({"model": "mock", "input": [7]}),
        )
        .param("input[0]"),
        post(
            "count on an unknown conversation",
            "/v1/responses/input_tokens",
            json!({"model": "mock", "conversation": "conv_nope"}),
        )
        .status(404)
        .param("conversation"),
        case(
            "count no key",
            Method::POST,
            "/v1/responses/input_tokens",
            Auth::Nothing,
            Body::None,
        )
        .status(401),
        get("unknown conversation", "/v1/conversations/conv_nope")
            .status(404)
            .param("conversation_id")
            .code("conversation_not_found"),
        post(
            "update unknown conversation",
            "/v1/conversations/conv_nope",
            json!({"metadata": {}}),
        )
        .status(404)
        .param("conversation_id"),
        get(
            "items of unknown conversation",
            "/v1/conversations/conv_nope/items",
        )
        .status(404)
        .param("conversation_id"),
        post(
            "add to unknown conversation",
            "/v1/conversations/conv_nope/items",
            json!({"items": []}),
        )
        .status(404)
        .param("conversation_id"),
        case(
            "delete unknown conversation",
            Method::DELETE,
            "/v1/conversations/conv_nope",
            Auth::Key,
            Body::None,
        )
        .status(404)
        .param("conversation_id"),
        get(
            "item of unknown conversation",
            "/v1/conversations/conv_nope/items/msg_1",
        )
        .status(404)
        .param("conversation_id"),
    ]
}

fn admin_cases() -> Vec<Case> {
    let long = "p".repeat(300);
    let raw = |s: &str| Body::Raw(s.to_owned());
    let body = Body::Json;
    let mut cases = vec![
        admin("project: truncated JSON", Method::POST, "/projects", raw("{")).code("invalid_json"),
        admin("project: junk after JSON", Method::POST, "/projects", raw(r#"{"name":"p"} x"#)).code("invalid_json"),
        admin("project: empty body", Method::POST, "/projects", raw("")).code("empty_body"),
        admin("project: NUL in the name", Method::POST, "/projects", raw(r#"{"name":"a\u0000"}"#))
            .code("invalid_nul_character"),
        admin("project: array body", Method::POST, "/projects", raw("[\"p\"]")).code("invalid_type"),
        admin("project: no name", Method::POST, "/projects", body(json!({}))).param("name"),
        admin("project: name a number", Method::POST, "/projects", body(json!({"name": 5}))).param("name"),
        admin("project: name empty", Method::POST, "/projects", body(json!({"name": ""}))).param("name"),
        admin("project: unknown field", Method::POST, "/projects", body(json!({"name": "p", "bogus": 1})))
            .param("bogus")
            .code("unknown_parameter"),
        admin("project: duplicate name", Method::POST, "/projects", body(json!({"name": "acme"}))).status(409),
        admin("project: NUL id", Method::GET, "/projects/%00", Body::None).param("project_id"),
        admin("project: invalid UTF-8 id", Method::GET, "/projects/%FF", Body::None).code("invalid_path"),
        admin("project: long id", Method::GET, &format!("/projects/{long}"), Body::None).param("project_id"),
        admin("project: unknown", Method::GET, "/projects/proj_nope", Body::None).status(404),
        admin("project: PATCH unknown", Method::PATCH, "/projects/proj_nope", body(json!({"name": "y"})))
            .status(404),
        admin("project: PATCH NUL id", Method::PATCH, "/projects/%00", body(json!({"name": "y"})))
            .param("project_id"),
        admin("project: DELETE NUL id", Method::DELETE, "/projects/%00", Body::None).param("project_id"),
        admin("project: DELETE unknown", Method::DELETE, "/projects/proj_nope", Body::None).status(404),
        admin("key: for an unknown project", Method::POST, "/projects/proj_nope/api_keys", body(json!({"name": "k"})))
            .status(404),
        admin("key: NUL project id", Method::POST, "/projects/%00/api_keys", body(json!({"name": "k"})))
            .param("project_id"),
        admin("key: list NUL project id", Method::GET, "/projects/%00/api_keys", Body::None).param("project_id"),
        admin("key: no name", Method::POST, "/projects/{P}/api_keys", body(json!({"name": 5}))).param("name"),
        admin("key: revoke NUL id", Method::DELETE, "/api_keys/%00", Body::None).param("key_id"),
        admin("key: revoke unknown", Method::DELETE, "/api_keys/key_nope", Body::None).status(404),
        admin("key: long id", Method::GET, &format!("/api_keys/{long}"), Body::None).param("key_id"),
        admin("key: invalid UTF-8 id", Method::GET, "/api_keys/%C3%28", Body::None).code("invalid_path"),
        admin("deployment: no name", Method::POST, "/deployments", body(json!({}))).param("name"),
        admin(
            "deployment: no provider",
            Method::POST,
            "/deployments",
            body(json!({"name": "d"})),
        )
        .param("provider"),
        admin(
            "deployment: unknown kind",
            Method::POST,
            "/deployments",
            body(json!({"name": "d", "provider": {"kind": "bogus", "base_url": "http://x", "model": "m"}})),
        )
        .param("provider.kind"),
        admin(
            "deployment: base_url not a URL",
            Method::POST,
            "/deployments",
            body(json!({"name": "d", "provider": {"kind": "openai_chat", "base_url": "not a url", "model": "m"}})),
        )
        .param("provider.base_url"),
        admin(
            "deployment: no upstream model",
            Method::POST,
            "/deployments",
            body(json!({"name": "d", "provider": {"kind": "openai_chat", "base_url": "http://x"}})),
        )
        .param("provider.model"),
        admin(
            "deployment: duplicate name",
            Method::POST,
            "/deployments",
            body(json!({"name": "mock", "provider": {"kind": "openai_chat", "base_url": "http://x", "model": "m"}})),
        )
        .status(409),
        admin("deployment: NUL id", Method::GET, "/deployments/%00", Body::None).param("deployment_id"),
        admin("deployment: unknown", Method::GET, "/deployments/dep_nope", Body::None).status(404),
        admin("deployment: PATCH unknown", Method::PATCH, "/deployments/dep_nope", body(json!({"name": "x"})))
            .status(404),
        admin("deployment: DELETE NUL id", Method::DELETE, "/deployments/%00", Body::None).param("deployment_id"),
        admin("group: no name", Method::POST, "/deployment_groups", body(json!({}))).param("name"),
        admin("group: NUL id", Method::GET, "/deployment_groups/%00", Body::None).param("group_id"),
        admin("group: unknown", Method::GET, "/deployment_groups/grp_nope", Body::None).status(404),
        admin(
            "group: attach unknown deployment",
            Method::PUT,
            "/deployment_groups/{G}/deployments/dep_nope",
            Body::None,
        )
        .status(404),
        admin(
            "group: attach to an unknown group",
            Method::PUT,
            "/deployment_groups/grp_nope/deployments/dep_nope",
            Body::None,
        )
        .status(404),
        admin(
            "group: NUL deployment id",
            Method::PUT,
            "/deployment_groups/{G}/deployments/%00",
            Body::None,
        )
        .param("deployment_id"),
        admin("group: grant unknown project", Method::PUT, "/deployment_groups/{G}/projects/proj_nope", Body::None)
            .status(404),
        admin("group: NUL project id", Method::PUT, "/deployment_groups/{G}/projects/%00", Body::None)
            .param("project_id"),
        admin(
            "group: attach unknown tool source",
            Method::PUT,
            "/deployment_groups/{G}/tool_sources/ts_nope",
            Body::None,
        )
        .status(404),
        admin("group: NUL tool source id", Method::PUT, "/deployment_groups/{G}/tool_sources/%00", Body::None)
            .param("tool_source_id"),
        admin("group: DELETE NUL group id", Method::DELETE, "/deployment_groups/%00", Body::None).param("group_id"),
        admin("tool source: no name", Method::POST, "/tool_sources", body(json!({}))).param("name"),
        admin(
            "tool source: ftp URL",
            Method::POST,
            "/tool_sources",
            body(json!({"name": "t", "description": "d", "parameters": {"type": "object"}, "url": "ftp://x"})),
        )
        .param("url"),
        admin(
            "tool source: parameters a string",
            Method::POST,
            "/tool_sources",
            body(json!({"name": "t", "description": "d", "parameters": "x", "url": "http://x"})),
        )
        .param("parameters"),
        admin(
            "tool source: parameters not a schema",
            Method::POST,
            "/tool_sources",
            body(json!({"name": "t", "description": "d", "parameters": {"type": 5}, "url": "http://x"})),
        )
        .param("parameters"),
        admin(
            "tool source: negative timeout",
            Method::POST,
            "/tool_sources",
            body(json!({"name": "t", "description": "d", "parameters": {"type": "object"}, "url": "http://x", "timeout_ms": -1})),
        )
        .param("timeout_ms"),
        admin(
            "tool source: name with a space",
            Method::POST,
            "/tool_sources",
            body(json!({"name": "a b", "description": "d", "parameters": {"type": "object"}, "url": "http://x"})),
        )
        .param("name"),
        admin("tool source: NUL id", Method::GET, "/tool_sources/%00", Body::None).param("tool_source_id"),
        admin("tool source: unknown", Method::GET, "/tool_sources/ts_nope", Body::None).status(404),
        admin("tool source: DELETE unknown", Method::DELETE, "/tool_sources/ts_nope", Body::None).status(404),
        admin("tool source: PATCH NUL id", Method::PATCH, "/tool_sources/%00", body(json!({"name": "x"})))
            .param("tool_source_id"),
        admin("unknown admin path", Method::GET, "/nothing", Body::None).status(404),
        admin("PUT on projects", Method::PUT, "/projects", Body::None).status(405),
    ];
    cases.push(
        admin(
            "project: body over the limit",
            Method::POST,
            "/projects",
            raw(&format!(r#"{{"name":"{}"}}"#, "n".repeat(70_000))),
        )
        .status(413)
        .code("request_too_large"),
    );
    cases
}

/// Rows in every table a request could write.
async fn all_rows(gw: &TestGateway) -> Vec<i64> {
    let mut rows = Vec::new();
    for table in [
        "responses",
        "response_input_items",
        "steps",
        "projects",
        "api_keys",
        "deployments",
        "deployment_groups",
        "tool_sources",
        "group_deployments",
        "group_projects",
        "group_tool_sources",
        "conversations",
        "conversation_items",
        "usage_records",
    ] {
        rows.push(gw.fetch_i64(&format!("SELECT count(*) FROM {table}")).await);
    }
    rows
}

/// What is wrong with one answer, if anything.
fn check(case: &Case, status: u16, retry: Option<&str>, body: &Value) -> Option<String> {
    let mut problems = Vec::new();
    if status != case.status {
        problems.push(format!("status {status}, expected {}", case.status));
    }
    if status >= 500 {
        problems.push("a client's mistake got a 5xx".to_owned());
    }
    match body["error"].as_object() {
        None => problems.push("no error object".to_owned()),
        Some(error) => {
            let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
            keys.sort_unstable();
            if keys != ["code", "message", "param", "type"] {
                problems.push(format!("error keys {keys:?}"));
            }
            if error["message"].as_str().is_none_or(str::is_empty) {
                problems.push("no message".to_owned());
            }
            if error["type"] != "invalid_request_error" {
                problems.push(format!("type {}", error["type"]));
            }
            if error["param"] != json!(case.param) {
                problems.push(format!(
                    "param {}, expected {:?}",
                    error["param"], case.param
                ));
            }
            let message = error["message"].as_str().unwrap_or_default();
            if let Some(words) = case.mentions {
                if !message.contains(words) {
                    problems.push(format!("message does not say {words:?}"));
                }
            }
            // The message speaks of the API, never of the gateway's own types.
            for internal in [
                "untagged enum",
                "expected struct",
                "CreateResponseBody",
                " elements",
            ] {
                if message.contains(internal) {
                    problems.push(format!(
                        "message shows the gateway's internals ({internal:?})"
                    ));
                }
            }
            if let Some(code) = case.code {
                if error["code"] != code {
                    problems.push(format!("code {}, expected {code}", error["code"]));
                }
            }
            // Every error has a code a client can branch on.
            if error["code"].as_str().is_none_or(str::is_empty) {
                problems.push(format!("no code: {}", error["code"]));
            }
        }
    }
    if retry != Some("false") {
        problems.push(format!("x-should-retry {retry:?}"));
    }
    (!problems.is_empty()).then(|| format!("{}: {} — {body}", case.name, problems.join("; ")))
}

#[tokio::test]
async fn every_bad_input_is_a_precise_openai_error_and_stores_nothing() {
    let gw = TestGateway::start_with(|config| config.server.body_limit_bytes = 64 * 1024).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "add").await;
    let other = gw.tenant("other").await;
    gw.model.push(Reply::text("mine"));
    let mine = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    gw.model.push(Reply::text("theirs"));
    let theirs = create_ok(&gw, &other.key, json!({"model": "mock", "input": "hi"})).await;
    let their_message = theirs["output"][0]["id"]
        .as_str()
        .expect("message id")
        .to_owned();
    let revoked = gw
        .admin_ok(
            Method::POST,
            &format!("/projects/{}/api_keys", tenant.project_id),
            Some(json!({"name": "old"})),
        )
        .await;
    gw.admin_ok(
        Method::DELETE,
        &format!("/api_keys/{}", revoked["id"].as_str().expect("id")),
        None,
    )
    .await;
    let revoked_key = revoked["key"].as_str().expect("key").to_owned();

    let cases: Vec<Case> = [
        create_cases(),
        auth_cases(),
        public_path_cases(),
        conversation_cases(),
        admin_cases(),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(cases.len() >= 150, "the table has {} cases", cases.len());

    let before = all_rows(&gw).await;
    let fill = |text: &str| {
        text.replace("{R}", &id_of(&mine))
            .replace("{F}", &id_of(&theirs))
            .replace("{M}", &their_message)
            .replace("{G}", &tenant.group_id)
            .replace("{P}", &tenant.project_id)
    };
    let mut failures = Vec::new();
    for case in &cases {
        let url = format!("{}{}", gw.base_url, fill(&case.path));
        let mut request = gw.http.request(case.method.clone(), &url);
        request = match case.auth {
            Auth::Key => request.bearer_auth(&tenant.key),
            Auth::Revoked => request.bearer_auth(&revoked_key),
            Auth::Admin => request.bearer_auth(&gw.admin_token),
            Auth::Nothing => request,
            Auth::Header(value) => request.header("authorization", value),
        };
        request = match &case.body {
            Body::None => request,
            Body::Raw(text) => request
                .header("content-type", "application/json")
                .body(text.clone()),
            Body::Bytes(bytes) => request
                .header("content-type", "application/json")
                .body(bytes.clone()),
            Body::Json(value) => request
                .json(&serde_json::from_str::<Value>(&fill(&value.to_string())).expect("json")),
        };
        for (name, value) in &case.headers {
            request = request.header(*name, value);
        }
        let answer = request.send().await.expect("request");
        let status = answer.status().as_u16();
        let retry = answer
            .headers()
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = answer.text().await.expect("body");
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if let Some(problem) = check(case, status, retry.as_deref(), &body) {
            failures.push(problem);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(
        all_rows(&gw).await,
        before,
        "a refused request stored something"
    );
    assert!(
        gw.model.requests().len() == 2,
        "no refused request reached the model"
    );
    assert!(gw.tools.calls().is_empty(), "no refused request ran a tool");
}

/// Sends `head` (a whole request head, as raw bytes) on a connection of its own and reads the answer to its end:
/// the status and the body as JSON. For requests an HTTP client will not build (a URL past what `http::Uri`
/// holds).
async fn raw_request(gw: &TestGateway, head: Vec<u8>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = gw.base_url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    tcp.write_all(&head).await.expect("send the head");
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tcp.read_to_end(&mut answer),
    )
    .await
    .expect("the gateway answers and closes in time")
    .expect("read the answer");
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
    (status, body)
}

#[tokio::test]
async fn a_url_or_head_too_large_to_parse_gets_an_openai_error_and_the_gateway_serves_on() {
    let (gw, tenant) = gateway().await;
    let get = |target: String, headers: String| {
        format!("GET {target} HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {}\r\n{headers}connection: close\r\n\r\n", tenant.key)
            .into_bytes()
    };
    let many_headers: String = (0..120).map(|n| format!("x-h{n}: v\r\n")).collect();
    let cases = [
        (
            "a URL of 100 KB",
            get(
                format!("/v1/responses/resp_x?q={}", "q".repeat(100_000)),
                String::new(),
            ),
            414,
            "url_too_long",
        ),
        (
            "a URL of 1 MB",
            get(
                format!("/v1/responses/resp_x?q={}", "q".repeat(1_000_000)),
                String::new(),
            ),
            431,
            "headers_too_large",
        ),
        (
            "120 headers",
            get("/v1/responses/resp_x".to_owned(), many_headers),
            431,
            "headers_too_large",
        ),
    ];
    for (name, head, status, code) in cases {
        let (got, body) = raw_request(&gw, head).await;

        assert_eq!(got, status, "{name}: {body}");
        assert_eq!(
            body["error"]["type"], "invalid_request_error",
            "{name}: {body}"
        );
        assert_eq!(body["error"]["code"], code, "{name}: {body}");
        assert_eq!(body["error"]["param"], Value::Null, "{name}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("16384")),
            "{name}: the message says the limit: {body}"
        );
    }
    let (status, body) = raw_request(
        &gw,
        b"GET /v1/responses HTTP/1.1 extra\r\nhost: gateway\r\n\r\n".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "a malformed request line: {body}");
    assert_eq!(body["error"]["code"], "invalid_http_request", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let (status, _) = raw_request(&gw, get("/healthz".to_owned(), String::new())).await;
    assert_eq!(status, 200, "the gateway serves on");
}

/// An item id of 3,008 random characters: over what an id may be (and, before ids were bounded, over what a
/// B-tree index takes once it does not compress enough).
fn long_random_id() -> String {
    (0..94)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect()
}
