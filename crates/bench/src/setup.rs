//! The bench's own database, and the gateway's configuration through its admin API.

use anyhow::{bail, Context};
use reqwest::{Client, Method};
use serde_json::{json, Value};
use sqlx::Connection;

/// A database created for one bench run and dropped at its end: on the Postgres server, or an embedded store
/// (a SQLite file in a directory of its own).
pub struct Database {
    server_url: String,
    pub name: String,
    pub url: String,
    /// The directory of an embedded store, removed at the end; `None` on Postgres.
    embedded: Option<std::path::PathBuf>,
}

impl Database {
    /// An embedded store in a fresh directory under the system's temporary directory.
    pub fn embedded() -> anyhow::Result<Database> {
        let name = format!("gw_bench_{}", uuid::Uuid::new_v4().simple());
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(Database {
            server_url: String::new(),
            url: format!("sqlite://{}/gateway.db?mode=rwc", dir.display()),
            name,
            embedded: Some(dir),
        })
    }

    /// Whether this is an embedded store (no Postgres backends to measure, no settings to apply).
    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// How many write transactions the whole Postgres server has begun so far (every transaction that writes
    /// takes a transaction id; reading one takes one too, which the caller subtracts): taken around a measured
    /// slice, the commits its writes cost. `None` for an embedded store.
    pub async fn transaction_ids(&self) -> Option<i64> {
        if self.is_embedded() {
            return None;
        }
        let mut conn = sqlx::PgConnection::connect(&self.url).await.ok()?;
        let id: Option<i64> = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
            .fetch_one(&mut conn)
            .await
            .ok();
        let _ = conn.close().await;
        id
    }

    /// Creates `gw_bench_<random>` on the Postgres server that `server_url` connects to.
    pub async fn create(server_url: &str) -> anyhow::Result<Database> {
        let name = format!("gw_bench_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(server_url)
            .await
            .with_context(|| format!("connect to Postgres at {server_url}"))?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .context("create the bench database")?;
        let _ = conn.close().await;
        let (path, query) = match server_url.split_once('?') {
            Some((path, query)) => (path, format!("?{query}")),
            None => (server_url, String::new()),
        };
        let url = match path.rsplit_once('/') {
            Some((base, _)) if base.contains("//") && !base.ends_with('/') => {
                format!("{base}/{name}{query}")
            }
            _ => bail!(
                "the database URL {server_url} has no database path (postgres://USER@HOST:PORT/DB)"
            ),
        };
        Ok(Database {
            server_url: server_url.to_owned(),
            name,
            url,
            embedded: None,
        })
    }

    /// Applies `KEY=VALUE` settings to the database (`ALTER DATABASE … SET`), for what-if runs such as
    /// `synchronous_commit=off`. They apply to the gateway's connections, which are opened afterwards.
    pub async fn apply_settings(&self, settings: &[String]) -> anyhow::Result<()> {
        if settings.is_empty() {
            return Ok(());
        }
        if self.is_embedded() {
            bail!("--db-setting applies to Postgres, not to the embedded store");
        }
        let simple = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        };
        let mut conn = sqlx::PgConnection::connect(&self.server_url).await?;
        for setting in settings {
            let Some((key, value)) = setting.split_once('=') else {
                bail!("--db-setting {setting}: expected KEY=VALUE");
            };
            let (key, value) = (key.trim(), value.trim());
            if !simple(key) || !simple(value) {
                bail!(
                    "--db-setting {setting}: only letters, digits, '_', '.' and '-' are accepted"
                );
            }
            sqlx::query(&format!(
                "ALTER DATABASE \"{}\" SET {key} = '{value}'",
                self.name
            ))
            .execute(&mut conn)
            .await
            .with_context(|| format!("ALTER DATABASE … SET {key} = '{value}'"))?;
        }
        let _ = conn.close().await;
        Ok(())
    }

    /// Drops the database, closing whatever connections are left.
    pub async fn drop_database(self) -> anyhow::Result<()> {
        if let Some(dir) = &self.embedded {
            return std::fs::remove_dir_all(dir)
                .with_context(|| format!("remove {}", dir.display()));
        }
        let mut conn = sqlx::PgConnection::connect(&self.server_url).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok(())
    }
}

/// Names of the two deployments the bench configures: one without server tools, one with.
pub const PLAIN_MODEL: &str = "mock";
pub const TOOLS_MODEL: &str = "mock-tools";
/// [`TOOLS_MODEL`] over the Anthropic Messages adapter.
pub const TOOLS_ANTHROPIC_MODEL: &str = "mock-tools-anthropic";
/// [`TOOLS_MODEL`] over the Responses adapter.
pub const TOOLS_RESPONSES_MODEL: &str = "mock-tools-responses";

/// The testkit tools attached to [`TOOLS_MODEL`].
pub const SERVER_TOOLS: [&str; 4] = ["add", "echo", "get_weather", "slow"];

/// The deployment group of [`TOOLS_MODEL`], to which the server tools are attached.
pub const TOOLS_GROUP: &str = "bench-tools";

/// The prefix of the example MCP server's tools as the gateway offers them (see [`attach_mcp`]): its `add`
/// becomes `mcp_add`, apart from the HTTP `add`.
pub const MCP_PREFIX: &str = "mcp_";

/// The gateway's admin API as the bench calls it: `gateway`'s `/admin/v1`, with the admin `token`.
#[derive(Clone, Copy)]
pub struct Admin<'a> {
    http: &'a Client,
    gateway: &'a str,
    token: &'a str,
}

