//! `/projects/{project_id}/api_keys` and `/api_keys`: issue (the only answer that shows a key), list, read,
//! change (name, expiry, limits, budget) and revoke a project's API keys.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::EntityName;
use gateway_core::governance::check_expires_at;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::governed::{governance, governance_changes, GovernanceObject};
use super::{
    found, list, nullable, parse_changed, parse_required, present, AdminJson, ApiPath, List,
};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{ApiKeyChanges, ApiKeyRow, NewApiKey};
use crate::store::tenancy::hash_key;

/// Random characters after `sk-` in a new API key (6 bits each).
const KEY_RANDOM_CHARS: usize = 48;

/// Characters of a key kept as its `key_prefix` (`sk-` and six random ones).
const KEY_PREFIX_CHARS: usize = 9;

const KEY_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `{"name", "expires_at", "limits", "budget"}` of an API key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    /// Unix seconds; `null` is never.
    #[serde(default, deserialize_with = "nullable")]
    expires_at: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    limits: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    budget: Option<Value>,
}

/// An API key as the admin API shows it: the key itself only in the answer that created it.
#[derive(Debug, Serialize)]
pub struct ApiKeyObject {
    id: String,
    object: &'static str,
    name: String,
    project_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    key_prefix: String,
    created_at: i64,
    revoked_at: Option<i64>,
    expires_at: Option<i64>,
    /// When it was last used (Unix seconds, to within a minute); `null` when never.
    last_used_at: Option<i64>,
    #[serde(flatten)]
    governance: GovernanceObject,
}

impl From<ApiKeyRow> for ApiKeyObject {
    fn from(row: ApiKeyRow) -> ApiKeyObject {
        ApiKeyObject {
            governance: GovernanceObject::from(&row.governance),
            id: row.id,
            object: "api_key",
            name: row.name,
            project_id: row.project_id,
            key: None,
            key_prefix: row.key_prefix,
            created_at: row.created_at,
            revoked_at: row.revoked_at,
            expires_at: row.expires_at,
            last_used_at: row.last_used_at,
        }
    }
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

/// `POST /projects/{project_id}/api_keys`: the only answer that ever contains the key. `expires_at`, `limits`
/// and `budget` are optional.
pub async fn create_api_key(
    State(state): State<AppState>,
    ApiPath(project_id): ApiPath<String>,
    AdminJson(body): AdminJson<ApiKeyBody>,
) -> Result<Json<ApiKeyObject>, ApiError> {
    let name = parse_required(body.name, "name", EntityName::parse)?;
    let expires_at = body
        .expires_at
        .flatten()
        .map(|at| check_expires_at(at, "expires_at"))
        .transpose()?;
    let governance = governance(body.limits, body.budget)?;
    let key = generate_key();
    let key_prefix: String = key.chars().take(KEY_PREFIX_CHARS).collect();
    let new = NewApiKey {
        project_id: &project_id,
        name: &name,
        key_hash: &hash_key(&key),
        key_prefix: &key_prefix,
        expires_at,
        governance,
    };
    let row = found(
        state.store.create_api_key(&new).await?,
        "project",
        &project_id,
    )?;
    tracing::info!(project.id = %row.project_id, api_key.id = %row.id, "api key created");
    Ok(Json(ApiKeyObject {
        key: Some(key),
        ..row.into()
    }))
}

/// `GET /projects/{project_id}/api_keys`: revoked keys included, never the key itself.
pub async fn list_api_keys(
    State(state): State<AppState>,
    ApiPath(project_id): ApiPath<String>,
) -> Result<Json<List<ApiKeyObject>>, ApiError> {
    let keys = found(
        state.store.list_api_keys(&project_id).await?,
        "project",
        &project_id,
    )?;
    Ok(list(keys))
}

get_by_id! {
    /// `GET /api_keys/{key_id}`.
    get_api_key: get_api_key -> ApiKeyObject, "API key"
}

/// `PATCH /api_keys/{key_id}`: any of `name`, `expires_at` (`null`: never), `limits` (merged) and `budget`
/// (replaced; `null` removes it), all checked before anything is written.
pub async fn update_api_key(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(body): AdminJson<ApiKeyBody>,
) -> Result<Json<ApiKeyObject>, ApiError> {
    let name = parse_changed(body.name, "name", EntityName::parse)?;
    let expires_at = match body.expires_at {
        Some(Some(at)) => Some(Some(check_expires_at(at, "expires_at")?)),
        other => other,
    };
    let changes = ApiKeyChanges {
        name: name.as_ref(),
        expires_at,
        governance: governance_changes(body.limits, body.budget)?,
    };
    let key = found(
        state.store.update_api_key(&id, &changes).await?,
        "API key",
        &id,
    )?;
    tracing::info!(project.id = %key.project_id, api_key.id = %key.id, "api key updated");
    Ok(Json(key.into()))
}

/// `DELETE /api_keys/{key_id}`: revokes the key (idempotently); it stops working on the next request.
pub async fn revoke_api_key(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ApiKeyObject>, ApiError> {
    let key = found(state.store.revoke_api_key(&id).await?, "API key", &id)?;
    tracing::info!(project.id = %key.project_id, api_key.id = %key.id, "api key revoked");
    Ok(Json(key.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::admin::GovernanceColumns;
    use serde_json::json;

    #[test]
    fn a_key_answers_the_documented_fields_and_the_key_only_when_given() {
        let row = ApiKeyRow {
            id: "key_1".into(),
            project_id: "proj_1".into(),
            name: "ci".into(),
            key_prefix: "sk-Vq3k0a".into(),
            created_at: 1_735_689_600,
            revoked_at: None,
            expires_at: Some(1_767_225_600),
            last_used_at: Some(1_735_700_000),
            governance: GovernanceColumns {
                rpm_limit: None,
                tpm_limit: Some(40_000),
                max_concurrent: None,
                budget_usd: Some(5.0),
                budget_period: Some("day".into()),
            },
        };
        let expected = json!({
            "id": "key_1",
            "object": "api_key",
            "name": "ci",
            "project_id": "proj_1",
            "key_prefix": "sk-Vq3k0a",
            "created_at": 1_735_689_600,
            "revoked_at": null,
            "last_used_at": 1_735_700_000,
            "expires_at": 1_767_225_600,
            "limits": {"rpm": null, "tpm": 40_000, "max_concurrent": null},
            "budget": {"usd": 5.0, "period": "day"},
        });
        let shown = ApiKeyObject::from(row.clone());
        assert_eq!(serde_json::to_value(shown).unwrap(), expected);
        let created = ApiKeyObject {
            key: Some("sk-Vq3k0a-rest".into()),
            ..row.into()
        };
        let mut with_key = expected;
        with_key["key"] = json!("sk-Vq3k0a-rest");
        assert_eq!(serde_json::to_value(created).unwrap(), with_key);
    }

    #[test]
    fn generated_keys_have_the_documented_shape() {
        let key = generate_key();
        assert_eq!(key.len(), 3 + KEY_RANDOM_CHARS);
        assert!(key.starts_with("sk-"));
        assert!(key[3..].bytes().all(|b| KEY_ALPHABET.contains(&b)));
        assert_ne!(generate_key(), key);
    }
}
