//! Deployment groups and their memberships: which deployments a project may use, and with which tool sources.

use gateway_core::entity::EntityName;

use crate::clock::now;
use crate::ids::new_id;
use crate::store::{Backend, Store, StoreError};

/// A deployment group with the ids of its members, each list sorted.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct GroupRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    // Read as JSON arrays, which both backends can build (SQLite has no arrays). `default`: a group just
    // created has no members, and its `INSERT ... RETURNING` has no such columns.
    #[sqlx(json, default)]
    pub deployment_ids: Vec<String>,
    #[sqlx(json, default)]
    pub project_ids: Vec<String>,
    #[sqlx(json, default)]
    pub tool_source_ids: Vec<String>,
    /// The members' names, in the order of their ids.
    #[sqlx(json, default)]
    pub deployment_names: Vec<String>,
    #[sqlx(json, default)]
    pub project_names: Vec<String>,
    #[sqlx(json, default)]
    pub tool_source_names: Vec<String>,
}

/// Groups with their members, all (`$1` null) or one (`$1` its id), by name. The aggregate that builds a
/// JSON array differs between the backends, so each has its own statement.
const POSTGRES_GROUPS: &str = "SELECT g.id, g.name, g.created_at,
    (SELECT COALESCE(jsonb_agg(deployment_id ORDER BY deployment_id), '[]') FROM group_deployments WHERE group_id = g.id) AS deployment_ids,
    (SELECT COALESCE(jsonb_agg(project_id ORDER BY project_id), '[]') FROM group_projects WHERE group_id = g.id) AS project_ids,
    (SELECT COALESCE(jsonb_agg(tool_source_id ORDER BY tool_source_id), '[]') FROM group_tool_sources WHERE group_id = g.id) AS tool_source_ids,
    (SELECT COALESCE(jsonb_agg(d.name ORDER BY d.id), '[]') FROM group_deployments m JOIN deployments d ON d.id = m.deployment_id WHERE m.group_id = g.id) AS deployment_names,
    (SELECT COALESCE(jsonb_agg(p.name ORDER BY p.id), '[]') FROM group_projects m JOIN projects p ON p.id = m.project_id WHERE m.group_id = g.id) AS project_names,
    (SELECT COALESCE(jsonb_agg(t.name ORDER BY t.id), '[]') FROM group_tool_sources m JOIN tool_sources t ON t.id = m.tool_source_id WHERE m.group_id = g.id) AS tool_source_names
 FROM deployment_groups g WHERE $1::text IS NULL OR g.id = $1 ORDER BY g.name";

const SQLITE_GROUPS: &str = "SELECT g.id, g.name, g.created_at,
    (SELECT json_group_array(deployment_id ORDER BY deployment_id) FROM group_deployments WHERE group_id = g.id) AS deployment_ids,
    (SELECT json_group_array(project_id ORDER BY project_id) FROM group_projects WHERE group_id = g.id) AS project_ids,
    (SELECT json_group_array(tool_source_id ORDER BY tool_source_id) FROM group_tool_sources WHERE group_id = g.id) AS tool_source_ids,
    (SELECT json_group_array(d.name ORDER BY d.id) FROM group_deployments m JOIN deployments d ON d.id = m.deployment_id WHERE m.group_id = g.id) AS deployment_names,
    (SELECT json_group_array(p.name ORDER BY p.id) FROM group_projects m JOIN projects p ON p.id = m.project_id WHERE m.group_id = g.id) AS project_names,
    (SELECT json_group_array(t.name ORDER BY t.id) FROM group_tool_sources m JOIN tool_sources t ON t.id = m.tool_source_id WHERE m.group_id = g.id) AS tool_source_names
 FROM deployment_groups g WHERE $1 IS NULL OR g.id = $1 ORDER BY g.name";

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
    /// Creates an empty group; `Conflict` when the name is taken.
    pub async fn create_group(&self, name: &EntityName) -> Result<GroupRow, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, GroupRow>(
            "INSERT INTO deployment_groups (id, name, created_at) VALUES ($1, $2, $3) RETURNING id, name, created_at",
        )
        .bind(new_id("grp"))
        .bind(name.as_str())
        .bind(now())
        .fetch_one(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(name.as_str())))
    }

    /// Every group with its members, by name.
    pub async fn list_groups(&self) -> Result<Vec<GroupRow>, StoreError> {
        self.groups(None).await
    }

    /// One group with its members.
    pub async fn get_group(&self, id: &str) -> Result<Option<GroupRow>, StoreError> {
        Ok(self.groups(Some(id)).await?.pop())
    }

    async fn groups(&self, id: Option<&str>) -> Result<Vec<GroupRow>, StoreError> {
        let sql = match self.backend {
            Backend::Postgres(_) => POSTGRES_GROUPS,
            Backend::Sqlite(_) => SQLITE_GROUPS,
        };
        Ok(with_pool!(self, |pool| sqlx::query_as::<_, GroupRow>(sql)
            .bind(id)
            .fetch_all(pool)
            .await)?)
    }

    /// Renames a group (`None` keeps the name); `Ok(None)` when there is no such group.
    pub async fn update_group(
        &self,
        id: &str,
        name: Option<&EntityName>,
    ) -> Result<Option<GroupRow>, StoreError> {
        let updated = with_pool!(self, |pool| sqlx::query(
            "UPDATE deployment_groups SET name = COALESCE($2, name) WHERE id = $1"
        )
        .bind(id)
        .bind(name.map(EntityName::as_str))
        .execute(pool)
        .await
        .map_err(|e| StoreError::from_write(e, &taken(name.map_or("", EntityName::as_str))))?
        .rows_affected());
        if updated == 0 {
            return Ok(None);
        }
        self.get_group(id).await
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
}

fn taken(name: &str) -> String {
    format!("A deployment group named '{name}' already exists.")
}
