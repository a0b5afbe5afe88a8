"""openai-agents against the gateway: local function tools, server tools, history replay, chaining."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, TypeVar

import agents
from agents import Agent, OpenAIResponsesModel, Runner, RunResult, function_tool
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses.response_output_item import McpCall

from conftest import Stack

agents.set_tracing_disabled(True)

T = TypeVar("T")


def run(stack: Stack, body: Callable[[Callable[[str], OpenAIResponsesModel]], Awaitable[T]]) -> T:
    """Runs `body` on a fresh event loop, with a factory of gateway-backed models bound to that loop."""

    async def main() -> T:
        async with stack.async_client() as sdk:
            return await body(lambda name: OpenAIResponsesModel(model=name, openai_client=sdk))

    return asyncio.run(main())


class Calls:
    """Local tools that record their calls."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

        @function_tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            self.log.append(("multiply", (a, b)))
            return a * b

        @function_tool
        def shout(text: str) -> str:
            """Upper-case a text."""
            self.log.append(("shout", text))
            return text.upper()

        self.tools = [multiply, shout]


def tool_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def message_texts(request: dict[str, Any]) -> list[str]:
    texts = []
    for m in request["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        if content:
            texts.append(content)
    return texts


def test_an_agent_runs_its_local_tools_and_answers_with_their_results(stack: Stack) -> None:
    calls = Calls()

    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(name="calculator", instructions="Use the tools.", tools=calls.tools, model=model("mock"))
        return await Runner.run(agent, '!call multiply {"a": 6, "b": 7}\n!call shout {"text": "hi"}')

    result = run(stack, body)

    assert calls.log == [("multiply", (6, 7)), ("shout", "hi")]
    assert result.final_output == "Tool results: 42; HI"
    assert [item.type for item in result.new_items] == [
        "tool_call_item",
        "tool_call_item",
        "tool_call_output_item",
        "tool_call_output_item",
        "message_output_item",
    ]
    assert all(isinstance(item.raw_item, ResponseFunctionToolCall) for item in result.new_items[:2])
    assert len(result.raw_responses) == 2
    # Default mode replays history: the second create sent the calls and outputs back, and the model
    # got one assistant message with both calls followed by both results.
    second = stack.model_requests()[1]
    assert second["messages"][0] == {"role": "system", "content": "Use the tools."}
    assert [c["function"]["name"] for c in second["messages"][-3]["tool_calls"]] == ["multiply", "shout"]
    assert tool_messages(second) == ["42", "HI"]
    assert stack.tool_calls() == []


def test_an_agent_on_a_deployment_with_server_tools_gets_mcp_calls_and_keeps_them_on_replay(
    stack: Stack,
) -> None:
    calls = Calls()

    async def body(model: Callable[[str], OpenAIResponsesModel]) -> tuple[RunResult, RunResult]:
        agent = Agent(name="forecaster", instructions="Help.", tools=calls.tools, model=model("mock-tools"))
        first = await Runner.run(agent, '!call get_weather {"city": "Paris"}')
        replay = first.to_input_list() + [{"role": "user", "content": "thanks"}]
        second = await Runner.run(agent, replay)
        return first, second

    first, second = run(stack, body)

    # The server tool ran in the gateway: the agent did not look for it locally.
    assert calls.log == []
    [weather] = stack.tool_calls()
    assert weather["tool"] == "get_weather" and weather["body"] == {"city": "Paris"}
    forecast = json.dumps({"city": "Paris", "forecast": "sunny", "temperature_c": 20}, separators=(",", ":"))
    assert first.final_output == f"Tool results: {forecast}"
    assert [item.type for item in first.new_items] == ["tool_call_item", "message_output_item"]
    mcp = first.new_items[0].raw_item
    assert isinstance(mcp, McpCall) and mcp.name == "get_weather" and mcp.output == forecast
    assert [item.type for item in first.raw_responses[0].output] == ["mcp_call", "message"]

    # Next turn, history replayed by the client: the model still sees the server tool's call and result,
    # and the tool is not run again.
    assert second.final_output == "Echo: thanks"
    last = stack.model_requests()[-1]
    assert tool_messages(last) == [forecast]
    calling = [m for m in last["messages"] if m.get("tool_calls")]
    assert [c["function"]["name"] for m in calling for c in m["tool_calls"]] == ["get_weather"]
    assert len(stack.tool_calls()) == 1


def test_an_agent_chains_turns_with_previous_response_id(client: Any, stack: Stack) -> None:
    calls = Calls()

    async def body(model: Callable[[str], OpenAIResponsesModel]) -> list[RunResult]:
        agent = Agent(name="chained", instructions="Chain.", tools=calls.tools, model=model("mock"))
        first = await Runner.run(agent, "hello")
        second = await Runner.run(agent, '!call multiply {"a": 2, "b": 5}', previous_response_id=first.last_response_id)
        third = await Runner.run(agent, "and then?", previous_response_id=second.last_response_id)
        return [first, second, third]

    first, second, third = run(stack, body)

    assert [r.final_output for r in (first, second, third)] == ["Echo: hello", "Tool results: 10", "Echo: and then?"]
    assert calls.log == [("multiply", (2, 5))]
    # Turn 2 made two creates: the call, then the output chained on it; each turn chains on the last.
    second_ids = [r.response_id for r in second.raw_responses]
    assert len(second_ids) == 2
    assert client.responses.retrieve(second_ids[0]).previous_response_id == first.last_response_id
    assert client.responses.retrieve(second_ids[1]).previous_response_id == second_ids[0]
    assert client.responses.retrieve(third.last_response_id).previous_response_id == second.last_response_id
    # With previous_response_id the client sends only the new items, yet the model saw the whole story.
    last = stack.model_requests()[-1]
    assert message_texts(last) == ["Chain.", "hello", "Echo: hello", '!call multiply {"a": 2, "b": 5}', "10", "Tool results: 10", "and then?"]
    assert tool_messages(last) == ["10"]


def test_an_agent_with_an_output_type_gets_it_parsed_on_every_provider_kind(stack: Stack) -> None:
    from pydantic import BaseModel

    from conftest import PROVIDER

    class Forecast(BaseModel):
        city: str
        degrees: int

    if PROVIDER == "anthropic":
        # Through Anthropic, the format is a tool the model is made to call; its input is the answer.
        stack.script({"tool_calls": [{"name": "emit_structured_output", "arguments": {"city": "Oslo", "degrees": 4}}]})
    else:
        stack.script({"text": '{"city": "Oslo", "degrees": 4}'})

    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(name="forecaster", instructions="Answer as JSON.", output_type=Forecast, model=model("mock"))
        return await Runner.run(agent, "weather in Oslo")

    result = run(stack, body)
    assert result.final_output == Forecast(city="Oslo", degrees=4)
    assert len(stack.model_requests()) == 1
