//! Admin API under `/admin/v1`: projects, API keys, deployments, deployment groups, tool sources and group
//! memberships. Handlers authenticate with [`AdminAuth`], validate, call the store and render the objects;
//! secrets (deployment API keys, tool-source secrets, API keys after creation) are never answered or logged.

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{get, put};
use axum::{Json, Router};
use gateway_core::entity::{
    check_non_empty, check_secret, EntityName, HttpUrl, ProviderKind, TimeoutMs, ToolName,
    ToolParameters,
};
use rand::Rng;
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::extract::{bearer, ApiJson};
use super::AppState;
use crate::store::admin::{
    ApiKeyRow, DeploymentChanges, DeploymentRow, GroupRow, Member, Membership, NewApiKey,
    NewDeployment, NewToolSource, ProjectRow, ToolSourceChanges, ToolSourceRow,
};
use crate::store::tenancy::hash_key;

/// Random characters after `sk-` in a new API key (6 bits each).
const KEY_RANDOM_CHARS: usize = 48;

/// Characters of a key kept as its `key_prefix` (`sk-` and six random ones).
const KEY_PREFIX_CHARS: usize = 9;

const KEY_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Every admin route, to be nested under `/admin/v1`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/projects", get(list_projects).post(create_project))
        .route(
            "/projects/{project_id}",
            get(get_project)
                .patch(update_project)
                .delete(delete_project),
        )
        .route(
            "/projects/{project_id}/api_keys",
            get(list_api_keys).post(create_api_key),
        )
        .route(
            "/api_keys/{key_id}",
            get(get_api_key)
                .patch(update_api_key)
                .delete(revoke_api_key),
        )
        .route(
            "/deployments",
            get(list_deployments).post(create_deployment),
        )
        .route(
            "/deployments/{deployment_id}",
            get(get_deployment)
                .patch(update_deployment)
                .delete(delete_deployment),
        )
        .route("/deployment_groups", get(list_groups).post(create_group))
        .route(
            "/deployment_groups/{group_id}",
            get(get_group).patch(update_group).delete(delete_group),
        )
        .route(
            "/deployment_groups/{group_id}/deployments/{member_id}",
            put(attach_deployment).delete(detach_deployment),
        )
        .route(
            "/deployment_groups/{group_id}/projects/{member_id}",
            put(attach_project).delete(detach_project),
        )
        .route(
            "/deployment_groups/{group_id}/tool_sources/{member_id}",
            put(attach_tool_source).delete(detach_tool_source),
        )
        .route(
            "/tool_sources",
            get(list_tool_sources).post(create_tool_source),
        )
        .route(
            "/tool_sources/{tool_source_id}",
            get(get_tool_source)
                .patch(update_tool_source)
                .delete(delete_tool_source),
        )
        // Applies to the routes above only, so it must stay last.
        .method_not_allowed_fallback(method_not_allowed)
}

// ---------------------------------------------------------------------------------------------------------
// Extractors

/// Proof that the request carries the admin token (`Authorization: Bearer <admin token>`).
///
/// Without a configured token every admin request is refused.
#[derive(Debug, Clone, Copy)]
pub struct AdminAuth;

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(expected) = state.admin_token.as_ref() else {
            return Err(ApiError::unauthorized(
                "The admin API is disabled: the gateway has no admin token configured.",
                Some("admin_api_disabled"),
            ));
        };
        let Some(given) = bearer(parts) else {
            return Err(ApiError::unauthorized(
                "You didn't provide the admin token. Send it as 'Authorization: Bearer <admin token>'.",
                None,
            ));
        };
        if same_secret(given, expected.expose_secret()) {
            Ok(AdminAuth)
        } else {
            Err(ApiError::unauthorized(
                "Incorrect admin token provided.",
                Some("invalid_admin_token"),
            ))
        }
    }
}

