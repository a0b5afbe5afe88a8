//! The Conversations API (SPEC 15): `/v1/conversations` and its items, scoped to the key's project like
//! responses (another project's conversation is not found).

use axum::extract::{RawQuery, State};
use axum::Json;
use gateway_core::conversation::{
    conversation_item_json, conversation_object, read_items, read_metadata,
};
use gateway_core::items::InputItem;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery, ProjectKey};
use super::responses::{list_page, ListQuery};
use super::AppState;
use crate::clock::now;
use crate::ids::new_id;
use crate::store::conversations::{AppendError, ConversationRow, NewConversationItem, OnTakenId};

/// Body of `POST /v1/conversations`.
#[derive(Debug, Default, Deserialize)]
pub struct CreateBody {
    items: Option<Value>,
    metadata: Option<Value>,
}

/// Body of `POST /v1/conversations/{id}`.
#[derive(Debug, Default, Deserialize)]
pub struct UpdateBody {
    metadata: Option<Value>,
}

/// Body of `POST /v1/conversations/{id}/items`.
#[derive(Debug, Default, Deserialize)]
pub struct AddItemsBody {
    items: Option<Value>,
}

/// `POST /v1/conversations`: a conversation, with the items it starts with.
pub async fn create_conversation(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Json<Value>, ApiError> {
    let metadata = read_metadata(body.metadata)?;
    let items = read_items(body.items, false)?;
    let items = new_items(&state, &project, items, &std::collections::HashSet::new()).await?;
    let row = ConversationRow {
        id: new_id("conv"),
        metadata: json!(metadata),
        created_at: now(),
    };
    state
        .store
        .create_conversation(&project, &row, &items)
        .await?;
    Ok(Json(conversation_object(
        &row.id,
        row.created_at,
        &row.metadata,
    )))
}

/// `GET /v1/conversations/{id}`.
pub async fn get_conversation(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let row = find_conversation(&state, &project, &id).await?;
    Ok(Json(conversation_object(
        &row.id,
        row.created_at,
        &row.metadata,
    )))
}

/// `POST /v1/conversations/{id}`: its metadata replaced.
pub async fn update_conversation(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateBody>,
) -> Result<Json<Value>, ApiError> {
    let Some(metadata) = body.metadata else {
        return Err(ApiError::invalid(
            "Missing required parameter: 'metadata'.",
            Some("metadata"),
            Some("missing_required_parameter"),
        ));
    };
    let metadata = read_metadata(Some(metadata))?;
    let row = state
        .store
        .update_conversation(&project, &id, &json!(metadata))
        .await?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(conversation_object(
        &row.id,
        row.created_at,
        &row.metadata,
    )))
}

/// `DELETE /v1/conversations/{id}`: the conversation and its items.
pub async fn delete_conversation(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_conversation(&project, &id).await? {
        return Err(not_found(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "conversation.deleted", "deleted": true}),
    ))
}

/// `GET /v1/conversations/{id}/items`: a page of its items (`limit`, `order`, `after`, `include`).
pub async fn list_items(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ListQuery>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let (limit, order) = query.page()?;
    find_conversation(&state, &project, &id).await?;
    let (data, has_more) = state
        .store
        .conversation_items_page(&id, query.after.as_deref(), limit, order)
        .await?
        .ok_or_else(|| {
            ApiError::invalid(
                format!(
                    "Invalid 'after': no item with id '{}' in conversation '{id}'.",
                    query.after.as_deref().unwrap_or_default()
                ),
                Some("after"),
                None,
            )
        })?;
    let include = include_of(raw.as_deref());
    let data = data
        .into_iter()
        .map(|item| conversation_item_json(item, Some(&include)))
        .collect();
    Ok(Json(list_page(data, has_more)))
}

