//! What a run's calls used and who pays for them (SPEC 13): a usage record for every model call that returned
//! usage and every server tool call, counted against the payer's limits and budgets at once, and written with the
//! step it belongs to (a `store: false` response's, by the batch writer).

use gateway_core::steps::{StepBody, StepState, Usage};

use super::{Engine, Run};
use crate::clock::now;
use crate::governance::{cost, Payer};
use crate::store::governance::UsageRecord;
use crate::store::tenancy::Deployment;

impl Engine {
    /// Accounts for the model call of step `index`, answered by `fallback` or the run's own deployment.
    pub(super) fn account_model_call(
        &self,
        run: &mut Run,
        index: usize,
        fallback: Option<&Deployment>,
    ) {
        let step = &run.steps[index];
        let usage = match &step.body {
            StepBody::Model(model) if step.state == StepState::Succeeded => {
                model.output.as_ref().and_then(|output| output.usage)
            }
            _ => None,
        };
        let Some(usage) = usage else {
            return;
        };
        let deployment = fallback.unwrap_or(&run.deployment);
        let cost = cost(deployment.pricing.as_ref(), &usage);
        self.governor
            .count_model_call(&run.payer, &deployment.name, &usage, cost);
        let record = UsageRecord {
            input_tokens: clamp(usage.input_tokens),
            cached_tokens: clamp(usage.cached_tokens),
            output_tokens: clamp(usage.output_tokens),
            reasoning_tokens: clamp(usage.reasoning_tokens),
            cost_usd: cost,
            ..self.usage_record(run, index, deployment, None)
        };
        self.keep_usage(run, record);
    }

    /// Accounts for the server tool call of step `index`, which ended.
    pub(super) fn account_tool_call(&self, run: &mut Run, index: usize) {
        let source = match &run.steps[index].body {
            StepBody::Tool(tool) => run
                .server_tools
                .get(&tool.call.name)
                .map(|tool| tool.source_name()),
            _ => None,
        };
        let Some(source) = source else {
            return;
        };
        let record = self.usage_record(run, index, &run.deployment, Some(source));
        self.keep_usage(run, record);
    }

    /// A record of step `index` with no usage yet.
    fn usage_record(
        &self,
        run: &Run,
        index: usize,
        deployment: &Deployment,
        tool_source: Option<String>,
    ) -> UsageRecord {
        UsageRecord {
            response_id: run.record.id.clone(),
            seq: run.steps[index].seq as i32,
            project_id: run.payer.project_id.clone(),
            api_key_id: run.payer.key_id.clone(),
            deployment: deployment.name.clone(),
            provider_kind: deployment.provider_kind.as_str().to_owned(),
            tool_source,
            input_tokens: 0,
            cached_tokens: 0,
            output_tokens: 0,
            reasoning_tokens: 0,
            cost_usd: 0.0,
            created_at: now(),
            calls: 1,
        }
    }

    /// Accounts for the summary call of compaction `id` like a model call of an unstored response: counted
    /// against the payer's `tpm` and budgets and in the metrics, and recorded by the batch writer, summed with the
    /// usage of unstored responses.
    pub(super) fn account_compaction(
        &self,
        payer: &Payer,
        deployment: &Deployment,
        id: &str,
        usage: &Usage,
    ) {
        let cost = cost(deployment.pricing.as_ref(), usage);
        self.governor
            .count_model_call(payer, &deployment.name, usage, cost);
        self.governor.record_unstored(vec![UsageRecord {
            response_id: id.to_owned(),
            seq: 0,
            project_id: payer.project_id.clone(),
            api_key_id: payer.key_id.clone(),
            deployment: deployment.name.clone(),
            provider_kind: deployment.provider_kind.as_str().to_owned(),
            tool_source: None,
            input_tokens: clamp(usage.input_tokens),
            cached_tokens: clamp(usage.cached_tokens),
            output_tokens: clamp(usage.output_tokens),
            reasoning_tokens: clamp(usage.reasoning_tokens),
            cost_usd: cost,
            created_at: now(),
            calls: 1,
        }]);
    }

    /// A stored run writes its records with its next step write; an unstored one hands them to the batch writer.
    fn keep_usage(&self, run: &mut Run, record: UsageRecord) {
        if run.journal.persists() {
            run.unrecorded_usage.push(record);
        } else {
            self.governor.record_unstored(vec![record]);
        }
    }
}

/// A token count as the store's `BIGINT` holds it.
fn clamp(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}
