//! The pure checks a request passes before its response runs: which hosted types the server tools serve, whether
//! the request's tools, `tool_choice` and remote MCP tool names fit with them, what the deployment does with
//! tools nothing serves, and how `item_reference`s become items. The engine fetches and stores; these decide.

use std::collections::{BTreeSet, HashMap};

use crate::context::PairingError;
use crate::entity::ProviderKind;
use crate::items::{ContentPart, InputItem, McpCallItem, MessageContent, MessageItem, Role};
use crate::request::ResponseParams;
use crate::toolset::{
    forced_tool_name, unserved_tools, DeclaredTool, UnsupportedTools, IGNORED_TOOLS_KEY,
};
use crate::Item;
use serde_json::Value;

/// Why a request is refused before anything runs. Each names the offending tool or input by its index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreparationError {
    /// A client tool has the name of a server tool the key may use.
    #[error("client tool '{name}' clashes with a server tool")]
    ToolNameConflict { name: String, index: usize },
    /// `tool_choice` names a tool that is not among the tools.
    #[error("tool_choice names '{name}', which is not among the tools")]
    UnknownToolChoice { name: String },
    /// The deployment refuses tools of a type nothing serves (`unsupported_tools: reject`).
    #[error("tools of type '{kind}' are not supported by this deployment")]
    UnsupportedTool { kind: String, index: usize },
    /// The deployment refuses parameters its provider kind cannot honour (`unsupported_params: reject`).
    #[error("parameter '{param}' is not supported by this deployment")]
    UnsupportedParam { param: &'static str },
    /// A tool of a remote MCP server has the name of another tool of the request or of the key.
    #[error("MCP tool '{name}' of '{server_label}' clashes with another tool")]
    RemoteToolClash {
        name: String,
        server_label: String,
        index: usize,
    },
    /// An `item_reference` names no stored item of this project.
    #[error("item '{id}' not found")]
    ItemNotFound { id: String, index: usize },
}

/// A server tool as the hosted binding sees it: its name, and the hosted type its source serves, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bindable<'a> {
    pub name: &'a str,
    pub hosted: Option<&'a str>,
}

/// What the hosted binding decided, tool by tool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostedBinding {
    /// For each tool, in order: the name it is offered under, or `None` when it is left out.
    pub offered_as: Vec<Option<String>>,
    /// The hosted types served.
    pub served: BTreeSet<String>,
}

