//! Admin API under `/admin/v1`: the routes, the admin-token layer that guards them all, and what the
//! entity modules share (body and path extractors, field helpers, small answers). Secrets (deployment API
//! keys, tool-source secrets, API keys after creation) are never answered or logged.

// The handler macros come before the entity modules that use them (macros are in scope from where they stand).

/// `GET /<entities>/{id}`: the entity `$read` finds, as its answer object, or a 404 naming `$what`.
macro_rules! get_by_id {
    ($(#[$doc:meta])* $handler:ident: $read:ident -> $object:ty, $what:literal) => {
        $(#[$doc])*
        pub async fn $handler(
            axum::extract::State(state): axum::extract::State<crate::api::AppState>,
            super::ApiPath(id): super::ApiPath<String>,
        ) -> Result<axum::Json<$object>, crate::api::error::ApiError> {
            let row = super::found(state.store.$read(&id).await?, $what, &id)?;
            Ok(axum::Json(row.into()))
        }
    };
}

/// `GET /<entities>` (every entity `$read_all` lists) and `GET /<entities>/{id}` (see `get_by_id`).
macro_rules! list_and_get {
    (
        $object:ty, $what:literal;
        $(#[$list_doc:meta])* $list:ident: $read_all:ident;
        $(#[$get_doc:meta])* $get:ident: $read:ident;
    ) => {
        $(#[$list_doc])*
        pub async fn $list(
            axum::extract::State(state): axum::extract::State<crate::api::AppState>,
        ) -> Result<axum::Json<super::List<$object>>, crate::api::error::ApiError> {
            Ok(super::list(state.store.$read_all().await?))
        }

        get_by_id! {
            $(#[$get_doc])*
            $get: $read -> $object, $what
        }
    };
}

/// `POST /<entities>` and `PATCH /<entities>/{id}` of an entity that is only a name (`NameBody`): created with
/// `$create`, renamed with `$rename`, each logged with the id under `$field`.
macro_rules! create_and_rename {
    (
        $object:ty, $what:literal, $($field:ident).+;
        $(#[$create_doc:meta])* $create:ident: $store_create:ident;
        $(#[$rename_doc:meta])* $rename:ident: $store_rename:ident;
    ) => {
        $(#[$create_doc])*
        pub async fn $create(
            axum::extract::State(state): axum::extract::State<crate::api::AppState>,
            super::AdminJson(body): super::AdminJson<super::NameBody>,
        ) -> Result<axum::Json<$object>, crate::api::error::ApiError> {
            let name = super::parse_required(body.name, "name", gateway_core::entity::EntityName::parse)?;
            let row = state.store.$store_create(&name).await?;
            tracing::info!($($field).+ = %row.id, "{} created", $what);
            Ok(axum::Json(row.into()))
        }

        $(#[$rename_doc])*
        pub async fn $rename(
            axum::extract::State(state): axum::extract::State<crate::api::AppState>,
            super::ApiPath(id): super::ApiPath<String>,
            super::AdminJson(body): super::AdminJson<super::NameBody>,
        ) -> Result<axum::Json<$object>, crate::api::error::ApiError> {
            let name = super::parse_changed(body.name, "name", gateway_core::entity::EntityName::parse)?;
            let row = super::found(state.store.$store_rename(&id, name.as_ref()).await?, $what, &id)?;
            tracing::info!($($field).+ = %row.id, "{} updated", $what);
            Ok(axum::Json(row.into()))
        }
    };
}

/// `DELETE /<entities>/{id}`: deletes with `$remove` and answers `{"id", "object": $object, "deleted": true}`,
/// or a 404 naming `$what`; the deletion is logged with the id under `$field`.
macro_rules! delete_by_id {
    ($(#[$doc:meta])* $handler:ident: $remove:ident, $what:literal, $object:literal, $($field:ident).+) => {
        $(#[$doc])*
        pub async fn $handler(
            axum::extract::State(state): axum::extract::State<crate::api::AppState>,
            super::ApiPath(id): super::ApiPath<String>,
        ) -> Result<axum::Json<super::Deleted>, crate::api::error::ApiError> {
            if !state.store.$remove(&id).await? {
                return Err(super::not_found($what, &id));
            }
            tracing::info!($($field).+ = %id, "{} deleted", $what);
            Ok(super::deleted(id, $object))
        }
    };
    // With what refers to it: `$remove` refuses, answered `409`, while anything does, unless `?force=true`, which
    // detaches them; it looks and deletes in one transaction.
    ($(#[$doc:meta])* $handler:ident: $remove:ident, $what:literal, $object:literal, $($field:ident).+,
     unless referred to) => {
        $(#[$doc])*
        pub async fn $handler(
            axum::extract::State(state): axum::extract::State<crate::api::AppState>,
            super::ApiPath(id): super::ApiPath<String>,
            crate::api::extract::ApiQuery(force): crate::api::extract::ApiQuery<super::Force>,
        ) -> Result<axum::Json<super::Deleted>, crate::api::error::ApiError> {
            match state.store.$remove(&id, force.force).await? {
                crate::store::admin::Removal::Missing => Err(super::not_found($what, &id)),
                crate::store::admin::Removal::InUse(referrers) => Err(super::in_use($what, &id, &referrers)),
                crate::store::admin::Removal::Deleted(referrers) => {
                    tracing::info!($($field).+ = %id, detached = ?referrers, "{} deleted", $what);
                    Ok(super::deleted(id, $object))
                }
            }
        }
    };
}

/// `?force=true` on a delete: detach what refers to the entity, then delete it.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Force {
    #[serde(default)]
    force: bool,
}

/// A delete refused because `referrers` still refer to the entity.
fn in_use(what: &str, id: &str, referrers: &[String]) -> crate::api::error::ApiError {
    let mut error = crate::api::error::ApiError::conflict(format!(
        "The {what} '{id}' is referred to by {}; detach it first, or delete it with '?force=true', which detaches \
         it from them.",
        referrers.join(", ")
    ));
    error.code = Some("in_use".into());
    error
}

mod api_keys;
mod browse;
mod deployments;
mod governed;
mod groups;
mod projects;
mod resolution;
mod tool_calls;
mod tool_health;
mod tool_sources;
mod usage;
mod webhooks;

use axum::extract::{FromRequest, Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, put};
use axum::{Json, Router};
use gateway_core::request::InvalidRequest;
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
pub use super::extract::ApiPath;
use super::extract::{bearer, ApiJson};
use super::AppState;

/// The routes of an entity served by the five usual handlers of `$module`: list and create on `$collection`;
/// read, update and delete on `$item`.
macro_rules! entity_routes {
    ($router:expr, $module:ident, $collection:literal, $item:literal:
     $list:ident, $create:ident, $get:ident, $update:ident, $delete:ident) => {
        $router
            .route($collection, get($module::$list).post($module::$create))
            .route(
                $item,
                get($module::$get)
                    .patch($module::$update)
                    .delete($module::$delete),
            )
    };
}

/// Every admin route, to be nested under `/admin/v1`.
pub fn routes(state: AppState) -> Router<AppState> {
    let router = Router::new();
    let router = entity_routes!(router, projects, "/projects", "/projects/{project_id}":
        list_projects, create_project, get_project, update_project, delete_project);
    let router = entity_routes!(router, deployments, "/deployments", "/deployments/{deployment_id}":
        list_deployments, create_deployment, get_deployment, update_deployment, delete_deployment);
    let router = entity_routes!(router, groups, "/deployment_groups", "/deployment_groups/{group_id}":
        list_groups, create_group, get_group, update_group, delete_group);
    let router = entity_routes!(router, tool_sources, "/tool_sources", "/tool_sources/{tool_source_id}":
        list_tool_sources, create_tool_source, get_tool_source, update_tool_source, delete_tool_source);
    router
        .route(
            "/projects/{project_id}/api_keys",
            get(api_keys::list_api_keys).post(api_keys::create_api_key),
        )
        .route(
            "/projects/{project_id}/webhooks",
            get(webhooks::list_webhooks).post(webhooks::create_webhook),
        )
        .route(
            "/projects/{project_id}/webhooks/{webhook_id}",
            axum::routing::delete(webhooks::delete_webhook),
        )
        .route(
            "/projects/{project_id}/webhooks/{webhook_id}/deliveries",
            get(webhooks::list_deliveries),
        )
        .route(
            "/api_keys/{key_id}",
            get(api_keys::get_api_key)
                .patch(api_keys::update_api_key)
                .delete(api_keys::revoke_api_key),
        )
        .route(
            "/deployment_groups/{group_id}/deployments/{deployment_id}",
            put(groups::attach_deployment).delete(groups::detach_deployment),
        )
        .route(
            "/deployment_groups/{group_id}/projects/{project_id}",
            put(groups::attach_project).delete(groups::detach_project),
        )
        .route(
            "/deployment_groups/{group_id}/tool_sources/{tool_source_id}",
            put(groups::attach_tool_source).delete(groups::detach_tool_source),
        )
        .route(
            "/deployments/{deployment_id}/check",
            axum::routing::post(deployments::check_deployment),
        )
        .route(
            "/projects/{project_id}/resolution",
            get(resolution::project_resolution),
        )
        .route(
            "/tool_sources/{tool_source_id}/tools",
            get(resolution::source_tools),
        )
        .route("/responses", get(browse::list_responses))
        .route(
            "/responses/{response_id}/steps",
            get(browse::response_steps),
        )
        .route(
            "/responses/{response_id}/tool_calls",
            get(tool_calls::response_tool_calls),
        )
        .route(
            "/projects/{project_id}/tool_calls",
            get(tool_calls::project_tool_calls),
        )
        .route("/usage", get(usage::usage))
        .route("/tool_sources/health", get(tool_health::tool_source_health))
        // Both apply to the routes above only, so they must stay last. The token is checked before any
        // extractor reads the path or body; an unknown route or method answers 404 or 405 without it.
        .route_layer(middleware::from_fn_with_state(state, require_admin_token))
        .method_not_allowed_fallback(method_not_allowed)
}

// ---------------------------------------------------------------------------------------------------------
// Authentication

/// Lets a request through only with the admin token (`Authorization: Bearer <admin token>`), or, for a `GET`,
/// with the console's session cookie (the console reads, never writes). Without a configured token every admin
/// request is refused: the admin API is disabled.
async fn require_admin_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(expected) = state.admin_token.as_ref() else {
        return Err(ApiError::unauthorized(
            "The admin API is disabled: the gateway has no admin token configured.",
            Some("admin_api_disabled"),
        ));
    };
    let Some(given) = bearer(request.headers()) else {
        if request.method() == Method::GET
            && super::console::signed_in(&state, request.headers()).await?
        {
            return Ok(next.run(request).await);
        }
        return Err(ApiError::unauthorized(
            "You didn't provide the admin token. Send it as 'Authorization: Bearer <admin token>'.",
            None,
        ));
    };
    if !same_secret(given, expected.expose_secret()) {
        return Err(ApiError::unauthorized(
            "Incorrect admin token provided.",
            Some("invalid_admin_token"),
        ));
    }
    Ok(next.run(request).await)
}

/// Compares two secrets in constant time: both are hashed to fixed-length digests first, so neither where
/// they differ nor how long the expected one is shows in the time taken.
pub(crate) fn same_secret(given: &str, expected: &str) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    given.as_slice().ct_eq(expected.as_slice()).into()
}

// ---------------------------------------------------------------------------------------------------------
// Extractors

/// A JSON object body: `ApiJson`'s 400s for unreadable bodies, then a 400 for anything but an object (serde
/// would otherwise accept `["acme"]` as `{"name": "acme"}`), then typed with the offending field as `param`.
pub struct AdminJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for AdminJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
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

/// `{"name"}`: deployment groups.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
}

/// Present fields become `Some`, so that `null` (`Some(None)`) differs from absent (`None`, by `default`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// A present field as the JSON it is, `null` included (`Some(Value::Null)`); absent is `None` (by `default`).
/// For fields checked by a parser that names their inner fields (`limits.rpm`), which serde's own types would
/// not.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

// ---------------------------------------------------------------------------------------------------------
// Fields

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

/// Refuses a query naming a parameter not in `known`: a 400 naming it, so a typo is not silently ignored.
fn only_params(
    query: &std::collections::HashMap<String, String>,
    known: &[&str],
) -> Result<(), ApiError> {
    match query.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(ApiError::invalid(
            format!("Unknown query parameter '{unknown}'."),
            Some(unknown),
            Some("unknown_parameter"),
        )),
        None => Ok(()),
    }
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

/// A field that must be present, parsed with `parse` (e.g. `EntityName::parse`), which names `param`.
fn parse_required<T, U>(
    value: Option<Option<T>>,
    param: &str,
    parse: impl FnOnce(T, &str) -> Result<U, InvalidRequest>,
) -> Result<U, ApiError> {
    Ok(parse(required(value, param)?, param)?)
}

/// A PATCH field that may be absent but not `null`, parsed with `parse` when present.
fn parse_changed<T, U>(
    value: Option<Option<T>>,
    param: &str,
    parse: impl FnOnce(T, &str) -> Result<U, InvalidRequest>,
) -> Result<Option<U>, ApiError> {
    match not_null(value, param)? {
        Some(value) => Ok(Some(parse(value, param)?)),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Answers

/// `{"object": "list", "data": [...]}`: every list answer.
#[derive(Debug, Serialize)]
pub struct List<T> {
    object: &'static str,
    data: Vec<T>,
}

/// Lists `rows` as their answer objects.
fn list<R, T: From<R>>(rows: Vec<R>) -> Json<List<T>> {
    Json(List {
        object: "list",
        data: rows.into_iter().map(T::from).collect(),
    })
}

/// `{"id", "object", "deleted": true}`: the answer to a delete.
#[derive(Debug, Serialize)]
pub struct Deleted {
    id: String,
    object: &'static str,
    deleted: bool,
}

fn deleted(id: String, object: &'static str) -> Json<Deleted> {
    Json(Deleted {
        id,
        object,
        deleted: true,
    })
}

fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::not_found(format!("No {what} with id '{id}'."))
}

/// The row a read found, or a 404 saying there is no `what` with id `id`.
fn found<R>(row: Option<R>, what: &str, id: &str) -> Result<R, ApiError> {
    row.ok_or_else(|| not_found(what, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(same_secret("admin-token", "admin-token"));
        assert!(!same_secret("admin-token", "admin-tokeN"));
        assert!(!same_secret("admin-token", "admin-token-longer"));
        assert!(!same_secret("", "admin-token"));
    }
}
