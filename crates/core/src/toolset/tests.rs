use super::*;
use crate::items::{CustomToolCallItem, CustomToolCallOutputItem, FunctionOutput, Item};
use crate::steps::{CallKind, ToolCall};
use serde_json::json;

fn tools(value: Value) -> Vec<DeclaredTool> {
    let Value::Array(values) = value else {
        unreachable!("not an array")
    };
    parse_tools(values).unwrap()
}

fn codex_like_tools() -> Vec<DeclaredTool> {
    tools(json!([
        {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "custom", "name": "apply_patch", "description": "Patch files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "namespace", "name": "mcp__github", "description": "GitHub",
         "tools": [{"type": "function", "name": "search_issues", "parameters": {"type": "object"}},
                   {"type": "custom", "name": "raw_query"}]},
        {"type": "web_search", "search_context_size": "low"},
        {"type": "tool_search"},
        {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example.com/"},
    ]))
}

#[test]
fn every_declared_type_round_trips_through_its_stored_json() {
    let declared = codex_like_tools();
    let stored = serde_json::to_value(&declared).unwrap();
    let back: Vec<DeclaredTool> = serde_json::from_value(stored.clone()).unwrap();
    assert_eq!(back, declared);
    assert_eq!(
        stored[3],
        json!({"type": "web_search", "search_context_size": "low"})
    );
    assert_eq!(stored[1]["format"]["syntax"], "lark");
}

#[test]
fn a_stored_function_without_a_type_is_read_as_a_function() {
    let old: Vec<DeclaredTool> =
        serde_json::from_value(json!([{"name": "f", "description": null, "parameters": {"type": "object"}, "strict": true}]))
            .unwrap();
    assert_eq!(
        old,
        vec![DeclaredTool::Function(FunctionTool {
            name: "f".into(),
            description: None,
            parameters: Some(json!({"type": "object"})),
            strict: Some(true),
        })]
    );
}

#[test]
fn namespaces_are_flattened_and_other_types_are_not_offered() {
    let offered = offered_client_tools(&codex_like_tools());
    let names: Vec<&str> = offered.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "shell",
            "apply_patch",
            "mcp__github__search_issues",
            "mcp__github__raw_query"
        ]
    );
    assert!(matches!(
        offered[1].input,
        ToolInput::Text { format: Some(_) }
    ));
    assert!(matches!(offered[3].input, ToolInput::Text { format: None }));
}

#[test]
fn flat_names_fit_every_provider() {
    assert_eq!(flat_name(None, "f"), "f");
    assert_eq!(flat_name(Some("crm"), "find"), "crm__find");
    assert_eq!(
        flat_name(Some("my server.v2"), "find"),
        "my_server_v2__find"
    );
    let long = flat_name(Some(&"n".repeat(80)), "tool");
    assert_eq!(long.len(), 64);
    assert!(is_valid_tool_name(&long), "{long}");
    assert_ne!(
        long,
        flat_name(Some(&"n".repeat(81)), "tool"),
        "the hash keeps them apart"
    );
    assert_eq!(long, flat_name(Some(&"n".repeat(80)), "tool"), "stable");
}

#[test]
fn calls_are_named_back_as_the_client_declared_them() {
    let declared = codex_like_tools();
    let mut calls = vec![
        ToolCall::function("fc_1", "c1", "shell", "{}"),
        ToolCall::function("fc_2", "c2", "apply_patch", "*** Begin Patch"),
        ToolCall::function("fc_3", "c3", "mcp__github__search_issues", "{\"q\":1}"),
        ToolCall::function("fc_4", "c4", "mcp__github__raw_query", "select"),
        ToolCall::function("fc_5", "c5", "get_weather", "{}"),
    ];
    name_calls(&declared, &mut calls);
    let named: Vec<(Option<&str>, &str, CallKind)> = calls
        .iter()
        .map(|c| (c.namespace.as_deref(), c.name.as_str(), c.kind))
        .collect();
    assert_eq!(
        named,
        [
            (None, "shell", CallKind::Function),
            (None, "apply_patch", CallKind::Custom),
            (Some("mcp__github"), "search_issues", CallKind::Function),
            (Some("mcp__github"), "raw_query", CallKind::Custom),
            (None, "get_weather", CallKind::Function),
        ]
    );
    let registered: BTreeSet<String> =
        ["get_weather".to_owned(), "search_issues".to_owned()].into();
    assert!(calls[4].is_server_call(&registered));
    assert!(
        !calls[2].is_server_call(&registered),
        "a namespaced call is the client's even when a server tool shares its name"
    );
}

