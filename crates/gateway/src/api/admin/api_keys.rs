//! `/projects/{project_id}/api_keys` and `/api_keys`: issue (the only answer that shows a key), list, read,
//! rename and revoke a project's API keys.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::EntityName;
use rand::Rng;
use serde_json::{json, Value};

use super::{entity_name, list, not_found, required, AdminJson, Ids, NameBody};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{ApiKeyRow, NewApiKey};
use crate::store::tenancy::hash_key;

/// Random characters after `sk-` in a new API key (6 bits each).
const KEY_RANDOM_CHARS: usize = 48;

/// Characters of a key kept as its `key_prefix` (`sk-` and six random ones).
const KEY_PREFIX_CHARS: usize = 9;

const KEY_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn key_object(k: &ApiKeyRow) -> Value {
    json!({
        "id": k.id,
        "object": "api_key",
        "name": k.name,
        "project_id": k.project_id,
        "key_prefix": k.key_prefix,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
    })
}

/// A fresh key: `sk-` and 48 characters of the URL-safe alphabet from the thread's CSPRNG (288 bits).
fn generate_key() -> String {
    let mut rng = rand::rng();
    let mut key = String::with_capacity(3 + KEY_RANDOM_CHARS);
    key.push_str("sk-");
    for _ in 0..KEY_RANDOM_CHARS {
        // 256 is a multiple of 64, so masking keeps every character equally likely.
        let index = usize::from(rng.random::<u8>() & 63);
        key.push(char::from(KEY_ALPHABET[index]));
    }
    key
}

/// `POST /projects/{project_id}/api_keys`: the only answer that ever contains the key.
pub async fn create_api_key(
    State(state): State<AppState>,
    Ids(project_id): Ids<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let key = generate_key();
    let key_prefix: String = key.chars().take(KEY_PREFIX_CHARS).collect();
    let new = NewApiKey {
        project_id: &project_id,
        name: &name,
        key_hash: &hash_key(&key),
        key_prefix: &key_prefix,
    };
    let row = state
        .store
        .create_api_key(&new)
        .await?
        .ok_or_else(|| not_found("project", &project_id))?;
    tracing::info!(project.id = %row.project_id, api_key.id = %row.id, "api key created");
    let mut object = key_object(&row);
    object["key"] = Value::String(key);
    Ok(Json(object))
}

/// `GET /projects/{project_id}/api_keys`: revoked keys included, never the key itself.
pub async fn list_api_keys(
    State(state): State<AppState>,
    Ids(project_id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let keys = state
        .store
        .list_api_keys(&project_id)
        .await?
        .ok_or_else(|| not_found("project", &project_id))?;
    Ok(list(keys.iter().map(key_object).collect()))
}

/// `GET /api_keys/{key_id}`.
pub async fn get_api_key(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let key = state
        .store
        .get_api_key(&id)
        .await?
        .ok_or_else(|| not_found("API key", &id))?;
    Ok(Json(key_object(&key)))
}

/// `PATCH /api_keys/{key_id}`: renames the key.
pub async fn update_api_key(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let key = state
        .store
        .update_api_key(&id, name.as_ref())
        .await?
        .ok_or_else(|| not_found("API key", &id))?;
    Ok(Json(key_object(&key)))
}

/// `DELETE /api_keys/{key_id}`: revokes the key (idempotently); it stops working on the next request.
pub async fn revoke_api_key(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let key = state
        .store
        .revoke_api_key(&id)
        .await?
        .ok_or_else(|| not_found("API key", &id))?;
    tracing::info!(project.id = %key.project_id, api_key.id = %key.id, "api key revoked");
    Ok(Json(key_object(&key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_documented_shape() {
        let key = generate_key();
        assert_eq!(key.len(), 3 + KEY_RANDOM_CHARS);
        assert!(key.starts_with("sk-"));
        assert!(key[3..].bytes().all(|b| KEY_ALPHABET.contains(&b)));
        assert_ne!(generate_key(), key);
    }
}