/// Compares two secrets in time independent of where they differ: both are hashed to fixed-length digests,
/// which are compared without an early exit.
fn same_secret(given: &str, expected: &str) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    given
        .iter()
        .zip(expected.iter())
        .fold(0u8, |diff, (a, b)| diff | (a ^ b))
        == 0
}

/// Path parameters, with an OpenAI-shaped 400 when they cannot be read (e.g. bad percent-encoding).
pub struct Ids<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Ids<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Ids(value)),
            Err(rejection) => Err(ApiError::invalid(
                format!("Invalid path: {}", rejection.body_text()),
                None,
                None,
            )),
        }
    }
}

/// A JSON object body: `ApiJson`'s 400s for unreadable bodies, then a 400 for anything but an object (serde
/// would otherwise accept `["acme"]` as `{"name": "acme"}`), then typed with the offending field as `param`.
pub struct AdminJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for AdminJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let ApiJson(value) = ApiJson::<Value>::from_request(req, state).await?;
        if !value.is_object() {
            return Err(ApiError::invalid(
                "The request body must be a JSON object.",
                None,
                Some("invalid_type"),
            ));
        }
        serde_path_to_error::deserialize(value)
            .map(AdminJson)
            .map_err(|error| {
                let path = error.path().to_string();
                let inner = error.into_inner();
                if path == "." || path.is_empty() {
                    ApiError::invalid(
                        format!("Invalid request body: {inner}."),
                        None,
                        Some("invalid_type"),
                    )
                } else if inner.to_string().starts_with("unknown field") {
                    // serde's message lists the expected fields, which helps spot a typo.
                    ApiError::invalid(
                        format!("Unknown parameter: '{path}' ({inner})."),
                        Some(&path),
                        Some("unknown_parameter"),
                    )
                } else {
                    ApiError::invalid(
                        format!("Invalid type for '{path}': {inner}."),
                        Some(&path),
                        Some("invalid_type"),
                    )
                }
            })
    }
}

/// A known route asked with a method it does not serve: 405 in OpenAI's shape.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::invalid(
            format!("Method {method} is not allowed on {}.", uri.path()),
            None,
            Some("method_not_allowed"),
        )
    }
}

// ---------------------------------------------------------------------------------------------------------
// Request bodies
//
// Every field is optional at the serde level and checked by hand, so that a missing field is a 400 naming
// it as `param`. Fields of PATCH bodies distinguish "absent" (unchanged) from `null` (cleared, for the
// secrets; refused for the rest). Unknown fields are refused, so a typo such as `secrets` is not silently
// dropped.

/// `{"name"}`: projects, API keys and deployment groups.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
}

/// `{"name","provider"}` of a deployment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    provider: Option<Option<ProviderBody>>,
}

/// `{"kind","base_url","model","api_key"}` of a deployment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderBody {
    #[serde(default, deserialize_with = "nullable")]
    kind: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    base_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    model: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    api_key: Option<Option<String>>,
}

/// A tool source's fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSourceBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    parameters: Option<Option<Value>>,
    #[serde(default, deserialize_with = "nullable")]
    url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    timeout_ms: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    secret: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    strict: Option<Option<bool>>,
}

/// Present fields become `Some`, so that `null` (`Some(None)`) differs from absent (`None`, by `default`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

// ---------------------------------------------------------------------------------------------------------
// Validation

fn missing(param: &str) -> ApiError {
    ApiError::invalid(
        format!("Missing required parameter: '{param}'."),
        Some(param),
        Some("missing_required_parameter"),
    )
}

fn invalid_value(message: String, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param), Some("invalid_value"))
}

/// A field that must be present and not `null`.
fn required<T>(value: Option<Option<T>>, param: &str) -> Result<T, ApiError> {
    value.flatten().ok_or_else(|| missing(param))
}

