//! The providers (SPEC 8) as one table: every scenario runs over every provider kind (`openai_chat`, `anthropic`,
//! `openai_responses`), generated once by [`generate_provider_tests!`], as TensorZero generates its provider tests:
//! a new kind added to [`Kind`] and to the macro's list gets the whole table. The same scripted mock model answers
//! in each kind's shape; every scenario checks what the client got and what the upstream was sent, read into one
//! form by [`sent`]. What only one kind has (thinking signatures, encrypted reasoning, fallbacks across kinds) is
//! in [`specific`].

mod params;
mod sent;
mod specific;

use crate::common::sse::{check_stream, post_stream};
use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};
use gateway_testkit::{Call, Reply, StreamMode};
use reqwest::Method;
use serde_json::{json, Value};

use params::every_parameter_row_is_sent_or_listed_whole_and_streamed;
use sent::sent;

/// The upstream key the provider deployments are created with.
const UPSTREAM_KEY: &str = "upstream-key-123";

/// A provider kind, as a deployment names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OpenaiChat,
    Anthropic,
    OpenaiResponses,
}

impl Kind {
    /// The kind as the admin API spells it; the table's deployment of this kind has the same name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::OpenaiChat => "openai_chat",
            Kind::Anthropic => "anthropic",
            Kind::OpenaiResponses => "openai_responses",
        }
    }

    /// The model the deployment asks its upstream for.
    fn upstream_model(self) -> String {
        format!("{}-model", self.name())
    }

    /// Whether the provider marks a failed tool result as such (Anthropic's `is_error`).
    fn marks_failed_results(self) -> bool {
        self == Kind::Anthropic
    }
}

/// Adds deployment `name` of `kind` on the mock model (with its own base URL convention) to the tenant's group.
pub async fn add_provider(
    gw: &TestGateway,
    tenant: &Tenant,
    name: &str,
    kind: &str,
    extra: Value,
) -> Value {
    let base_url = match kind {
        "anthropic" => gw.model.root_url(),
        _ => gw.model.base_url(),
    };
    let mut body = json!({"name": name, "provider": {"kind": kind, "base_url": base_url, "model": format!("{kind}-model"), "api_key": UPSTREAM_KEY}});
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    let deployment = gw.admin_ok(Method::POST, "/deployments", Some(body)).await;
    let id = deployment["id"].as_str().expect("deployment id");
    gw.admin_ok(
        Method::PUT,
        &format!("/deployment_groups/{}/deployments/{id}", tenant.group_id),
        None,
    )
    .await;
    deployment
}

/// A gateway whose tenant sees the `add` and `fail` tools and a deployment of `kind`, named as the kind.
async fn gateway_of(kind: Kind) -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    add_provider(&gw, &tenant, kind.name(), kind.name(), json!({})).await;
    (gw, tenant)
}