/// `POST /v1/conversations/{id}/items`: items appended after every item it holds; answers them as a list.
pub async fn add_items(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<AddItemsBody>,
) -> Result<Json<Value>, ApiError> {
    let items = read_items(body.items, true)?;
    let held = state
        .store
        .conversation_item_ids(&project, &id)
        .await?
        .ok_or_else(|| not_found(&id))?;
    let items = new_items(&state, &project, items, &held).await?;
    let added = state
        .store
        .append_conversation_items(&project, &id, &items, None, OnTakenId::Refuse, now())
        .await
        .map_err(|e| match e {
            AppendError::NotFound => not_found(&id),
            AppendError::TakenId(item_id) => taken(&items, &item_id),
            AppendError::Store(e) => ApiError::from(e),
        })?;
    let include = include_of(raw.as_deref());
    let data = added
        .into_iter()
        .map(|item| conversation_item_json(item, Some(&include)))
        .collect();
    Ok(Json(list_page(data, false)))
}

/// `GET /v1/conversations/{id}/items/{item_id}`.
pub async fn get_item(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath((id, item_id)): ApiPath<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    find_conversation(&state, &project, &id).await?;
    let item = state
        .store
        .conversation_item(&id, &item_id)
        .await?
        .ok_or_else(|| item_not_found(&id, &item_id))?;
    let include = include_of(raw.as_deref());
    Ok(Json(conversation_item_json(item, Some(&include))))
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: answers the conversation, as OpenAI does.
pub async fn delete_item(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath((id, item_id)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let row = find_conversation(&state, &project, &id).await?;
    if !state.store.delete_conversation_item(&id, &item_id).await? {
        return Err(item_not_found(&id, &item_id));
    }
    Ok(Json(conversation_object(
        &row.id,
        row.created_at,
        &row.metadata,
    )))
}

async fn find_conversation(
    state: &AppState,
    project: &str,
    id: &str,
) -> Result<ConversationRow, ApiError> {
    state
        .store
        .load_conversation(project, id)
        .await?
        .ok_or_else(|| not_found(id))
}

fn not_found(id: &str) -> ApiError {
    ApiError::conversation_not_found(id, "conversation_id")
}

fn item_not_found(conversation_id: &str, item_id: &str) -> ApiError {
    ApiError {
        param: Some("item_id".to_owned()),
        ..ApiError::not_found(format!(
            "Item with id '{item_id}' not found in conversation '{conversation_id}'."
        ))
    }
}

/// The `400` of an item whose id the conversation (or the same request) holds already.
fn taken(items: &[NewConversationItem], item_id: &str) -> ApiError {
    let index = items
        .iter()
        .position(|item| item.id == item_id)
        .unwrap_or(0);
    ApiError::invalid(
        format!("Invalid 'items[{index}].id': the conversation already holds an item with id '{item_id}'."),
        Some(&format!("items[{index}].id")),
        None,
    )
}

/// What `include` (`include[]=…` or `include=…`, repeated) asks for.
fn include_of(raw: Option<&str>) -> Vec<String> {
    url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .filter(|(key, _)| key == "include[]" || key == "include")
        .map(|(_, value)| value.into_owned())
        .collect()
}

/// The items a client adds, as stored: references resolved to the project's stored items, and every item with
/// an id (its own when it has one the conversation does not hold, a new one otherwise).
async fn new_items(
    state: &AppState,
    project: &str,
    items: Vec<InputItem>,
    held: &std::collections::HashSet<String>,
) -> Result<Vec<NewConversationItem>, ApiError> {
    state
        .engine
        .check_added_compactions(project, &items)
        .await?;
    let items = state
        .engine
        .resolve_references(project, items)
        .await
        .map_err(|error| match error {
            // The items of a conversation are `items[i]`, not a create's `input[i]`.
            crate::engine::EngineError::ItemNotFound { id, index } => ApiError::invalid(
                format!("Item with id '{id}' not found."),
                Some(&format!("items[{index}]")),
                Some("item_not_found"),
            ),
            other => ApiError::from(other),
        })?;
    let mut taken: std::collections::HashSet<String> = held.clone();
    let mut added = Vec::with_capacity(items.len());
    for mut item in items {
        let keep = item
            .id()
            .is_some_and(|id| !id.is_empty() && !taken.contains(id));
        if !keep {
            item.set_id(new_id(item.id_prefix()));
        }
        let id = item.id().unwrap_or_default().to_owned();
        taken.insert(id.clone());
        let stored = serde_json::to_value(&item)
            .map_err(|e| ApiError::server(format!("an item could not be stored: {e}")))?;
        added.push(NewConversationItem { id, item: stored });
    }
    Ok(added)
}
