//! The HTTP tool executor: runs one server tool call on its source's endpoint (SPEC section 7).

use std::sync::Arc;
use std::time::Duration;

use gateway_core::steps::{ToolCall, ToolOutcome};
use secrecy::ExposeSecret;
use serde_json::Value;

use crate::config::ToolsConfig;
use crate::retry::RetryPolicy;
use crate::store::tenancy::ToolSource;

/// Runs server tool calls; every failure becomes an error outcome that the model sees.
#[derive(Debug, Clone)]
pub struct ToolExecutor {
    http: reqwest::Client,
    config: ToolsConfig,
    retry: RetryPolicy,
    /// Compiled argument schemas, by the schema's JSON text: compiling is far dearer than checking.
    validators: moka::sync::Cache<String, Arc<jsonschema::Validator>>,
}

/// Identifies one tool step across retries and restarts.
#[derive(Debug, Clone, Copy)]
pub struct CallRef<'a> {
    pub response_id: &'a str,
    /// Stable key of the tool step, sent as `Idempotency-Key`.
    pub idempotency_key: &'a str,
}

const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

impl ToolExecutor {
    pub fn new(config: ToolsConfig) -> Result<ToolExecutor, reqwest::Error> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()?;
        Ok(ToolExecutor {
            http,
            retry: RetryPolicy::new(config.max_retries, config.backoff_ms),
            config,
            validators: moka::sync::Cache::new(1024),
        })
    }

    /// Runs `call` on `source`. Never fails: errors are outcomes.
    pub async fn execute(
        &self,
        source: &ToolSource,
        call: &ToolCall,
        at: CallRef<'_>,
    ) -> ToolOutcome {
        let started = std::time::Instant::now();
        let outcome = self.run(source, call, at).await;
        let result = if outcome.is_error() { "error" } else { "ok" };
        metrics::counter!("gateway_tool_calls_total", "tool" => source.name.clone(), "outcome" => result).increment(1);
        metrics::histogram!("gateway_tool_call_duration_seconds", "tool" => source.name.clone())
            .record(started.elapsed().as_secs_f64());
        outcome
    }

    async fn run(&self, source: &ToolSource, call: &ToolCall, at: CallRef<'_>) -> ToolOutcome {
        let arguments = match self.parse_arguments(source, &call.arguments) {
            Ok(arguments) => arguments,
            Err(message) => return ToolOutcome::error(message),
        };
        let timeout_ms = if source.timeout_ms == 0 {
            self.config.default_timeout_ms
        } else {
            source.timeout_ms
        };
        let sent = self
            .retry
            .run(
                |_| {
                    let mut request = self
                        .http
                        .post(&source.url)
                        .timeout(Duration::from_millis(timeout_ms))
                        .header("Idempotency-Key", at.idempotency_key)
                        .header("X-Gateway-Tool-Name", &source.name)
                        .header("X-Gateway-Call-Id", &call.call_id)
                        .header("X-Gateway-Response-Id", at.response_id)
                        .json(&arguments);
                    if let Some(secret) = &source.secret {
                        request = request.bearer_auth(secret.expose_secret());
                    }
                    request.send()
                },
                // A refused connection sent nothing, so trying again cannot run the tool twice.
                reqwest::Error::is_connect,
                |_, _, _| {},
            )
            .await;
        match sent {
            Ok(response) => read_answer(&source.name, response).await,
            Err(e) if e.is_timeout() => ToolOutcome::error(format!(
                "Tool '{}' timed out after {timeout_ms} ms.",
                source.name
            )),
            Err(e) => {
                tracing::warn!(tool.name = %source.name, error = %e, "tool request failed");
                ToolOutcome::error(format!("Tool '{}' could not be reached.", source.name))
            }
        }
    }
}

impl ToolExecutor {
    /// The call's arguments as a JSON object, checked against the tool's schema.
    fn parse_arguments(&self, source: &ToolSource, arguments: &str) -> Result<Value, String> {
        let value: Value = serde_json::from_str(arguments).map_err(|e| {
            format!(
                "The arguments for tool '{}' are not valid JSON: {e}.",
                source.name
            )
        })?;
        if !value.is_object() {
            return Err(format!(
                "The arguments for tool '{}' must be a JSON object.",
                source.name
            ));
        }
        let Some(validator) = self.validator(source) else {
            return Ok(value);
        };
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .take(5)
            .collect();
        if !problems.is_empty() {
            return Err(format!(
                "The arguments for tool '{}' do not match its schema: {}.",
                source.name,
                problems.join("; ")
            ));
        }
        Ok(value)
    }

    /// The compiled schema of a source, compiled once; `None` when it has none or it does not compile.
    fn validator(&self, source: &ToolSource) -> Option<Arc<jsonschema::Validator>> {
        if !source.parameters.is_object() {
            return None;
        }
        let key = source.parameters.to_string();
        if let Some(validator) = self.validators.get(&key) {
            return Some(validator);
        }
        match jsonschema::validator_for(&source.parameters) {
            Ok(validator) => {
                let validator = Arc::new(validator);
                self.validators.insert(key, Arc::clone(&validator));
                Some(validator)
            }
            Err(e) => {
                tracing::warn!(tool.name = %source.name, error = %e, "tool schema does not compile; arguments not checked");
                None
            }
        }
    }
}

async fn read_answer(tool: &str, response: reqwest::Response) -> ToolOutcome {
    let status = response.status();
    let is_json = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(e) if e.is_timeout() => {
            return ToolOutcome::error(format!("Tool '{tool}' timed out while answering."))
        }
        Err(_) => return ToolOutcome::error(format!("Tool '{tool}' broke off its answer.")),
    };
    let text = gateway_core::chat::scrub_nul(
        String::from_utf8_lossy(&body[..body.len().min(MAX_OUTPUT_BYTES)]).into_owned(),
    );
    if !status.is_success() {
        let detail: String = text.chars().take(1000).collect();
        return ToolOutcome::Error {
            message: format!("Tool '{tool}' answered HTTP {}: {detail}", status.as_u16()),
            http_status: Some(status.as_u16()),
        };
    }
    if is_json {
        // Compact, valid JSON text; a body that claims JSON but is not passes through as text.
        match serde_json::from_str::<Value>(&text) {
            Ok(value) => ToolOutcome::Output {
                text: value.to_string(),
            },
            Err(_) => ToolOutcome::Output { text },
        }
    } else {
        ToolOutcome::Output { text }
    }
}