fn lookup_tool() -> Value {
    json!({"type": "function", "name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}})
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// `POST /v1/responses/input_tokens` counts what the first model call of the same create sends (instructions,
/// server and client tools, the chained turn, the input): asked of the provider where it counts (the count
/// request is the call's body cut to the counting endpoint's fields), counted locally for Chat. Nothing is
/// stored and no model is called by the count.
async fn input_tokens_count_what_the_first_call_sends(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": kind.name(), "instructions": "Be brief.", "input": "Hi"}),
    )
    .await;
    let body = json!({"model": kind.name(), "instructions": "Be brief.", "input": "And now?",
        "previous_response_id": id_of(&first), "tools": [lookup_tool()]});
    let (calls, rows) = (gw.model.requests().len(), stored_rows(&gw).await);

    let answer = gw
        .call(
            gw.public(Method::POST, "/responses/input_tokens", &tenant.key)
                .json(&body),
        )
        .await;
    assert_eq!(answer.status.as_u16(), 200, "{:#}", answer.body);
    assert_eq!(answer.body["object"], "response.input_tokens");
    let counted = answer.body["input_tokens"].as_u64().expect("input_tokens");
    let counted_by = answer
        .headers
        .get("x-gateway-tokens-counted-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(gw.model.requests().len(), calls, "no model call");
    assert_eq!(stored_rows(&gw).await, rows, "nothing stored");

    // The create the count stands for: its first model call's body.
    create_ok(&gw, &tenant.key, body).await;
    let call = gw.model.requests().last().cloned().expect("the call");
    match kind {
        Kind::OpenaiChat => {
            assert_eq!(counted_by, "local:o200k_base");
            let local = gateway::upstream::count::count_chat_request(
                &call,
                gateway::upstream::count::Encoding::O200kBase,
            );
            assert_eq!(counted, local);
            assert!(counted > 20, "{counted}");
        }
        Kind::Anthropic | Kind::OpenaiResponses => {
            assert_eq!(counted_by, "provider");
            let [count_request] = gw
                .model
                .count_requests()
                .try_into()
                .expect("one count request");
            let object = count_request.as_object().expect("object");
            for (field, value) in object {
                assert_eq!(&call[field], value, "{field} as the call sends it");
            }
            let read = ["model", "tools"]
                .into_iter()
                .chain(if kind == Kind::Anthropic {
                    ["messages", "system"]
                } else {
                    ["input", "instructions"]
                });
            for field in read {
                assert!(
                    object.contains_key(field),
                    "{field} missing from {count_request:#}"
                );
            }
            assert!(!object.contains_key("stream") && !object.contains_key("max_tokens"));
            assert_eq!(
                counted,
                gateway_testkit::mock_input_tokens(&count_request, kind == Kind::Anthropic)
            );
        }
    }
}

/// One `mod` per provider kind, each with one test per scenario calling `scenario(kind)`.
macro_rules! generate_provider_tests {
    (kinds: [$($module:ident => $kind:expr),* $(,)?], scenarios: $scenarios:tt) => {
        $(generate_provider_tests!(@kind $module, $kind, $scenarios);)*
    };
    (@kind $module:ident, $kind:expr, [$($scenario:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario($kind).await;
                }
            )*
        }
    };
}

generate_provider_tests! {
    kinds: [
        openai_chat => super::Kind::OpenaiChat,
        anthropic => super::Kind::Anthropic,
        openai_responses => super::Kind::OpenaiResponses,
    ],
    scenarios: [
        text_goes_with_the_instructions_the_model_and_the_kinds_own_headers,
        a_server_tool_round_and_parallel_batch_pair_each_call_with_its_result,
        a_client_tool_is_handed_back_and_continued_with_its_output,
        a_streamed_tool_round_equals_the_whole_one,
        an_overloaded_upstream_is_retried_and_a_400_is_passed_on,
        an_error_event_mid_stream_fails_the_streamed_response,
        input_tokens_count_what_the_first_call_sends,
        every_parameter_row_is_sent_or_listed_whole_and_streamed,
    ]
}

async fn text_goes_with_the_instructions_the_model_and_the_kinds_own_headers(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    gw.model
        .push(Reply::text("Hello from the model").with_usage(12, 4));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": kind.name(), "instructions": "Be brief.", "input": "hi"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "Hello from the model");
    assert_eq!(body["model"], kind.name());
    assert_eq!(body["usage"]["input_tokens"], 12);
    assert_eq!(body["usage"]["output_tokens"], 4);
    let request = &gw.model.requests()[0];
    assert_eq!(request["model"], kind.upstream_model());
    let sent = sent(kind, request);
    assert_eq!(sent.instructions.as_deref(), Some("Be brief."));
    assert_eq!(sent.lines, ["user:hi"]);
    let headers = &gw.model.request_headers()[0];
    let bearer = format!("Bearer {UPSTREAM_KEY}");
    match kind {
        Kind::Anthropic => {
            // The newest block carries the prompt-caching breakpoint.
            assert_eq!(
                request["messages"],
                json!([{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}])
            );
            assert_eq!(
                request["max_tokens"], 4096,
                "the default when the request sets none"
            );
            assert_eq!(header(headers, "x-api-key"), Some(UPSTREAM_KEY));
            assert_eq!(header(headers, "anthropic-version"), Some("2023-06-01"));
            assert_eq!(header(headers, "authorization"), None);
        }
        Kind::OpenaiResponses => {
            assert_eq!(request["store"], false, "called statelessly");
            assert_eq!(request["include"], json!(["reasoning.encrypted_content"]));
            assert_eq!(header(headers, "authorization"), Some(bearer.as_str()));
        }
        Kind::OpenaiChat => {
            assert_eq!(sent.roles, ["system", "user"]);
            assert_eq!(header(headers, "authorization"), Some(bearer.as_str()));
        }
    }
}

async fn a_server_tool_round_and_parallel_batch_pair_each_call_with_its_result(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    gw.model.push(Reply::text_and_tool_calls(
        "Adding.",
        vec![
            Call::new("add", json!({"a": 1, "b": 2})).with_id("toolu_1"),
            Call::new("fail", json!({})).with_id("toolu_2"),
        ],
    ));
    gw.model.push(Reply::text("3, and one failed"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": kind.name(), "input": "add and fail", "max_output_tokens": 300}),
    )
    .await;

    assert_eq!(body["output_text"], "Adding.3, and one failed", "{body:#}");
    assert_eq!(items_of(&body, "mcp_call").len(), 2);
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    let first = sent(kind, &requests[0]);
    assert_eq!(first.max_tokens, Some(300));
    assert_eq!(first.tools, ["add", "fail"]);
    let second = sent(kind, &requests[1]);
    assert_eq!(
        second.lines[..4],
        [
            "user:add and fail",
            "assistant:Adding.",
            "call:toolu_1:add:{\"a\":1,\"b\":2}",
            "call:toolu_2:fail:{}"
        ],
        "the text and the batch, as the model made them"
    );
    assert_eq!(second.lines.len(), 6, "{:?}", second.lines);
    assert_eq!(second.lines[4], "result:toolu_1:{\"sum\":3}");
    let failed = &second.lines[5];
    assert!(
        failed.starts_with("result:toolu_2:{\"error\"")
            && failed.ends_with(":error") == kind.marks_failed_results(),
        "a failed tool's result is the error, marked where the provider marks it: {failed}"
    );
    match kind {
        Kind::Anthropic => {
            assert!(requests[0]["tools"][0]["input_schema"].is_object());
            assert_eq!(second.roles, ["user", "assistant", "user"]);
        }
        Kind::OpenaiChat => assert_eq!(second.roles, ["user", "assistant", "tool", "tool"]),
        Kind::OpenaiResponses => assert_eq!(requests[0]["tools"][0]["type"], "function"),
    }
}

async fn a_client_tool_is_handed_back_and_continued_with_its_output(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("lookup", json!({"word": "gateway"})).with_id("toolu_c"),
        Call::new("add", json!({"a": 2, "b": 2})).with_id("toolu_s"),
    ]));
    gw.model.push(Reply::text("A gateway is a door; 4."));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": kind.name(), "input": "define gateway, add 2+2", "tools": [lookup_tool()]}),
    )
    .await;
    let handed: Vec<&Value> = items_of(&first, "function_call");
    assert_eq!(
        handed.len(),
        2,
        "a mixed batch is handed back whole: {first:#}"
    );
    assert_eq!(handed[0]["call_id"], "toolu_c");

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": kind.name(), "previous_response_id": id_of(&first), "tools": [lookup_tool()],
               "input": [{"type": "function_call_output", "call_id": "toolu_c", "output": "a door"},
                         {"type": "function_call_output", "call_id": "toolu_s", "output": "{\"sum\":4}"}]}),
    )
    .await;

    assert_eq!(second["output_text"], "A gateway is a door; 4.");
    let sent = sent(kind, &gw.model.requests()[1]);
    assert_eq!(sent.lines.len(), 5, "{:?}", sent.lines);
    assert_eq!(sent.lines[0], "user:define gateway, add 2+2");
    let mut calls = sent.lines[1..3].to_vec();
    calls.sort();
    assert_eq!(
        calls,
        [
            "call:toolu_c:lookup:{\"word\":\"gateway\"}",
            "call:toolu_s:add:{\"a\":2,\"b\":2}"
        ]
    );
    let mut results = sent.lines[3..].to_vec();
    results.sort();
    assert_eq!(
        results,
        ["result:toolu_c:a door", "result:toolu_s:{\"sum\":4}"],
        "each output after the calls, paired by call id"
    );
    if kind == Kind::Anthropic {
        assert_eq!(sent.roles, ["user", "assistant", "user"]);
    }
}

