"""pydantic-ai (published, unmodified) streaming a run through the gateway in which a server tool runs.

pydantic-ai's Responses model reads an `mcp_call` as OpenAI streams it: the item added with empty
`arguments`, the arguments in `response.mcp_call_arguments.delta` / `.done`; it fails on anything else."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, NativeToolCallPart, NativeToolReturnPart
from pydantic_ai.models.openai import OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from conftest import Stack


def test_pydantic_ai_streams_a_run_in_which_a_server_tool_runs(stack: Stack) -> None:
    model = OpenAIResponsesModel("mock-tools", provider=OpenAIProvider(openai_client=stack.async_client()))
    agent = Agent(model)
    events: list[Any] = []

    async def handler(_ctx: Any, stream: Any) -> None:
        async for event in stream:
            events.append(event)

    result = asyncio.run(agent.run('!call add {"a": 2, "b": 3}', event_stream_handler=handler))

    assert result.output == 'Tool results: {"sum":5}'
    assert events, "the run was streamed"
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    calls = [p for m in responses for p in m.parts if isinstance(p, NativeToolCallPart)]
    returns = [p for m in responses for p in m.parts if isinstance(p, NativeToolReturnPart)]
    assert len(calls) == 1 and len(returns) == 1, responses
    # The arguments were put together from the delta events into the call's part.
    assert calls[0].args_as_dict() == {"action": "call_tool", "tool_name": "add", "tool_args": {"a": 2, "b": 3}}
    assert calls[0].tool_name == "mcp_server:gateway"
    assert '"sum":5' in returns[0].content["output"]
    [call] = stack.tool_calls("add")
    assert call["body"] == {"a": 2, "b": 3}
