//! Start-up seeding: creates or updates the configured entities, idempotently, by name.
//!
//! Every seeded field is parsed with the same rules as the admin API (`gateway_core::entity`), so a seed
//! cannot store what the admin API would refuse.

use gateway_core::entity::{
    check_non_empty, check_secret, EntityName, HttpUrl, ProviderKind, TimeoutMs, ToolName,
    ToolParameters,
};
use gateway_core::governance::{
    check_expires_at, Budget, Governance, LimitChanges, Pricing, RateLimits,
};
use gateway_core::request::InvalidRequest;
use gateway_core::toolset::UnsupportedTools;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::config::{
    SeedApiKey, SeedConfig, SeedDeployment, SeedGroup, SeedProject, SeedToolSource,
};
use crate::store::admin::{
    ApiKeyChanges, DeploymentChanges, GovernanceChanges, Member, Membership, NewApiKey,
    NewDeployment, NewToolSource, ProjectChanges, ToolSourceChanges,
};
use crate::store::tenancy::hash_key;
use crate::store::tenancy::SourceKind;
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

/// Applies `seed`: creates what is missing, updates what differs, never deletes. Running it twice changes
/// nothing the second time.
pub async fn apply(store: &Store, seed: &SeedConfig) -> Result<(), SeedError> {
    for (name, project) in &seed.projects {
        seed_project(store, name, project).await?;
    }
    for (name, deployment) in &seed.deployments {
        seed_deployment(store, name, deployment).await?;
    }
    for (name, tool) in &seed.tool_sources {
        seed_tool_source(store, name, tool).await?;
    }
    for (name, group) in &seed.deployment_groups {
        seed_group(store, name, group).await?;
    }
    Ok(())
}

async fn seed_project(store: &Store, name: &str, project: &SeedProject) -> Result<(), SeedError> {
    let reject = |e| invalid("project", name, e);
    let project_name = EntityName::parse(name, "name").map_err(reject)?;
    let governance =
        seeded_governance(project.limits.as_ref(), project.budget.as_ref()).map_err(reject)?;
    // Every key is checked before anything is written, so a bad one leaves the store as it was.
    let keys = project
        .api_keys
        .iter()
        .map(|(key_name, key)| seeded_key(key_name, key))
        .collect::<Result<Vec<_>, _>>()?;
    let existing = named(store.list_projects().await?, project_name.as_str(), |p| {
        &p.name
    });
    let id = match existing {
        Some(existing) => {
            let changes = ProjectChanges {
                name: None,
                governance,
            };
            store.update_project(&existing.id, &changes).await?;
            existing.id
        }
        None => {
            let new = governance.applied_to(Governance::default());
            store.create_project(&project_name, &new).await?.id
        }
    };
    for key in keys {
        seed_api_key(store, &id, key).await?;
    }
    Ok(())
}

/// A seeded key, checked: its name, the key, and what it is held to.
struct SeededKey<'a> {
    name: EntityName,
    key: &'a str,
    expires_at: Option<i64>,
    governance: GovernanceChanges,
}

fn seeded_key<'a>(name: &str, seeded: &'a SeedApiKey) -> Result<SeededKey<'a>, SeedError> {
    let reject = |e| invalid("api key", name, e);
    let label = EntityName::parse(name, "name").map_err(reject)?;
    let key = seeded.key().expose_secret();
    if !key.starts_with("sk-") || key.len() < 20 {
        return Err(problem(
            "api key",
            name,
            "a key must start with 'sk-' and have at least 20 characters".into(),
        ));
    }
    let (expires_at, governance) = match seeded {
        SeedApiKey::Key(_) => (None, GovernanceChanges::default()),
        SeedApiKey::Governed(governed) => (
            governed
                .expires_at
                .map(|at| check_expires_at(at, "expires_at"))
                .transpose()
                .map_err(reject)?,
            seeded_governance(governed.limits.as_ref(), governed.budget.as_ref())
                .map_err(reject)?,
        ),
    };
    Ok(SeededKey {
        name: label,
        key,
        expires_at,
        governance,
    })
}

