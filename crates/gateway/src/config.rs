//! Typed configuration: `config/default.toml` (or a given file), then `GATEWAY__SECTION__KEY` variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The whole configuration, loaded once at start-up.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub database: DatabaseConfig,
    pub limits: LimitsConfig,
    pub upstream: UpstreamConfig,
    pub tools: ToolsConfig,
    pub log: LogConfig,
    pub tenancy: TenancyConfig,
    pub durability: DurabilityConfig,
    pub websocket: WebSocketConfig,
    pub compaction: CompactionConfig,
    pub governance: GovernanceConfig,
    pub telemetry: TelemetryConfig,
    pub webhooks: WebhooksConfig,
    /// Entities created or updated at start-up, idempotently.
    pub seed: SeedConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Listen address; port 0 picks a free port.
    #[default(SocketAddr::from(([127, 0, 0, 1], 8080)))]
    pub bind: SocketAddr,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    #[default(8 * 1024 * 1024)]
    pub body_limit_bytes: usize,
    /// After SIGTERM/SIGINT, how long requests in flight may take to finish.
    #[default(30_000)]
    pub shutdown_grace_ms: u64,
    /// Responses running at once (streams included, for as long as they stream); a create beyond it is
    /// answered 503 with `Retry-After` at once instead of queueing.
    #[default(2048)]
    pub max_active_responses: usize,
    /// While an event stream sends nothing for this long, a `: keep-alive` comment goes out (SPEC 6: at most
    /// 15 s), so proxies and clients do not time out a stream waiting on a slow model or tool.
    #[default(15_000)]
    pub keep_alive_ms: u64,
    /// A stream's client (SSE, a follower, a WebSocket) that takes nothing of what is sent to it for this long
    /// (its socket's window shut: a paused or wedged process) is treated as gone, so that it holds neither its
    /// response's run, nor a follower's task, nor its connection's place.
    #[default(60_000)]
    pub stream_stall_timeout_ms: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token of the admin API; without one the admin API refuses every request.
    pub token: Option<SecretString>,
    /// Bearer token that `GET /metrics` asks for; without one the metrics are open to whoever reaches the
    /// port (bind the gateway to a private interface, or set this).
    pub metrics_token: Option<SecretString>,
}

#[derive(Debug, Clone, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `postgres://...` selects Postgres, `sqlite:...` (or none: `data/gateway.db`) the embedded store;
    /// `DATABASE_URL` is honoured too.
    pub url: Option<SecretString>,
    #[default(16)]
    pub max_connections: u32,
    /// Postgres: make every step boundary wait for its commit to reach the disk. By default only the writes
    /// that must do (before a tool request goes out, and a response's end) wait; the others are on disk a
    /// fraction of a second later, and are lost only if the database server itself crashes in between.
    pub flush_every_step: bool,
    /// How long a request waits for a pooled connection before it is answered 503 (overloaded).
    #[default(5_000)]
    pub acquire_timeout_ms: u64,
    /// Postgres: how long a starting gateway waits for its database (not up yet, restarting, unreachable for a
    /// moment), trying again with backoff, before it exits with the error; 0 tries once.
    #[default(60_000)]
    pub startup_wait_ms: u64,
    /// Group commit: responses' writes that concurrent runs make at once are written together (one statement
    /// per kind on Postgres, one transaction on the embedded store), at most this many batches at a time; 0
    /// writes each alone. The embedded store writes one batch at a time whatever this says.
    #[default(2)]
    pub group_commit_batches: usize,
    /// Postgres: how long any statement (a read, a group-commit batch, an admin write, a counter's addition) waits
    /// for the database's answer; past it the statement is abandoned and fails as a lost reply would: a read is
    /// answered as a passing failure, a write of responses' rows is in doubt (tried again, and recognised if it
    /// had committed). A connection whose database vanished without closing it (a network that drops everything)
    /// would otherwise keep the request, or the writer, waiting for ever. Was `write_timeout_ms`, which is still
    /// read.
    #[default(30_000)]
    #[serde(alias = "write_timeout_ms")]
    pub reply_timeout_ms: u64,
    /// Postgres: a session left idle inside a transaction for this long (its replica paused, or cut off, between
    /// two statements of one) is ended by the database, which gives its row locks back, so that the other
    /// replicas can take that replica's responses over instead of waiting behind its locks. 0 leaves the
    /// database's own setting. Sent at connection start-up (a pooler in front must pass startup options on).
    #[default(10_000)]
    pub idle_in_transaction_timeout_ms: u64,
    /// Postgres: after this many seconds of silence the database probes whether the replica at the other end of a
    /// session is still there (then every third of it, three times), and data it sent may wait this long twice
    /// for an acknowledgement: a session whose replica's machine or network vanished is ended, and its locks
    /// given back, within about half a minute rather than hours. 0 leaves the database's own settings.
    #[default(10)]
    pub server_keepalive_secs: u64,
}

