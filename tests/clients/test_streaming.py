"""Streaming (`stream: true`) through the published SDKs: openai-python's `responses.stream()` helper and raw
event iteration, and openai-agents' `Runner.run_streamed`, over text, server tools and client tools."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import agents
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool
from openai.types.responses import Response, ResponseFunctionToolCall
from openai.types.responses.response_output_item import McpCall

from conftest import UPSTREAM_MAX_RETRIES, Stack

agents.set_tracing_disabled(True)

CLOCK_TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a time zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string"}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "strict": True,
}

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def event_types(events: list[Any]) -> list[str]:
    return [event.type for event in events]


# openai-python: the responses.stream() helper ------------------------------------------------------


def test_the_stream_helper_accumulates_text_deltas_into_the_final_response(client: openai.OpenAI) -> None:
    deltas: list[str] = []
    with client.responses.stream(model="mock", input="hello stream") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                assert event.snapshot == "".join(deltas)
        final = stream.get_final_response()

    assert isinstance(final, Response)
    assert final.status == "completed"
    assert final.output_text == "Echo: hello stream"
    assert "".join(deltas) == final.output_text
    assert len(deltas) > 1, "text arrives in pieces"
    assert final.usage is not None and final.usage.total_tokens == 15
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_the_stream_helper_over_a_server_tool_ends_with_an_mcp_call_and_the_answer(
    client: openai.OpenAI, stack: Stack
) -> None:
    with client.responses.stream(model="mock-tools", input='!call add {"a": 2, "b": 3}') as stream:
        types = event_types(list(stream))
        final = stream.get_final_response()

    assert [item.type for item in final.output] == ["mcp_call", "message"]
    mcp = final.output[0]
    assert isinstance(mcp, McpCall) and mcp.status == "completed" and mcp.name == "add"
    assert json.loads(mcp.output or "") == {"sum": 5}
    assert final.output_text == 'Tool results: {"sum":5}'
    # The server tool's item went in progress, then completed, before the answer's item began.
    assert types.index("response.mcp_call.in_progress") < types.index("response.mcp_call.completed")
    assert types.index("response.mcp_call.completed") < types.index("response.content_part.added")
    assert types[-1] == "response.completed"
    [call] = stack.tool_calls("add")
    assert call["body"] == {"a": 2, "b": 3}


def test_the_stream_helper_over_client_tools_gives_function_calls_and_the_stream_continues_with_previous_response_id(
    client: openai.OpenAI, stack: Stack
) -> None:
    arguments: list[str] = []
    with client.responses.stream(
        model="mock", input='!call get_time {"zone": "UTC"}', tools=[CLOCK_TOOL]
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                arguments.append(event.delta)
            if event.type == "response.function_call_arguments.done":
                assert event.name == "get_time"
        first = stream.get_final_response()

    [call] = first.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_time" and call.status == "completed"
    assert json.loads(call.arguments) == {"zone": "UTC"} == json.loads("".join(arguments))

    with client.responses.stream(
        model="mock",
        previous_response_id=first.id,
        tools=[CLOCK_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}],
    ) as stream:
        second = stream.get_final_response()

    assert second.status == "completed"
    assert second.previous_response_id == first.id
    assert second.output_text == "Tool results: 12:00"
    assert stack.tool_calls() == []


# openai-python: raw event iteration -----------------------------------------------------------------


def test_raw_stream_iteration_yields_every_event_in_order_with_contiguous_sequence_numbers(
    client: openai.OpenAI,
) -> None:
    events = list(client.responses.create(model="mock", input="raw events", stream=True))

    assert event_types(events) == TEXT_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    created, completed = events[0], events[-1]
    assert created.response.status == "in_progress" and created.response.output == []
    assert completed.response.id == created.response.id
    assert completed.response.output_text == "Echo: raw events"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Echo: raw events"


def test_raw_stream_iteration_over_a_mixed_batch_hands_back_every_call(client: openai.OpenAI, stack: Stack) -> None:
    events = list(
        client.responses.create(
            model="mock-tools",
            input='!call add {"a": 1, "b": 2}\n!call get_time {"zone": "CET"}',
            tools=[CLOCK_TOOL],
            stream=True,
        )
    )

    call_events = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert event_types(events) == ["response.created", "response.in_progress", *call_events, *call_events, "response.completed"]
    final = events[-1].response
    assert [(item.type, item.name) for item in final.output] == [("function_call", "add"), ("function_call", "get_time")]
    assert stack.tool_calls() == []


def test_an_upstream_failure_in_a_stream_raises_an_api_error_in_the_sdk(stack: Stack, client: openai.OpenAI) -> None:
    stack.script(*[{"error": {"status": 500, "message": "upstream down"}}] * (1 + UPSTREAM_MAX_RETRIES))
    seen: list[str] = []
    with pytest.raises(openai.APIError) as raised:
        for event in client.responses.create(model="mock", input="fail please", stream=True):
            seen.append(event.type)

    # The error event carries a nested `error` object, so the SDK raises on it, after the start events.
    assert seen == ["response.created", "response.in_progress"]
    assert "500" in raised.value.message and "upstream down" not in raised.value.message
    assert getattr(raised.value, "code", None) == "server_error"


def test_validation_errors_of_a_stream_raise_before_any_event(client: openai.OpenAI, stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="mock", input="x", temperature=3, stream=True)
    assert raised.value.param == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x", stream=True)
    assert stack.model_requests() == []


# openai-agents: Runner.run_streamed -----------------------------------------------------------------


def run_streamed(stack: Stack, agent_for: Callable[[Callable[[str], OpenAIResponsesModel]], Agent], prompt: str) -> tuple[Any, list[Any]]:
    """Runs the agent with `Runner.run_streamed` on a fresh event loop; returns the result and its events."""

    async def main() -> tuple[Any, list[Any]]:
        async with stack.async_client() as sdk:
            agent = agent_for(lambda name: OpenAIResponsesModel(model=name, openai_client=sdk))
            result = Runner.run_streamed(agent, prompt)
            events = [event async for event in result.stream_events()]
            return result, events

    return asyncio.run(main())


def raw_types(events: list[Any]) -> list[str]:
    return [e.data.type for e in events if e.type == "raw_response_event"]


def test_an_agent_streams_a_text_answer(stack: Stack) -> None:
    result, events = run_streamed(
        stack, lambda model: Agent(name="talker", instructions="Talk.", model=model("mock")), "stream to me"
    )

    assert result.is_complete
    assert result.final_output == "Echo: stream to me"
    deltas = [e.data.delta for e in events if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
    assert "".join(deltas) == "Echo: stream to me"
    assert raw_types(events)[0] == "response.created" and raw_types(events)[-1] == "response.completed"
    assert [e.item.type for e in events if e.type == "run_item_stream_event"] == ["message_output_item"]


def test_an_agent_streams_through_its_local_function_tool(stack: Stack) -> None:
    log: list[tuple[int, int]] = []

    @function_tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        log.append((a, b))
        return a * b

    result, events = run_streamed(
        stack,
        lambda model: Agent(name="calculator", instructions="Use the tools.", tools=[multiply], model=model("mock")),
        '!call multiply {"a": 6, "b": 7}',
    )

    assert log == [(6, 7)]
    assert result.final_output == "Tool results: 42"
    items = [e.item.type for e in events if e.type == "run_item_stream_event"]
    assert items == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert raw_types(events).count("response.completed") == 2, "two streamed responses: the call, then the answer"
    assert stack.tool_calls() == []


def test_an_agent_streams_on_a_deployment_with_server_tools(stack: Stack) -> None:
    log: list[str] = []

    @function_tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        log.append(text)
        return text.upper()

    result, events = run_streamed(
        stack,
        lambda model: Agent(name="forecaster", instructions="Help.", tools=[shout], model=model("mock-tools")),
        '!call get_weather {"city": "Paris"}',
    )

    assert log == [], "the server tool was not looked for locally"
    forecast = json.dumps({"city": "Paris", "forecast": "sunny", "temperature_c": 20}, separators=(",", ":"))
    assert result.final_output == f"Tool results: {forecast}"
    items = [e.item for e in events if e.type == "run_item_stream_event"]
    assert [item.type for item in items] == ["tool_call_item", "message_output_item"]
    assert isinstance(items[0].raw_item, McpCall) and items[0].raw_item.output == forecast
    types = raw_types(events)
    assert "response.mcp_call.completed" in types and types.count("response.completed") == 1
    [weather] = stack.tool_calls()
    assert weather["tool"] == "get_weather" and weather["body"] == {"city": "Paris"}
