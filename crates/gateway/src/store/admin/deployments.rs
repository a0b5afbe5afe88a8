//! Deployments: the model names clients send, bound to an upstream provider, with their prices. The upstream
//! key is written here and only read back as `has_api_key`.

use gateway_core::entity::{EntityName, HttpUrl, ProviderKind};
use gateway_core::governance::{Change, Pricing};
use gateway_core::toolset::UnsupportedTools;

use super::references::LOCK_ALL_DEPLOYMENTS;
use crate::clock::now;
use crate::ids::new_id;
use crate::store::{Backend, Store, StoreError};

/// A deployment, without its upstream credentials.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeploymentRow {
    pub id: String,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub provider_kind: ProviderKind,
    pub base_url: String,
    pub upstream_model: String,
    pub has_api_key: bool,
    /// JSON array of deployment names.
    pub fallbacks: String,
    pub unsupported_tools: String,
    pub unsupported_params: String,
    pub max_tokens: Option<i64>,
    pub created_at: i64,
    pub input_per_mtok: Option<f64>,
    pub cached_input_per_mtok: Option<f64>,
    pub output_per_mtok: Option<f64>,
}

impl DeploymentRow {
    /// The deployment's prices: set when its input and output prices are.
    pub fn pricing(&self) -> Option<Pricing> {
        let (input_per_mtok, output_per_mtok) = self.input_per_mtok.zip(self.output_per_mtok)?;
        Some(Pricing {
            input_per_mtok,
            cached_input_per_mtok: self.cached_input_per_mtok,
            output_per_mtok,
        })
    }
}

/// A deployment to create.
#[derive(Debug, Clone)]
pub struct NewDeployment<'a> {
    pub name: &'a EntityName,
    pub provider_kind: ProviderKind,
    pub base_url: &'a HttpUrl,
    pub upstream_model: &'a str,
    pub api_key: Option<&'a str>,
    pub fallbacks: &'a [String],
    pub unsupported_tools: UnsupportedTools,
    pub unsupported_params: UnsupportedTools,
    pub max_tokens: Option<u32>,
    pub pricing: Option<Pricing>,
}

/// Changes to a deployment; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct DeploymentChanges<'a> {
    pub name: Option<&'a EntityName>,
    pub provider_kind: Option<ProviderKind>,
    pub base_url: Option<&'a HttpUrl>,
    pub upstream_model: Option<&'a str>,
    /// `Some(None)` clears the key, `Some(Some(k))` replaces it.
    pub api_key: Option<Option<&'a str>>,
    pub fallbacks: Option<&'a [String]>,
    pub unsupported_tools: Option<UnsupportedTools>,
    pub unsupported_params: Option<UnsupportedTools>,
    /// `Some(None)` returns to the gateway's default.
    pub max_tokens: Option<Option<u32>>,
    /// `Some(None)` removes the prices (calls then cost nothing), `Some(Some(p))` replaces them.
    pub pricing: Change<Pricing>,
}

/// The columns of a `DeploymentRow`: whether there is a key, never the key.
macro_rules! deployment_columns {
    () => {
        "id, name, provider_kind, base_url, upstream_model, (api_key IS NOT NULL) AS has_api_key, fallbacks,
         unsupported_tools, unsupported_params, max_tokens, created_at, input_per_mtok, cached_input_per_mtok,
         output_per_mtok"
    };
}

/// The first of `$fallbacks` (a `&[String]`) that no deployment is named, read in `$tx`'s transaction (after the
/// lock on Postgres; on the embedded store its one writer orders the writes); a macro, since the transaction is
/// of either backend.
macro_rules! missing_fallback {
    ($tx:ident, $fallbacks:expr) => {{
        let fallbacks: &[String] = $fallbacks;
        if fallbacks.is_empty() {
            None
        } else {
            let names: Vec<String> = sqlx::query_scalar("SELECT name FROM deployments")
                .fetch_all(&mut *$tx)
                .await?;
            fallbacks.iter().find(|name| !names.contains(name)).cloned()
        }
    }};
}