/// Operator ceilings of the loop; a request may lower them, never raise them.
#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    #[default(16)]
    pub max_model_calls: u32,
    #[default(64)]
    pub max_tool_calls: u32,
    #[default(3)]
    pub max_failing_batches: u32,
    /// Tool calls of one batch that run at the same time.
    #[default(8)]
    pub tool_concurrency: usize,
    /// Whole-response deadline.
    #[default(10 * 60 * 1000)]
    pub response_deadline_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Timeout of one upstream request.
    #[default(120_000)]
    pub timeout_ms: u64,
    /// Retries after the first attempt, for 429, 5xx and connection errors.
    #[default(2)]
    pub max_retries: u32,
    /// Base of the backoff between retries (`retry::RetryPolicy`: exponential, equal jitter).
    #[default(200)]
    pub backoff_ms: u64,
    /// Idle connections kept per upstream host for the next calls; past them, a connection a call gave back is
    /// closed. Each holds its buffers (about 30 KiB), so after a burst the memory of these stays.
    #[default(64)]
    pub max_idle_connections: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// Timeout of a tool source that sets none.
    #[default(30_000)]
    pub default_timeout_ms: u64,
    /// Retries of a tool request whose connection failed before anything was sent.
    #[default(2)]
    pub max_retries: u32,
    /// Base of the backoff between those retries (`retry::RetryPolicy`: exponential, equal jitter).
    #[default(50)]
    pub backoff_ms: u64,
    /// How long an MCP source's tool list is used before it is listed again (a `list_changed` notification
    /// makes it listed again sooner).
    #[default(60_000)]
    pub mcp_list_ttl_ms: u64,
    /// How long opening an MCP session or listing its tools may take.
    #[default(5_000)]
    pub mcp_connect_timeout_ms: u64,
    /// URL prefixes of the MCP servers a request may declare itself (`{"type": "mcp", "server_url": ...}`); none
    /// (the default) allows none. A plain prefix of the normalised URL (`https://`, `https://mcp.`,
    /// `https://mcp.example.com/v1/`), admitting servers whose every address is public: however long, it never
    /// admits a private, loopback, link-local or CGNAT address ([`crate::tools::remote`]).
    pub mcp_allowed_urls: Vec<String>,
    /// URL prefixes of declared MCP servers allowed whatever their addresses, private ones included: the
    /// operator's internal servers (`http://calc:9000/`). A prefix here allows the URL on its own. Name whole
    /// hosts: a prefix such as `http://` would open every internal address to requests.
    pub mcp_allowed_private_urls: Vec<String>,
}

/// The shortest lease a replica may have (milliseconds).
pub const MIN_LEASE_MS: u64 = 300;