/// Creates a seeded key, or brings the one given before up to date (a revoked one stays revoked).
async fn seed_api_key(
    store: &Store,
    project_id: &str,
    key: SeededKey<'_>,
) -> Result<(), SeedError> {
    let key_hash = hash_key(key.key);
    let new = NewApiKey {
        project_id,
        name: &key.name,
        key_hash: &key_hash,
        key_prefix: &key.key.chars().take(9).collect::<String>(),
        expires_at: key.expires_at,
        governance: key.governance.applied_to(Governance::default()),
    };
    match store.create_api_key(&new).await {
        Ok(_) => return Ok(()),
        Err(StoreError::Conflict(_)) => {}
        Err(other) => return Err(other.into()),
    }
    // The key exists already. In another project it is left alone, as it always was.
    let Some(existing) = store.api_key_with_hash(project_id, &key_hash).await? else {
        return Ok(());
    };
    let changes = ApiKeyChanges {
        name: None,
        expires_at: key.expires_at.map(Some),
        governance: key.governance,
    };
    store.update_api_key(&existing.id, &changes).await?;
    Ok(())
}

/// What a seed's `limits` and `budget` change: each given replaces what is stored, each left out keeps it. They
/// read as the admin API's, so the errors name the same fields (`limits.rpm`, `budget.period`).
fn seeded_governance(
    limits: Option<&Value>,
    budget: Option<&Value>,
) -> Result<GovernanceChanges, InvalidRequest> {
    let limits = match limits {
        Some(limits) => {
            LimitChanges::replacing(LimitChanges::parse(limits)?.applied_to(RateLimits::default()))
        }
        None => LimitChanges::default(),
    };
    Ok(GovernanceChanges {
        limits,
        budget: budget.map(Budget::parse).transpose()?,
    })
}

async fn seed_deployment(
    store: &Store,
    name: &str,
    deployment: &SeedDeployment,
) -> Result<(), SeedError> {
    let reject = |e| invalid("deployment", name, e);
    let name = EntityName::parse(name, "name").map_err(reject)?;
    let kind = ProviderKind::parse(&deployment.kind, "kind").map_err(reject)?;
    let base_url = HttpUrl::parse(deployment.base_url.as_str(), "base_url").map_err(reject)?;
    check_non_empty(&deployment.model, "model").map_err(reject)?;
    let api_key = optional_secret(deployment.api_key.as_ref(), "api_key").map_err(reject)?;
    // Given, the prices replace the stored ones; left out, those are kept.
    let pricing = deployment
        .pricing
        .as_ref()
        .map(Pricing::parse)
        .transpose()
        .map_err(reject)?;
    let policy = |value: &Option<String>, field: &str| {
        value
            .as_deref()
            .map(|text| {
                UnsupportedTools::parse(text).ok_or_else(|| {
                    reject(InvalidRequest::new(
                        format!("'{field}' must be 'ignore' or 'reject'; got '{text}'."),
                        field,
                    ))
                })
            })
            .transpose()
    };
    let unsupported_tools = policy(&deployment.unsupported_tools, "unsupported_tools")?;
    let unsupported_params = policy(&deployment.unsupported_params, "unsupported_params")?;
    let existing = named(store.list_deployments().await?, name.as_str(), |d| &d.name);
    if let Some(existing) = existing {
        let changes = DeploymentChanges {
            name: None,
            provider_kind: Some(kind),
            base_url: Some(&base_url),
            upstream_model: Some(&deployment.model),
            api_key: Some(api_key),
            fallbacks: Some(&deployment.fallbacks),
            unsupported_tools,
            unsupported_params,
            max_tokens: Some(deployment.max_tokens),
            pricing,
        };
        store.update_deployment(&existing.id, &changes).await?;
    } else {
        let new = NewDeployment {
            name: &name,
            provider_kind: kind,
            base_url: &base_url,
            upstream_model: &deployment.model,
            api_key,
            fallbacks: &deployment.fallbacks,
            unsupported_tools: unsupported_tools.unwrap_or_default(),
            unsupported_params: unsupported_params.unwrap_or_default(),
            max_tokens: deployment.max_tokens,
            pricing: pricing.flatten(),
        };
        store.create_deployment(&new).await?;
    }
    Ok(())
}