/// The items of a response as `(type, text or name)`, ignoring ids.
fn shape(response: &Value) -> Vec<(String, String)> {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let detail = match i["type"].as_str().unwrap() {
                "message" => i["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                "reasoning" => i["summary"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                _ => format!(
                    "{}:{}",
                    i["name"].as_str().unwrap_or_default(),
                    i["output"].as_str().unwrap_or_default()
                ),
            };
            (i["type"].as_str().unwrap().to_owned(), detail)
        })
        .collect()
}

fn script_round(gw: &TestGateway, mode: StreamMode) {
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 1, "b": 1})).with_id("toolu_a"),
            Call::new("add", json!({"a": 2, "b": 2})).with_id("toolu_b"),
        ])
        .with_thinking("Two sums.", "SIG_1")
        .stream_mode(mode),
    );
    gw.model
        .push(Reply::text("2 and 4, done.").stream_mode(mode));
}

/// A streamed tool round gives the same output, usage and upstream requests as a whole one.
async fn a_streamed_tool_round_equals_the_whole_one(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    let request = json!({"model": kind.name(), "input": "two sums"});
    script_round(&gw, StreamMode::Normal);
    let whole = create_ok(&gw, &tenant.key, request.clone()).await;
    // The upstream numbers its reasoning items per answer: their ids differ between the two runs. Whether to
    // stream, and Chat's `stream_options` that goes with it, are the one intended difference.
    let without_reasoning_ids = |mut requests: Vec<Value>| {
        for request in &mut requests {
            let object = request.as_object_mut().unwrap();
            object.remove("stream");
            object.remove("stream_options");
            for item in request["input"].as_array_mut().into_iter().flatten() {
                if item["type"] == "reasoning" {
                    item.as_object_mut().unwrap().remove("id");
                }
            }
        }
        requests
    };
    let whole_requests = without_reasoning_ids(gw.model.requests());
    gw.model.reset();
    script_round(&gw, StreamMode::Normal);

    let checked = check_stream(post_stream(&gw, &tenant.key, request).await);

    assert_eq!(checked.terminal_kind(), "response.completed");
    assert_eq!(
        shape(&checked.terminal),
        shape(&whole),
        "{:#}",
        checked.terminal
    );
    assert_eq!(checked.terminal["usage"], whole["usage"]);
    let stored = get_response(&gw, &tenant.key, &checked.id()).await;
    assert_eq!(stored.body, checked.terminal);
    let streamed_requests = without_reasoning_ids(gw.model.requests());
    assert_eq!(streamed_requests.len(), 2);
    assert_eq!(
        streamed_requests, whole_requests,
        "the same requests, streamed or not"
    );
}