/// How replicas share the running responses (SPEC 9): leases, takeover, waits.
#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct DurabilityConfig {
    /// How long a replica keeps its responses without beating: after that, another replica takes them over.
    /// It beats every third of this.
    #[default(10_000)]
    pub lease_ms: u64,
    /// How often a replica looks for responses to take: queued ones nobody took, and those of a replica whose
    /// lease ran out. A notification wakes it sooner for new queued ones.
    #[default(2_000)]
    pub sweep_interval_ms: u64,
    /// How long a create repeated with the `Idempotency-Key` of a running response waits for it to end before
    /// answering `409` (which SDKs retry); also how long a cancel waits for the response to stop.
    #[default(10_000)]
    pub wait_ms: u64,
    /// How many re-attached streams (`GET /v1/responses/{id}?stream=true`) one replica follows at once; more
    /// are refused with `503 server_overloaded`, which SDKs retry.
    #[default(1_000)]
    pub max_followers: usize,
    /// How many times one running response may be started from its stored steps (taken over from a replica that
    /// stopped beating, resumed after a hand-over; a queued background response's first start counts too) before
    /// it ends `failed` (`resumed_too_often`) instead of running again: a response whose run crashes or panics its
    /// replica every time stops here rather than loop for ever (SPEC 9). A read-back of its stored state that fails
    /// for a passing reason counts too, once the database answers the count (so one that fails every time ends,
    /// `unreadable_state`); a database that answers nothing counts nothing. A rolling restart hands a long response
    /// over once.
    #[default(25)]
    pub max_resumes: u32,
}

/// The WebSocket transport of `/v1/responses` (SPEC 11).
#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct WebSocketConfig {
    /// How long one connection may live; then it gets `websocket_connection_limit_reached` and is closed (a turn
    /// in flight finishes first).
    #[default(60 * 60 * 1000)]
    pub max_connection_ms: u64,
    /// Connections one API key may hold open at once; one more is refused with `429`
    /// (`websocket_connection_limit_reached`) before the upgrade.
    #[default(16)]
    pub max_connections_per_key: usize,
}

/// The keys that seal compaction items (`POST /v1/responses/compact`, SPEC 11).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// The key new compaction items are sealed with: 32 bytes, base64. Without one, a key generated once and kept
    /// in the database is used, shared by every replica.
    pub key: Option<SecretString>,
    /// Keys that only open items sealed before a rotation (32 bytes each, base64).
    pub old_keys: Vec<SecretString>,
}

/// How long key and model resolutions read from the store are reused.
#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct TenancyConfig {
    /// Admin writes through this gateway take effect at once; on other replicas within this time. 0 disables.
    #[default(2_000)]
    pub cache_ttl_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct GovernanceConfig {
    /// How often a replica adds its tokens to the shared `tpm` counts and reads the others' back, and reads the
    /// spend of budgets; the tolerance of those limits across replicas (SPEC 13).
    #[default(250)]
    pub sync_ms: u64,
    /// How often the usage of `store: false` responses is written, in one batch.
    #[default(100)]
    pub usage_flush_ms: u64,
}

/// Webhook deliveries (SPEC 15): at least once, from the `webhook_deliveries` outbox, by any replica.
#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// How long one try may take, connection and answer included.
    #[default(10_000)]
    pub timeout_ms: u64,
    /// Tries of a delivery before it is given up as `failed`.
    #[default(10)]
    pub max_attempts: u32,
    /// The wait before the second try; each further wait is four times the last, up to `max_backoff_ms`.
    #[default(1_000)]
    pub backoff_ms: u64,
    #[default(3_600_000)]
    pub max_backoff_ms: u64,
    /// How long a replica holds a delivery it took (by the database's clock); one that stopped mid-try loses it
    /// after this, and another replica tries again with the same `webhook-id`. At least `timeout_ms` + 1 s is
    /// used, so that a try ends before its lock lapses.
    #[default(30_000)]
    pub lock_ms: u64,
    /// How often each replica looks for deliveries that are due.
    #[default(500)]
    pub poll_ms: u64,
}

