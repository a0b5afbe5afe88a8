"""openai-agents with MCP through the gateway: `HostedMCPTool` naming the testkit's MCP server (no approval,
approval granted and refused by `on_approval_request`, history re-sent or chained by `previous_response_id`), and
an operator's MCP tool source on a deployment."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, TypeVar

import agents
import pytest
from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, RunResult
from agents.tool import MCPToolApprovalFunctionResult, MCPToolApprovalRequest
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools

from conftest import Stack

agents.set_tracing_disabled(True)

T = TypeVar("T")

SUM_3 = json.dumps({"sum": 3}, separators=(",", ":"))
SUM_5 = json.dumps({"sum": 5}, separators=(",", ":"))


def run(stack: Stack, body: Callable[[Callable[[str], OpenAIResponsesModel]], Awaitable[T]]) -> T:
    """Runs `body` on a fresh event loop, with a factory of gateway-backed models bound to that loop."""

    async def main() -> T:
        async with stack.async_client() as sdk:
            return await body(lambda name: OpenAIResponsesModel(model=name, openai_client=sdk))

    return asyncio.run(main())


def calc(stack: Stack, require_approval: Any, on_approval_request: Any = None) -> HostedMCPTool:
    """The request's `mcp` tool for the testkit's MCP server, labelled `calc`."""
    return HostedMCPTool(
        tool_config={
            "type": "mcp",
            "server_label": "calc",
            "server_url": stack.mcp_url,
            "require_approval": require_approval,
        },
        on_approval_request=on_approval_request,
    )


def tool_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def offered_tools(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools", []))


def called_tools(request: dict[str, Any]) -> list[str]:
    return [c["function"]["name"] for m in request["messages"] for c in m.get("tool_calls") or []]


class Approver:
    """An `on_approval_request` hook that answers `decision` and notes each request and the MCP server's calls
    at that moment (so a test can show that nothing ran before the answer)."""

    def __init__(self, stack: Stack, decision: MCPToolApprovalFunctionResult) -> None:
        self.stack = stack
        self.decision = decision
        self.requests: list[McpApprovalRequest] = []
        self.calls_when_asked: list[list[dict[str, Any]]] = []

    def __call__(self, request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
        self.requests.append(request.data)
        self.calls_when_asked.append(self.stack.mcp_calls())
        return self.decision


def test_an_agent_with_a_hosted_mcp_tool_gets_its_call_run_by_the_gateway(stack: Stack) -> None:
    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(name="adder", instructions="Add.", tools=[calc(stack, "never")], model=model("mock"))
        return await Runner.run(agent, '!call add {"a": 2, "b": 3}')

    result = run(stack, body)

    assert stack.mcp_calls() == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]
    assert result.final_output == f"Tool results: {SUM_5}"
    assert [item.type for item in result.new_items] == ["mcp_list_tools_item", "tool_call_item", "message_output_item"]
    listing = result.new_items[0].raw_item
    assert isinstance(listing, McpListTools) and listing.server_label == "calc"
    assert sorted(t.name for t in listing.tools) == ["add", "fail", "hang"]
    call = result.new_items[1].raw_item
    assert isinstance(call, McpCall)
    assert (call.server_label, call.name, json.loads(call.arguments)) == ("calc", "add", {"a": 2, "b": 3})
    assert call.output == SUM_5 and call.error is None
    # One create: the gateway ran the call between its two upstream requests.
    assert len(result.raw_responses) == 1
    first, second = stack.model_requests()
    assert offered_tools(first) == ["add", "fail", "hang"]
    assert called_tools(second) == ["add"]
    assert tool_messages(second) == [SUM_5]


def test_a_failing_hosted_mcp_tool_shows_as_a_failed_mcp_call_and_the_model_hears_the_error(stack: Stack) -> None:
    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(name="adder", instructions="Add.", tools=[calc(stack, "never")], model=model("mock"))
        return await Runner.run(agent, "!call fail {}")

    result = run(stack, body)

    assert stack.mcp_calls() == [{"tool": "fail", "arguments": {}}]
    assert [item.type for item in result.new_items] == ["mcp_list_tools_item", "tool_call_item", "message_output_item"]
    call = result.new_items[1].raw_item
    assert isinstance(call, McpCall) and call.name == "fail"
    assert call.status == "failed" and call.error, call
    [told] = tool_messages(stack.model_requests()[-1])
    assert "failed on purpose" in told, told
    assert result.final_output == f"Tool results: {told}"


@pytest.mark.parametrize("chained", [False, True], ids=["history", "previous_response_id"])
def test_an_approved_hosted_mcp_call_runs_only_after_on_approval_request_approves(stack: Stack, chained: bool) -> None:
    approver = Approver(stack, {"approve": True})

    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(
            name="careful", instructions="Add.", tools=[calc(stack, "always", approver)], model=model("mock")
        )
        return await Runner.run(agent, '!call add {"a": 1, "b": 2}', auto_previous_response_id=chained)

    result = run(stack, body)

    [request] = approver.requests
    assert isinstance(request, McpApprovalRequest) and request.id.startswith("mcpr_")
    assert (request.server_label, request.name, json.loads(request.arguments)) == ("calc", "add", {"a": 1, "b": 2})
    assert approver.calls_when_asked == [[]], "nothing ran before the approval"
    assert stack.mcp_calls() == [{"tool": "add", "arguments": {"a": 1, "b": 2}}]
    assert stack.mcp_lists() == 1, "the second create used the listing it was given"
    assert [item.type for item in result.new_items] == [
        "mcp_list_tools_item",
        "mcp_approval_request_item",
        "mcp_approval_response_item",
        "tool_call_item",
        "message_output_item",
    ]
    response = result.new_items[2].raw_item
    assert response["approval_request_id"] == request.id and response["approve"] is True
    call = result.new_items[3].raw_item
    assert isinstance(call, McpCall) and call.name == "add" and call.output == SUM_3
    assert call.approval_request_id == request.id
    assert result.final_output == f"Tool results: {SUM_3}"
    # Two creates: the first ended at the approval request, the second carried the answer.
    assert len(result.raw_responses) == 2
    [first_output, second_output] = [[item.type for item in r.output] for r in result.raw_responses]
    assert first_output == ["mcp_list_tools", "mcp_approval_request"]
    assert second_output == ["mcp_call", "message"]
    last = stack.model_requests()[-1]
    assert called_tools(last) == ["add"]
    assert tool_messages(last) == [SUM_3]


def test_a_hosted_mcp_call_refused_by_on_approval_request_never_runs_and_the_model_hears_why(stack: Stack) -> None:
    approver = Approver(stack, {"approve": False, "reason": "too costly"})

    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(
            name="careful", instructions="Add.", tools=[calc(stack, "always", approver)], model=model("mock")
        )
        return await Runner.run(agent, '!call add {"a": 1, "b": 2}')

    result = run(stack, body)

    assert len(approver.requests) == 1
    assert stack.mcp_calls() == [], "a refused call never runs"
    assert [item.type for item in result.new_items] == [
        "mcp_list_tools_item",
        "mcp_approval_request_item",
        "mcp_approval_response_item",
        "message_output_item",
    ]
    response = result.new_items[2].raw_item
    assert response["approve"] is False and response.get("reason") == "too costly"
    [told] = tool_messages(stack.model_requests()[-1])
    assert "too costly" in told, told
    assert result.final_output == f"Tool results: {told}"


def test_an_agent_on_a_deployment_with_an_mcp_source_gets_mcp_calls_labelled_with_the_source(stack: Stack) -> None:
    async def body(model: Callable[[str], OpenAIResponsesModel]) -> RunResult:
        agent = Agent(name="adder", instructions="Add.", model=model("mock-mcp"))
        return await Runner.run(agent, '!call calc_add {"a": 2, "b": 3}')

    result = run(stack, body)

    assert stack.mcp_calls() == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]
    assert result.final_output == f"Tool results: {SUM_5}"
    assert [item.type for item in result.new_items] == ["tool_call_item", "message_output_item"]
    call = result.new_items[0].raw_item
    assert isinstance(call, McpCall)
    assert (call.server_label, call.name, call.output) == ("calc", "calc_add", SUM_5)
    first, second = stack.model_requests()
    assert offered_tools(first) == ["calc_add", "calc_fail", "calc_hang"]
    assert tool_messages(second) == [SUM_5]
