//! One model call of a run: the conversation and tools offered, the deployment and its fallbacks tried (SPEC 8),
//! text passed on as it streams, and what came back recorded in the call's step.

use std::time::Instant;

use gateway_core::chat::scrub_nul;
use gateway_core::context::{make_call_ids_unique, model_conversation};
use gateway_core::events::Progress;
use gateway_core::response::FailureCode;
use gateway_core::steps::{
    Approval, AssistantMessage, ModelDelta, ModelOutput, ModelStep, StepBody, StepState, ToolCall,
    UpstreamFailure,
};
use gateway_core::toolset::{
    flatten_namespaces, name_calls, offered_client_tools, OfferedTool, ToolInput,
};
use tokio::sync::mpsc;

use super::driver::{told_to_stop, CANCELLED};
use super::{Engine, ProgressSink, Run, Stop};
use crate::ids::{item_id, new_id};
use crate::store::tenancy::Deployment;
use crate::tools::ServerTools;
use crate::upstream::{Live, ModelRequest, Target, UpstreamError};

/// What a model call cut by the response's deadline records as its failure.
const DEADLINE_PASSED: &str = "The response's deadline passed before this model call ended.";

/// Model text waiting for a slow reader: the upstream read waits when this many pieces are queued.
const TEXT_BUFFER: usize = 64;

/// What a model call came to: its answer or failure, and the fallback deployment that answered, if one did.
type Answer = (Result<ModelOutput, UpstreamError>, Option<Deployment>);

impl Engine {
    /// Calls the model for step `index` (already recorded as running) and records what came back.
    pub(super) async fn call_model<S: ProgressSink>(
        &self,
        run: &mut Run,
        index: usize,
        sink: &mut S,
    ) {
        let mut conversation = model_conversation(&run.context, &run.steps[..index]);
        flatten_namespaces(&mut conversation);
        let tools = offered_tools(&run.record.params.tools, &run.server_tools);
        let resend = HeldAndNotStopped {
            replica: &self.replica,
            stop: run.registration.stop.clone(),
        };
        let request = ModelRequest {
            response_id: &run.record.id,
            params: &run.record.params,
            conversation: &conversation,
            tools: &tools,
            resend: Some(&resend),
        };
        // The text a reader was shown while the call ran, as it was cut.
        let mut shown = Shown {
            item_id: item_id("msg", &run.record.id),
            ..Shown::default()
        };
        let call = self.call_with_fallbacks(&run.deployment, &request, &mut *sink, &mut shown);
        // A call still running when the response's deadline passes is dropped, and recorded as cut by it: the
        // loop ends the response `incomplete` (deadline), with the text a reader was shown of the call. A stream's
        // reads are bounded one by one, not as a whole.
        let deadline = tokio::time::sleep_until(run.deadline.into());
        let answer = tokio::select! {
            answer = call => Some(answer),
            () = told_to_stop(run) => None,
            () = deadline => {
                let failure = UpstreamFailure {
                    message: DEADLINE_PASSED.into(),
                    code: Default::default(),
                    partial: None,
                    cut_by_deadline: true,
                };
                return record_failure(run, index, failure, shown, sink).await;
            }
        };
        match answer {
            Some((result, fallback)) => {
                let result = result.map(|mut output| {
                    // Upstreams that number calls per answer reuse ids; pairing by call_id needs them unique.
                    make_call_ids_unique(&mut output.tool_calls, &conversation, || new_id("call"));
                    output
                });
                let fallback_name = fallback.as_ref().map(|d| d.name.clone());
                record_answer(run, index, result, fallback_name, shown, sink).await;
                self.account_model_call(run, index, fallback.as_ref());
            }
            // Told to stop mid-call: the call is dropped, and its connection with it. A cancel records it as
            // failed; a replica giving the response up leaves it running, to be made again by whoever resumes it.
            None if run.stop() == Some(Stop::Cancel) => {
                let failure = UpstreamFailure {
                    message: CANCELLED.into(),
                    code: Default::default(),
                    partial: None,
                    cut_by_deadline: false,
                };
                record_failure(run, index, failure, shown, sink).await;
            }
            None => {}
        }
    }