/// OpenTelemetry traces (SPEC 14): off unless an endpoint is set.
#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP receiver (a collector, Jaeger, Tempo, Honeycomb...), e.g.
    /// `http://localhost:4318`; spans go to `{endpoint}/v1/traces` as protobuf. Unset: no spans are made.
    pub otlp_endpoint: Option<String>,
    /// Headers sent with every export, e.g. `x-honeycomb-team`.
    #[serde(skip_serializing)]
    pub otlp_headers: BTreeMap<String, SecretString>,
    /// The share of new traces kept, from 0 to 1; a request whose `traceparent` is sampled is always kept, one
    /// whose `traceparent` is not sampled never.
    #[default(1.0)]
    pub sampling_ratio: f64,
    /// Put prompts, outputs and tool arguments and results on the spans (`gen_ai.input.messages`, ...).
    pub capture_content: bool,
    /// How long finished spans wait to be exported together, in milliseconds.
    #[default(5000)]
    pub export_delay_ms: u64,
    /// The `service.name` of the spans.
    #[default("gateway")]
    pub service_name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, SmartDefault)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `pretty` or `json`.
    #[default("pretty")]
    pub format: String,
    /// A `tracing` filter, e.g. `info,gateway=debug`.
    #[default("info")]
    pub filter: String,
}

impl Config {
    /// Loads the defaults, then `file` when it exists, then `GATEWAY__*` variables and `DATABASE_URL`.
    pub fn load(file: &Path) -> Result<Config, Box<figment::Error>> {
        let mut figment =
            Figment::from(Serialized::defaults(DefaultsShim::default())).merge(Toml::file(file));
        if let Ok(url) = std::env::var("DATABASE_URL") {
            figment = figment.merge(("database.url", url));
        }
        let config: Config = figment
            .merge(Env::prefixed("GATEWAY__").split("__"))
            .extract()
            .map_err(Box::new)?;
        config
            .check()
            .map_err(|problem| Box::new(figment::Error::from(problem)))?;
        Ok(config)
    }

