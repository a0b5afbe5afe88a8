//! Conversations (OpenAI's Conversations API): the bodies of their routes read and checked, the `conversation` a
//! create names, and a conversation's items as a client is shown them.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::items::{parse_input_item, InputItem, Item};
use crate::output::{client_item_json, listed_input_item};
use crate::request::{validate_metadata, InvalidRequest};

/// Items a create or an items `POST` may add at once, as OpenAI allows.
pub const MAX_ITEMS_PER_ADD: usize = 20;

/// Reads the `conversation` of a create: an id, or `{"id"}`.
pub fn conversation_id(value: &Value) -> Result<String, InvalidRequest> {
    let id = match value {
        Value::String(id) => Some(id.as_str()),
        Value::Object(map) => map.get("id").and_then(Value::as_str),
        _ => None,
    };
    match id {
        Some(id) if !id.trim().is_empty() => Ok(id.to_owned()),
        Some(_) => Err(InvalidRequest::new(
            "'conversation' must not be empty.",
            "conversation",
        )),
        None => Err(InvalidRequest::new(
            "Invalid 'conversation': expected a conversation id or an object with its 'id'.",
            "conversation",
        )),
    }
}

/// Reads `metadata` of a conversation's create or update: string values, within OpenAI's bounds.
pub fn read_metadata(value: Option<Value>) -> Result<BTreeMap<String, String>, InvalidRequest> {
    let metadata = match value {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => {
            let mut metadata = BTreeMap::new();
            for (key, value) in map {
                let Value::String(value) = value else {
                    return Err(InvalidRequest::new(
                        format!("Invalid 'metadata': the value of '{key}' must be a string."),
                        "metadata",
                    ));
                };
                metadata.insert(key, value);
            }
            metadata
        }
        Some(_) => {
            return Err(InvalidRequest::new(
                "Invalid 'metadata': expected an object of string values.",
                "metadata",
            ))
        }
    };
    validate_metadata(&metadata)?;
    Ok(metadata)
}

/// Reads the `items` a conversation's create or an items `POST` adds (at most [`MAX_ITEMS_PER_ADD`]); each error
/// names the item (`items[2]`). References are resolved by the shell, which can read stored items.
pub fn read_items(value: Option<Value>, required: bool) -> Result<Vec<InputItem>, InvalidRequest> {
    let items = match value {
        None | Some(Value::Null) if required => {
            return Err(
                InvalidRequest::new("Missing required parameter: 'items'.", "items")
                    .with_code("missing_required_parameter"),
            )
        }
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(InvalidRequest::new(
                format!(
                    "Invalid 'items': expected an array of items, got {}.",
                    crate::items::json_kind(&other)
                ),
                "items",
            ))
        }
    };
    if items.len() > MAX_ITEMS_PER_ADD {
        return Err(InvalidRequest::new(
            format!(
                "Invalid 'items': at most {MAX_ITEMS_PER_ADD} items may be added at once, got {}.",
                items.len()
            ),
            "items",
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            parse_input_item(item).map_err(|e| {
                InvalidRequest::new(
                    format!("Invalid 'items[{index}]': {}.", e.message),
                    format!("items[{index}]"),
                )
            })
        })
        .collect()
}

/// The conversation object (`{"id", "object": "conversation", "created_at", "metadata"}`).
pub fn conversation_object(id: &str, created_at: i64, metadata: &Value) -> Value {
    json!({
        "id": id,
        "object": "conversation",
        "created_at": created_at,
        "metadata": if metadata.is_object() { metadata.clone() } else { json!({}) },
    })
}

/// A stored conversation item as a client is shown it: in the shape of a response's output item, reasoning
/// without its encrypted content unless `include` asks for it, and `status` on the items that carry one.
pub fn conversation_item_json(stored: Value, include: Option<&[String]>) -> Value {
    let mut shown = match serde_json::from_value::<Item>(stored.clone()) {
        // A message's text given as a string is shown as one text part, as OpenAI shows it.
        Ok(item) => listed_input_item(client_item_json(&crate::reasoning::shown(&item, include))),
        Err(_) => listed_input_item(stored),
    };
    let carries_status = matches!(
        shown.get("type").and_then(Value::as_str),
        Some(
            "message"
                | "function_call"
                | "function_call_output"
                | "custom_tool_call"
                | "custom_tool_call_output"
        )
    );
    if let Some(map) = shown.as_object_mut() {
        if carries_status && !map.get("status").is_some_and(Value::is_string) {
            map.insert("status".into(), json!("completed"));
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_is_named_by_its_id_or_an_object_holding_it() {
        assert_eq!(conversation_id(&json!("conv_1")).unwrap(), "conv_1");
        assert_eq!(conversation_id(&json!({"id": "conv_2"})).unwrap(), "conv_2");
        for bad in [
            json!(""),
            json!({"id": ""}),
            json!({}),
            json!(3),
            json!({"id": 4}),
        ] {
            let error = conversation_id(&bad).unwrap_err();
            assert_eq!(error.param.as_deref(), Some("conversation"), "{bad}");
        }
    }

    #[test]
    fn metadata_holds_strings_within_openais_bounds() {
        assert_eq!(
            read_metadata(Some(json!({"topic": "demo"}))).unwrap(),
            BTreeMap::from([("topic".to_owned(), "demo".to_owned())])
        );
        assert!(read_metadata(None).unwrap().is_empty());
        for bad in [
            json!({"n": 1}),
            json!("x"),
            json!((0..17)
                .map(|i| (format!("k{i}"), json!("v")))
                .collect::<serde_json::Map<_, _>>()),
            json!({"k": "v".repeat(513)}),
        ] {
            let error = read_metadata(Some(bad.clone())).unwrap_err();
            assert_eq!(error.param.as_deref(), Some("metadata"), "{bad}");
        }
    }

    #[test]
    fn items_are_read_with_errors_that_name_them() {
        let items = read_items(
            Some(json!([{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_1"}])),
            true,
        )
        .unwrap();
        assert_eq!(items.len(), 2);
        let error = read_items(
            Some(json!([{"role": "user", "content": "hi"}, {"type": "bogus"}])),
            true,
        )
        .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("items[1]"));
        assert_eq!(
            read_items(None, true).unwrap_err().param.as_deref(),
            Some("items")
        );
        assert!(read_items(None, false).unwrap().is_empty());
        let many = Value::Array(vec![json!({"role": "user", "content": "x"}); 21]);
        assert_eq!(
            read_items(Some(many), true).unwrap_err().param.as_deref(),
            Some("items")
        );
    }

    #[test]
    fn items_are_shown_as_output_items_with_a_status() {
        let shown = conversation_item_json(
            json!({"type": "message", "id": "msg_1", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}),
            None,
        );
        assert_eq!(shown["status"], "completed");
        assert_eq!(shown["content"][0]["text"], "hi");
        let text = conversation_item_json(
            json!({"type": "message", "id": "msg_2", "role": "user", "content": "plain"}),
            None,
        );
        assert_eq!(
            text["content"],
            json!([{"type": "input_text", "text": "plain"}])
        );
        let call = conversation_item_json(
            json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}),
            None,
        );
        assert_eq!(call["status"], "completed");
    }
}
