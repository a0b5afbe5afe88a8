//! Preparing a response: the request checked against the project's deployment, server tools and stored
//! responses, its context assembled, and (for responses someone may look for while they run) its row written.
//! Nothing is stored when any check fails.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_core::context::pair_calls;
use gateway_core::decide::LoopInput;
use gateway_core::items::{InputItem, McpCallItem};
use gateway_core::output::render_output;
use gateway_core::request::{ResponseParams, ValidRequest};
use gateway_core::response::{ResponseRecord, ResponseState};
use gateway_core::steps::{ModelStep, Step, StepBody, StepState, ToolStep};
use gateway_core::toolset::{
    forced_tool_name, unserved_tools, DeclaredTool, UnsupportedTools, IGNORED_TOOLS_KEY,
};
use gateway_core::{decide_next_action, Item, Limits, NextAction};

use gateway_core::events::Event;
use tokio::sync::broadcast;

use crate::store::notify::Notification;
use crate::store::tenancy::{SourceKind, ToolSource};

use super::journal::Journal;
use super::{Engine, EngineError, Origin, Run};
use crate::clock::now;
use crate::ids::{item_id, new_id};
use crate::store::responses::{Durability, NewResponse};
use crate::store::StoreError;

/// What preparing a request gave.
// It lives for the length of one call, moved once: boxing the run would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Prepared {
    /// A run to start now.
    Run(Run),
    /// A background response stored as queued, for the first replica with room to take.
    Queued(ResponseRecord),
}

impl Engine {
    /// Validates a foreground `request` against the project's deployments, tools and stored responses, and
    /// builds the run. A streamed response, and one created with an `Idempotency-Key`, are stored now; any other
    /// stored response with its first step boundary that waits for the disk (see `journal.rs`).
    pub async fn prepare(
        &self,
        project_id: &str,
        request: ValidRequest,
        idempotency_key: Option<&str>,
    ) -> Result<Run, EngineError> {
        match self
            .prepare_any(project_id, request, idempotency_key, None)
            .await?
        {
            Prepared::Run(run) => Ok(run),
            // Only a background request is queued.
            Prepared::Queued(_) => Err(EngineError::Overloaded),
        }
    }

    /// Like [`prepare`](Engine::prepare) for a foreground request whose previous response is given rather than
    /// read from the store: `previous` is its whole context, output included (a WebSocket connection keeps the
    /// last `store: false` response in memory, SPEC 11).
    pub async fn prepare_continuing(
        &self,
        project_id: &str,
        request: ValidRequest,
        previous: Vec<Item>,
    ) -> Result<Run, EngineError> {
        match self
            .prepare_any(project_id, request, None, Some(previous))
            .await?
        {
            Prepared::Run(run) => Ok(run),
            Prepared::Queued(_) => Err(EngineError::Overloaded),
        }
    }

    /// Stores a background request as queued and starts it when this replica has room; otherwise the first
    /// replica with room takes it. Answers the response as it was stored, and (with `follow`) its live events
    /// when it runs here.
    pub async fn submit(
        &self,
        project_id: &str,
        request: ValidRequest,
        idempotency_key: Option<&str>,
        follow: bool,
    ) -> Result<(ResponseRecord, Option<broadcast::Receiver<Event>>), EngineError> {
        match self
            .prepare_any(project_id, request, idempotency_key, None)
            .await?
        {
            Prepared::Run(run) => {
                let record = run.record.clone();
                // Following before the run starts, so that no live event is missed.
                let live = follow
                    .then(|| self.replica.runs.follow(&record.id))
                    .flatten();
                let sink = super::EventSink::for_followers(&run.record, &run.steps);
                self.spawn(run, sink);
                Ok((record, live))
            }
            Prepared::Queued(record) => {
                // No room here: whichever replica has room takes it.
                self.tell_all(Notification::Work).await;
                Ok((record, None))
            }
        }
    }