/// A PATCH field that may be absent but not `null`.
fn not_null<T>(value: Option<Option<T>>, param: &str) -> Result<Option<T>, ApiError> {
    match value {
        None => Ok(None),
        Some(None) => Err(invalid_value(format!("'{param}' cannot be null."), param)),
        Some(Some(v)) => Ok(Some(v)),
    }
}

/// The `name` of a PATCH body of a project, key, deployment or group: absent, or a valid name.
fn entity_name(name: Option<Option<String>>) -> Result<Option<EntityName>, ApiError> {
    not_null(name, "name")?
        .map(|name| EntityName::parse(name, "name"))
        .transpose()
        .map_err(ApiError::from)
}

// ---------------------------------------------------------------------------------------------------------
// Answers

fn list(data: Vec<Value>) -> Json<Value> {
    Json(json!({"object": "list", "data": data}))
}

fn deleted(id: &str, object: &str) -> Json<Value> {
    Json(json!({"id": id, "object": object, "deleted": true}))
}

fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::not_found(format!("No {what} with id '{id}'."))
}

fn project_object(p: &ProjectRow) -> Value {
    json!({"id": p.id, "object": "project", "name": p.name, "created_at": p.created_at})
}

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

fn deployment_object(d: &DeploymentRow) -> Value {
    json!({
        "id": d.id,
        "object": "deployment",
        "name": d.name,
        "provider": {"kind": d.provider_kind, "base_url": d.base_url, "model": d.upstream_model, "has_api_key": d.has_api_key},
        "created_at": d.created_at,
    })
}

fn group_object(g: &GroupRow) -> Value {
    json!({
        "id": g.id,
        "object": "deployment_group",
        "name": g.name,
        "deployment_ids": g.deployment_ids,
        "project_ids": g.project_ids,
        "tool_source_ids": g.tool_source_ids,
        "created_at": g.created_at,
    })
}

fn tool_source_object(t: &ToolSourceRow) -> Value {
    json!({
        "id": t.id,
        "object": "tool_source",
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "url": t.url,
        "timeout_ms": t.timeout_ms,
        "strict": t.strict,
        "has_secret": t.has_secret,
        "created_at": t.created_at,
    })
}

// ---------------------------------------------------------------------------------------------------------
// Projects

/// `POST /projects`.
pub async fn create_project(
    _: AdminAuth,
    State(state): State<AppState>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let project = state.store.create_project(&name).await?;
    tracing::info!(project.id = %project.id, "project created");
    Ok(Json(project_object(&project)))
}

/// `GET /projects`.
pub async fn list_projects(
    _: AdminAuth,
    State(state): State<AppState>,
) -> Result<Json<Value>, ApiError> {
    let projects = state.store.list_projects().await?;
    Ok(list(projects.iter().map(project_object).collect()))
}

/// `GET /projects/{project_id}`.
pub async fn get_project(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let project = state
        .store
        .get_project(&id)
        .await?
        .ok_or_else(|| not_found("project", &id))?;
    Ok(Json(project_object(&project)))
}

/// `PATCH /projects/{project_id}`.
pub async fn update_project(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let project = state
        .store
        .update_project(&id, name.as_ref())
        .await?
        .ok_or_else(|| not_found("project", &id))?;
    tracing::info!(project.id = %project.id, "project updated");
    Ok(Json(project_object(&project)))
}

/// `DELETE /projects/{project_id}`: also deletes its keys, responses and group grants.
pub async fn delete_project(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_project(&id).await? {
        return Err(not_found("project", &id));
    }
    tracing::info!(project.id = %id, "project deleted");
    Ok(deleted(&id, "project"))
}

// ---------------------------------------------------------------------------------------------------------
// API keys

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
    _: AdminAuth,
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
    _: AdminAuth,
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
    _: AdminAuth,
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
    _: AdminAuth,
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
    _: AdminAuth,
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

// ---------------------------------------------------------------------------------------------------------
// Deployments

