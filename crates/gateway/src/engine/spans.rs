//! The spans of a run (SPEC 14): one per run of a response on a replica, one per model call (`chat {model}`) and
//! one per tool call (`execute_tool {name}`), with the GenAI semantic conventions' attributes. With traces off,
//! each is `Span::none()`, which costs nothing.

use gateway_core::entity::ProviderKind;
use gateway_core::steps::{Finish, ModelOutput, ToolCall, ToolOutcome};
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Origin, Run};
use crate::store::tenancy::Deployment;
use crate::telemetry::{capture_content, context_from_traceparent, traces_on};
use crate::tools::ServerTool;
use crate::upstream::{ModelRequest, UpstreamError};

/// The span of one run of a response on this replica: a child of the trace the response was created in, so that
/// a run resumed on another replica lands in the same trace.
pub(super) fn run_span(run: &Run, replica_id: &str) -> Span {
    if !traces_on() {
        return Span::none();
    }
    let origin = match run.origin {
        Origin::New => "new",
        Origin::Queued => "queued",
        Origin::Resumed => "resumed",
    };
    let span = tracing::info_span!(
        "invoke_agent",
        otel.name = "invoke_agent gateway",
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = "gateway",
        gen_ai.request.model = %run.record.model,
        gen_ai.response.id = %run.record.id,
        gateway.replica.id = %replica_id,
        gateway.run.origin = origin,
        gateway.response.status = Empty,
    );
    if let Some(traceparent) = &run.trace_context {
        let _ = span.set_parent(context_from_traceparent(traceparent));
    }
    span
}

/// Records how the run ended on its span.
pub(super) fn run_ended(span: &Span, status: &str) {
    span.record("gateway.response.status", status);
}

/// The span of one model call to `deployment` (a fallback gets its own).
pub(super) fn model_call(deployment: &Deployment, request: &ModelRequest<'_>) -> Span {
    if !traces_on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "chat",
        otel.name = %format!("chat {}", deployment.upstream_model),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider_name(deployment.provider_kind),
        gen_ai.request.model = %deployment.upstream_model,
        gen_ai.response.model = Empty,
        gen_ai.response.id = %request.response_id,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cached_input_tokens = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        gateway.deployment = %deployment.name,
        error.type = Empty,
    );
    if capture_content() {
        if let Ok(messages) = serde_json::to_string(request.conversation) {
            span.record("gen_ai.input.messages", messages);
        }
    }
    span
}

/// Records what a model call came to on its span.
pub(super) fn model_answered(
    span: &Span,
    deployment: &Deployment,
    result: &Result<ModelOutput, UpstreamError>,
) {
    if span.is_none() {
        return;
    }
    match result {
        Ok(output) => {
            span.record("gen_ai.response.model", deployment.upstream_model.as_str());
            // An array, as the conventions have it: set on the span itself (a `tracing` field holds no arrays).
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(opentelemetry::Array::String(vec![finish_reason(
                    output.finish,
                )
                .into()])),
            );
            if let Some(usage) = &output.usage {
                span.record("gen_ai.usage.input_tokens", as_i64(usage.input_tokens));
                span.record("gen_ai.usage.output_tokens", as_i64(usage.output_tokens));
                span.record(
                    "gen_ai.usage.cached_input_tokens",
                    as_i64(usage.cached_tokens),
                );
            }
            if capture_content() {
                if let Ok(messages) = serde_json::to_string(&(&output.message, &output.tool_calls))
                {
                    span.record("gen_ai.output.messages", messages);
                }
            }
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", e.failure_code().as_str());
        }
    }
}

/// The span of one server tool call.
pub(super) fn tool_call(tool: &ServerTool, call: &ToolCall) -> Span {
    if !traces_on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = %format!("execute_tool {}", call.name),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.call_id,
        gen_ai.tool.type = "function",
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        gateway.tool.source = %tool.source_name(),
        gateway.tool.outcome = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
    );
    if capture_content() {
        span.record("gen_ai.tool.call.arguments", call.arguments.as_str());
    }
    span
}

/// Records a tool call's outcome on its span.
pub(super) fn tool_ended(span: &Span, outcome: &ToolOutcome) {
    if span.is_none() {
        return;
    }
    match outcome {
        ToolOutcome::Output { text } => {
            span.record("gateway.tool.outcome", "ok");
            if capture_content() {
                span.record("gen_ai.tool.call.result", text.as_str());
            }
        }
        ToolOutcome::Error {
            message,
            http_status,
        } => {
            span.record("gateway.tool.outcome", "error");
            span.record("otel.status_code", "ERROR");
            span.record("error.type", "tool_error");
            if let Some(status) = http_status {
                span.record("http.response.status_code", i64::from(*status));
            }
            if capture_content() {
                span.record("gen_ai.tool.call.result", message.as_str());
            }
        }
    }
}

/// The GenAI conventions' `gen_ai.provider.name` of a provider kind.
fn provider_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::OpenaiChat | ProviderKind::OpenaiResponses => "openai",
        ProviderKind::Anthropic => "anthropic",
    }
}

/// The finish reason as the conventions spell it.
fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::ToolCalls => "tool_calls",
        Finish::Length => "length",
        Finish::ContentFilter => "content_filter",
    }
}

/// A count as an OpenTelemetry integer (`tracing` records `u64` as text).
fn as_i64(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}
