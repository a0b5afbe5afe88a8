//! The live event stream of one response: turns the loop's progress into Responses SSE events with
//! contiguous sequence numbers and output indices that match the final `output` array.

use std::collections::HashMap;

use gateway_core::events::{Event, EventSequence};
use gateway_core::output::{
    assistant_message, function_call_item, mcp_call_item, message_with_status,
};
use gateway_core::steps::{AssistantMessage, ModelOutput, Step, ToolCall, ToolOutcome, ToolStep};
use gateway_core::Item;
use serde_json::{json, Value};
use std::time::Duration;

use tokio::sync::mpsc;

/// Frames waiting for a slow client: the loop waits when this many are queued (backpressure).
pub const STREAM_BUFFER: usize = 64;

/// A client that takes no event for this long, its connection open, is treated as gone: its response stops at
/// the next step boundary and gives back its place, instead of holding it for ever.
pub const STREAM_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a response's events go while its loop runs.
pub struct StreamSink {
    events: EventSequence,
    tx: mpsc::Sender<Event>,
    next_output_index: usize,
    /// The message item being streamed: id, output index, text so far.
    open_message: Option<(String, usize, String)>,
    /// Output index of each server tool step, by step seq.
    tool_items: HashMap<u32, usize>,
    closed: bool,
}

impl StreamSink {
    pub fn new(tx: mpsc::Sender<Event>) -> StreamSink {
        StreamSink {
            events: EventSequence::new(),
            tx,
            next_output_index: 0,
            open_message: None,
            tool_items: HashMap::new(),
            closed: false,
        }
    }

    /// Whether the client went away.
    pub fn is_closed(&self) -> bool {
        self.closed || self.tx.is_closed()
    }

    async fn send(&mut self, event: Event) {
        if self.closed {
            return;
        }
        match tokio::time::timeout(STREAM_STALL_TIMEOUT, self.tx.send(event)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.closed = true,
            Err(_) => {
                tracing::info!("stream client stalled; treating it as gone");
                self.closed = true;
            }
        }
    }

    /// `response.created` then `response.in_progress`, each with the response as it starts.
    pub async fn started(&mut self, response: &Value) {
        let created = self.events.response("response.created", response);
        self.send(created).await;
        let in_progress = self.events.response("response.in_progress", response);
        self.send(in_progress).await;
    }