/// `POST /deployments`.
pub async fn create_deployment(
    _: AdminAuth,
    State(state): State<AppState>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let provider = required(body.provider, "provider")?;
    let kind = ProviderKind::parse(&required(provider.kind, "provider.kind")?, "provider.kind")?;
    let base_url = HttpUrl::parse(
        required(provider.base_url, "provider.base_url")?,
        "provider.base_url",
    )?;
    let model = required(provider.model, "provider.model")?;
    check_non_empty(&model, "provider.model")?;
    let api_key = provider.api_key.flatten();
    if let Some(api_key) = &api_key {
        check_secret(api_key, "provider.api_key")?;
    }
    let new = NewDeployment {
        name: &name,
        provider_kind: kind,
        base_url: &base_url,
        upstream_model: &model,
        api_key: api_key.as_deref(),
    };
    let deployment = state.store.create_deployment(&new).await?;
    tracing::info!(deployment.id = %deployment.id, "deployment created");
    Ok(Json(deployment_object(&deployment)))
}

/// `GET /deployments`.
pub async fn list_deployments(
    _: AdminAuth,
    State(state): State<AppState>,
) -> Result<Json<Value>, ApiError> {
    let deployments = state.store.list_deployments().await?;
    Ok(list(deployments.iter().map(deployment_object).collect()))
}

/// `GET /deployments/{deployment_id}`.
pub async fn get_deployment(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let deployment = state
        .store
        .get_deployment(&id)
        .await?
        .ok_or_else(|| not_found("deployment", &id))?;
    Ok(Json(deployment_object(&deployment)))
}

/// `PATCH /deployments/{deployment_id}`: any of `name` and the provider's fields; `provider.api_key: null`
/// removes the key.
pub async fn update_deployment(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let provider = not_null(body.provider, "provider")?;
    let (mut kind, mut base_url, mut model, mut api_key) = (None, None, None, None);
    if let Some(provider) = provider {
        kind = not_null(provider.kind, "provider.kind")?
            .map(|kind| ProviderKind::parse(&kind, "provider.kind"))
            .transpose()?;
        base_url = not_null(provider.base_url, "provider.base_url")?
            .map(|url| HttpUrl::parse(url, "provider.base_url"))
            .transpose()?;
        model = not_null(provider.model, "provider.model")?;
        if let Some(model) = &model {
            check_non_empty(model, "provider.model")?;
        }
        api_key = provider.api_key;
        if let Some(Some(api_key)) = &api_key {
            check_secret(api_key, "provider.api_key")?;
        }
    }
    let changes = DeploymentChanges {
        name: name.as_ref(),
        provider_kind: kind,
        base_url: base_url.as_ref(),
        upstream_model: model.as_deref(),
        api_key: api_key.as_ref().map(Option::as_deref),
    };
    let deployment = state
        .store
        .update_deployment(&id, &changes)
        .await?
        .ok_or_else(|| not_found("deployment", &id))?;
    tracing::info!(deployment.id = %deployment.id, "deployment updated");
    Ok(Json(deployment_object(&deployment)))
}

/// `DELETE /deployments/{deployment_id}`: also removes it from every group.
pub async fn delete_deployment(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_deployment(&id).await? {
        return Err(not_found("deployment", &id));
    }
    tracing::info!(deployment.id = %id, "deployment deleted");
    Ok(deleted(&id, "deployment"))
}

// ---------------------------------------------------------------------------------------------------------
// Deployment groups

/// `POST /deployment_groups`.
pub async fn create_group(
    _: AdminAuth,
    State(state): State<AppState>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let group = state.store.create_group(&name).await?;
    tracing::info!(group.id = %group.id, "deployment group created");
    Ok(Json(group_object(&group)))
}

/// `GET /deployment_groups`.
pub async fn list_groups(
    _: AdminAuth,
    State(state): State<AppState>,
) -> Result<Json<Value>, ApiError> {
    let groups = state.store.list_groups().await?;
    Ok(list(groups.iter().map(group_object).collect()))
}