    /// The call made to `primary`, then (SPEC 8) to its fallbacks, in order, one level deep, only while nothing of
    /// the call reached the client; never for a request the provider refused.
    async fn call_with_fallbacks<S: ProgressSink>(
        &self,
        primary: &Deployment,
        request: &ModelRequest<'_>,
        sink: &mut S,
        shown: &mut Shown,
    ) -> Answer {
        let mut result = self.call_deployment(primary, request, sink, shown).await;
        let mut answered_by = None;
        for name in &primary.fallbacks {
            let may_fall_back = matches!(&result, Err(e) if e.failure_code() != FailureCode::UpstreamRejected && !matches!(e, UpstreamError::Withheld { .. }))
                && shown.text.is_empty();
            if !may_fall_back {
                break;
            }
            if let Some(resend) = request.resend {
                if !resend.may_resend().await {
                    break;
                }
            }
            let fallback = match self.store.deployment_by_name(name).await {
                Ok(Some(fallback)) => fallback,
                Ok(None) => {
                    tracing::warn!(response.id = %request.response_id, deployment = %primary.name, fallback = %name,
                        "a fallback deployment named by this deployment does not exist; skipped");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(deployment = %name, error = %e, "could not load a fallback deployment");
                    continue;
                }
            };
            if let Err(e) = &result {
                tracing::warn!(response.id = %request.response_id, deployment = %primary.name, fallback = %fallback.name, error = %e, "model call failed; trying a fallback");
            }
            crate::metrics::fallback_tried(&primary.name, &fallback.name);
            result = self.call_deployment(&fallback, request, sink, shown).await;
            if result.is_ok() {
                answered_by = Some(fallback);
            }
        }
        (result, answered_by)
    }

    /// One model call to `deployment`: streamed to `sink` (text recorded in `shown` as it is reported) when it takes
    /// text deltas, whole otherwise.
    async fn call_deployment<S: ProgressSink>(
        &self,
        deployment: &Deployment,
        request: &ModelRequest<'_>,
        sink: &mut S,
        shown: &mut Shown,
    ) -> Result<ModelOutput, UpstreamError> {
        let span = super::spans::model_call(deployment, request);
        let started = Instant::now();
        let result = tracing::Instrument::instrument(
            self.call_deployment_traced(deployment, request, sink, shown),
            span.clone(),
        )
        .await;
        super::spans::model_answered(&span, deployment, &result);
        // Each deployment tried is counted as itself: a fallback's success is the fallback's.
        crate::metrics::upstream_call(&deployment.name, started, result.is_ok());
        result
    }

    /// [`Engine::call_deployment`] within its span.
    async fn call_deployment_traced<S: ProgressSink>(
        &self,
        deployment: &Deployment,
        request: &ModelRequest<'_>,
        sink: &mut S,
        shown: &mut Shown,
    ) -> Result<ModelOutput, UpstreamError> {
        if !sink.wants_text_deltas() {
            return self.upstream.call(&target(deployment), request, None).await;
        }
        // Text is passed on as the model produces it; the upstream read and the reader move together, so a
        // slow reader slows the upstream read (backpressure).
        let (delta_tx, mut delta_rx) = mpsc::channel::<ModelDelta>(TEXT_BUFFER);
        let message_id = shown.item_id.clone();
        let message_id = message_id.as_str();
        let call = async move {
            let live = Live {
                message_id,
                deltas: &delta_tx,
            };
            // The sender is dropped with this block, which ends the forwarding below.
            self.upstream
                .call(&target(deployment), request, Some(live))
                .await
        };
        let forward = async {
            while let Some(delta) = delta_rx.recv().await {
                match delta {
                    ModelDelta::Text(text) => {
                        let text = scrub_nul(text);
                        // Counted as shown before it is reported: the report may wait on a slow reader, and a call
                        // cut meanwhile (by the deadline) keeps what the reader's stream already holds.
                        shown.push(&text);
                        sink.report(Progress::TextDelta {
                            item_id: message_id,
                            delta: &text,
                        })
                        .await;
                    }
                }
            }
        };
        let (result, ()) = tokio::join!(call, forward);
        result
    }
}

/// What the model is offered: the client's tools, then the server tools.
pub(super) fn offered_tools(
    client_tools: &[gateway_core::toolset::DeclaredTool],
    server_tools: &ServerTools,
) -> Vec<OfferedTool> {
    let mut tools = offered_client_tools(client_tools);
    tools.extend(server_tools.iter().map(|t| OfferedTool {
        name: t.name.clone(),
        description: Some(t.description.clone()),
        input: ToolInput::Json {
            parameters: t.parameters.clone(),
            strict: Some(t.strict),
        },
    }));
    tools
}

