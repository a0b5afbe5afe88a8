//! Compaction (SPEC 11): a window (a previous response's context and output, then new input) summarised by the
//! deployment's model into a sealed `compaction` item; and compaction items that come back as input opened, so
//! that the model reads their summary.

use gateway_core::context::model_conversation;
use gateway_core::items::{CompactionItem, ContentPart, MessageContent, Role};
use gateway_core::request::{ResponseParams, ValidRequest};
use gateway_core::steps::Usage;
use gateway_core::Item;

use super::model_call::target;
use super::prepare::Start;
use super::{Engine, EngineError};
use crate::clock::now;
use crate::compaction::OpenError;
use crate::ids::{item_id, new_id};
use crate::upstream::{ModelRequest, UpstreamError};

/// What the model is asked after the window.
const SUMMARY_PROMPT: &str = "Summarize the conversation above so that it can continue from your summary alone: \
keep every fact, decision, name, number, open question and the state of any task; leave out pleasantries. \
Answer with the summary only.";

/// A compacted window: the user messages kept as they were, then the sealed summary.
#[derive(Debug, Clone)]
pub struct Compacted {
    pub id: String,
    pub created_at: i64,
    pub output: Vec<Item>,
    pub usage: Usage,
}

impl Engine {
    /// Compacts the window of `request` (its previous response's context and output, then its input) for the
    /// payer's project, whose limits and budgets the summary call counts against. Nothing is stored but its usage.
    pub async fn compact(
        &self,
        payer: &crate::governance::Payer,
        mut request: ValidRequest,
    ) -> Result<Compacted, EngineError> {
        let project_id = payer.project_id.as_str();
        let resolution = self.resolution(project_id, &request.model).await?;
        let id = new_id("resp");
        let input = std::mem::take(&mut request.input);
        let (window, _) = self
            .starting_context(project_id, input, Start::of(&request, None), &id)
            .await?;

        let mut conversation = model_conversation(&window, &[]);
        conversation.push(Item::user_text(SUMMARY_PROMPT));
        let params = ResponseParams {
            instructions: request.params.instructions,
            prompt_cache_key: request.params.prompt_cache_key,
            ..ResponseParams::default()
        };
        let answer = self
            .upstream
            .call(
                &target(&resolution.deployment),
                &ModelRequest {
                    response_id: &id,
                    params: &params,
                    conversation: &conversation,
                    tools: &[],
                    resend: None,
                },
                None,
            )
            .await
            .map_err(|error| {
                tracing::warn!(error = %error, "the model failed to summarise a window for compaction");
                EngineError::SummaryFailed {
                    message: error.public_message(),
                    rejected: matches!(error, UpstreamError::Rejected { .. }),
                }
            })?;
        let usage = answer.usage.unwrap_or_default();
        self.account_compaction(payer, &resolution.deployment, &id, &usage);
        let summary = answer
            .message
            .map(|message| message.text)
            .filter(|text| !text.trim().is_empty())
            .ok_or_else(|| EngineError::SummaryFailed {
                message: "The upstream model gave no summary.".into(),
                rejected: false,
            })?;
        let encrypted_content = self.sealer.seal(project_id, &summary).await?;

        // The user's own words stay as they were; everything else (and any earlier compaction) is in the summary.
        let mut output: Vec<Item> = window
            .into_iter()
            .filter_map(|item| match item {
                Item::Message(mut message) if message.role == Role::User => {
                    // Shown as output items are: content as parts, a status.
                    if let MessageContent::Text(text) = message.content {
                        message.content =
                            MessageContent::Parts(vec![ContentPart::InputText { text }]);
                    }
                    message.status = Some("completed".into());
                    Some(Item::Message(message))
                }
                _ => None,
            })
            .collect();
        output.push(Item::Compaction(CompactionItem {
            id: Some(item_id("cmp", &id)),
            encrypted_content,
            summary: None,
        }));
        Ok(Compacted {
            id,
            created_at: now(),
            output,
            usage,
        })
    }

    /// Checks that every compaction item among `items`, which a client adds to a conversation (as it sent them,
    /// before references are resolved), opens: one that does not is refused as `items[i]` now, rather than break
    /// every later response of the conversation.
    pub async fn check_added_compactions(
        &self,
        project_id: &str,
        items: &[gateway_core::items::InputItem],
    ) -> Result<(), EngineError> {
        for (index, item) in items.iter().enumerate() {
            let gateway_core::items::InputItem::Item(Item::Compaction(compaction)) = item else {
                continue;
            };
            match self
                .sealer
                .open(project_id, &compaction.encrypted_content)
                .await
            {
                Ok(_) => {}
                Err(OpenError::Store(error)) => return Err(error.into()),
                Err(OpenError::Refused) => {
                    return Err(EngineError::CompactionRefused {
                        param: format!("items[{index}]"),
                    })
                }
            }
        }
        Ok(())
    }

    /// Opens every compaction item of `context` not opened yet, so that the model reads its summary. One that
    /// does not open is refused, named as the request's input item (from `first_new` on) or as `earlier`.
    pub(super) async fn open_compactions(
        &self,
        project_id: &str,
        context: &mut [Item],
        first_new: usize,
        earlier: &str,
    ) -> Result<(), EngineError> {
        for (index, item) in context.iter_mut().enumerate() {
            let Item::Compaction(compaction) = item else {
                continue;
            };
            if compaction.summary.is_some() {
                continue;
            }
            match self
                .sealer
                .open(project_id, &compaction.encrypted_content)
                .await
            {
                Ok(summary) => compaction.summary = Some(summary),
                Err(OpenError::Store(error)) => return Err(error.into()),
                Err(OpenError::Refused) => {
                    let param = match index.checked_sub(first_new) {
                        Some(position) => format!("input[{position}]"),
                        None => earlier.to_owned(),
                    };
                    return Err(EngineError::CompactionRefused { param });
                }
            }
        }
        Ok(())
    }
}
