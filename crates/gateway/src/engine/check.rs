//! An operator's check of a deployment (`POST /admin/v1/deployments/{id}/check`): one small model call made as a
//! response's would be, with its latency, what came back, and the provider's own words when it failed.

use std::time::Instant;

use gateway_core::entity::ProviderKind;
use gateway_core::items::Item;
use gateway_core::request::ResponseParams;
use serde::Serialize;

use super::model_call::target;
use super::Engine;
use crate::store::tenancy::Deployment;
use crate::upstream::{ModelRequest, UpstreamError};

/// What the check of a deployment found.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct DeploymentCheck {
    pub object: &'static str,
    pub deployment_id: String,
    /// The model answered.
    pub ok: bool,
    /// From the first byte sent to the answer read (retries included, as a response's call would make them).
    pub latency_ms: u64,
    /// What the model answered, when it did.
    pub output_text: Option<String>,
    /// Why it failed: `rejected` (the provider refused the request), `http_error` (it answered an error status
    /// after the retries), `unreachable`, `broken` (the answer broke off) or `unreadable`.
    pub failure: Option<&'static str>,
    /// The HTTP status the provider answered, when it answered an error.
    pub status: Option<u16>,
    /// The provider's own words, or the transport's cause.
    pub message: Option<String>,
    /// A likely fix, when the failure looks like a known setup mistake.
    pub hint: Option<String>,
}

impl Engine {
    /// Makes one small call to `deployment` ("Reply with the word ok.", at most 16 output tokens).
    pub async fn check_deployment(&self, deployment: &Deployment) -> DeploymentCheck {
        let params = ResponseParams {
            max_output_tokens: Some(16),
            ..ResponseParams::default()
        };
        let conversation = [Item::user_text("Reply with the word ok.")];
        let request = ModelRequest {
            response_id: "check",
            params: &params,
            conversation: &conversation,
            tools: &[],
            resend: None,
        };
        let started = Instant::now();
        let result = self
            .upstream
            .call(&target(deployment), &request, None)
            .await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut check = DeploymentCheck {
            object: "deployment.check",
            deployment_id: deployment.id.clone(),
            ok: result.is_ok(),
            latency_ms,
            output_text: None,
            failure: None,
            status: None,
            message: None,
            hint: None,
        };
        match result {
            Ok(output) => check.output_text = output.message.map(|m| m.text),
            Err(error) => {
                let (failure, status) = match &error {
                    UpstreamError::Rejected { status, .. } => ("rejected", Some(*status)),
                    UpstreamError::Status { status, .. } => ("http_error", Some(*status)),
                    UpstreamError::Transport { .. } => ("unreachable", None),
                    UpstreamError::Broken { .. } => ("broken", None),
                    UpstreamError::Parse(_) => ("unreadable", None),
                    // A check is made without a gate: never withheld.
                    UpstreamError::Withheld { .. } => ("unreachable", None),
                };
                check.failure = Some(failure);
                check.status = status;
                check.hint = hint(deployment, status);
                check.message = Some(error.to_string());
            }
        }
        check
    }
}

/// A likely fix for a failed check: a 404 from an OpenAI-style `base_url` without a version path usually means
/// the path is missing (`https://api.openai.com` for `https://api.openai.com/v1`), and from an Anthropic one with
/// it that the path is there twice (the gateway adds `/v1/messages`); a 401 or 403 is the key.
fn hint(deployment: &Deployment, status: Option<u16>) -> Option<String> {
    let base = deployment.base_url.trim_end_matches('/');
    let last = base.rsplit('/').next().unwrap_or_default();
    let versioned =
        last.len() > 1 && last.starts_with('v') && last[1..].chars().all(|c| c.is_ascii_digit());
    let anthropic = deployment.provider_kind == ProviderKind::Anthropic;
    match status {
        Some(404) if !anthropic && !versioned => Some(format!(
            "The provider has no such route: base_url '{base}' has no version path; it usually ends with '/v1' \
             (as in '{base}/v1')."
        )),
        Some(404) if anthropic && versioned => Some(format!(
            "The provider has no such route: an Anthropic base_url has no version path (the gateway adds \
             '/v1/messages'); try '{}'.",
            base.trim_end_matches(last).trim_end_matches('/')
        )),
        Some(404) => Some(
            "The provider has no such route, or no model named as this deployment's 'model'.".into(),
        ),
        Some(401 | 403) => {
            Some("The provider refused the credentials: check the deployment's api_key.".into())
        }
        _ => None,
    }
}