/// Records the model's answer, or its failure, in step `index`, and reports it.
async fn record_answer<S: ProgressSink>(
    run: &mut Run,
    index: usize,
    result: Result<ModelOutput, UpstreamError>,
    answered_by: Option<String>,
    shown: Shown,
    sink: &mut S,
) {
    let mut output = match result {
        Ok(output) => output,
        Err(e) => {
            tracing::warn!(response.id = %run.record.id, deployment = %run.deployment.name, error = %e, "model call failed");
            let failure = UpstreamFailure {
                message: e.public_message(),
                code: e.failure_code(),
                partial: None,
                cut_by_deadline: false,
            };
            return record_failure(run, index, failure, shown, sink).await;
        }
    };
    // The model called tools by the flat names it was offered; the client sees its own.
    name_calls(&run.record.params.tools, &mut output.tool_calls);
    mark_approvals(&run.server_tools, &run.record.id, &mut output.tool_calls);
    if let Some(message) = &mut output.message {
        message.deltas = shown.deltas;
    }
    sink.report(Progress::ModelEnded { output: &output }).await;
    let step = &mut run.steps[index];
    step.state = StepState::Succeeded;
    step.body = StepBody::Model(ModelStep {
        output: Some(output),
        failure: None,
        deployment: answered_by,
    });
    // Recorded with the next write, which comes before any other side effect.
    run.journal.touch(index);
}

/// Records a failed model call in step `index`, with the text a reader was shown of it, and reports it.
async fn record_failure<S: ProgressSink>(
    run: &mut Run,
    index: usize,
    mut failure: UpstreamFailure,
    shown: Shown,
    sink: &mut S,
) {
    failure.partial = shown.into_message();
    sink.report(Progress::ModelFailed {
        partial: failure.partial.as_ref(),
    })
    .await;
    let step = &mut run.steps[index];
    step.state = StepState::Failed;
    step.body = StepBody::Model(ModelStep {
        deployment: None,
        output: None,
        failure: Some(failure),
    });
    run.journal.touch(index);
}

/// The text of a model call shown to a reader as it streamed, and how it was cut.
#[derive(Default)]
struct Shown {
    item_id: String,
    text: String,
    deltas: Vec<u32>,
}

impl Shown {
    fn push(&mut self, delta: &str) {
        self.text.push_str(delta);
        self.deltas.push(delta.chars().count() as u32);
    }

    /// The text shown, as the message that ends `incomplete` when the call failed; `None` when nothing was.
    fn into_message(self) -> Option<AssistantMessage> {
        (!self.text.is_empty()).then_some(AssistantMessage {
            item_id: self.item_id,
            text: self.text,
            deltas: self.deltas,
        })
    }
}

/// Marks the calls of remote MCP tools that wait for the client's approval (SPEC 12): they are handed back as
/// `mcp_approval_request` items, with ids of their own.
fn mark_approvals(server_tools: &ServerTools, response_id: &str, calls: &mut [ToolCall]) {
    for call in calls {
        if call.namespace.is_some() || !call.kind.is_function() {
            continue;
        }
        let Some(tool) = server_tools
            .get(&call.name)
            .filter(|t| t.approval_required())
        else {
            continue;
        };
        call.approval = Some(Approval::Required {
            server_label: tool.server_label().unwrap_or_default().to_owned(),
        });
        call.item_id = item_id("mcpr", response_id);
    }
}

/// What upstream needs of `deployment` to call its provider.
pub(super) fn target(deployment: &Deployment) -> Target<'_> {
    Target {
        name: &deployment.name,
        kind: deployment.provider_kind,
        base_url: &deployment.base_url,
        model: &deployment.upstream_model,
        api_key: deployment.api_key.as_ref(),
        max_tokens: deployment.max_tokens,
    }
}

/// A model call of a run is made again (a retry, a fallback) only while this replica holds its lease (waiting,
/// after a pause, for the next beat, which first tells the runs whose response another replica took) and the run
/// was not told to stop: a paused process must not send a paid call for a response that is no longer its own.
struct HeldAndNotStopped<'a> {
    replica: &'a super::Replica,
    stop: tokio::sync::watch::Receiver<Option<Stop>>,
}

impl crate::upstream::Resend for HeldAndNotStopped<'_> {
    fn may_resend(&self) -> futures::future::BoxFuture<'_, bool> {
        Box::pin(async move { self.replica.hold_lease().await && self.stop.borrow().is_none() })
    }
}