    /// Values that parse but cannot work: a zero ceiling would end every response at once.
    fn check(&self) -> Result<(), String> {
        let limits = &self.limits;
        let must_be_positive = [
            ("limits.max_model_calls", u64::from(limits.max_model_calls)),
            ("limits.max_tool_calls", u64::from(limits.max_tool_calls)),
            (
                "limits.max_failing_batches",
                u64::from(limits.max_failing_batches),
            ),
            ("limits.tool_concurrency", limits.tool_concurrency as u64),
            ("limits.response_deadline_ms", limits.response_deadline_ms),
            (
                "server.body_limit_bytes",
                self.server.body_limit_bytes as u64,
            ),
            (
                "server.max_active_responses",
                self.server.max_active_responses as u64,
            ),
            (
                "database.acquire_timeout_ms",
                self.database.acquire_timeout_ms,
            ),
            ("database.reply_timeout_ms", self.database.reply_timeout_ms),
            ("durability.lease_ms", self.durability.lease_ms),
            (
                "durability.max_resumes",
                u64::from(self.durability.max_resumes),
            ),
            (
                "durability.max_followers",
                self.durability.max_followers as u64,
            ),
            (
                "durability.sweep_interval_ms",
                self.durability.sweep_interval_ms,
            ),
            (
                "websocket.max_connection_ms",
                self.websocket.max_connection_ms,
            ),
            (
                "websocket.max_connections_per_key",
                self.websocket.max_connections_per_key as u64,
            ),
        ];
        let compaction_keys = self.compaction.key.iter().map(|k| ("compaction.key", k));
        let old_keys = self
            .compaction
            .old_keys
            .iter()
            .map(|k| ("compaction.old_keys", k));
        for (name, key) in compaction_keys.chain(old_keys) {
            use secrecy::ExposeSecret;
            crate::compaction::parse_key(key.expose_secret())
                .map_err(|problem| format!("{name} must be 32 bytes in base64: {problem}"))?;
        }
        crate::tools::remote::RemoteServers::new(&self.tools.mcp_allowed_urls, &[])
            .map_err(|problem| format!("tools.mcp_allowed_urls: {problem}"))?;
        crate::tools::remote::RemoteServers::new(&[], &self.tools.mcp_allowed_private_urls)
            .map_err(|problem| format!("tools.mcp_allowed_private_urls: {problem}"))?;
        if !(0.0..=1.0).contains(&self.telemetry.sampling_ratio) {
            return Err("telemetry.sampling_ratio must be between 0 and 1".to_owned());
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint {
            let scheme = url::Url::parse(endpoint).map(|u| u.scheme().to_owned());
            if !matches!(scheme.as_deref(), Ok("http" | "https")) {
                return Err(format!(
                    "telemetry.otlp_endpoint must be an http(s) URL, not '{endpoint}'"
                ));
            }
        }
        if self.server.max_active_responses > tokio::sync::Semaphore::MAX_PERMITS {
            return Err(format!(
                "server.max_active_responses must be at most {}",
                tokio::sync::Semaphore::MAX_PERMITS
            ));
        }
        // A replica beats every third of its lease, and each beat waits at most a quarter of it for its own
        // connection: a beat may fail once and the next still lands in time. Below this the beats' round trips
        // themselves would eat the lease.
        if self.durability.lease_ms < MIN_LEASE_MS {
            return Err(format!(
                "durability.lease_ms must be at least {MIN_LEASE_MS} (a beat every third of it must reach the \
                 database in time)"
            ));
        }
        // A write left unanswered is tried again only once the database has ended the session that may still carry
        // it (its keepalive gives up on a silent replica within about twice `server_keepalive_secs`): the
        // abandoned statement can then never land after the retry and what followed it.
        let keepalive = self.database.server_keepalive_secs;
        if keepalive > 0 && self.database.reply_timeout_ms <= keepalive.saturating_mul(2_000) {
            return Err(format!(
                "database.reply_timeout_ms must be more than twice database.server_keepalive_secs ({} ms): a \
                 write is tried again only once the database has given up the session that may still carry it",
                keepalive.saturating_mul(2_000)
            ));
        }
        match must_be_positive.iter().find(|(_, value)| *value == 0) {
            Some((key, _)) => Err(format!("{key} must be at least 1")),
            None => Ok(()),
        }
    }
}

/// Serialisable defaults for the sections that have them, so figment reports unknown keys against them.
#[derive(Default, Serialize)]
struct DefaultsShim {
    tenancy: TenancyConfig,
    durability: DurabilityConfig,
    server: ServerConfig,
    limits: LimitsConfig,
    upstream: UpstreamConfig,
    tools: ToolsConfig,
    log: LogConfig,
    websocket: WebSocketConfig,
    telemetry: TelemetryConfig,
}

/// What start-up creates or brings up to date, each entity keyed by its name. Maps (not lists) so that one
/// field can be overridden by a variable, e.g. `GATEWAY__SEED__DEPLOYMENTS__UPSTREAM__BASE_URL`.
/// Entities missing from the seed are left alone; nothing is deleted.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SeedConfig {
    pub projects: BTreeMap<String, SeedProject>,
    pub deployments: BTreeMap<String, SeedDeployment>,
    pub tool_sources: BTreeMap<String, SeedToolSource>,
    pub deployment_groups: BTreeMap<String, SeedGroup>,
}

/// A seeded project. Its `limits` and `budget` read as the admin API's (SPEC 13); given, they replace what is
/// stored (`limits = {}` removes every limit); left out, what is stored is kept.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SeedProject {
    /// API keys by name, stored hashed. A seeded key that was revoked stays revoked.
    pub api_keys: BTreeMap<String, SeedApiKey>,
    /// `{ rpm?, tpm?, max_concurrent? }`.
    pub limits: Option<serde_json::Value>,
    /// `{ usd, period = "day" | "month" | "total" }`.
    pub budget: Option<serde_json::Value>,
}

/// A seeded API key: the key itself (`"sk-..."`), or a table with the key and what it is held to.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SeedApiKey {
    Key(SecretString),
    Governed(SeedGovernedKey),
}

impl SeedApiKey {
    /// The key itself.
    pub fn key(&self) -> &SecretString {
        match self {
            SeedApiKey::Key(key) => key,
            SeedApiKey::Governed(governed) => &governed.key,
        }
    }
}

impl From<String> for SeedApiKey {
    fn from(key: String) -> SeedApiKey {
        SeedApiKey::Key(key.into())
    }
}