impl<'a> Admin<'a> {
    pub fn new(http: &'a Client, gateway: &'a str, token: &'a str) -> Admin<'a> {
        Admin {
            http,
            gateway,
            token,
        }
    }

    /// Sends one admin request and reads its JSON answer (`null` for an empty one); any status but 2xx fails.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}/admin/v1{path}", self.gateway))
            .bearer_auth(self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("{method} {path} answered {status}: {text}");
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_str(&text)?)
    }

    /// Creates what `body` describes under `path`; answers its id.
    async fn create(&self, path: &str, body: Value) -> anyhow::Result<String> {
        id_of(&self.call(Method::POST, path, Some(body)).await?)
    }

    /// Attaches one object to another: a `PUT` of `path` without a body.
    async fn attach(&self, path: &str) -> anyhow::Result<()> {
        self.call(Method::PUT, path, None).await.map(drop)
    }

    /// Creates the tool source `body` describes and attaches it to deployment group `group`; answers its id.
    async fn add_tool_source(&self, group: &str, body: Value) -> anyhow::Result<String> {
        let source = self.create("/tool_sources", body).await?;
        self.attach(&format!("/deployment_groups/{group}/tool_sources/{source}"))
            .await?;
        Ok(source)
    }

    /// Configures a project with a key, a deployment [`PLAIN_MODEL`] without tools and a deployment
    /// [`TOOLS_MODEL`] with the [`SERVER_TOOLS`], both on the mock model; answers the key.
    pub async fn configure(
        self,
        mock_url: &str,
        tools_url: &str,
        govern: bool,
    ) -> anyhow::Result<String> {
        let project = self.create("/projects", json!({"name": "bench"})).await?;
        let key = self
            .call(
                Method::POST,
                &format!("/projects/{project}/api_keys"),
                Some(json!({"name": "bench"})),
            )
            .await?;
        let key_id = id_of(&key)?;
        let key = key
            .get("key")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .context("no key in the api_key answer")?;
        // Governed as a team's key would be (SPEC 13), so that every create pays for its limit checks and usage:
        // limits and budgets it never reaches. A build from before governance refuses the fields: it runs without.
        let governed = json!({
            "limits": {"rpm": 1_000_000_000u64, "tpm": 1_000_000_000_000u64},
            "budget": {"usd": 1e9, "period": "month"},
        });
        let key_governed = govern
            && self
                .call(
                    Method::PATCH,
                    &format!("/api_keys/{key_id}"),
                    Some(governed.clone()),
                )
                .await
                .is_ok();
        if key_governed {
            self.call(
                Method::PATCH,
                &format!("/projects/{project}"),
                Some(governed),
            )
            .await?;
        }

        // Every deployment is the mock model, over one provider kind or another.
        let create_deployment = async |name: &str, kind: &str, base_url: String| {
            let deployment = self
                .create(
                    "/deployments",
                    json!({
                        "name": name,
                        "provider": {"kind": kind, "base_url": base_url, "model": "mock-model"},
                    }),
                )
                .await?;
            if key_governed {
                let pricing = json!({"pricing": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}});
                self.call(
                    Method::PATCH,
                    &format!("/deployments/{deployment}"),
                    Some(pricing),
                )
                .await?;
            }
            anyhow::Ok(deployment)
        };
        for (model, group, with_tools) in [
            (PLAIN_MODEL, "bench-plain", false),
            (TOOLS_MODEL, TOOLS_GROUP, true),
        ] {
            let deployment =
                create_deployment(model, "openai_chat", format!("{mock_url}/v1")).await?;
            let group = self
                .create("/deployment_groups", json!({"name": group}))
                .await?;
            self.attach(&format!(
                "/deployment_groups/{group}/deployments/{deployment}"
            ))
            .await?;
            self.attach(&format!("/deployment_groups/{group}/projects/{project}"))
                .await?;
            if !with_tools {
                continue;
            }
            for definition in gateway_testkit::tool_definitions()
                .into_iter()
                .filter(|d| SERVER_TOOLS.contains(&d.name))
            {
                let tool = json!({
                    "name": definition.name,
                    "description": definition.description,
                    "parameters": definition.parameters,
                    "url": format!("{tools_url}/tools/{}", definition.name),
                });
                self.add_tool_source(&group, tool).await?;
            }
            // The same tools over the other provider kinds, for their tool rounds.
            for (name, kind, base_url) in [
                (TOOLS_ANTHROPIC_MODEL, "anthropic", mock_url.to_owned()),
                (
                    TOOLS_RESPONSES_MODEL,
                    "openai_responses",
                    format!("{mock_url}/v1"),
                ),
            ] {
                let deployment = create_deployment(name, kind, base_url).await?;
                self.attach(&format!(
                    "/deployment_groups/{group}/deployments/{deployment}"
                ))
                .await?;
            }
        }
        Ok(key)
    }

    /// Registers the example MCP server at `mcp_url` (`http://HOST:PORT/mcp`) as an operator tool source, its
    /// `add` alone and named with [`MCP_PREFIX`], and attaches it to [`TOOLS_GROUP`] (made by
    /// [`Admin::configure`]); answers the source's id.
    pub async fn attach_mcp(self, mcp_url: &str) -> anyhow::Result<String> {
        let groups = self.call(Method::GET, "/deployment_groups", None).await?;
        let group = groups["data"]
            .as_array()
            .and_then(|groups| groups.iter().find(|g| g["name"] == TOOLS_GROUP))
            .with_context(|| format!("no deployment group {TOOLS_GROUP}: configure first"))?;
        let group = id_of(group)?;
        let mcp = json!({
            "kind": "mcp",
            "name": "bench-mcp",
            "url": mcp_url,
            "allowed_tools": ["add"],
            "name_prefix": MCP_PREFIX,
        });
        self.add_tool_source(&group, mcp).await
    }
}

fn id_of(value: &Value) -> anyhow::Result<String> {
    value
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("no id in {value}"))
}