/// `GET /deployment_groups/{group_id}`.
pub async fn get_group(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let group = state
        .store
        .get_group(&id)
        .await?
        .ok_or_else(|| not_found("deployment group", &id))?;
    Ok(Json(group_object(&group)))
}

/// `PATCH /deployment_groups/{group_id}`: renames the group.
pub async fn update_group(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let group = state
        .store
        .update_group(&id, name.as_ref())
        .await?
        .ok_or_else(|| not_found("deployment group", &id))?;
    tracing::info!(group.id = %group.id, "deployment group updated");
    Ok(Json(group_object(&group)))
}

/// `DELETE /deployment_groups/{group_id}`: removes its memberships, not its members.
pub async fn delete_group(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_group(&id).await? {
        return Err(not_found("deployment group", &id));
    }
    tracing::info!(group.id = %id, "deployment group deleted");
    Ok(deleted(&id, "deployment_group"))
}

/// Attaches (`attach`) or detaches a member and renders `{"group_id", "<kind>_id", "attached"}`.
async fn membership(
    state: &AppState,
    kind: Member,
    group_id: &str,
    member_id: &str,
    attach: bool,
) -> Result<Json<Value>, ApiError> {
    let outcome = if attach {
        state.store.attach_member(group_id, kind, member_id).await
    } else {
        state.store.detach_member(group_id, kind, member_id).await
    };
    let what = kind.as_str().replace('_', " ");
    match outcome {
        Ok(Membership::Done) => {}
        Ok(Membership::GroupMissing) => return Err(not_found("deployment group", group_id)),
        Ok(Membership::MemberMissing) => return Err(not_found(&what, member_id)),
        Ok(Membership::NotAttached) => {
            return Err(ApiError::not_found(format!(
                "The {what} '{member_id}' is not attached to deployment group '{group_id}'."
            )))
        }
        // A concurrent delete of the group or the member.
        Err(crate::store::StoreError::NotFound) => {
            return Err(ApiError::not_found(format!(
                "No deployment group '{group_id}' or {what} '{member_id}'."
            )))
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(group.id = %group_id, member.kind = kind.as_str(), member.id = %member_id, attached = attach, "group membership changed");
    let mut answer = serde_json::Map::new();
    answer.insert("group_id".into(), json!(group_id));
    answer.insert(format!("{}_id", kind.as_str()), json!(member_id));
    answer.insert("attached".into(), json!(attach));
    Ok(Json(Value::Object(answer)))
}

/// `PUT /deployment_groups/{group_id}/deployments/{deployment_id}`.
pub async fn attach_deployment(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Deployment, &group_id, &member_id, true).await
}

/// `DELETE /deployment_groups/{group_id}/deployments/{deployment_id}`.
pub async fn detach_deployment(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Deployment, &group_id, &member_id, false).await
}

/// `PUT /deployment_groups/{group_id}/projects/{project_id}`: grants the project the group.
pub async fn attach_project(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Project, &group_id, &member_id, true).await
}

/// `DELETE /deployment_groups/{group_id}/projects/{project_id}`: withdraws the grant.
pub async fn detach_project(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Project, &group_id, &member_id, false).await
}

/// `PUT /deployment_groups/{group_id}/tool_sources/{tool_source_id}`.
pub async fn attach_tool_source(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::ToolSource, &group_id, &member_id, true).await
}

/// `DELETE /deployment_groups/{group_id}/tool_sources/{tool_source_id}`.
pub async fn detach_tool_source(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::ToolSource, &group_id, &member_id, false).await
}

// ---------------------------------------------------------------------------------------------------------
// Tool sources

