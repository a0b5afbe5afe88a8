//! What refers to an entity an operator deletes: the deployments that name a deployment as their fallback, and
//! the groups that hold a deployment, a tool source or members. A delete that would leave them pointing at
//! nothing is refused unless forced, and a forced one detaches them (SPEC 10: nothing dangling). The look at who
//! refers and the delete are one transaction, with the entity's row locked first on Postgres: a member attached,
//! or a fallback named, meanwhile either committed before (and is seen, and refused or detached) or waits for
//! the delete and then finds nothing to refer to.

use crate::store::{Backend, Store, StoreError};

/// What a delete of an entity others may refer to did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// There was no such entity.
    Missing,
    /// Refused, not forced: these still refer to it, as an operator reads them (`group 'team'`).
    InUse(Vec<String>),
    /// Deleted; these were detached from it.
    Deleted(Vec<String>),
}

/// Locks every deployment, in one order, on Postgres: what renames, fallback changes and deletes of deployments
/// take first, so that none of them sees the fallbacks change under it and two of them wait instead of
/// deadlocking. `NO KEY UPDATE`: the responses written meanwhile, whose foreign key to their deployment takes a
/// `KEY SHARE` lock on its row, do not wait for it (an operator's transaction paused half-way would otherwise hold
/// up every create until the database ends its session). A delete locks its own row `FOR UPDATE` after it.
pub(super) const LOCK_ALL_DEPLOYMENTS: &str =
    "SELECT id FROM deployments ORDER BY id FOR NO KEY UPDATE";

/// The statements of a removal, per backend: the entity's name (its row locked on Postgres), who refers to it
/// (`(kind, name)` rows, kind `group` for a group, `deployment` for a member), and its delete; and whether other
/// deployments may name it among their fallbacks (a deployment's removal).
struct RemovalSql {
    fallbacks: bool,
    find_postgres: &'static str,
    find_sqlite: &'static str,
    referrers: &'static str,
    delete: &'static str,
}

const TOOL_SOURCE: RemovalSql = RemovalSql {
    fallbacks: false,
    find_postgres: "SELECT name FROM tool_sources WHERE id = $1 FOR UPDATE",
    find_sqlite: "SELECT name FROM tool_sources WHERE id = $1",
    referrers: "SELECT 'group', g.name FROM group_tool_sources m JOIN deployment_groups g ON g.id = m.group_id
                WHERE m.tool_source_id = $1 ORDER BY 2",
    delete: "DELETE FROM tool_sources WHERE id = $1",
};

const GROUP: RemovalSql = RemovalSql {
    fallbacks: false,
    find_postgres: "SELECT name FROM deployment_groups WHERE id = $1 FOR UPDATE",
    find_sqlite: "SELECT name FROM deployment_groups WHERE id = $1",
    referrers:
        "SELECT 'project', p.name FROM group_projects m JOIN projects p ON p.id = m.project_id
                    WHERE m.group_id = $1
                UNION ALL SELECT 'deployment', d.name FROM group_deployments m
                    JOIN deployments d ON d.id = m.deployment_id WHERE m.group_id = $1
                UNION ALL SELECT 'tool source', t.name FROM group_tool_sources m
                    JOIN tool_sources t ON t.id = m.tool_source_id WHERE m.group_id = $1
                ORDER BY 1, 2",
    delete: "DELETE FROM deployment_groups WHERE id = $1",
};

/// A deployment's statements; every deployment is locked first (`LOCK_ALL_DEPLOYMENTS`), then its own row for
/// good, so that a group attaching it meanwhile waits.
const DEPLOYMENT: RemovalSql = RemovalSql {
    fallbacks: true,
    find_postgres: "SELECT name FROM deployments WHERE id = $1 FOR UPDATE",
    find_sqlite: "SELECT name FROM deployments WHERE id = $1",
    referrers: "SELECT 'group', g.name FROM group_deployments m JOIN deployment_groups g ON g.id = m.group_id
                WHERE m.deployment_id = $1 ORDER BY 2",
    delete: "DELETE FROM deployments WHERE id = $1",
};

impl Store {
    /// Deletes tool source `id` unless a group holds it; `force` detaches it from them instead.
    pub async fn remove_tool_source(&self, id: &str, force: bool) -> Result<Removal, StoreError> {
        self.remove(&TOOL_SOURCE, id, force).await
    }

    /// Deletes group `id` unless it holds projects, deployments or tool sources; `force` removes its memberships
    /// (never its members).
    pub async fn remove_group(&self, id: &str, force: bool) -> Result<Removal, StoreError> {
        self.remove(&GROUP, id, force).await
    }

    /// Deletes deployment `id` unless another names it among its fallbacks or a group holds it; `force` takes its
    /// name out of those fallbacks and its memberships with it.
    pub async fn remove_deployment(&self, id: &str, force: bool) -> Result<Removal, StoreError> {
        self.remove(&DEPLOYMENT, id, force).await
    }

    /// One removal, in one transaction: the entity found (and locked), who refers to it read, then refused, or
    /// deleted after the deployments naming it as their fallback (for a deployment) have let go of its name.
    async fn remove(&self, sql: &RemovalSql, id: &str, force: bool) -> Result<Removal, StoreError> {
        let fallbacks = sql.fallbacks;
        let (lock_all, find) = match &self.backend {
            Backend::Postgres(_) => (fallbacks.then_some(LOCK_ALL_DEPLOYMENTS), sql.find_postgres),
            Backend::Sqlite(_) => (None, sql.find_sqlite),
        };
        Ok(with_pool!(self, |pool| {
            async {
            let mut tx = pool.begin().await?;
            if let Some(lock_all) = lock_all {
                sqlx::query(lock_all).execute(&mut *tx).await?;
            }
            let name: Option<String> = sqlx::query_scalar(find).bind(id).fetch_optional(&mut *tx).await?;
            let Some(name) = name else {
                return Ok(Removal::Missing);
            };
            // `(id, name, fallbacks kept)` of each deployment whose fallbacks name this one.
            let mut falling_back: Vec<(String, String, Vec<String>)> = Vec::new();
            if fallbacks {
                let rows: Vec<(String, String, String)> = sqlx::query_as(
                    "SELECT id, name, fallbacks FROM deployments WHERE fallbacks <> '[]' ORDER BY name",
                )
                .fetch_all(&mut *tx)
                .await?;
                falling_back = rows
                    .into_iter()
                    .filter_map(|(other_id, other, names)| {
                        let names = names_in(&names);
                        names.contains(&name).then(|| {
                            (other_id, other, names.into_iter().filter(|n| *n != name).collect())
                        })
                    })
                    .collect();
            }
            let members: Vec<(String, String)> =
                sqlx::query_as(sql.referrers).bind(id).fetch_all(&mut *tx).await?;
            let referrers: Vec<String> = falling_back
                .iter()
                .map(|(_, other, _)| format!("deployment '{other}' (fallbacks)"))
                .chain(members.into_iter().map(|(kind, name)| format!("{kind} '{name}'")))
                .collect();
            if !referrers.is_empty() && !force {
                return Ok(Removal::InUse(referrers));
            }
            for (other_id, _, kept) in falling_back {
                sqlx::query("UPDATE deployments SET fallbacks = $2 WHERE id = $1")
                    .bind(other_id)
                    .bind(serde_json::Value::from(kept).to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(sql.delete).bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(Removal::Deleted(referrers))
        }
        .await
        })?)
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
}

/// The deployment names of a `fallbacks` column (a JSON array).
fn names_in(fallbacks: &str) -> Vec<String> {
    serde_json::from_str(fallbacks).unwrap_or_default()
}
