#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};

use super::*;

fn declared(tools: &[Value]) -> Vec<DeclaredTool> {
    tools
        .iter()
        .map(|t| DeclaredTool::from_json(t.clone()).unwrap())
        .collect()
}

fn params(tools: &[Value], tool_choice: Value) -> ResponseParams {
    ResponseParams {
        tools: declared(tools),
        tool_choice,
        ..ResponseParams::default()
    }
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn function(name: &str) -> Value {
    json!({"type": "function", "name": name, "parameters": {"type": "object"}})
}

fn mcp_server(label: &str) -> Value {
    json!({"type": "mcp", "server_label": label, "server_url": "https://mcp.example/"})
}

#[test]
fn hosted_binding_offers_a_bound_tool_only_for_a_declared_type_and_only_once() {
    let tools = [
        Bindable {
            name: "add",
            hosted: None,
        },
        Bindable {
            name: "search_a",
            hosted: Some("web_search"),
        },
        Bindable {
            name: "search_b",
            hosted: Some("web_search"),
        },
        Bindable {
            name: "files",
            hosted: Some("file_search"),
        },
        Bindable {
            name: "web_search_x",
            hosted: Some("code_interpreter"),
        },
        Bindable {
            name: "code_interpreter",
            hosted: None,
        },
    ];
    type Case<'a> = (&'a [Value], [Option<&'a str>; 6], &'a [&'a str]);
    let cases: [Case<'_>; 3] = [
        (
            &[],
            [
                Some("add"),
                None,
                None,
                None,
                None,
                Some("code_interpreter"),
            ],
            &[],
        ),
        (
            &[
                json!({"type": "web_search"}),
                json!({"type": "tool_search"}),
            ],
            [
                Some("add"),
                Some("web_search"),
                None,
                None,
                None,
                Some("code_interpreter"),
            ],
            &["web_search"],
        ),
        // A type that is already an unbound tool's name is served by nothing; an MCP server is no hosted type.
        (
            &[json!({"type": "code_interpreter"}), mcp_server("files")],
            [
                Some("add"),
                None,
                None,
                None,
                None,
                Some("code_interpreter"),
            ],
            &[],
        ),
    ];
    for (declared_tools, offered, served) in cases {
        let binding = bind_hosted(&tools, &declared(declared_tools));
        let offered: Vec<Option<String>> = offered.iter().map(|o| o.map(str::to_owned)).collect();
        assert_eq!(binding.offered_as, offered, "{declared_tools:?}");
        assert_eq!(binding.served, names(served), "{declared_tools:?}");
    }
}

#[test]
fn client_tools_and_tool_choice_are_checked_against_the_server_tools() {
    let server = names(&["add"]);
    let cases = [
        (params(&[function("mul")], Value::Null), Ok(())),
        (
            params(&[function("mul"), function("add")], Value::Null),
            Err(PreparationError::ToolNameConflict {
                name: "add".into(),
                index: 1,
            }),
        ),
        (
            params(&[], json!({"type": "function", "name": "add"})),
            Ok(()),
        ),
        (
            params(
                &[function("mul")],
                json!({"type": "function", "name": "mul"}),
            ),
            Ok(()),
        ),
        (
            params(
                &[function("mul")],
                json!({"type": "function", "name": "div"}),
            ),
            Err(PreparationError::UnknownToolChoice { name: "div".into() }),
        ),
        (params(&[], json!("auto")), Ok(())),
    ];
    for (params, expected) in cases {
        assert_eq!(
            check_tools(&params, &server),
            expected,
            "{:?}",
            params.tool_choice
        );
    }
}

#[test]
fn a_remote_tool_may_not_take_a_name_already_used() {
    let params = params(
        &[function("mul"), mcp_server("a"), mcp_server("b")],
        Value::Null,
    );
    let server = names(&["add"]);
    let clash = |name: &str, label: &str, index| {
        Err(PreparationError::RemoteToolClash {
            name: name.into(),
            server_label: label.into(),
            index,
        })
    };
    let cases: [(&[RemoteName<'_>], Result<(), PreparationError>); 4] = [
        (
            &[
                RemoteName {
                    name: "ask",
                    server_label: "a",
                },
                RemoteName {
                    name: "read",
                    server_label: "b",
                },
            ],
            Ok(()),
        ),
        (
            &[RemoteName {
                name: "mul",
                server_label: "a",
            }],
            clash("mul", "a", 1),
        ),
        (
            &[RemoteName {
                name: "add",
                server_label: "b",
            }],
            clash("add", "b", 2),
        ),
        (
            &[
                RemoteName {
                    name: "ask",
                    server_label: "a",
                },
                RemoteName {
                    name: "ask",
                    server_label: "b",
                },
            ],
            clash("ask", "b", 2),
        ),
    ];
    for (remote, expected) in cases {
        assert_eq!(
            check_remote_names(&params, &server, remote),
            expected,
            "{remote:?}"
        );
    }
}

#[test]
fn unserved_tools_are_refused_or_listed_in_the_metadata_as_the_deployment_says() {
    let tools = [
        function("mul"),
        json!({"type": "web_search"}),
        json!({"type": "file_search"}),
    ];
    let cases = [
        (
            &["web_search", "file_search"][..],
            UnsupportedTools::Reject,
            Ok(None),
        ),
        (
            &["web_search"][..],
            UnsupportedTools::Reject,
            Err(PreparationError::UnsupportedTool {
                kind: "file_search".into(),
                index: 2,
            }),
        ),
        (
            &[][..],
            UnsupportedTools::Ignore,
            Ok(Some("web_search,file_search".to_owned())),
        ),
    ];
    for (served, policy, expected) in cases {
        let mut params = params(&tools, Value::Null);
        let answer = apply_unsupported_tools(&mut params, &names(served), policy);
        assert_eq!(answer, expected, "{served:?} {policy:?}");
        assert_eq!(
            params.metadata.get(IGNORED_TOOLS_KEY),
            expected.ok().flatten().as_ref(),
            "{served:?} {policy:?}"
        );
    }
}

fn hosted_call(id: &str, hosted: Option<&str>) -> Item {
    serde_json::from_value(json!({
        "type": "mcp_call", "id": id, "server_label": "gateway", "name": "web_search", "arguments": "{}",
        "output": "found", "hosted_type": hosted,
    }))
    .unwrap()
}

#[test]
fn references_become_the_items_they_name_and_a_hosted_call_only_a_stored_hosted_call() {
    let found: HashMap<String, Item> = [
        ("msg_1".to_owned(), Item::user_text("stored")),
        ("ws_1".to_owned(), hosted_call("ws_1", Some("web_search"))),
        ("mcp_1".to_owned(), hosted_call("mcp_1", None)),
    ]
    .into_iter()
    .collect();
    let input = vec![
        InputItem::Item(Item::user_text("new")),
        InputItem::Reference { id: "msg_1".into() },
        InputItem::Hosted {
            id: Some("ws_1".into()),
        },
        InputItem::Hosted {
            id: Some("mcp_1".into()),
        },
        InputItem::Hosted {
            id: Some("nowhere".into()),
        },
        InputItem::Hosted { id: None },
    ];
    assert_eq!(
        referenced_ids(&input),
        ["msg_1", "ws_1", "mcp_1", "nowhere"]
    );
    let items = resolve_input(input, &found).unwrap();
    assert_eq!(
        items,
        [
            Item::user_text("new"),
            Item::user_text("stored"),
            hosted_call("ws_1", Some("web_search"))
        ]
    );

    let missing = vec![
        InputItem::Item(Item::user_text("new")),
        InputItem::Reference { id: "msg_9".into() },
    ];
    assert_eq!(
        resolve_input(missing, &found),
        Err(PreparationError::ItemNotFound {
            id: "msg_9".into(),
            index: 1
        })
    );
}

#[test]
fn a_pairing_error_names_the_input_item_or_else_what_came_before_it() {
    let at = |index| PairingError::OrphanOutput {
        call_id: "c".into(),
        index,
    };
    let cases = [
        (at(5), 3, "input", "input[2]"),
        (at(3), 3, "input", "input[0]"),
        (at(1), 3, "input", "input"),
        (at(4), 3, "conversation", "input[1]"),
        (at(1), 3, "conversation", "conversation"),
    ];
    for (error, first_new, earlier, expected) in cases {
        assert_eq!(
            pairing_param(&error, first_new, earlier),
            expected,
            "{error:?}"
        );
    }
}

#[test]
fn parameters_a_kind_cannot_honour_are_listed_under_the_metadata() {
    let mut params = ResponseParams {
        text: json!({"format": {"type": "json_schema", "name": "x", "schema": {}}, "verbosity": "low"}),
        reasoning: Some(json!({"effort": "high", "summary": "auto"})),
        top_logprobs: Some(2),
        prompt_cache_key: Some("k".into()),
        service_tier: Some("flex".into()),
        temperature: Some(0.3),
        top_p: Some(0.9),
        ..params(&[function("f")], json!("required"))
    };
    assert_eq!(
        ignored_params(ProviderKind::Anthropic, &params),
        [
            "text.format",
            "text.verbosity",
            "reasoning.summary",
            "top_logprobs",
            "prompt_cache_key",
            "service_tier",
            "temperature",
            "top_p",
            "tool_choice"
        ]
    );
    assert_eq!(
        ignored_params(ProviderKind::OpenaiChat, &params),
        ["reasoning.summary"]
    );
    assert!(ignored_params(ProviderKind::OpenaiResponses, &params).is_empty());
    // Without thinking, Anthropic takes the sampling parameters and a forced tool.
    params.reasoning = None;
    assert!(!ignored_params(ProviderKind::Anthropic, &params).contains(&"temperature"));
    assert!(!ignored_params(ProviderKind::Anthropic, &params).contains(&"tool_choice"));
    // What is listed lands in the metadata; a request that sets nothing unhonoured gets no key.
    let ignore = UnsupportedTools::Ignore;
    let listed = apply_ignored_params(&mut params, &[], ProviderKind::OpenaiChat, ignore).unwrap();
    assert_eq!(listed, None);
    let listed = apply_ignored_params(&mut params, &[], ProviderKind::Anthropic, ignore).unwrap();
    assert_eq!(params.metadata.get(IGNORED_PARAMS_KEY), listed.as_ref());
    let mut plain = ResponseParams::default();
    assert_eq!(
        apply_ignored_params(&mut plain, &[], ProviderKind::Anthropic, ignore).unwrap(),
        None
    );
    assert!(plain.metadata.is_empty());
    // A deployment that rejects them refuses the create, naming the first.
    let mut refused = ResponseParams {
        service_tier: Some("flex".into()),
        ..ResponseParams::default()
    };
    let reject = UnsupportedTools::Reject;
    let error =
        apply_ignored_params(&mut refused, &[], ProviderKind::Anthropic, reject).unwrap_err();
    assert!(
        matches!(
            error,
            PreparationError::UnsupportedParam {
                param: "service_tier"
            }
        ),
        "{error:?}"
    );
    assert!(refused.metadata.is_empty());
    let mut nothing_set = ResponseParams::default();
    assert_eq!(
        apply_ignored_params(&mut nothing_set, &[], ProviderKind::Anthropic, reject).unwrap(),
        None
    );
}

#[test]
fn files_a_provider_kind_cannot_take_are_listed_once_each() {
    let input: Vec<InputItem> = [
        json!({"role": "user", "content": [
            {"type": "input_file", "file_url": "https://x/a.pdf"},
            {"type": "input_file", "file_url": "https://x/b.pdf"},
            {"type": "input_file", "file_data": "data:text/csv;base64,YSxi"},
            {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER"},
            {"type": "input_file", "file_id": "file-1"},
            {"type": "input_image", "file_id": "file-2"}]}),
        json!({"role": "user", "content": "no parts"}),
        json!({"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_text", "text": "t"},
            {"type": "input_image", "image_url": "https://x/p.png"},
            {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER"},
            {"type": "input_file", "file_id": "file-3"}]}),
    ]
    .into_iter()
    .map(|value| crate::items::parse_input_item(value).unwrap())
    .collect();

    assert_eq!(
        ignored_content(ProviderKind::OpenaiChat, &input),
        [
            "input_file.file_url",
            "input_image.file_id",
            "function_call_output.input_image",
            "function_call_output.input_file"
        ]
    );
    assert_eq!(
        ignored_content(ProviderKind::Anthropic, &input),
        [
            "input_file.file_data",
            "input_file.file_id",
            "input_image.file_id",
            "function_call_output.input_file.file_id"
        ]
    );
    assert!(ignored_content(ProviderKind::OpenaiResponses, &input).is_empty());
    // Listed with the parameters, or refused naming the first.
    let mut params = ResponseParams::default();
    let listed = apply_ignored_params(
        &mut params,
        &input,
        ProviderKind::OpenaiChat,
        UnsupportedTools::Ignore,
    );
    assert_eq!(
        listed.unwrap().as_deref(),
        Some("input_file.file_url,input_image.file_id,function_call_output.input_image,function_call_output.input_file")
    );
    let refused = apply_ignored_params(
        &mut ResponseParams::default(),
        &input,
        ProviderKind::Anthropic,
        UnsupportedTools::Reject,
    );
    assert!(
        matches!(
            refused,
            Err(PreparationError::UnsupportedParam {
                param: "input_file.file_data"
            })
        ),
        "{refused:?}"
    );
}