/// `POST /tool_sources`.
pub async fn create_tool_source(
    _: AdminAuth,
    State(state): State<AppState>,
    AdminJson(body): AdminJson<ToolSourceBody>,
) -> Result<Json<Value>, ApiError> {
    let name = ToolName::parse(required(body.name, "name")?, "name")?;
    let description = body.description.flatten().unwrap_or_default();
    let parameters = ToolParameters::parse(required(body.parameters, "parameters")?, "parameters")?;
    let url = HttpUrl::parse(required(body.url, "url")?, "url")?;
    let timeout_ms = match body.timeout_ms.flatten() {
        Some(timeout_ms) => TimeoutMs::parse(timeout_ms, "timeout_ms")?,
        None => TimeoutMs::DEFAULT,
    };
    let secret = body.secret.flatten();
    if let Some(secret) = &secret {
        check_secret(secret, "secret")?;
    }
    let new = NewToolSource {
        name: &name,
        description: &description,
        parameters: &parameters,
        url: &url,
        timeout_ms,
        secret: secret.as_deref(),
        strict: body.strict.flatten().unwrap_or(false),
    };
    let source = state.store.create_tool_source(&new).await?;
    tracing::info!(tool_source.id = %source.id, tool.name = %source.name, "tool source created");
    Ok(Json(tool_source_object(&source)))
}

/// `GET /tool_sources`.
pub async fn list_tool_sources(
    _: AdminAuth,
    State(state): State<AppState>,
) -> Result<Json<Value>, ApiError> {
    let sources = state.store.list_tool_sources().await?;
    Ok(list(sources.iter().map(tool_source_object).collect()))
}

/// `GET /tool_sources/{tool_source_id}`.
pub async fn get_tool_source(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let source = state
        .store
        .get_tool_source(&id)
        .await?
        .ok_or_else(|| not_found("tool source", &id))?;
    Ok(Json(tool_source_object(&source)))
}

/// `PATCH /tool_sources/{tool_source_id}`: any field; `secret: null` removes the secret, `description: null`
/// empties the description.
pub async fn update_tool_source(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<ToolSourceBody>,
) -> Result<Json<Value>, ApiError> {
    let name = not_null(body.name, "name")?
        .map(|name| ToolName::parse(name, "name"))
        .transpose()?;
    let description = body.description.map(Option::unwrap_or_default);
    let parameters = not_null(body.parameters, "parameters")?
        .map(|parameters| ToolParameters::parse(parameters, "parameters"))
        .transpose()?;
    let url = not_null(body.url, "url")?
        .map(|url| HttpUrl::parse(url, "url"))
        .transpose()?;
    let timeout_ms = not_null(body.timeout_ms, "timeout_ms")?
        .map(|timeout_ms| TimeoutMs::parse(timeout_ms, "timeout_ms"))
        .transpose()?;
    if let Some(Some(secret)) = &body.secret {
        check_secret(secret, "secret")?;
    }
    let strict = not_null(body.strict, "strict")?;
    let changes = ToolSourceChanges {
        name: name.as_ref(),
        description: description.as_deref(),
        parameters: parameters.as_ref(),
        url: url.as_ref(),
        timeout_ms,
        secret: body.secret.as_ref().map(Option::as_deref),
        strict,
    };
    let source = state
        .store
        .update_tool_source(&id, &changes)
        .await?
        .ok_or_else(|| not_found("tool source", &id))?;
    tracing::info!(tool_source.id = %source.id, tool.name = %source.name, "tool source updated");
    Ok(Json(tool_source_object(&source)))
}

/// `DELETE /tool_sources/{tool_source_id}`: also detaches it from every group.
pub async fn delete_tool_source(
    _: AdminAuth,
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_tool_source(&id).await? {
        return Err(not_found("tool source", &id));
    }
    tracing::info!(tool_source.id = %id, "tool source deleted");
    Ok(deleted(&id, "tool_source"))
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

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(same_secret("admin-token", "admin-token"));
        assert!(!same_secret("admin-token", "admin-tokeN"));
        assert!(!same_secret("admin-token", "admin-token-longer"));
        assert!(!same_secret("", "admin-token"));
    }
}
