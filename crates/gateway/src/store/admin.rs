//! Admin persistence: projects, API keys, deployments, deployment groups, tool sources and the group
//! memberships that decide what a project may use.
//!
//! Row structs never carry a secret: deployment API keys and tool-source secrets are written here but only
//! ever read back as `has_api_key` / `has_secret`, so no admin answer can leak them by accident.

use super::backend::Fields;
use super::{Backend, Store, StoreError};
use crate::clock::now;
use crate::ids::new_id;
use serde_json::Value;

/// A project (tenant).
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

/// An API key as the store keeps it: a hash (not read back here) and a short prefix to tell keys apart.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRow {
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub key_prefix: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A new API key: the caller generates the key and passes only its hash and prefix.
#[derive(Debug, Clone)]
pub struct NewApiKey<'a> {
    pub project_id: &'a str,
    pub name: &'a str,
    pub key_hash: &'a str,
    pub key_prefix: &'a str,
}

/// A deployment, without its upstream credentials.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentRow {
    pub id: String,
    pub name: String,
    pub provider_kind: String,
    pub base_url: String,
    pub upstream_model: String,
    pub has_api_key: bool,
    pub created_at: i64,
}

/// A deployment to create.
#[derive(Debug, Clone)]
pub struct NewDeployment<'a> {
    pub name: &'a str,
    pub provider_kind: &'a str,
    pub base_url: &'a str,
    pub upstream_model: &'a str,
    pub api_key: Option<&'a str>,
}

/// Changes to a deployment; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct DeploymentChanges<'a> {
    pub name: Option<&'a str>,
    pub provider_kind: Option<&'a str>,
    pub base_url: Option<&'a str>,
    pub upstream_model: Option<&'a str>,
    /// `Some(None)` clears the key, `Some(Some(k))` replaces it.
    pub api_key: Option<Option<&'a str>>,
}

/// A deployment group with the ids of its members.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    pub deployment_ids: Vec<String>,
    pub project_ids: Vec<String>,
    pub tool_source_ids: Vec<String>,
}

/// A tool source, without its secret.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSourceRow {
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub url: String,
    pub timeout_ms: i64,
    pub strict: bool,
    pub has_secret: bool,
    pub created_at: i64,
}

/// A tool source to create.
#[derive(Debug, Clone)]
pub struct NewToolSource<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub parameters: &'a Value,
    pub url: &'a str,
    pub timeout_ms: i64,
    pub secret: Option<&'a str>,
    pub strict: bool,
}

/// Changes to a tool source; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ToolSourceChanges<'a> {
    pub name: Option<&'a str>,
    pub description: Option<&'a str>,
    pub parameters: Option<&'a Value>,
    pub url: Option<&'a str>,
    pub timeout_ms: Option<i64>,
    /// `Some(None)` clears the secret, `Some(Some(s))` replaces it.
    pub secret: Option<Option<&'a str>>,
    pub strict: Option<bool>,
}

/// What can be a member of a deployment group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    Deployment,
    Project,
    ToolSource,
}

impl Member {
    /// `deployment`, `project` or `tool_source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Member::Deployment => "deployment",
            Member::Project => "project",
            Member::ToolSource => "tool_source",
        }
    }

    // One fixed statement per member kind: table names cannot be bound, and SQL is never built with format!.
    fn exists_sql(self) -> &'static str {
        match self {
            Member::Deployment => "SELECT EXISTS (SELECT 1 FROM deployments WHERE id = $1)",
            Member::Project => "SELECT EXISTS (SELECT 1 FROM projects WHERE id = $1)",
            Member::ToolSource => "SELECT EXISTS (SELECT 1 FROM tool_sources WHERE id = $1)",
        }
    }

    fn attach_sql(self) -> &'static str {
        match self {
            Member::Deployment => {
                "INSERT INTO group_deployments (group_id, deployment_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            }
            Member::Project => "INSERT INTO group_projects (group_id, project_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            Member::ToolSource => {
                "INSERT INTO group_tool_sources (group_id, tool_source_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            }
        }
    }

    fn detach_sql(self) -> &'static str {
        match self {
            Member::Deployment => {
                "DELETE FROM group_deployments WHERE group_id = $1 AND deployment_id = $2"
            }
            Member::Project => "DELETE FROM group_projects WHERE group_id = $1 AND project_id = $2",
            Member::ToolSource => {
                "DELETE FROM group_tool_sources WHERE group_id = $1 AND tool_source_id = $2"
            }
        }
    }
}