async fn an_overloaded_upstream_is_retried_and_a_400_is_passed_on(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    gw.model.push(Reply::error(529, "Overloaded"));
    gw.model.push(Reply::error(429, "Rate limited"));
    gw.model.push(Reply::text("made it"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": kind.name(), "input": "hi"}),
    )
    .await;
    assert_eq!(body["output_text"], "made it");
    assert_eq!(gw.model.requests().len(), 3);

    gw.model.push(Reply::error(
        400,
        "prompt is too long: 250000 tokens > 200000 maximum",
    ));
    let answer = gw
        .create(
            &tenant.key,
            json!({"model": kind.name(), "input": "too long"}),
        )
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert!(answer.error()["message"]
        .as_str()
        .unwrap()
        .contains("prompt is too long: 250000 tokens > 200000 maximum"));
    assert_eq!(gw.model.requests().len(), 4, "not retried");
}

async fn an_error_event_mid_stream_fails_the_streamed_response(kind: Kind) {
    let (gw, tenant) = gateway_of(kind).await;
    gw.model
        .push(Reply::text("Half an answer").stream_mode(StreamMode::ErrorMidStream));

    let checked = check_stream(
        post_stream(
            &gw,
            &tenant.key,
            json!({"model": kind.name(), "input": "hi"}),
        )
        .await,
    );

    assert_eq!(checked.terminal_kind(), "response.failed");
    assert_eq!(checked.error_event().unwrap()["code"], "server_error");
    assert_eq!(gw.model.requests().len(), 1, "text was shown: no retry");
}