impl Store {
    /// Creates a deployment; `Conflict` when the name is taken, or when a fallback it names was deleted since the
    /// caller checked (its fallbacks are checked again under the deployments' lock, in the same transaction).
    pub async fn create_deployment(
        &self,
        new: &NewDeployment<'_>,
    ) -> Result<DeploymentRow, StoreError> {
        let lock_all = self.lock_for_fallbacks(!new.fallbacks.is_empty());
        let created = with_pool!(self, |pool| async {
            let mut tx = pool.begin().await?;
            if let Some(lock_all) = lock_all {
                sqlx::query(lock_all).execute(&mut *tx).await?;
            }
            if let Some(missing) = missing_fallback!(tx, new.fallbacks) {
                return Ok(Err(missing));
            }
            let row = sqlx::query_as::<_, DeploymentRow>(concat!(
            "INSERT INTO deployments (id, name, provider_kind, base_url, upstream_model, api_key, created_at,
                                      fallbacks, unsupported_tools, max_tokens, input_per_mtok,
                                      cached_input_per_mtok, output_per_mtok, unsupported_params)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
             RETURNING ",
            deployment_columns!()
        ))
        .bind(new_id("dep"))
        .bind(new.name.as_str())
        .bind(new.provider_kind.as_str())
        .bind(new.base_url.as_str())
        .bind(new.upstream_model)
        .bind(new.api_key)
        .bind(now())
        .bind(fallbacks_json(new.fallbacks))
        .bind(new.unsupported_tools.as_str())
        .bind(new.max_tokens.map(i64::from))
        .bind(new.pricing.map(|p| p.input_per_mtok))
        .bind(new.pricing.and_then(|p| p.cached_input_per_mtok))
        .bind(new.pricing.map(|p| p.output_per_mtok))
        .bind(new.unsupported_params.as_str())
        .fetch_one(&mut *tx)
        .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(Ok(row))
        }
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(new.name.as_str())))?;
        created.map_err(fallback_gone)
    }

    rows_by_name_and_id! {
        DeploymentRow, deployment_columns, "deployments";
        /// Every deployment, by name.
        list_deployments;
        /// One deployment.
        get_deployment
    }

    /// Applies changes to a deployment; `Ok(None)` when there is no such deployment. A deployment renamed keeps
    /// its place among the fallbacks of the others: they name it by its new name from the same transaction on.
    pub async fn update_deployment(
        &self,
        id: &str,
        changes: &DeploymentChanges<'_>,
    ) -> Result<Option<DeploymentRow>, StoreError> {
        let pricing = changes.pricing.flatten();
        // A rename, or new fallbacks, lock every deployment first, in one order, on Postgres: the fallbacks a
        // rename rewrites cannot change under it, a fallback named cannot be deleted before this commits, and two
        // such writes wait for each other instead of deadlocking.
        let names_fallbacks = changes.fallbacks.is_some_and(|names| !names.is_empty());
        let lock_all = self.lock_for_fallbacks(changes.name.is_some() || names_fallbacks);
        let updated = with_pool!(self, |pool| async {
            let mut tx = pool.begin().await?;
            if let Some(lock_all) = lock_all {
                sqlx::query(lock_all).execute(&mut *tx).await?;
            }
            if let Some(missing) = missing_fallback!(tx, changes.fallbacks.unwrap_or_default()) {
                return Ok(Err(missing));
            }
            let before: Option<String> =
                sqlx::query_scalar("SELECT name FROM deployments WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some(row) = sqlx::query_as::<_, DeploymentRow>(concat!(
                "UPDATE deployments SET
                name = COALESCE($2, name),
                provider_kind = COALESCE($3, provider_kind),
                base_url = COALESCE($4, base_url),
                upstream_model = COALESCE($5, upstream_model),
                api_key = CASE WHEN $6 THEN $7 ELSE api_key END,
                fallbacks = COALESCE($8, fallbacks),
                unsupported_tools = COALESCE($9, unsupported_tools),
                max_tokens = CASE WHEN $10 THEN $11 ELSE max_tokens END,
                input_per_mtok = CASE WHEN $12 THEN $13 ELSE input_per_mtok END,
                cached_input_per_mtok = CASE WHEN $14 THEN $15 ELSE cached_input_per_mtok END,
                output_per_mtok = CASE WHEN $16 THEN $17 ELSE output_per_mtok END,
                unsupported_params = COALESCE($18, unsupported_params)
             WHERE id = $1
             RETURNING ",
                deployment_columns!()
            ))
            .bind(id)
            .bind(changes.name.map(EntityName::as_str))
            .bind(changes.provider_kind.map(ProviderKind::as_str))
            .bind(changes.base_url.map(HttpUrl::as_str))
            .bind(changes.upstream_model)
            .bind(changes.api_key.is_some())
            .bind(changes.api_key.flatten())
            .bind(changes.fallbacks.map(fallbacks_json))
            .bind(changes.unsupported_tools.map(UnsupportedTools::as_str))
            .bind(changes.max_tokens.is_some())
            .bind(changes.max_tokens.flatten().map(i64::from))
            .bind(changes.pricing.is_some())
            .bind(pricing.map(|p| p.input_per_mtok))
            .bind(changes.pricing.is_some())
            .bind(pricing.and_then(|p| p.cached_input_per_mtok))
            .bind(changes.pricing.is_some())
            .bind(pricing.map(|p| p.output_per_mtok))
            .bind(changes.unsupported_params.map(UnsupportedTools::as_str))
            .fetch_optional(&mut *tx)
            .await?
            else {
                return Ok(Ok(None));
            };
            if let Some(before) = before.filter(|before| *before != row.name) {
                let referring: Vec<(String, String)> =
                    sqlx::query_as("SELECT id, fallbacks FROM deployments WHERE fallbacks <> '[]'")
                        .fetch_all(&mut *tx)
                        .await?;
                for (referring_id, fallbacks) in referring {
                    let names: Vec<String> = serde_json::from_str(&fallbacks).unwrap_or_default();
                    if !names.contains(&before) {
                        continue;
                    }
                    let renamed: Vec<String> = names
                        .into_iter()
                        .map(|name| {
                            if name == before {
                                row.name.clone()
                            } else {
                                name
                            }
                        })
                        .collect();
                    sqlx::query("UPDATE deployments SET fallbacks = $2 WHERE id = $1")
                        .bind(&referring_id)
                        .bind(fallbacks_json(&renamed))
                        .execute(&mut *tx)
                        .await?;
                }
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(Ok(Some(row)))
        }
        .await)
        .map_err(|e| {
            StoreError::from_write(e, &taken(changes.name.map_or("", EntityName::as_str)))
        })?;
        updated.map_err(fallback_gone)
    }

    /// The lock a write that renames deployments or names fallbacks takes first on Postgres (`when`).
    fn lock_for_fallbacks(&self, when: bool) -> Option<&'static str> {
        match self.backend() {
            Backend::Postgres(_) if when => Some(LOCK_ALL_DEPLOYMENTS),
            _ => None,
        }
    }
}

/// A write refused because fallback `name` was deleted after the caller checked it.
fn fallback_gone(name: String) -> StoreError {
    StoreError::Conflict(format!(
        "No deployment named '{name}' remains to be a fallback: it was deleted meanwhile."
    ))
}

fn fallbacks_json(names: &[String]) -> String {
    serde_json::Value::from(names.to_vec()).to_string()
}

fn taken(name: &str) -> String {
    format!("A deployment named '{name}' already exists.")
}