async fn seed_tool_source(
    store: &Store,
    name: &str,
    tool: &SeedToolSource,
) -> Result<(), SeedError> {
    let reject = |e| invalid("tool source", name, e);
    let name = ToolName::parse(name, "name").map_err(reject)?;
    let kind = match tool.kind.as_deref() {
        None => SourceKind::Http,
        Some(kind) => SourceKind::parse(kind).ok_or_else(|| {
            reject(gateway_core::request::InvalidRequest::new(
                format!("Invalid 'kind': '{kind}'; expected 'http' or 'mcp'."),
                "kind",
            ))
        })?,
    };
    let parameters = match (kind, &tool.parameters) {
        (SourceKind::Mcp, serde_json::Value::Null) => serde_json::json!({"type": "object"}),
        (_, parameters) => parameters.clone(),
    };
    let parameters = ToolParameters::parse(parameters, "parameters").map_err(reject)?;
    let url = HttpUrl::parse(tool.url.as_str(), "url").map_err(reject)?;
    let timeout_ms = match tool.timeout_ms {
        Some(timeout_ms) => TimeoutMs::parse(timeout_ms, "timeout_ms").map_err(reject)?,
        None => TimeoutMs::DEFAULT,
    };
    let secret = optional_secret(tool.secret.as_ref(), "secret").map_err(reject)?;
    let existing = named(store.list_tool_sources().await?, name.as_str(), |t| &t.name);
    if let Some(existing) = existing {
        let changes = ToolSourceChanges {
            name: None,
            description: Some(&tool.description),
            parameters: Some(&parameters),
            url: Some(&url),
            timeout_ms: Some(timeout_ms),
            secret: Some(secret),
            strict: Some(tool.strict),
            allowed_tools: Some(tool.allowed_tools.as_deref()),
            name_prefix: Some(tool.name_prefix.as_deref()),
            ..Default::default()
        };
        store.update_tool_source(&existing.id, &changes).await?;
    } else {
        let new = NewToolSource {
            name: &name,
            description: &tool.description,
            parameters: &parameters,
            url: &url,
            timeout_ms,
            secret,
            strict: tool.strict,
            policy: Default::default(),
            note_on_request: None,
            note_on_result: None,
            hosted_type: None,
            kind: kind.as_str(),
            allowed_tools: tool.allowed_tools.as_deref(),
            name_prefix: tool.name_prefix.as_deref(),
        };
        store.create_tool_source(&new).await?;
    }
    Ok(())
}

async fn seed_group(store: &Store, name: &str, group: &SeedGroup) -> Result<(), SeedError> {
    let group_name =
        EntityName::parse(name, "name").map_err(|e| invalid("deployment group", name, e))?;
    let existing = named(store.list_groups().await?, group_name.as_str(), |g| &g.name);
    let group_id = match existing {
        Some(existing) => existing.id,
        None => store.create_group(&group_name).await?.id,
    };
    let deployments = store.list_deployments().await?;
    let projects = store.list_projects().await?;
    let tools = store.list_tool_sources().await?;
    let members = (group.deployments.iter())
        .map(|n| {
            let id = deployments.iter().find(|d| &d.name == n).map(|d| &d.id);
            (Member::Deployment, n, id)
        })
        .chain(group.projects.iter().map(|n| {
            let id = projects.iter().find(|p| &p.name == n).map(|p| &p.id);
            (Member::Project, n, id)
        }))
        .chain(group.tool_sources.iter().map(|n| {
            let id = tools.iter().find(|t| &t.name == n).map(|t| &t.id);
            (Member::ToolSource, n, id)
        }));
    for (kind, member_name, member_id) in members {
        let Some(member_id) = member_id else {
            return Err(problem(
                "deployment group",
                name,
                format!("no {} named '{member_name}'", kind.as_str()),
            ));
        };
        match store.attach_member(&group_id, kind, member_id).await? {
            Membership::Done | Membership::NotAttached => {}
            Membership::GroupMissing | Membership::MemberMissing => {
                return Err(problem(
                    "deployment group",
                    name,
                    "a member vanished while seeding".into(),
                ));
            }
        }
    }
    Ok(())
}

/// A seeded credential: an empty one (e.g. an unset variable in docker compose) means none.
fn optional_secret<'a>(
    secret: Option<&'a SecretString>,
    param: &str,
) -> Result<Option<&'a str>, InvalidRequest> {
    match secret.map(|s| s.expose_secret()).filter(|s| !s.is_empty()) {
        Some(secret) => check_secret(secret, param).map(|()| Some(secret)),
        None => Ok(None),
    }
}

/// A seeded field that does not parse: the parser's message says why, and names the field where it did not
/// already (`limits.rpms: Unknown limit 'rpms'`).
fn invalid(entity: &'static str, name: &str, error: InvalidRequest) -> SeedError {
    let message = match error.param {
        Some(param) if !error.message.contains(&format!("'{param}'")) => {
            format!("{param}: {}", error.message)
        }
        _ => error.message,
    };
    problem(entity, name, message)
}

fn problem(entity: &'static str, name: &str, problem: String) -> SeedError {
    SeedError::Invalid {
        entity,
        name: name.to_owned(),
        problem,
    }
}

/// The row among `rows` whose name (read by `name_of`) is `name`, if any.
fn named<R>(rows: Vec<R>, name: &str, name_of: impl Fn(&R) -> &String) -> Option<R> {
    rows.into_iter().find(|row| name_of(row) == name)
}
