//! What refers to an entity an operator deletes: the deployments that name a deployment as their fallback, and
//! the groups that hold a deployment, a tool source or members. A delete that would leave them pointing at
//! nothing is refused unless forced, and a forced one detaches them (SPEC 10: nothing dangling).

use crate::store::{Store, StoreError};

impl Store {
    /// Who refers to deployment `id`, as an operator reads it: `deployment 'primary' (fallbacks)`,
    /// `group 'team'`. Empty when nothing does, or when there is no such deployment.
    pub async fn deployment_referrers(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let Some(name) = self.deployment_name(id).await? else {
            return Ok(Vec::new());
        };
        let mut referrers: Vec<String> = self
            .deployments_falling_back_to(&name)
            .await?
            .into_iter()
            .map(|(_, other)| format!("deployment '{other}' (fallbacks)"))
            .collect();
        referrers.extend(
            self.group_names(
                "SELECT g.name FROM group_deployments m JOIN deployment_groups g ON g.id = m.group_id
                 WHERE m.deployment_id = $1 ORDER BY g.name",
                id,
            )
            .await?,
        );
        Ok(referrers)
    }

    /// Who refers to tool source `id`: the groups that hold it.
    pub async fn tool_source_referrers(&self, id: &str) -> Result<Vec<String>, StoreError> {
        self.group_names(
            "SELECT g.name FROM group_tool_sources m JOIN deployment_groups g ON g.id = m.group_id
             WHERE m.tool_source_id = $1 ORDER BY g.name",
            id,
        )
        .await
    }

    /// What group `id` holds: its projects, deployments and tool sources.
    pub async fn group_referrers(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let members: Vec<(String, String)> = with_pool!(self, |pool| {
            sqlx::query_as(
            "SELECT 'project', p.name FROM group_projects m JOIN projects p ON p.id = m.project_id
                 WHERE m.group_id = $1
             UNION ALL SELECT 'deployment', d.name FROM group_deployments m JOIN deployments d ON d.id = m.deployment_id
                 WHERE m.group_id = $1
             UNION ALL SELECT 'tool source', t.name FROM group_tool_sources m JOIN tool_sources t ON t.id = m.tool_source_id
                 WHERE m.group_id = $1
             ORDER BY 1, 2",
        )
        .bind(id)
        .fetch_all(pool)
        .await?
        });
        Ok(members
            .into_iter()
            .map(|(kind, name)| format!("{kind} '{name}'"))
            .collect())
    }

    /// Deletes deployment `id` after taking its name out of every other deployment's fallbacks (first, so that a
    /// failure between the two leaves nothing naming a missing deployment); its group memberships go with it.
    /// `false` when there was none.
    pub async fn delete_deployment(&self, id: &str) -> Result<bool, StoreError> {
        if let Some(name) = self.deployment_name(id).await? {
            for (other_id, _) in self.deployments_falling_back_to(&name).await? {
                self.remove_fallback(&other_id, &name).await?;
            }
        }
        self.delete_by_id("DELETE FROM deployments WHERE id = $1", id)
            .await
    }

    /// The names of the groups through which project `project_id` gets tool source `source_id` with deployment
    /// `deployment_id`.
    pub async fn groups_granting(
        &self,
        project_id: &str,
        deployment_id: &str,
        source_id: &str,
    ) -> Result<Vec<String>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT g.name FROM deployment_groups g
             JOIN group_tool_sources gt ON gt.group_id = g.id AND gt.tool_source_id = $3
             JOIN group_deployments gd ON gd.group_id = g.id AND gd.deployment_id = $2
             JOIN group_projects gp ON gp.group_id = g.id AND gp.project_id = $1
             ORDER BY g.name"
        )
        .bind(project_id)
        .bind(deployment_id)
        .bind(source_id)
        .fetch_all(pool)
        .await?))
    }

    /// Every group membership of a tool source: `(tool source id, group id, group name)`, by group name.
    pub async fn tool_source_groups(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_as(
            "SELECT m.tool_source_id, g.id, g.name FROM group_tool_sources m
             JOIN deployment_groups g ON g.id = m.group_id ORDER BY g.name"
        )
        .fetch_all(pool)
        .await?))
    }

    async fn deployment_name(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT name FROM deployments WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(pool)
        .await?))
    }

    /// `(id, name)` of every deployment whose fallbacks name `name`.
    async fn deployments_falling_back_to(
        &self,
        name: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows: Vec<(String, String, String)> = with_pool!(self, |pool| sqlx::query_as(
            "SELECT id, name, fallbacks FROM deployments WHERE fallbacks <> '[]' ORDER BY name"
        )
        .fetch_all(pool)
        .await?);
        Ok(rows
            .into_iter()
            .filter(|(_, _, fallbacks)| names_in(fallbacks).iter().any(|n| n == name))
            .map(|(id, name, _)| (id, name))
            .collect())
    }

    async fn remove_fallback(&self, id: &str, name: &str) -> Result<(), StoreError> {
        let fallbacks: Option<String> = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT fallbacks FROM deployments WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(pool)
        .await?);
        let Some(fallbacks) = fallbacks else {
            return Ok(());
        };
        let kept: Vec<String> = names_in(&fallbacks)
            .into_iter()
            .filter(|n| n != name)
            .collect();
        let kept = serde_json::Value::from(kept).to_string();
        with_pool!(self, |pool| sqlx::query(
            "UPDATE deployments SET fallbacks = $2 WHERE id = $1"
        )
        .bind(id)
        .bind(&kept)
        .execute(pool)
        .await
        .map(drop)?);
        Ok(())
    }

    async fn group_names(&self, sql: &'static str, id: &str) -> Result<Vec<String>, StoreError> {
        let names: Vec<String> = with_pool!(self, |pool| sqlx::query_scalar(sql)
            .bind(id)
            .fetch_all(pool)
            .await?);
        Ok(names.into_iter().map(|n| format!("group '{n}'")).collect())
    }
}

/// The deployment names of a `fallbacks` column (a JSON array).
fn names_in(fallbacks: &str) -> Vec<String> {
    serde_json::from_str(fallbacks).unwrap_or_default()
}