#[test]
fn handed_back_calls_show_as_function_or_custom_items() {
    let mut custom = ToolCall::function("ctc_1", "c1", "raw_query", "select 1");
    custom.kind = CallKind::Custom;
    custom.namespace = Some("db".into());
    assert_eq!(
        serde_json::to_value(call_item(&custom, "completed")).unwrap(),
        json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "c1", "namespace": "db", "name": "raw_query",
               "input": "select 1", "status": "completed"})
    );
    let function = ToolCall::function("fc_1", "c2", "shell", "{}");
    assert_eq!(
        serde_json::to_value(call_item(&function, "completed")).unwrap(),
        json!({"type": "function_call", "id": "fc_1", "call_id": "c2", "name": "shell", "arguments": "{}",
               "status": "completed"})
    );
}

#[test]
fn custom_tools_become_functions_of_one_string_for_providers_without_them() {
    let mut offered = offered_client_tools(&codex_like_tools());
    let mut conversation = vec![
        Item::CustomToolCall(CustomToolCallItem {
            id: Some("ctc_1".into()),
            call_id: "c1".into(),
            namespace: None,
            name: "apply_patch".into(),
            input: "*** Begin \"Patch\"".into(),
            status: None,
        }),
        Item::CustomToolCallOutput(CustomToolCallOutputItem {
            id: None,
            call_id: "c1".into(),
            output: FunctionOutput::Text("Done".into()),
            status: None,
        }),
    ];
    custom_as_functions(&mut conversation, &mut offered);
    let Item::FunctionCall(call) = &conversation[0] else {
        unreachable!("{:?}", conversation[0])
    };
    assert_eq!(
        serde_json::from_str::<Value>(&call.arguments).unwrap(),
        json!({"input": "*** Begin \"Patch\""})
    );
    assert!(matches!(conversation[1], Item::FunctionCallOutput(_)));
    assert!(offered
        .iter()
        .all(|t| matches!(t.input, ToolInput::Json { .. })));
    let patch = offered.iter().find(|t| t.name == "apply_patch").unwrap();
    assert!(
        patch
            .description
            .as_deref()
            .is_some_and(|d| d.contains("lark grammar:\nstart:")),
        "the grammar is spelled out for the model: {:?}",
        patch.description
    );

    // And the model's answer comes back as the free-form text.
    let text_tools = offered_client_tools(&codex_like_tools());
    let mut calls = vec![
        ToolCall::function("fc_1", "c2", "apply_patch", r#"{"input": "line\nline"}"#),
        ToolCall::function("fc_2", "c3", "shell", r#"{"input": "kept"}"#),
        ToolCall::function("fc_3", "c4", "apply_patch", "not json"),
    ];
    unwrap_custom_inputs(&text_tools, &mut calls);
    assert_eq!(calls[0].arguments, "line\nline");
    assert_eq!(
        calls[1].arguments, r#"{"input": "kept"}"#,
        "a function's arguments are its own"
    );
    assert_eq!(calls[2].arguments, "not json", "kept as the model wrote it");
}

#[test]
fn namespaced_calls_reach_the_model_under_their_flat_name() {
    let mut conversation: Vec<Item> = serde_json::from_value(json!([
        {"type": "function_call", "call_id": "c1", "namespace": "crm", "name": "find", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c2", "namespace": "crm", "name": "raw", "input": "x"},
        {"type": "function_call", "call_id": "c3", "name": "plain", "arguments": "{}"},
    ]))
    .unwrap();
    flatten_namespaces(&mut conversation);
    let names: Vec<String> = conversation
        .iter()
        .map(|item| match item {
            Item::FunctionCall(c) => format!("{:?}/{}", c.namespace, c.name),
            Item::CustomToolCall(c) => format!("{:?}/{}", c.namespace, c.name),
            other => unreachable!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["None/crm__find", "None/crm__raw", "None/plain"]);
}

#[test]
fn clashing_names_are_refused_with_the_param_of_the_second() {
    let cases = [
        (
            json!([{"type": "function", "name": "f"}, {"type": "custom", "name": "f"}]),
            "tools[1].name",
        ),
        (
            json!([{"type": "function", "name": "crm__find"},
                   {"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "find"}]}]),
            "tools[1].tools[0].name",
        ),
        (
            json!([{"type": "namespace", "name": "crm", "tools": [
                {"type": "function", "name": "find"}, {"type": "custom", "name": "find"}]}]),
            "tools[0].tools[1].name",
        ),
    ];
    for (value, param) in cases {
        let Value::Array(values) = value.clone() else {
            unreachable!()
        };
        let err = parse_tools(values).unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some(param),
            "{value}: {}",
            err.message
        );
        assert!(err.message.contains("Duplicate"), "{}", err.message);
    }
}

#[test]
fn an_invalid_schema_is_refused_with_the_validators_reason() {
    let err = parse_tools(vec![json!({"type": "function", "name": "f",
        "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}})])
    .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools[0].parameters"));
    assert!(
        err.message.contains("not a valid JSON Schema"),
        "{}",
        err.message
    );
}

#[test]
fn tools_nothing_serves_are_listed_by_index() {
    let declared = codex_like_tools();
    let served: BTreeSet<String> = ["web_search".to_owned()].into();
    assert_eq!(
        unserved_tools(&declared, &served),
        [(4, "tool_search")],
        "a remote MCP server is the gateway's to serve, never left to the policy"
    );
}

#[test]
fn tool_choice_is_checked_and_shown_to_the_model_by_flat_name() {
    for valid in [
        json!("auto"),
        json!({"type": "function", "name": "f"}),
        json!({"type": "custom", "name": "apply_patch"}),
        json!({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]}),
        json!({"type": "mcp", "server_label": "docs"}),
        json!({"type": "web_search_preview"}),
    ] {
        assert_eq!(validate_tool_choice(&valid), Ok(()), "{valid}");
    }
    for invalid in [
        json!("sometimes"),
        json!({"type": "function"}),
        json!({"type": "allowed_tools", "mode": "maybe", "tools": []}),
        json!(5),
    ] {
        assert!(validate_tool_choice(&invalid).is_err(), "{invalid}");
    }
    let offered = offered_client_tools(&codex_like_tools());
    assert_eq!(
        model_tool_choice(&json!({"type": "custom", "name": "apply_patch"}), &offered),
        json!({"type": "custom", "name": "apply_patch"})
    );
    assert_eq!(
        model_tool_choice(&json!({"type": "web_search"}), &offered),
        json!("auto"),
        "a tool the model is not offered"
    );
    let mut bound = offered.clone();
    bound.push(OfferedTool {
        name: "web_search".into(),
        description: Some("Search the web.".into()),
        input: ToolInput::Json {
            parameters: json!({"type": "object"}),
            strict: None,
        },
    });
    assert_eq!(
        model_tool_choice(&json!({"type": "web_search"}), &bound),
        json!({"type": "function", "name": "web_search"}),
        "a hosted type a bound source serves"
    );
    assert_eq!(
        model_tool_choice(&json!("required"), &offered),
        json!("required")
    );
}