    /// A piece of model text, as it arrives; opens the message item on the first piece.
    pub async fn text_delta(&mut self, message_id: &str, delta: &str) {
        if self.open_message.is_none() {
            let index = self.take_index();
            let item = json!({"id": message_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
            let added = self.events.item_added(index, &item);
            self.send(added).await;
            let part = self.events.content_part_added(message_id, index);
            self.send(part).await;
            self.open_message = Some((message_id.to_owned(), index, String::new()));
        }
        let Some((id, index, text)) = self.open_message.as_mut() else {
            return;
        };
        text.push_str(delta);
        let event = self.events.text_delta(id, *index, delta);
        self.send(event).await;
    }

    /// The model call ended: closes the streamed message (or emits it whole if it was not streamed).
    pub async fn model_ended(&mut self, output: &ModelOutput) {
        let Some(message) = &output.message else {
            self.open_message = None;
            return;
        };
        if self.open_message.is_none() {
            self.text_delta(&message.item_id, &message.text).await;
        }
        let Some((id, index, _)) = self.open_message.take() else {
            return;
        };
        let text = &message.text;
        let done = self.events.text_done(&id, index, text);
        self.send(done).await;
        let part = self.events.content_part_done(&id, index, text);
        self.send(part).await;
        let item = item_json(&assistant_message(&id, text));
        let done = self.events.item_done(index, &item);
        self.send(done).await;
    }

    /// The model call failed after some text was streamed: the message item ends `incomplete`, with the
    /// text the client saw, which is returned so that the stored response shows the same item.
    pub async fn abandon_message(&mut self) -> Option<AssistantMessage> {
        let (id, index, text) = self.open_message.take()?;
        let done = self.events.text_done(&id, index, &text);
        self.send(done).await;
        let part = self.events.content_part_done(&id, index, &text);
        self.send(part).await;
        let item = item_json(&message_with_status(&id, &text, "incomplete"));
        let done = self.events.item_done(index, &item);
        self.send(done).await;
        Some(AssistantMessage { item_id: id, text })
    }

    /// Server tool steps started: one `mcp_call` item each, in progress.
    pub async fn tools_started(&mut self, steps: &[&Step]) {
        for step in steps {
            let Some(tool) = step.tool() else { continue };
            if self.tool_items.contains_key(&step.seq) {
                continue;
            }
            let index = self.take_index();
            self.tool_items.insert(step.seq, index);
            let item = item_json(&mcp_call_item(&ToolStep {
                outcome: None,
                ..tool.clone()
            }));
            let added = self.events.item_added(index, &item);
            self.send(added).await;
            let progress = self.events.event(
                "response.mcp_call.in_progress",
                json!({"item_id": tool.item_id, "output_index": index}),
            );
            self.send(progress).await;
        }
    }

    /// A server tool step ended: its `mcp_call` item is done, with output or error.
    pub async fn tool_ended(&mut self, step: &Step) {
        let (Some(tool), Some(&index)) = (step.tool(), self.tool_items.get(&step.seq)) else {
            return;
        };
        let kind = if tool.outcome.as_ref().is_some_and(ToolOutcome::is_error) {
            "response.mcp_call.failed"
        } else {
            "response.mcp_call.completed"
        };
        let status = self.events.event(
            kind,
            json!({"item_id": tool.item_id, "output_index": index}),
        );
        self.send(status).await;
        let item = item_json(&mcp_call_item(tool));
        let done = self.events.item_done(index, &item);
        self.send(done).await;
    }

    /// A batch handed back to the client: one `function_call` item each, arguments streamed whole.
    pub async fn handed_back(&mut self, calls: &[ToolCall]) {
        for call in calls {
            let index = self.take_index();
            let item = item_json(&function_call_item(
                &ToolCall {
                    arguments: String::new(),
                    ..call.clone()
                },
                "in_progress",
            ));
            let added = self.events.item_added(index, &item);
            self.send(added).await;
            let delta = self
                .events
                .arguments_delta(&call.item_id, index, &call.arguments);
            self.send(delta).await;
            let done =
                self.events
                    .arguments_done(&call.item_id, index, &call.name, &call.arguments);
            self.send(done).await;
            let item = item_json(&function_call_item(call, "completed"));
            let done = self.events.item_done(index, &item);
            self.send(done).await;
        }
    }

    /// An error inside the stream (before `response.failed`).
    pub async fn error(&mut self, code: &str, message: &str) {
        let event = self.events.error(code, message);
        self.send(event).await;
    }

    /// The one terminal event, chosen by the response's status, carrying the full response.
    pub async fn finished(&mut self, response: &Value) {
        let kind = match response.get("status").and_then(Value::as_str) {
            Some("completed") => "response.completed",
            Some("incomplete") => "response.incomplete",
            Some("cancelled") => "response.cancelled",
            _ => "response.failed",
        };
        let event = self.events.response(kind, response);
        self.send(event).await;
    }

    fn take_index(&mut self) -> usize {
        let index = self.next_output_index;
        self.next_output_index += 1;
        index
    }
}

fn item_json(item: &Item) -> Value {
    serde_json::to_value(item).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn a_sink_whose_client_reads_nothing_waits_once_its_buffer_is_full() {
        let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = StreamSink::new(tx);
        sink.started(&json!({})).await;
        // created, in_progress, then output_item.added, content_part.added and the first delta.
        sink.text_delta("msg_1", "a").await;
        for _ in 5..STREAM_BUFFER {
            assert!(
                sink.text_delta("msg_1", "a").now_or_never().is_some(),
                "room left"
            );
        }
        assert!(
            sink.text_delta("msg_1", "b").now_or_never().is_none(),
            "the sink waits instead of queueing without bound"
        );
        assert_eq!(rx.recv().await.map(|e| e.kind), Some("response.created"));
        assert!(sink.text_delta("msg_1", "c").now_or_never().is_some());
        assert!(!sink.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_treated_as_gone_after_the_stall_timeout() {
        let (tx, _rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = StreamSink::new(tx);
        // The first delta opens the message: three events; then one each, up to a full buffer.
        for _ in 0..STREAM_BUFFER - 2 {
            sink.text_delta("msg_1", "a").await;
        }
        assert!(!sink.is_closed(), "a full buffer alone is backpressure");
        let started = tokio::time::Instant::now();
        // The receiver is alive but never reads: the send gives up after the stall timeout.
        sink.text_delta("msg_1", "b").await;
        assert!(sink.is_closed());
        assert!(started.elapsed() >= STREAM_STALL_TIMEOUT);
        assert!(sink.text_delta("msg_1", "c").now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_sink_whose_client_went_away_is_closed_and_drops_events() {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = StreamSink::new(tx);
        drop(rx);
        assert!(sink.is_closed());
        // Nothing blocks, however many events follow.
        for _ in 0..STREAM_BUFFER * 2 {
            assert!(sink.text_delta("msg_1", "a").now_or_never().is_some());
        }
    }

    #[tokio::test]
    async fn an_abandoned_message_ends_with_its_text_and_status_incomplete() {
        let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = StreamSink::new(tx);
        sink.text_delta("msg_1", "Hel").await;
        sink.text_delta("msg_1", "lo").await;
        let partial = sink.abandon_message().await;
        assert_eq!(
            partial,
            Some(AssistantMessage {
                item_id: "msg_1".into(),
                text: "Hello".into()
            })
        );
        drop(sink);
        let mut kinds = Vec::new();
        let mut last = Value::Null;
        while let Some(event) = rx.recv().await {
            kinds.push(event.kind);
            last = event.data;
        }
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        assert_eq!(last["item"]["status"], "incomplete");
        assert_eq!(last["item"]["content"][0]["text"], "Hello");
    }
}