/// Outcome of attaching or detaching a group member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// Done (attaching something already attached, too).
    Done,
    GroupMissing,
    MemberMissing,
    /// Detaching something that was not attached.
    NotAttached,
}

impl Store {
    // ---- projects ----

    /// Creates a project; `Conflict` when the name is taken.
    pub async fn create_project(&self, name: &str) -> Result<ProjectRow, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query("INSERT INTO projects (id, name, created_at) VALUES ($1, $2, $3) RETURNING id, name, created_at")
                .bind(new_id("proj"))
                .bind(name)
                .bind(now())
                .fetch_one(pool)
                .await
                .map_err(|e| StoreError::from_write(e, &format!("A project named '{name}' already exists.")))?;
            Ok(project(&row)?)
        })
    }

    /// Every project, by name.
    pub async fn list_projects(&self) -> Result<Vec<ProjectRow>, StoreError> {
        with_pool!(self, |pool| {
            let rows = sqlx::query("SELECT id, name, created_at FROM projects ORDER BY name")
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(project).collect::<Result<_, _>>()?)
        })
    }

    /// One project.
    pub async fn get_project(&self, id: &str) -> Result<Option<ProjectRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query("SELECT id, name, created_at FROM projects WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(project).transpose()?)
        })
    }

    /// Renames a project (`None` keeps the name); `Ok(None)` when there is no such project.
    pub async fn update_project(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<Option<ProjectRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query("UPDATE projects SET name = COALESCE($2, name) WHERE id = $1 RETURNING id, name, created_at")
                .bind(id)
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(|e| StoreError::from_write(e, &format!("A project named '{}' already exists.", name.unwrap_or_default())))?;
            Ok(row.as_ref().map(project).transpose()?)
        })
    }

    /// Deletes a project with its keys, responses and group grants; `false` when there was none.
    pub async fn delete_project(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM projects WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }

    // ---- api keys ----

    /// Records a new key of a project; `Ok(None)` when the project does not exist.
    pub async fn create_api_key(
        &self,
        new: &NewApiKey<'_>,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "INSERT INTO api_keys (id, project_id, name, key_hash, key_prefix, created_at)
                 SELECT $1, p.id, $3, $4, $5, $6 FROM projects p WHERE p.id = $2
                 RETURNING id, project_id, name, key_prefix, created_at, revoked_at",
            )
            .bind(new_id("key"))
            .bind(new.project_id)
            .bind(new.name)
            .bind(new.key_hash)
            .bind(new.key_prefix)
            .bind(now())
            .fetch_optional(pool)
            .await
            .map_err(|e| StoreError::from_write(e, "A key with the same hash already exists."))?;
            Ok(row.as_ref().map(api_key).transpose()?)
        })
    }

    /// Every key of a project (revoked ones too), oldest first; `Ok(None)` when the project does not exist.
    pub async fn list_api_keys(
        &self,
        project_id: &str,
    ) -> Result<Option<Vec<ApiKeyRow>>, StoreError> {
        if self.get_project(project_id).await?.is_none() {
            return Ok(None);
        }
        with_pool!(self, |pool| {
            let rows = sqlx::query(
                "SELECT id, project_id, name, key_prefix, created_at, revoked_at
                 FROM api_keys WHERE project_id = $1 ORDER BY created_at, id",
            )
            .bind(project_id)
            .fetch_all(pool)
            .await?;
            Ok(Some(rows.iter().map(api_key).collect::<Result<_, _>>()?))
        })
    }

    /// One key.
    pub async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query("SELECT id, project_id, name, key_prefix, created_at, revoked_at FROM api_keys WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(api_key).transpose()?)
        })
    }

    /// Renames a key (`None` keeps the name).
    pub async fn update_api_key(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "UPDATE api_keys SET name = COALESCE($2, name) WHERE id = $1
                 RETURNING id, project_id, name, key_prefix, created_at, revoked_at",
            )
            .bind(id)
            .bind(name)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(api_key).transpose()?)
        })
    }

    /// Revokes a key at once (authentication reads `revoked_at` per request). Revoking again keeps the
    /// first revocation time.
    pub async fn revoke_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1
                 RETURNING id, project_id, name, key_prefix, created_at, revoked_at",
            )
            .bind(id)
            .bind(now())
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(api_key).transpose()?)
        })
    }

    // ---- deployments ----

    /// Creates a deployment; `Conflict` when the name is taken.
    pub async fn create_deployment(
        &self,
        new: &NewDeployment<'_>,
    ) -> Result<DeploymentRow, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "INSERT INTO deployments (id, name, provider_kind, base_url, upstream_model, api_key, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 RETURNING id, name, provider_kind, base_url, upstream_model, (api_key IS NOT NULL) AS has_api_key, created_at",
            )
            .bind(new_id("dep"))
            .bind(new.name)
            .bind(new.provider_kind)
            .bind(new.base_url)
            .bind(new.upstream_model)
            .bind(new.api_key)
            .bind(now())
            .fetch_one(pool)
            .await
            .map_err(|e| StoreError::from_write(e, &format!("A deployment named '{}' already exists.", new.name)))?;
            Ok(deployment(&row)?)
        })
    }

    /// Every deployment, by name.
    pub async fn list_deployments(&self) -> Result<Vec<DeploymentRow>, StoreError> {
        with_pool!(self, |pool| {
            let rows = sqlx::query(
                "SELECT id, name, provider_kind, base_url, upstream_model, (api_key IS NOT NULL) AS has_api_key, created_at
                 FROM deployments ORDER BY name",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(deployment).collect::<Result<_, _>>()?)
        })
    }

    /// One deployment.
    pub async fn get_deployment(&self, id: &str) -> Result<Option<DeploymentRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "SELECT id, name, provider_kind, base_url, upstream_model, (api_key IS NOT NULL) AS has_api_key, created_at
                 FROM deployments WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(deployment).transpose()?)
        })
    }

    /// Applies changes to a deployment; `Ok(None)` when there is no such deployment.
    pub async fn update_deployment(
        &self,
        id: &str,
        changes: &DeploymentChanges<'_>,
    ) -> Result<Option<DeploymentRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "UPDATE deployments SET
                    name = COALESCE($2, name),
                    provider_kind = COALESCE($3, provider_kind),
                    base_url = COALESCE($4, base_url),
                    upstream_model = COALESCE($5, upstream_model),
                    api_key = CASE WHEN $6 THEN $7 ELSE api_key END
                 WHERE id = $1
                 RETURNING id, name, provider_kind, base_url, upstream_model, (api_key IS NOT NULL) AS has_api_key, created_at",
            )
            .bind(id)
            .bind(changes.name)
            .bind(changes.provider_kind)
            .bind(changes.base_url)
            .bind(changes.upstream_model)
            .bind(changes.api_key.is_some())
            .bind(changes.api_key.flatten())
            .fetch_optional(pool)
            .await
            .map_err(|e| {
                StoreError::from_write(e, &format!("A deployment named '{}' already exists.", changes.name.unwrap_or_default()))
            })?;
            Ok(row.as_ref().map(deployment).transpose()?)
        })
    }

    /// Deletes a deployment and its group memberships; `false` when there was none.
    pub async fn delete_deployment(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM deployments WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }

    // ---- deployment groups ----

    /// Creates an empty group; `Conflict` when the name is taken.
    pub async fn create_group(&self, name: &str) -> Result<GroupRow, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "INSERT INTO deployment_groups (id, name, created_at) VALUES ($1, $2, $3) RETURNING id, name, created_at",
            )
            .bind(new_id("grp"))
            .bind(name)
            .bind(now())
            .fetch_one(pool)
            .await
            .map_err(|e| StoreError::from_write(e, &format!("A deployment group named '{name}' already exists.")))?;
            Ok(GroupRow {
                id: row.field("id")?,
                name: row.field("name")?,
                created_at: row.field("created_at")?,
                deployment_ids: Vec::new(),
                project_ids: Vec::new(),
                tool_source_ids: Vec::new(),
            })
        })
    }

    /// Every group with its members, by name.
    pub async fn list_groups(&self) -> Result<Vec<GroupRow>, StoreError> {
        match &self.backend {
            Backend::Postgres(pool) => {
                let rows = sqlx::query(
                    "SELECT g.id, g.name, g.created_at,
                        ARRAY(SELECT deployment_id FROM group_deployments WHERE group_id = g.id ORDER BY deployment_id) AS deployment_ids,
                        ARRAY(SELECT project_id FROM group_projects WHERE group_id = g.id ORDER BY project_id) AS project_ids,
                        ARRAY(SELECT tool_source_id FROM group_tool_sources WHERE group_id = g.id ORDER BY tool_source_id) AS tool_source_ids
                     FROM deployment_groups g ORDER BY g.name",
                )
                .fetch_all(pool)
                .await?;
                Ok(rows.iter().map(group).collect::<Result<_, _>>()?)
            }
            Backend::Sqlite(pool) => {
                let rows = sqlx::query(
                    "SELECT g.id, g.name, g.created_at,
                        (SELECT json_group_array(deployment_id ORDER BY deployment_id) FROM group_deployments WHERE group_id = g.id) AS deployment_ids,
                        (SELECT json_group_array(project_id ORDER BY project_id) FROM group_projects WHERE group_id = g.id) AS project_ids,
                        (SELECT json_group_array(tool_source_id ORDER BY tool_source_id) FROM group_tool_sources WHERE group_id = g.id) AS tool_source_ids
                     FROM deployment_groups g ORDER BY g.name",
                )
                .fetch_all(pool)
                .await?;
                Ok(rows.iter().map(group).collect::<Result<_, _>>()?)
            }
        }
    }

    /// One group with its members.
    pub async fn get_group(&self, id: &str) -> Result<Option<GroupRow>, StoreError> {
        match &self.backend {
            Backend::Postgres(pool) => {
                let row = sqlx::query(
                    "SELECT g.id, g.name, g.created_at,
                        ARRAY(SELECT deployment_id FROM group_deployments WHERE group_id = g.id ORDER BY deployment_id) AS deployment_ids,
                        ARRAY(SELECT project_id FROM group_projects WHERE group_id = g.id ORDER BY project_id) AS project_ids,
                        ARRAY(SELECT tool_source_id FROM group_tool_sources WHERE group_id = g.id ORDER BY tool_source_id) AS tool_source_ids
                     FROM deployment_groups g WHERE g.id = $1",
                )
                .bind(id)
                .fetch_optional(pool)
                .await?;
                Ok(row.as_ref().map(group).transpose()?)
            }
            Backend::Sqlite(pool) => {
                let row = sqlx::query(
                    "SELECT g.id, g.name, g.created_at,
                        (SELECT json_group_array(deployment_id ORDER BY deployment_id) FROM group_deployments WHERE group_id = g.id) AS deployment_ids,
                        (SELECT json_group_array(project_id ORDER BY project_id) FROM group_projects WHERE group_id = g.id) AS project_ids,
                        (SELECT json_group_array(tool_source_id ORDER BY tool_source_id) FROM group_tool_sources WHERE group_id = g.id) AS tool_source_ids
                     FROM deployment_groups g WHERE g.id = $1",
                )
                .bind(id)
                .fetch_optional(pool)
                .await?;
                Ok(row.as_ref().map(group).transpose()?)
            }
        }
    }

    /// Renames a group (`None` keeps the name); `Ok(None)` when there is no such group.
    pub async fn update_group(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<Option<GroupRow>, StoreError> {
        let updated = with_pool!(self, |pool| sqlx::query(
            "UPDATE deployment_groups SET name = COALESCE($2, name) WHERE id = $1"
        )
        .bind(id)
        .bind(name)
        .execute(pool)
        .await
        .map_err(|e| {
            StoreError::from_write(
                e,
                &format!(
                    "A deployment group named '{}' already exists.",
                    name.unwrap_or_default()
                ),
            )
        })?
        .rows_affected());
        if updated == 0 {
            return Ok(None);
        }
        self.get_group(id).await
    }

    /// Deletes a group and its memberships (not the members); `false` when there was none.
    pub async fn delete_group(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM deployment_groups WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }

    /// Adds a member to a group; attaching twice is not an error.
    pub async fn attach_member(
        &self,
        group_id: &str,
        kind: Member,
        member_id: &str,
    ) -> Result<Membership, StoreError> {
        if let Some(missing) = self.missing_party(group_id, kind, member_id).await? {
            return Ok(missing);
        }
        // A delete racing with this insert fails its foreign key, which `from_write` maps to `NotFound`.
        with_pool!(self, |pool| sqlx::query(kind.attach_sql())
            .bind(group_id)
            .bind(member_id)
            .execute(pool)
            .await
            .map_err(|e| StoreError::from_write(e, "The membership already exists."))?
            .rows_affected());
        Ok(Membership::Done)
    }

    /// Removes a member from a group.
    pub async fn detach_member(
        &self,
        group_id: &str,
        kind: Member,
        member_id: &str,
    ) -> Result<Membership, StoreError> {
        let detached = with_pool!(self, |pool| sqlx::query(kind.detach_sql())
            .bind(group_id)
            .bind(member_id)
            .execute(pool)
            .await?
            .rows_affected());
        if detached > 0 {
            return Ok(Membership::Done);
        }
        Ok(self
            .missing_party(group_id, kind, member_id)
            .await?
            .unwrap_or(Membership::NotAttached))
    }

    /// Which side of a membership does not exist, if any.
    async fn missing_party(
        &self,
        group_id: &str,
        kind: Member,
        member_id: &str,
    ) -> Result<Option<Membership>, StoreError> {
        let group: bool = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM deployment_groups WHERE id = $1)"
        )
        .bind(group_id)
        .fetch_one(pool)
        .await?);
        if !group {
            return Ok(Some(Membership::GroupMissing));
        }
        let member: bool = with_pool!(self, |pool| sqlx::query_scalar(kind.exists_sql())
            .bind(member_id)
            .fetch_one(pool)
            .await?);
        Ok((!member).then_some(Membership::MemberMissing))
    }

    // ---- tool sources ----

    /// Creates a tool source; `Conflict` when the name is taken.
    pub async fn create_tool_source(
        &self,
        new: &NewToolSource<'_>,
    ) -> Result<ToolSourceRow, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "INSERT INTO tool_sources (id, name, description, parameters, url, timeout_ms, secret, strict, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 RETURNING id, name, description, parameters, url, timeout_ms, strict, (secret IS NOT NULL) AS has_secret, created_at",
            )
            .bind(new_id("tool"))
            .bind(new.name)
            .bind(new.description)
            .bind(new.parameters)
            .bind(new.url)
            .bind(new.timeout_ms)
            .bind(new.secret)
            .bind(new.strict)
            .bind(now())
            .fetch_one(pool)
            .await
            .map_err(|e| StoreError::from_write(e, &format!("A tool source named '{}' already exists.", new.name)))?;
            Ok(tool_source(&row)?)
        })
    }

    /// Every tool source, by name.
    pub async fn list_tool_sources(&self) -> Result<Vec<ToolSourceRow>, StoreError> {
        with_pool!(self, |pool| {
            let rows = sqlx::query(
                "SELECT id, name, description, parameters, url, timeout_ms, strict, (secret IS NOT NULL) AS has_secret, created_at
                 FROM tool_sources ORDER BY name",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(tool_source).collect::<Result<_, _>>()?)
        })
    }

    /// One tool source.
    pub async fn get_tool_source(&self, id: &str) -> Result<Option<ToolSourceRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "SELECT id, name, description, parameters, url, timeout_ms, strict, (secret IS NOT NULL) AS has_secret, created_at
                 FROM tool_sources WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(tool_source).transpose()?)
        })
    }

    /// Applies changes to a tool source; `Ok(None)` when there is no such tool source.
    pub async fn update_tool_source(
        &self,
        id: &str,
        changes: &ToolSourceChanges<'_>,
    ) -> Result<Option<ToolSourceRow>, StoreError> {
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "UPDATE tool_sources SET
                    name = COALESCE($2, name),
                    description = COALESCE($3, description),
                    parameters = COALESCE($4, parameters),
                    url = COALESCE($5, url),
                    timeout_ms = COALESCE($6, timeout_ms),
                    secret = CASE WHEN $7 THEN $8 ELSE secret END,
                    strict = COALESCE($9, strict)
                 WHERE id = $1
                 RETURNING id, name, description, parameters, url, timeout_ms, strict, (secret IS NOT NULL) AS has_secret, created_at",
            )
            .bind(id)
            .bind(changes.name)
            .bind(changes.description)
            .bind(changes.parameters)
            .bind(changes.url)
            .bind(changes.timeout_ms)
            .bind(changes.secret.is_some())
            .bind(changes.secret.flatten())
            .bind(changes.strict)
            .fetch_optional(pool)
            .await
            .map_err(|e| {
                StoreError::from_write(e, &format!("A tool source named '{}' already exists.", changes.name.unwrap_or_default()))
            })?;
            Ok(row.as_ref().map(tool_source).transpose()?)
        })
    }

    /// Deletes a tool source and its group attachments; `false` when there was none.
    pub async fn delete_tool_source(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM tool_sources WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }
}

