//! Start-up seeding: creates or updates the configured entities, idempotently, by name.

use secrecy::ExposeSecret;

use crate::config::SeedConfig;
use crate::store::admin::{
    DeploymentChanges, Member, Membership, NewApiKey, NewDeployment, NewToolSource,
    ToolSourceChanges,
};
use crate::store::tenancy::hash_key;
use crate::store::{Store, StoreError};

/// Why the seed could not be applied; start-up stops with this message.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("seed {entity} '{name}': {problem}")]
    Invalid {
        entity: &'static str,
        name: String,
        problem: String,
    },
    #[error("seeding failed: {0}")]
    Store(#[from] StoreError),
}

const DEFAULT_TOOL_TIMEOUT_MS: i64 = 30_000;

/// Applies `seed`: creates what is missing, updates what differs, never deletes. Running it twice changes
/// nothing the second time.
pub async fn apply(store: &Store, seed: &SeedConfig) -> Result<(), SeedError> {
    for (name, project) in &seed.projects {
        let id = match store
            .list_projects()
            .await?
            .into_iter()
            .find(|p| &p.name == name)
        {
            Some(existing) => existing.id,
            None => store.create_project(name).await?.id,
        };
        for (key_name, key) in &project.api_keys {
            let key = key.expose_secret();
            if !key.starts_with("sk-") || key.len() < 20 {
                return Err(invalid(
                    "api key",
                    key_name,
                    "a key must start with 'sk-' and have at least 20 characters",
                ));
            }
            let new = NewApiKey {
                project_id: &id,
                name: key_name,
                key_hash: &hash_key(key),
                key_prefix: &key.chars().take(9).collect::<String>(),
            };
            match store.create_api_key(&new).await {
                // The key exists already (maybe revoked since: it stays as it is).
                Ok(_) | Err(StoreError::Conflict(_)) => {}
                Err(other) => return Err(other.into()),
            }
        }
    }

    for (name, deployment) in &seed.deployments {
        if !matches!(
            deployment.kind.as_str(),
            "openai_chat" | "anthropic" | "openai_responses"
        ) {
            return Err(invalid(
                "deployment",
                name,
                "kind must be openai_chat, anthropic or openai_responses",
            ));
        }
        // An empty key (e.g. an unset variable in docker compose) means none.
        let api_key = deployment
            .api_key
            .as_ref()
            .map(|k| k.expose_secret())
            .filter(|k| !k.is_empty());
        match store
            .list_deployments()
            .await?
            .into_iter()
            .find(|d| &d.name == name)
        {
            Some(existing) => {
                let changes = DeploymentChanges {
                    name: None,
                    provider_kind: Some(&deployment.kind),
                    base_url: Some(&deployment.base_url),
                    upstream_model: Some(&deployment.model),
                    api_key: Some(api_key),
                };
                store.update_deployment(&existing.id, &changes).await?;
            }
            None => {
                let new = NewDeployment {
                    name,
                    provider_kind: &deployment.kind,
                    base_url: &deployment.base_url,
                    upstream_model: &deployment.model,
                    api_key,
                };
                store.create_deployment(&new).await?;
            }
        }
    }

    for (name, tool) in &seed.tool_sources {
        if !gateway_core::request::is_valid_tool_name(name) {
            return Err(invalid(
                "tool source",
                name,
                "the name must match ^[a-zA-Z0-9_-]{1,64}$",
            ));
        }
        if !tool.parameters.is_object() || jsonschema::validator_for(&tool.parameters).is_err() {
            return Err(invalid(
                "tool source",
                name,
                "parameters must be a valid JSON Schema object",
            ));
        }
        let timeout_ms = tool.timeout_ms.unwrap_or(DEFAULT_TOOL_TIMEOUT_MS);
        let secret = tool
            .secret
            .as_ref()
            .map(|s| s.expose_secret())
            .filter(|s| !s.is_empty());
        match store
            .list_tool_sources()
            .await?
            .into_iter()
            .find(|t| &t.name == name)
        {
            Some(existing) => {
                let changes = ToolSourceChanges {
                    name: None,
                    description: Some(&tool.description),
                    parameters: Some(&tool.parameters),
                    url: Some(&tool.url),
                    timeout_ms: Some(timeout_ms),
                    secret: Some(secret),
                    strict: Some(tool.strict),
                };
                store.update_tool_source(&existing.id, &changes).await?;
            }
            None => {
                let new = NewToolSource {
                    name,
                    description: &tool.description,
                    parameters: &tool.parameters,
                    url: &tool.url,
                    timeout_ms,
                    secret,
                    strict: tool.strict,
                };
                store.create_tool_source(&new).await?;
            }
        }
    }

    for (name, group) in &seed.deployment_groups {
        let group_id = match store
            .list_groups()
            .await?
            .into_iter()
            .find(|g| &g.name == name)
        {
            Some(existing) => existing.id,
            None => store.create_group(name).await?.id,
        };
        let deployments = store.list_deployments().await?;
        let projects = store.list_projects().await?;
        let tools = store.list_tool_sources().await?;
        let members = group
            .deployments
            .iter()
            .map(|n| {
                (
                    Member::Deployment,
                    n,
                    deployments
                        .iter()
                        .find(|d| &d.name == n)
                        .map(|d| d.id.clone()),
                )
            })
            .chain(group.projects.iter().map(|n| {
                (
                    Member::Project,
                    n,
                    projects.iter().find(|p| &p.name == n).map(|p| p.id.clone()),
                )
            }))
            .chain(group.tool_sources.iter().map(|n| {
                (
                    Member::ToolSource,
                    n,
                    tools.iter().find(|t| &t.name == n).map(|t| t.id.clone()),
                )
            }));
        for (kind, member_name, member_id) in members {
            let Some(member_id) = member_id else {
                return Err(invalid(
                    "deployment group",
                    name,
                    &format!("no {} named '{member_name}'", kind.as_str()),
                ));
            };
            match store.attach_member(&group_id, kind, &member_id).await? {
                Membership::Done | Membership::NotAttached => {}
                Membership::GroupMissing | Membership::MemberMissing => {
                    return Err(invalid(
                        "deployment group",
                        name,
                        "a member vanished while seeding",
                    ));
                }
            }
        }
    }
    Ok(())
}

fn invalid(entity: &'static str, name: &str, problem: &str) -> SeedError {
    SeedError::Invalid {
        entity,
        name: name.to_owned(),
        problem: problem.to_owned(),
    }
}
