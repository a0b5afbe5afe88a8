"""The low-level `openai` SDK against the gateway: the Responses resource, errors, tools, retries."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import openai
import pytest
from pydantic import BaseModel
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
)
from openai.types.responses.response_output_item import McpCall

from conftest import PROVIDER, UPSTREAM_MAX_RETRIES, Stack
from proxy import CuttingProxy

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
DATE_TOOL = {
    "type": "function",
    "name": "get_date",
    "description": "Today's date.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}


def item_text(item: Any) -> str:
    """The text of a message item (input or output), whatever its content shape."""
    content = item.content
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content)


def of_type(response: Response, kind: str) -> list[Any]:
    return [item for item in response.output if item.type == kind]


# Create, retrieve, delete, input items ------------------------------------------------------------


def test_create_returns_a_typed_response_with_output_text_and_usage(client: openai.OpenAI) -> None:
    response = client.responses.create(model="mock", input="hello there", metadata={"suite": "clients"})

    assert isinstance(response, Response)
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.model == "mock"
    assert response.error is None and response.incomplete_details is None
    assert response.metadata == {"suite": "clients"}
    assert response.output_text == "Echo: hello there"
    [message] = response.output
    assert isinstance(message, ResponseOutputMessage)
    assert message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].text == "Echo: hello there"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (10, 5, 15)


def test_a_truncated_answer_is_an_incomplete_response(client: openai.OpenAI, stack: Stack) -> None:
    stack.script({"text": "cut sho", "finish_reason": "length"})
    response = client.responses.create(model="mock", input="tell me everything", max_output_tokens=16)

    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "cut sho"
    assert response.max_output_tokens == 16


def test_parse_returns_structured_output_for_a_json_schema_format(client: openai.OpenAI, stack: Stack) -> None:
    class Forecast(BaseModel):
        city: str
        degrees: int

    if PROVIDER == "anthropic":
        # Anthropic answers a JSON format through the forced tool the gateway offers it.
        stack.script({"tool_calls": [{"name": "emit_structured_output", "arguments": {"city": "Oslo", "degrees": 4}}]})
    else:
        stack.script({"text": '{"city": "Oslo", "degrees": 4}'})
    parsed = client.responses.parse(model="mock", input="weather in Oslo as JSON", text_format=Forecast)

    assert parsed.output_parsed == Forecast(city="Oslo", degrees=4)
    assert parsed.text is not None and parsed.text.format is not None and parsed.text.format.type == "json_schema"
    assert "gateway_ignored_params" not in (parsed.metadata or {})
    sent = stack.model_requests()[0]
    if PROVIDER == "anthropic":
        [tool] = [t for t in sent["tools"] if t["function"]["name"] == "emit_structured_output"]
        assert tool["function"]["parameters"]["required"] == ["city", "degrees"]
    elif PROVIDER == "openai_chat":
        upstream_format = sent["response_format"]
        assert upstream_format["type"] == "json_schema"
        assert upstream_format["json_schema"]["schema"]["required"] == ["city", "degrees"]


def test_an_unstored_response_cannot_be_read_back(client: openai.OpenAI) -> None:
    response = client.responses.create(model="mock", input="forget me", store=False)

    assert response.output_text == "Echo: forget me"
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_retrieve_returns_the_stored_response(client: openai.OpenAI) -> None:
    created = client.responses.create(model="mock", input="keep me", instructions="Be brief.")
    retrieved = client.responses.retrieve(created.id)

    assert isinstance(retrieved, Response)
    assert retrieved.id == created.id
    assert retrieved.status == "completed"
    assert retrieved.output_text == "Echo: keep me"
    assert retrieved.instructions == "Be brief."
    assert [item.id for item in retrieved.output] == [item.id for item in created.output]
    assert retrieved.usage == created.usage


def test_delete_removes_the_response(client: openai.OpenAI) -> None:
    created = client.responses.create(model="mock", input="short-lived")

    assert client.responses.delete(created.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(created.id)


def test_input_items_auto_paginate_over_the_full_context(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="mock", input=[{"role": "user", "content": f"message {i}"} for i in range(5)]
    )
    second = client.responses.create(model="mock", previous_response_id=first.id, input="last one")
    expected = [f"message {i}" for i in range(5)] + ["Echo: message 4", "last one"]

    page = client.responses.input_items.list(second.id, limit=2)
    pages = list(page.iter_pages())
    assert [len(p.data) for p in pages] == [2, 2, 2, 1]
    assert [p.has_more for p in pages] == [True, True, True, False]
    newest_first = list(client.responses.input_items.list(second.id, limit=2))
    assert [item_text(item) for item in newest_first] == list(reversed(expected))
    assert all(item.type == "message" for item in newest_first)
    assert len({item.id for item in newest_first}) == len(expected)

    oldest_first = list(client.responses.input_items.list(second.id, limit=3, order="asc"))
    assert [item.id for item in oldest_first] == [item.id for item in reversed(newest_first)]
    assert [item.role for item in oldest_first] == ["user"] * 5 + ["assistant", "user"]


# Errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param", "code"),
    [
        pytest.param({"model": "mock", "input": "x", "temperature": 3}, "temperature", None, id="temperature-3"),
        pytest.param({"input": "x"}, "model", "missing_required_parameter", id="missing-model"),
        pytest.param(
            {"model": "mock", "input": "x", "previous_response_id": "resp_does_not_exist"},
            "previous_response_id",
            "previous_response_not_found",
            id="unknown-previous-response",
        ),
        pytest.param(
            {"model": "mock", "input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "42"}]},
            "input[0]",
            "function_call_output_without_call",
            id="orphan-function-call-output",
        ),
    ],
)
def test_invalid_requests_raise_bad_request_error(
    client: openai.OpenAI, stack: Stack, kwargs: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(**kwargs)

    error = raised.value
    assert error.status_code == 400
    assert error.type == "invalid_request_error"
    assert error.param == param
    if code is not None:
        assert error.code == code
    assert error.response.headers["x-should-retry"] == "false"
    assert stack.model_requests() == []


def test_unknown_model_raises_not_found_error(client: openai.OpenAI, stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model="no-such-model", input="x")

    assert raised.value.code == "model_not_found"
    assert raised.value.param == "model"
    assert stack.model_requests() == []


def test_unknown_response_id_raises_not_found_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.retrieve("resp_does_not_exist")
    assert "resp_does_not_exist" in raised.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_does_not_exist")


def test_bad_key_raises_authentication_error(stack: Stack) -> None:
    with stack.client(api_key="sk-not-a-key") as bad, pytest.raises(openai.AuthenticationError) as raised:
        bad.responses.create(model="mock", input="x")
    assert raised.value.status_code == 401
    assert raised.value.code == "invalid_api_key"


def test_revoked_key_raises_authentication_error(stack: Stack) -> None:
    key = stack.new_key(stack.project_id, "short-lived")
    with stack.client(api_key=key["key"]) as sdk:
        assert sdk.responses.create(model="mock", input="before").output_text == "Echo: before"
        stack.admin("DELETE", f"/api_keys/{key['id']}")
        with pytest.raises(openai.AuthenticationError):
            sdk.responses.create(model="mock", input="after")


def refused_rate_limited(stack: Stack) -> float:
    """How many creates the gateway refused over a rate limit so far (its Prometheus counter)."""
    text = stack.http.get(f"{stack.gateway_url}/metrics").text
    for line in text.splitlines():
        if line.startswith('gateway_responses_refused_total{reason="rate_limited"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_429_carries_openais_rate_limit_headers_and_the_sdk_retries_it(stack: Stack) -> None:
    key = stack.new_key(stack.project_id, "limited")
    stack.admin("PATCH", f"/api_keys/{key['id']}", {"limits": {"rpm": 1000, "max_concurrent": 1}})
    # One response holds the key's only place while the model takes its time.
    stack.script({"text": "slow", "delay_ms": 3000}, {"text": "next"})
    with stack.client(api_key=key["key"], max_retries=0) as once, stack.client(
        api_key=key["key"], max_retries=5
    ) as patient:
        holder = threading.Thread(target=lambda: once.responses.create(model="mock", input="hold"))
        holder.start()
        try:
            for _ in range(500):
                if stack.model_requests():
                    break
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as raised:
                once.responses.create(model="mock", input="refused")
            error = raised.value
            assert error.status_code == 429
            assert error.code == "rate_limit_exceeded"
            assert error.response.headers["retry-after"] == "1"
            assert error.response.headers["x-should-retry"] == "true"
            assert error.response.headers["x-ratelimit-limit-requests"] == "1000"
            assert int(error.response.headers["x-ratelimit-remaining-requests"]) < 1000

            # The SDK waits as told and tries again until the place is free.
            refused_before = refused_rate_limited(stack)
            answer = patient.responses.create(model="mock", input="patient")
            assert answer.output_text == "next"
            assert refused_rate_limited(stack) > refused_before, "it was refused at least once first"
        finally:
            holder.join()


def test_another_projects_response_does_not_exist_for_you(stack: Stack, client: openai.OpenAI) -> None:
    mine = client.responses.create(model="mock", input="private")
    other = stack.admin("POST", "/projects", {"name": f"other-{mine.id}"})
    stack.admin("PUT", f"/deployment_groups/{stack.ids['plain_group']}/projects/{other['id']}")
    with stack.client(api_key=stack.new_key(other["id"], "other")["key"]) as theirs:
        assert theirs.responses.create(model="mock", input="works").output_text == "Echo: works"
        with pytest.raises(openai.NotFoundError):
            theirs.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            theirs.responses.delete(mine.id)
        with pytest.raises(openai.BadRequestError) as raised:
            theirs.responses.create(model="mock", input="x", previous_response_id=mine.id)
        assert raised.value.code == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError) as raised_model:
            theirs.responses.create(model="mock-tools", input="not granted")
        assert raised_model.value.code == "model_not_found"
    assert client.responses.retrieve(mine.id).output_text == "Echo: private"


# Client tools: passthrough and continuation --------------------------------------------------------


def test_client_tool_calls_come_back_as_function_calls_and_continue_with_previous_response_id(
    client: openai.OpenAI, stack: Stack
) -> None:
    first = client.responses.create(
        model="mock", input='!call get_time {"zone": "UTC"}\n!call get_date {}', tools=[CLOCK_TOOL, DATE_TOOL]
    )

    assert first.status == "completed"
    calls = of_type(first, "function_call")
    assert len(calls) == 2 and len(first.output) == 2
    assert all(isinstance(call, ResponseFunctionToolCall) for call in calls)
    assert [call.name for call in calls] == ["get_time", "get_date"]
    assert [json.loads(call.arguments) for call in calls] == [{"zone": "UTC"}, {}]
    assert all(call.status == "completed" and call.id and call.call_id for call in calls)
    assert first.output_text == ""
    assert [t.name for t in first.tools] == ["get_time", "get_date"]

    second = client.responses.create(
        model="mock",
        previous_response_id=first.id,
        tools=[CLOCK_TOOL, DATE_TOOL],
        input=[
            {"type": "function_call_output", "call_id": calls[1].call_id, "output": "1 May"},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "12:00"},
        ],
    )

    assert second.status == "completed"
    assert second.previous_response_id == first.id
    assert second.output_text == "Tool results: 12:00; 1 May"
    # Upstream, the batch is one assistant message with both calls, then one tool message per call, paired
    # by call id (not by the order the client sent the outputs in).
    messages = stack.model_requests()[-1]["messages"]
    assert [c["id"] for c in messages[-3]["tool_calls"]] == [calls[0].call_id, calls[1].call_id]
    assert messages[-2:] == [
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "12:00"},
        {"role": "tool", "tool_call_id": calls[1].call_id, "content": "1 May"},
    ]
    assert stack.tool_calls() == []


def test_client_tool_history_can_be_replayed_without_previous_response_id(client: openai.OpenAI) -> None:
    question = '!call get_time {"zone": "CET"}'
    first = client.responses.create(model="mock", input=question, tools=[CLOCK_TOOL])
    [call] = of_type(first, "function_call")

    replay = client.responses.create(
        model="mock",
        tools=[CLOCK_TOOL],
        input=[
            {"role": "user", "content": question},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "13:00"},
        ],
    )
    assert replay.output_text == "Tool results: 13:00"


# Server tools -------------------------------------------------------------------------------------


def test_a_server_tool_runs_in_the_gateway_and_shows_as_an_mcp_call(client: openai.OpenAI, stack: Stack) -> None:
    response = client.responses.create(model="mock-tools", input='!call add {"a": 2, "b": 3}')

    assert response.status == "completed"
    assert [item.type for item in response.output] == ["mcp_call", "message"]
    mcp = response.output[0]
    assert isinstance(mcp, McpCall)
    assert (mcp.name, mcp.server_label, mcp.status, mcp.error) == ("add", "gateway", "completed", None)
    assert json.loads(mcp.arguments) == {"a": 2, "b": 3}
    assert json.loads(mcp.output or "") == {"sum": 5}
    assert response.output_text == 'Tool results: {"sum":5}'
    assert of_type(response, "function_call") == []

    [call] = stack.tool_calls()
    assert call["tool"] == "add" and call["body"] == {"a": 2, "b": 3}
    assert call["headers"]["idempotency-key"].startswith(f"{response.id}:")
    assert call["headers"]["x-gateway-response-id"] == response.id
    assert response.usage is not None and response.usage.total_tokens == 30

    retrieved = client.responses.retrieve(response.id)
    assert [item.type for item in retrieved.output] == ["mcp_call", "message"]
    assert retrieved.output[0].output == mcp.output


def test_server_tool_results_stay_in_the_chained_context(client: openai.OpenAI, stack: Stack) -> None:
    first = client.responses.create(model="mock-tools", input='!call get_weather {"city": "Paris"}')
    second = client.responses.create(model="mock-tools", previous_response_id=first.id, input="and tomorrow?")

    assert second.output_text == "Echo: and tomorrow?"
    messages = stack.model_requests()[-1]["messages"]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert len(tool_messages) == 1 and json.loads(tool_messages[0]["content"])["city"] == "Paris"
    assert len(stack.tool_calls("get_weather")) == 1
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [item.type for item in items] == ["message", "mcp_call", "message", "message"]
    assert json.loads(items[1].output)["forecast"] == "sunny"


def test_the_deployment_without_server_tools_offers_none_upstream(client: openai.OpenAI, stack: Stack) -> None:
    response = client.responses.create(model="mock", input='!call add {"a": 1, "b": 1}')

    assert response.output_text == 'Echo: !call add {"a": 1, "b": 1}'
    assert not stack.model_requests()[0].get("tools")
    assert stack.tool_calls() == []


def test_a_failing_server_tool_is_a_failed_mcp_call_that_the_model_sees(
    client: openai.OpenAI, stack: Stack
) -> None:
    response = client.responses.create(model="mock-tools", input="!call fail {}")

    assert response.status == "completed"
    mcp = response.output[0]
    assert isinstance(mcp, McpCall) and mcp.status == "failed" and mcp.output is None
    assert "500" in str(mcp.error)
    tool_message = stack.model_requests()[-1]["messages"][-1]
    assert tool_message["role"] == "tool" and "error" in json.loads(tool_message["content"])
    assert len(stack.tool_calls("fail")) == 1


def test_a_failed_mcp_call_error_has_the_sdk_error_type(client: openai.OpenAI) -> None:
    response = client.responses.create(model="mock-tools", input="!call fail {}")
    error = response.output[0].error
    assert error is not None and not isinstance(error, str)
    # The example `fail` tool answers HTTP 500: an http_error with that code.
    assert error.type == "http_error"
    assert error.code == 500
    assert "tool exploded" in error.message


# Retries never run a server tool twice --------------------------------------------------------------


def test_an_upstream_failure_after_a_server_tool_is_not_retried_by_the_sdk(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
        *[{"error": {"status": 500, "message": "upstream down"}}] * (1 + UPSTREAM_MAX_RETRIES),
    )
    with stack.client(max_retries=2) as sdk, pytest.raises(openai.InternalServerError) as raised:
        # Were the SDK to retry, the rules of the mock model would call `add` again for this input.
        sdk.responses.create(model="mock-tools", input='!call add {"a": 1, "b": 2}')

    error = raised.value
    assert error.status_code == 500
    assert error.code == "server_error"
    assert error.response.headers["x-should-retry"] == "false"
    assert "upstream down" not in error.message
    assert len(stack.tool_calls("add")) == 1
    assert len(stack.model_requests()) == 2 + UPSTREAM_MAX_RETRIES
    # The error names the failed response, which was stored as failed.
    match = re.search(r"resp_[0-9a-zA-Z]+", error.message)
    assert match, error.message
    with stack.client() as sdk:
        failed = sdk.responses.retrieve(match.group(0))
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.code == "server_error"
    assert [item.type for item in failed.output] == ["mcp_call"]


def test_a_create_cut_off_before_reaching_the_gateway_is_retried_and_runs_once(stack: Stack) -> None:
    with CuttingProxy(stack.gateway_url, ["cut_before"]) as proxy:
        with openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=stack.key, max_retries=2, timeout=60) as sdk:
            response = sdk.responses.create(model="mock-tools", input='!call add {"a": 4, "b": 5}')

    assert [r["step"] for r in proxy.requests] == ["cut_before", "forward"]
    assert proxy.requests[1]["headers"].get("x-stainless-retry-count") == "1"
    assert json.loads(response.output[0].output) == {"sum": 9}
    assert len(stack.tool_calls("add")) == 1


def test_a_create_whose_answer_was_lost_is_retried_without_running_its_tools_again(stack: Stack) -> None:
    with CuttingProxy(stack.gateway_url, ["cut_after"]) as proxy:
        with openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=stack.key, max_retries=2, timeout=60) as sdk:
            # openai-python sends no Idempotency-Key of its own for responses; a client that wants retried
            # creates to run once sets one, and the gateway answers the retry with the first response.
            response = sdk.responses.create(
                model="mock-tools",
                input='!call add {"a": 6, "b": 7}',
                extra_headers={"Idempotency-Key": "lost-answer-1"},
            )

    assert [r["step"] for r in proxy.requests] == ["cut_after", "forward"]
    assert json.loads(response.output[0].output) == {"sum": 13}
    assert len(stack.tool_calls("add")) == 1