    async fn prepare_any(
        &self,
        project_id: &str,
        request: ValidRequest,
        idempotency_key: Option<&str>,
        known_previous: Option<Vec<Item>>,
    ) -> Result<Prepared, EngineError> {
        if !self.replica.is_accepting() {
            crate::metrics::response_refused("shutting_down");
            return Err(EngineError::ShuttingDown);
        }
        // A full gateway says so at once, before any work, rather than letting requests queue without bound;
        // a background request waits in the store for a replica with room instead.
        let admitted = match Arc::clone(&self.admission).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) if request.background => None,
            Err(_) => {
                crate::metrics::response_refused("overloaded");
                return Err(EngineError::Overloaded);
            }
        };
        let resolution = self
            .resolver
            .resolve(project_id, &request.model)
            .await?
            .ok_or_else(|| EngineError::ModelNotFound {
                model: request.model.clone(),
            })?;
        // MCP sources become the tools their servers list now (cached per source).
        let expanded = self.tools.expand(resolution.tools.clone()).await;
        // Sources bound to a hosted type serve it only when the request declares it.
        let (mut server_tools, served) = bind_hosted_tools(expanded, &request.params.tools);
        let mut registered: BTreeSet<String> =
            server_tools.iter().map(|t| t.name.clone()).collect();
        let mut request = request;
        apply_unsupported_tools(
            &mut request,
            &served,
            resolution.deployment.unsupported_tools,
        )?;

        let response_id = new_id("resp");
        let input = self.resolve_references(project_id, request.input).await?;
        let mut context = match (&request.previous_response_id, known_previous) {
            (Some(_), Some(known)) => known,
            (Some(previous_id), None) => self.previous_context(project_id, previous_id).await?,
            (None, _) => Vec::new(),
        };
        let first_new = context.len();
        add_input(&mut context, input, &response_id);
        self.open_compactions(project_id, &mut context, first_new)
            .await?;
        // The request's own MCP servers: listed now unless the chain already holds their listing.
        let remote = self
            .remote_tools(&request.params.tools, &context, &response_id)
            .await?;
        check_remote_names(&request.params, &registered, &remote.tools)?;
        registered.extend(remote.tools.iter().map(|t| t.name.clone()));
        server_tools.extend(remote.tools);
        check_tools(&request.params, &registered)?;
        let carried = pair_calls(&context, first_new, &registered).map_err(|error| {
            let param = match error.index() {
                Some(index) if index >= first_new => format!("input[{}]", index - first_new),
                _ => "input".to_owned(),
            };
            EngineError::Pairing { error, param }
        })?;

        let limits = self.limits_for(request.params.max_tool_calls);
        // Listings first, as they happened; then the calls carried over from the client's answer.
        let mut steps: Vec<Step> = remote
            .listings
            .into_iter()
            .map(|listing| Step {
                seq: 0,
                state: StepState::Succeeded,
                body: StepBody::Listing(listing),
            })
            .collect();
        steps.extend(carried.into_iter().map(|call| {
            let source = server_tools.iter().find(|s| s.name == call.name);
            Step {
                seq: 0,
                state: StepState::Pending,
                body: StepBody::Tool(ToolStep {
                    item_id: item_id("mcp", &response_id),
                    server_label: source.and_then(|s| s.server_label.clone()),
                    call,
                    batch: None,
                    outcome: None,
                    ended_rank: None,
                    started_at_ms: None,
                    ended_at_ms: None,
                    notes: Default::default(),
                    hosted_type: None,
                }),
            }
        }));
        for (seq, step) in steps.iter_mut().enumerate() {
            step.seq = seq as u32;
        }
        let first = decide_next_action(&LoopInput {
            steps: &steps,
            registered: &registered,
            limits,
            deadline_passed: false,
        });
        if first == NextAction::CallModel && !request.background {
            // The first model call is recorded with the response itself: one write instead of two. A background
            // response records it when a replica starts it.
            steps.push(Step {
                seq: steps.len() as u32,
                state: StepState::Running,
                body: StepBody::Model(ModelStep::default()),
            });
        }
        let record = ResponseRecord {
            id: response_id,
            created_at: now(),
            model: request.model,
            params: request.params,
            previous_response_id: request.previous_response_id,
            store: request.store,
            background: request.background,
            state: if request.background {
                ResponseState::Queued
            } else {
                ResponseState::InProgress
            },
            usage: None,
        };
        // A foreground response's deadline runs from now; a background one's from when a replica starts it.
        let deadline_in_ms = (!request.background).then(|| self.deadline_ms());
        // A response that someone may look for while it runs (its stream told the client its id) or that
        // must be found by its Idempotency-Key is written now. Any other is written with its first step
        // boundary: before a tool request goes out, or with its ending. Until then nothing outside this call
        // knows it, and a crash leaves nothing half-done behind (the client, cut off, sends it again).
        let write_now =
            request.store && (request.stream || request.background || idempotency_key.is_some());
        if write_now {
            let owner = admitted.is_some().then_some(self.replica.id.as_str());
            self.create_row(
                &NewResponse {
                    record: &record,
                    project_id,
                    deployment_id: &resolution.deployment.id,
                    server_tools: &server_tools,
                    context: &context,
                    steps: &steps,
                    idempotency_key,
                    owner,
                    deadline_in_ms,
                },
                // A background response is answered `queued` at once: it must outlive a crash of the
                // database server from then on. The others run on, and their next writes make this one
                // durable before anything else happens.
                if request.background {
                    Durability::Flush
                } else {
                    self.relaxed()
                },
            )
            .await
            .map_err(|e| match e {
                // Two creates with one Idempotency-Key raced: the other one is running it.
                StoreError::Conflict(_) => EngineError::IdempotencyInProgress,
                other => {
                    if owner.is_some() && other.may_have_committed() {
                        // It may have committed with its reply lost: once the store answers, the response
                        // is handed to whichever replica claims it, rather than left owned by nobody running.
                        self.replica.release_later(&record.id, 0);
                    }
                    EngineError::NothingStored(other)
                }
            })?;
        }
        let Some(admitted) = admitted else {
            return Ok(Prepared::Queued(record));
        };
        let registration = self
            .replica
            .runs
            .register(&record.id, 0)
            .ok_or(EngineError::TaskFailed)?;
        let journal = Journal::new(request.store, project_id, write_now, steps.len());
        Ok(Prepared::Run(Run {
            record,
            project_id: project_id.to_owned(),
            keyed: idempotency_key.is_some(),
            deployment: resolution.deployment.clone(),
            server_tools,
            registered,
            context,
            steps,
            limits,
            deadline: Instant::now() + Duration::from_millis(self.limits.response_deadline_ms),
            origin: if request.background {
                Origin::Queued
            } else {
                Origin::New
            },
            journal,
            registration,
            store_says: None,
            _admitted: admitted,
        }))
    }

    /// The loop's limits for a request that asked for `max_tool_calls`: it may lower the operator's ceiling, not
    /// raise it.
    pub(super) fn limits_for(&self, max_tool_calls: Option<u32>) -> Limits {
        let ceiling = self.limits.max_tool_calls;
        Limits {
            max_tool_calls: Some(max_tool_calls.map_or(ceiling, |n| n.min(ceiling))),
            max_model_calls: self.limits.max_model_calls,
            max_failing_batches: self.limits.max_failing_batches,
        }
    }

    /// The whole-response deadline, in milliseconds.
    pub(super) fn deadline_ms(&self) -> i64 {
        i64::try_from(self.limits.response_deadline_ms).unwrap_or(i64::MAX)
    }

    /// The context a chained response starts from: the previous response's context, then its output.
    pub(super) async fn previous_context(
        &self,
        project_id: &str,
        previous_id: &str,
    ) -> Result<Vec<Item>, EngineError> {
        let previous = self
            .store
            .load_response(project_id, previous_id)
            .await?
            .ok_or_else(|| EngineError::PreviousNotFound {
                id: previous_id.to_owned(),
            })?;
        let Some(ending) = previous.record.ending() else {
            return Err(EngineError::PreviousInProgress {
                id: previous_id.to_owned(),
                status: previous.record.status(),
            });
        };
        let mut context = self.store.load_context(project_id, previous_id).await?;
        let steps = self.store.load_steps(project_id, previous_id).await?;
        context.extend(render_output(&steps, ending.handed_back()));
        Ok(context)
    }

    /// The input with each `item_reference` replaced by the stored item it names (SPEC 5).
    pub(super) async fn resolve_references(
        &self,
        project_id: &str,
        input: Vec<InputItem>,
    ) -> Result<Vec<Item>, EngineError> {
        let mut items = Vec::with_capacity(input.len());
        for (index, item) in input.into_iter().enumerate() {
            match item {
                InputItem::Item(item) => items.push(item),
                InputItem::Reference { id } => match self.store.find_item(project_id, &id).await? {
                    Some(item) => items.push(item),
                    None => return Err(EngineError::ItemNotFound { id, index }),
                },
                // A hosted call sent back: the stored call it shows, if it is one; otherwise nothing.
                InputItem::Hosted { id } => {
                    if let Some(id) = id {
                        let found = self.store.find_item(project_id, &id).await?;
                        if let Some(
                            item @ Item::McpCall(McpCallItem {
                                hosted_type: Some(_),
                                ..
                            }),
                        ) = found
                        {
                            items.push(item);
                        }
                    }
                }
            }
        }
        Ok(items)
    }
}