fn project(row: &impl Fields) -> Result<ProjectRow, sqlx::Error> {
    Ok(ProjectRow {
        id: row.field("id")?,
        name: row.field("name")?,
        created_at: row.field("created_at")?,
    })
}

fn api_key(row: &impl Fields) -> Result<ApiKeyRow, sqlx::Error> {
    Ok(ApiKeyRow {
        id: row.field("id")?,
        project_id: row.field("project_id")?,
        name: row.field("name")?,
        key_prefix: row.field("key_prefix")?,
        created_at: row.field("created_at")?,
        revoked_at: row.field("revoked_at")?,
    })
}

fn deployment(row: &impl Fields) -> Result<DeploymentRow, sqlx::Error> {
    Ok(DeploymentRow {
        id: row.field("id")?,
        name: row.field("name")?,
        provider_kind: row.field("provider_kind")?,
        base_url: row.field("base_url")?,
        upstream_model: row.field("upstream_model")?,
        has_api_key: row.field("has_api_key")?,
        created_at: row.field("created_at")?,
    })
}

fn group(row: &impl Fields) -> Result<GroupRow, sqlx::Error> {
    Ok(GroupRow {
        id: row.field("id")?,
        name: row.field("name")?,
        created_at: row.field("created_at")?,
        deployment_ids: row.id_list("deployment_ids")?,
        project_ids: row.id_list("project_ids")?,
        tool_source_ids: row.id_list("tool_source_ids")?,
    })
}

fn tool_source(row: &impl Fields) -> Result<ToolSourceRow, sqlx::Error> {
    Ok(ToolSourceRow {
        id: row.field("id")?,
        name: row.field("name")?,
        description: row.field("description")?,
        parameters: row.field("parameters")?,
        url: row.field("url")?,
        timeout_ms: row.field("timeout_ms")?,
        strict: row.field("strict")?,
        has_secret: row.field("has_secret")?,
        created_at: row.field("created_at")?,
    })
}
