//! `POST /v1/responses/input_tokens` (SPEC 15): the input tokens of the model call a create would make first, with
//! the same deployment, instructions, tools (server tools included), chained context or conversation, and input.
//! Nothing is stored and no model is called.

use gateway_core::context::model_conversation;
use gateway_core::request::ValidRequest;
use gateway_core::toolset::flatten_namespaces;

use super::model_call::{offered_tools, target};
use super::prepare::Start;
use super::{Engine, EngineError};
use crate::ids::new_id;
use crate::upstream::count::CountedBy;
use crate::upstream::{ModelRequest, UpstreamError};

/// A count, and who made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputTokens {
    pub tokens: u64,
    pub counted_by: CountedBy,
}

impl Engine {
    /// Counts the input tokens of `request`'s first model call for `project_id`. The tools of MCP servers the
    /// request names itself are not listed for a count (that would call them); everything else is as the call.
    pub async fn count_input_tokens(
        &self,
        project_id: &str,
        mut request: ValidRequest,
    ) -> Result<InputTokens, EngineError> {
        let resolution = self.resolution(project_id, &request.model).await?;
        let server_tools = self.tools_for(&resolution, &mut request).await?;
        let id = new_id("resp");
        let input = std::mem::take(&mut request.input);
        let (context, _) = self
            .starting_context(project_id, input, Start::of(&request, None), &id)
            .await?;
        let mut conversation = model_conversation(&context, &[]);
        flatten_namespaces(&mut conversation);
        let tools = offered_tools(&request.params.tools, &server_tools);
        let model_request = ModelRequest {
            response_id: &id,
            params: &request.params,
            conversation: &conversation,
            tools: &tools,
            resend: None,
        };
        let (tokens, counted_by) = self
            .upstream
            .count_input_tokens(&target(&resolution.deployment), &model_request)
            .await
            .map_err(|error| {
                tracing::warn!(deployment = %resolution.deployment.name, error = %error, "the provider could not count input tokens");
                EngineError::CountFailed {
                    message: error.public_message(),
                    rejected: matches!(error, UpstreamError::Rejected { .. }),
                }
            })?;
        Ok(InputTokens { tokens, counted_by })
    }
}