/// Client tools may not take the name of a server tool the key may use, and `tool_choice` must name a tool
/// that exists.
fn check_tools(params: &ResponseParams, registered: &BTreeSet<String>) -> Result<(), EngineError> {
    for (index, tool) in params.tools.iter().enumerate() {
        if let Some(name) = tool
            .model_names()
            .into_iter()
            .find(|name| registered.contains(name))
        {
            return Err(EngineError::ToolNameConflict { name, index });
        }
    }
    if let Some(name) = forced_tool_name(&params.tool_choice) {
        let known = registered.contains(name)
            || params.tools.iter().any(|tool| {
                tool.model_names().iter().any(|n| n == name)
                    || matches!(tool, DeclaredTool::Namespace(ns) if ns.tools.iter().any(|m| m.name() == name))
            });
        if !known {
            return Err(EngineError::UnknownToolChoice {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

/// The tools of the request's own MCP servers may not take the name of a client tool, of a server tool the key
/// may use, or of another server's tool: a model could not tell them apart.
fn check_remote_names(
    params: &ResponseParams,
    registered: &BTreeSet<String>,
    remote: &[ToolSource],
) -> Result<(), EngineError> {
    let client: BTreeSet<String> = params
        .tools
        .iter()
        .flat_map(DeclaredTool::model_names)
        .collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for tool in remote {
        let clashes = client.contains(&tool.name)
            || registered.contains(&tool.name)
            || !seen.insert(tool.name.as_str());
        if clashes {
            let server_label = tool.server_label.clone().unwrap_or_default();
            let index = params
                .tools
                .iter()
                .position(|t| {
                    matches!(t, DeclaredTool::Other(o) if o.is_mcp()
                        && o.settings.get("server_label").and_then(|l| l.as_str()) == Some(server_label.as_str()))
                })
                .unwrap_or_default();
            return Err(EngineError::RemoteToolClash {
                name: tool.name.clone(),
                server_label,
                index,
            });
        }
    }
    Ok(())
}

/// The server tools a request may use, given the hosted tools it declares (SPEC 12), and the hosted types they
/// serve. A source bound to a hosted type (`hosted_type`) serves it only for a request that declares a tool of
/// that type: the model is then offered it under the hosted type's own name (`web_search`), with the source's
/// description and parameters, and its calls run the source. A request that does not declare the type is not
/// offered the source at all. When several visible sources bind one type, the first (the key's sources come
/// ordered by name) serves it; a bound source whose type is already the name of another server tool serves
/// nothing, and the declared tool is left to the deployment's policy.
pub(super) fn bind_hosted_tools(
    sources: Vec<ToolSource>,
    declared: &[DeclaredTool],
) -> (Vec<ToolSource>, BTreeSet<String>) {
    let declared: BTreeSet<&str> = declared
        .iter()
        .filter_map(|tool| match tool {
            DeclaredTool::Other(other) if !other.is_mcp() => Some(other.kind.as_str()),
            _ => None,
        })
        .collect();
    let plain: BTreeSet<String> = sources
        .iter()
        .filter(|s| s.hosted_type.is_none())
        .map(|s| s.name.clone())
        .collect();
    let mut served = BTreeSet::new();
    let mut bound = Vec::with_capacity(sources.len());
    for mut source in sources {
        if source.kind == SourceKind::Mcp {
            // An MCP server's tools are many: a binding names one HTTP tool.
            source.hosted_type = None;
        }
        let Some(hosted) = source.hosted_type.clone() else {
            bound.push(source);
            continue;
        };
        if !declared.contains(hosted.as_str()) || served.contains(&hosted) {
            continue;
        }
        if plain.contains(&hosted) {
            tracing::warn!(tool.source = %source.name, hosted_type = %hosted,
                "a server tool already has the hosted type's name: the binding is not used");
            continue;
        }
        source.name = hosted.clone();
        served.insert(hosted);
        bound.push(source);
    }
    (bound, served)
}

/// Declared tools that no model is offered and no source serves: left out and listed in the response's
/// metadata (`ignore`), or the request refused (`reject`), as the deployment says (SPEC 12).
fn apply_unsupported_tools(
    request: &mut ValidRequest,
    served: &BTreeSet<String>,
    policy: UnsupportedTools,
) -> Result<(), EngineError> {
    let unserved = unserved_tools(&request.params.tools, served);
    if unserved.is_empty() {
        return Ok(());
    }
    match policy {
        UnsupportedTools::Reject => {
            let (index, kind) = unserved[0];
            Err(EngineError::UnsupportedTool {
                kind: kind.to_owned(),
                index,
            })
        }
        UnsupportedTools::Ignore => {
            let mut kinds: Vec<&str> = unserved.iter().map(|(_, kind)| *kind).collect();
            kinds.dedup();
            let listed = kinds.join(",");
            tracing::info!(model = %request.model, tools.ignored = %listed, "tools of types nothing serves are left out");
            request
                .params
                .metadata
                .insert(IGNORED_TOOLS_KEY.to_owned(), listed);
            Ok(())
        }
    }
}

/// Appends the request's input to the context. Ids that clients send are kept when unique within the context,
/// and replaced otherwise; items without one get a fresh id of the response's.
pub(super) fn add_input(context: &mut Vec<Item>, input: Vec<Item>, response_id: &str) {
    let mut taken: HashSet<String> = context
        .iter()
        .filter_map(|i| i.id().map(str::to_owned))
        .collect();
    for mut item in input {
        let keep = item
            .id()
            .is_some_and(|id| !id.is_empty() && !taken.contains(id));
        if !keep {
            item.set_id(item_id(item.id_prefix(), response_id));
        }
        taken.insert(item.id().unwrap_or_default().to_owned());
        context.push(item);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn source(name: &str, hosted: Option<&str>, kind: &str) -> ToolSource {
        serde_json::from_value(json!({
            "id": format!("ts_{name}"), "name": name, "description": name, "parameters": {"type": "object"},
            "url": "http://127.0.0.1:1/", "timeout_ms": 1000, "strict": false, "hosted_type": hosted, "kind": kind,
        }))
        .unwrap()
    }

    fn declared(kinds: &[&str]) -> Vec<DeclaredTool> {
        kinds
            .iter()
            .map(|k| DeclaredTool::from_json(json!({"type": k})).unwrap())
            .collect()
    }

    fn names(sources: &[ToolSource]) -> Vec<(&str, Option<&str>)> {
        sources
            .iter()
            .map(|s| (s.name.as_str(), s.hosted_type.as_deref()))
            .collect()
    }

    #[test]
    fn a_bound_source_serves_its_type_only_when_declared_under_the_type_s_name() {
        let sources = || {
            vec![
                source("add", None, "http"),
                source("search_a", Some("web_search"), "http"),
                source("search_b", Some("web_search"), "http"),
                source("files", Some("file_search"), "http"),
            ]
        };
        let (bound, served) = bind_hosted_tools(sources(), &[]);
        assert_eq!(names(&bound), [("add", None)]);
        assert!(served.is_empty());

        let (bound, served) =
            bind_hosted_tools(sources(), &declared(&["web_search", "tool_search"]));
        assert_eq!(
            names(&bound),
            [("add", None), ("web_search", Some("web_search"))]
        );
        assert_eq!(
            bound[1].id, "ts_search_a",
            "the first binding serves the type"
        );
        assert_eq!(served.into_iter().collect::<Vec<_>>(), ["web_search"]);
    }

    #[test]
    fn a_binding_that_would_clash_or_names_an_mcp_source_serves_nothing() {
        let (bound, served) = bind_hosted_tools(
            vec![
                source("web_search", None, "http"),
                source("search", Some("web_search"), "http"),
                source("docs", Some("file_search"), "mcp"),
            ],
            &declared(&["web_search", "file_search"]),
        );
        assert_eq!(names(&bound), [("web_search", None), ("docs", None)]);
        assert!(served.is_empty());
    }
}