/// `{ key = "sk-...", limits?, budget?, expires_at? }`: as `SeedProject`, a field given replaces what is stored
/// and a field left out keeps it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedGovernedKey {
    pub key: SecretString,
    #[serde(default)]
    pub limits: Option<serde_json::Value>,
    #[serde(default)]
    pub budget: Option<serde_json::Value>,
    /// Unix seconds.
    #[serde(default)]
    pub expires_at: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedDeployment {
    /// `openai_chat`, `anthropic` or `openai_responses`.
    pub kind: String,
    pub base_url: String,
    /// The upstream's model name.
    pub model: String,
    #[serde(default)]
    pub api_key: Option<SecretString>,
    /// Deployments tried in order when this one fails (SPEC 8).
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// Anthropic's `max_tokens` when a request sets none.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `{ input_per_mtok, cached_input_per_mtok?, output_per_mtok }` in USD per million tokens; given, it replaces
    /// the stored prices; left out, they are kept.
    #[serde(default)]
    pub pricing: Option<serde_json::Value>,
    /// `ignore` or `reject`: what a request's tools that nothing serves do; given, it replaces the stored policy.
    #[serde(default)]
    pub unsupported_tools: Option<String>,
    /// `ignore` or `reject`: what a create setting a parameter the provider kind cannot honour gets; given, it
    /// replaces the stored policy.
    #[serde(default)]
    pub unsupported_params: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedToolSource {
    /// `http` (default) or `mcp`.
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments (`http`; an `mcp` source's tools bring their own).
    #[serde(default)]
    pub parameters: serde_json::Value,
    /// `mcp`: the server's tools offered (default all) and the prefix of their names.
    #[serde(default)]
    pub allowed_tools: Option<Vec<String>>,
    #[serde(default)]
    pub name_prefix: Option<String>,
    pub url: String,
    #[serde(default)]
    pub timeout_ms: Option<i64>,
    #[serde(default)]
    pub secret: Option<SecretString>,
    #[serde(default)]
    pub strict: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SeedGroup {
    /// Names of seeded or existing deployments, projects and tool sources to attach.
    pub deployments: Vec<String>,
    pub projects: Vec<String>,
    pub tool_sources: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Config as `Config::load` builds it, with `raw` given for `key` the way `Env` hands over a variable's
    /// text (parsed as a figment `Value`, so `'["a", "b"]'` is a list).
    fn with_variable(key: &str, raw: &str) -> Result<Config, Box<figment::Error>> {
        let value: figment::value::Value = match raw.parse() {
            Ok(value) => value,
            Err(never) => match never {},
        };
        let config: Config = Figment::from(Serialized::defaults(DefaultsShim::default()))
            .merge((key, value))
            .extract()
            .map_err(Box::new)?;
        config
            .check()
            .map_err(|problem| Box::new(figment::Error::from(problem)))?;
        Ok(config)
    }

    #[test]
    fn mcp_allowed_urls_parse_from_a_variable() {
        let config = with_variable("tools.mcp_allowed_urls", r#"["http://127.0.0.1:8080/"]"#)
            .expect("loads");
        assert_eq!(config.tools.mcp_allowed_urls, ["http://127.0.0.1:8080/"]);
        let config = with_variable("tools.mcp_list_ttl_ms", "1").expect("loads");
        assert!(config.tools.mcp_allowed_urls.is_empty());
        assert!(config.tools.mcp_allowed_private_urls.is_empty());
        let config = with_variable(
            "tools.mcp_allowed_private_urls",
            r#"["http://example-mcp:8083/"]"#,
        )
        .expect("loads");
        assert_eq!(
            config.tools.mcp_allowed_private_urls,
            ["http://example-mcp:8083/"]
        );
    }

    #[test]
    fn an_mcp_allowed_url_that_cannot_work_is_refused_at_start_up() {
        let problem = with_variable("tools.mcp_allowed_urls", r#"["mcp.example.com/"]"#)
            .expect_err("refused")
            .to_string();
        assert!(problem.contains("tools.mcp_allowed_urls"), "{problem}");
        let problem = with_variable("tools.mcp_allowed_private_urls", r#"["calc:9000/"]"#)
            .expect_err("refused")
            .to_string();
        assert!(
            problem.contains("tools.mcp_allowed_private_urls"),
            "{problem}"
        );
    }
}