/// Which server tools a request may use, given the hosted tools it declares (SPEC 12). A tool bound to a hosted
/// type serves it only for a request that declares a tool of that type: it is then offered under the type's own
/// name (`web_search`). A request that does not declare the type is not offered the tool at all. When several
/// tools bind one type, the first serves it; a bound tool whose type is already the name of an unbound tool
/// serves nothing, and the declared tool is left to the deployment's policy.
pub fn bind_hosted(tools: &[Bindable<'_>], declared: &[DeclaredTool]) -> HostedBinding {
    let declared: BTreeSet<&str> = declared
        .iter()
        .filter_map(|tool| match tool {
            DeclaredTool::Other(other) if !other.is_mcp() => Some(other.kind.as_str()),
            _ => None,
        })
        .collect();
    let plain: BTreeSet<&str> = tools
        .iter()
        .filter(|t| t.hosted.is_none())
        .map(|t| t.name)
        .collect();
    let mut binding = HostedBinding::default();
    for tool in tools {
        let offered = match tool.hosted {
            None => Some(tool.name.to_owned()),
            Some(hosted)
                if declared.contains(hosted)
                    && !binding.served.contains(hosted)
                    && !plain.contains(hosted) =>
            {
                binding.served.insert(hosted.to_owned());
                Some(hosted.to_owned())
            }
            Some(_) => None,
        };
        binding.offered_as.push(offered);
    }
    binding
}

/// Client tools may not take the name of a server tool the key may use, and `tool_choice` must name a tool
/// that exists.
pub fn check_tools(
    params: &ResponseParams,
    server_tools: &BTreeSet<String>,
) -> Result<(), PreparationError> {
    for (index, tool) in params.tools.iter().enumerate() {
        if let Some(name) = tool
            .model_names()
            .into_iter()
            .find(|name| server_tools.contains(name))
        {
            return Err(PreparationError::ToolNameConflict { name, index });
        }
    }
    if let Some(name) = forced_tool_name(&params.tool_choice) {
        let known = server_tools.contains(name)
            || params.tools.iter().any(|tool| {
                tool.model_names().iter().any(|n| n == name)
                    || matches!(tool, DeclaredTool::Namespace(ns) if ns.tools.iter().any(|m| m.name() == name))
            });
        if !known {
            return Err(PreparationError::UnknownToolChoice {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

/// A tool of one of the request's own MCP servers: its name, and its server's `server_label`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteName<'a> {
    pub name: &'a str,
    pub server_label: &'a str,
}

/// The tools of the request's own MCP servers may not take the name of a client tool, of a server tool the key
/// may use, or of another server's tool: a model could not tell them apart.
pub fn check_remote_names(
    params: &ResponseParams,
    server_tools: &BTreeSet<String>,
    remote: &[RemoteName<'_>],
) -> Result<(), PreparationError> {
    let client: BTreeSet<String> = params
        .tools
        .iter()
        .flat_map(DeclaredTool::model_names)
        .collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for tool in remote {
        let clashes = client.contains(tool.name)
            || server_tools.contains(tool.name)
            || !seen.insert(tool.name);
        if clashes {
            let index = params
                .tools
                .iter()
                .position(|t| {
                    matches!(t, DeclaredTool::Other(o) if o.is_mcp()
                        && o.settings.get("server_label").and_then(|l| l.as_str()) == Some(tool.server_label))
                })
                .unwrap_or_default();
            return Err(PreparationError::RemoteToolClash {
                name: tool.name.to_owned(),
                server_label: tool.server_label.to_owned(),
                index,
            });
        }
    }
    Ok(())
}

/// Declared tools that no model is offered and no source serves (SPEC 12): the request refused (`reject`), or
/// the tools left out and their types listed in the response's metadata (`ignore`). Answers the list written,
/// if any.
pub fn apply_unsupported_tools(
    params: &mut ResponseParams,
    served: &BTreeSet<String>,
    policy: UnsupportedTools,
) -> Result<Option<String>, PreparationError> {
    let unserved = unserved_tools(&params.tools, served);
    let Some(&(index, kind)) = unserved.first() else {
        return Ok(None);
    };
    match policy {
        UnsupportedTools::Reject => Err(PreparationError::UnsupportedTool {
            kind: kind.to_owned(),
            index,
        }),
        UnsupportedTools::Ignore => {
            let mut kinds: Vec<&str> = unserved.iter().map(|(_, kind)| *kind).collect();
            kinds.dedup();
            let listed = kinds.join(",");
            params
                .metadata
                .insert(IGNORED_TOOLS_KEY.to_owned(), listed.clone());
            Ok(Some(listed))
        }
    }
}

/// The `metadata` key that lists the create parameters the deployment's provider kind could not honour.
pub const IGNORED_PARAMS_KEY: &str = "gateway_ignored_params";

/// The parameters `params` sets that a deployment of `kind` does not honour: sent nowhere, or not as asked
/// (`docs/behaviour.md`, "Request fields", has the table these follow).
pub fn ignored_params(kind: ProviderKind, params: &ResponseParams) -> Vec<&'static str> {
    let reasoning_summary = params
        .reasoning
        .as_ref()
        .and_then(|r| r.get("summary"))
        .is_some_and(|s| !s.is_null());
    let mut ignored = Vec::new();
    // Open Responses' penalties: Chat Completions has them; OpenAI's Responses API and Anthropic do not.
    if kind != ProviderKind::OpenaiChat {
        for (param, value) in [
            ("presence_penalty", params.presence_penalty),
            ("frequency_penalty", params.frequency_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                ignored.push(param);
            }
        }
    }
    match kind {
        ProviderKind::OpenaiResponses => {}
        ProviderKind::OpenaiChat => {
            if reasoning_summary {
                ignored.push("reasoning.summary");
            }
        }
        ProviderKind::Anthropic => {
            // JSON formats become a forced tool, which Anthropic refuses while thinking.
            let thinking = crate::anthropic::thinking_budget(params.reasoning.as_ref()).is_some();
            let format = params.text.pointer("/format/type").and_then(Value::as_str);
            let mapped = matches!(format, Some("json_schema" | "json_object")) && !thinking;
            if format.is_some_and(|f| f != "text") && !mapped {
                ignored.push("text.format");
            }
            if params.text.get("verbosity").is_some_and(|v| !v.is_null()) {
                ignored.push("text.verbosity");
            }
            if reasoning_summary {
                ignored.push("reasoning.summary");
            }
            if params.top_logprobs.is_some_and(|n| n > 0) {
                ignored.push("top_logprobs");
            }
            if params.prompt_cache_key.is_some() {
                ignored.push("prompt_cache_key");
            }
            if params.service_tier.is_some() {
                ignored.push("service_tier");
            }
            if crate::anthropic::thinking_budget(params.reasoning.as_ref()).is_some() {
                if params.temperature.is_some() {
                    ignored.push("temperature");
                }
                if params.top_p.is_some() {
                    ignored.push("top_p");
                }
                let forced = match &params.tool_choice {
                    Value::String(mode) => mode == "required",
                    Value::Object(choice) => {
                        choice.get("type").and_then(Value::as_str) != Some("auto")
                    }
                    _ => false,
                };
                if forced && !params.tools.is_empty() {
                    ignored.push("tool_choice");
                }
            }
        }
    }
    ignored
}

/// The kinds of content in `input`'s user messages and tool outputs that a deployment of `kind` cannot take, as
/// named in `gateway_ignored_params`: for Chat Completions an image by file id and a file by URL alone, and any
/// image or file in a tool's output (`function_call_output.input_image`, `….input_file`: a `tool` message is
/// text); for Anthropic an image by file id, file data other than a PDF, and a file by id alone, in a message or
/// a tool's output (`function_call_output.…`). The Responses API takes them all.
pub fn ignored_content(kind: ProviderKind, input: &[InputItem]) -> Vec<&'static str> {
    let mut ignored = Vec::new();
    for item in input {
        let InputItem::Item(item) = item else {
            continue;
        };
        let names: Vec<&'static str> = match item {
            Item::Message(MessageItem {
                role: Role::User,
                content: MessageContent::Parts(parts),
                ..
            }) => parts
                .iter()
                .filter_map(|part| message_part_ignored(kind, part))
                .collect(),
            Item::FunctionCallOutput(output) | Item::CustomToolCallOutput(output) => output
                .output
                .parts()
                .unwrap_or_default()
                .iter()
                .filter_map(|part| output_part_ignored(kind, part))
                .collect(),
            _ => continue,
        };
        for name in names {
            if !ignored.contains(&name) {
                ignored.push(name);
            }
        }
    }
    ignored
}

/// What of a tool output's content part a deployment of `kind` cannot take: Chat takes a tool's text alone (a
/// `tool` message is text); Messages takes images and PDFs in a `tool_result`, as in a user's message.
fn output_part_ignored(kind: ProviderKind, part: &ContentPart) -> Option<&'static str> {
    Some(match (kind, part) {
        (ProviderKind::OpenaiChat, ContentPart::InputImage { .. }) => {
            "function_call_output.input_image"
        }
        (ProviderKind::OpenaiChat, ContentPart::InputFile { .. }) => {
            "function_call_output.input_file"
        }
        (ProviderKind::Anthropic, part) => match message_part_ignored(kind, part)? {
            "input_image.file_id" => "function_call_output.input_image.file_id",
            "input_file.file_data" => "function_call_output.input_file.file_data",
            _ => "function_call_output.input_file.file_id",
        },
        _ => return None,
    })
}

/// What of a user message's content part a deployment of `kind` cannot take, named as it is listed.
fn message_part_ignored(kind: ProviderKind, part: &ContentPart) -> Option<&'static str> {
    Some(match (kind, part) {
        (ProviderKind::OpenaiResponses, _) => return None,
        (
            _,
            ContentPart::InputImage {
                image_url: None, ..
            },
        ) => "input_image.file_id",
        (
            ProviderKind::OpenaiChat,
            ContentPart::InputFile {
                file_data: None,
                file_id: None,
                ..
            },
        ) => "input_file.file_url",
        (
            ProviderKind::Anthropic,
            ContentPart::InputFile {
                file_data: Some(data),
                ..
            },
        ) if crate::anthropic::pdf_data(data).is_none() => "input_file.file_data",
        (
            ProviderKind::Anthropic,
            ContentPart::InputFile {
                file_data: None,
                file_url: None,
                ..
            },
        ) => "input_file.file_id",
        _ => return None,
    })
}

/// The parameters (and kinds of `input` content) a deployment of `kind` does not honour, as its `policy` says:
/// listed under `metadata.gateway_ignored_params` (comma-separated; what was listed is answered), or refused
/// naming the first.
pub fn apply_ignored_params(
    params: &mut ResponseParams,
    input: &[InputItem],
    kind: ProviderKind,
    policy: UnsupportedTools,
) -> Result<Option<String>, PreparationError> {
    let mut ignored = ignored_params(kind, params);
    ignored.extend(ignored_content(kind, input));
    let Some(first) = ignored.first() else {
        return Ok(None);
    };
    if policy == UnsupportedTools::Reject {
        return Err(PreparationError::UnsupportedParam { param: first });
    }
    let listed = ignored.join(",");
    params
        .metadata
        .insert(IGNORED_PARAMS_KEY.to_owned(), listed.clone());
    Ok(Some(listed))
}

/// The ids of stored items the input names (`item_reference`s and hosted calls sent back), to be looked up.
pub fn referenced_ids(input: &[InputItem]) -> Vec<&str> {
    input
        .iter()
        .filter_map(|item| match item {
            InputItem::Item(_) | InputItem::Hosted { id: None } => None,
            InputItem::Reference { id } | InputItem::Hosted { id: Some(id) } => Some(id.as_str()),
        })
        .collect()
}

/// The input with each `item_reference` replaced by the stored item it names (SPEC 5), given the items `found`
/// by id. A hosted call sent back stands for the stored hosted call it shows, if it is one, and for nothing
/// otherwise.
pub fn resolve_input(
    input: Vec<InputItem>,
    found: &HashMap<String, Item>,
) -> Result<Vec<Item>, PreparationError> {
    let mut items = Vec::with_capacity(input.len());
    for (index, item) in input.into_iter().enumerate() {
        match item {
            InputItem::Item(item) => items.push(item),
            InputItem::Reference { id } => match found.get(&id) {
                Some(item) => items.push(item.clone()),
                None => return Err(PreparationError::ItemNotFound { id, index }),
            },
            InputItem::Hosted { id } => {
                let stored = id.and_then(|id| found.get(&id));
                if let Some(
                    item @ Item::McpCall(McpCallItem {
                        hosted_type: Some(_),
                        ..
                    }),
                ) = stored
                {
                    items.push(item.clone());
                }
            }
        }
    }
    Ok(items)
}

/// The `param` a pairing error names: the request's input item when it is one (`first_new` is where the input
/// starts in the context); `earlier` when it lies in what came before the input (`conversation` for a
/// conversation's items, `input` for the previous response's context).
pub fn pairing_param(error: &PairingError, first_new: usize, earlier: &str) -> String {
    match error.index() {
        Some(index) if index >= first_new => format!("input[{}]", index - first_new),
        _ => earlier.to_owned(),
    }
}

#[cfg(test)]
#[path = "preparation_tests.rs"]
mod tests;
