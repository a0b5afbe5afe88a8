"""Progress notes (`gateway:tool_note` extension events) as published clients meet them: openai-python's
`responses.stream()` helper and raw event iteration both read a stream that carries them, unharmed."""

from __future__ import annotations

import json
from typing import Any

import openai

from conftest import SERVER_TOOLS, Stack

MODEL = "mock-notes"


def ensure_noted_deployment(stack: Stack) -> None:
    """A deployment `mock-notes` whose one server tool, `weather_noted`, has progress notes."""
    if "notes_group" in stack.ids:
        return
    provider = {"kind": "openai_chat", "base_url": f"{stack.mock_url}/v1", "model": "mock-model"}
    group = stack.admin("POST", "/deployment_groups", {"name": "with-notes"})["id"]
    deployment = stack.admin("POST", "/deployments", {"name": MODEL, "provider": provider})["id"]
    stack.admin("PUT", f"/deployment_groups/{group}/deployments/{deployment}")
    stack.admin("PUT", f"/deployment_groups/{group}/projects/{stack.project_id}")
    source = stack.admin(
        "POST",
        "/tool_sources",
        {
            "name": "weather_noted",
            "url": f"{stack.tools_url}/tools/get_weather",
            "note_on_request": "Looking up the weather in {city}",
            "note_on_result": "It is {result.forecast} in {city}",
            **SERVER_TOOLS["get_weather"],
        },
    )
    stack.admin("PUT", f"/deployment_groups/{group}/tool_sources/{source['id']}")
    stack.ids["notes_group"] = group


def test_the_stream_helper_reads_a_stream_with_tool_notes(client: openai.OpenAI, stack: Stack) -> None:
    ensure_noted_deployment(stack)
    with client.responses.stream(model=MODEL, input='!call weather_noted {"city": "Paris"}') as stream:
        events = list(stream)
        final = stream.get_final_response()

    assert [item.type for item in final.output] == ["mcp_call", "message"]
    assert json.loads(final.output[0].output or "")["city"] == "Paris"
    assert final.output_text.startswith("Tool results:")
    # The helper passes the unknown events on (or drops them); either way nothing broke.
    notes = [e for e in events if getattr(e, "type", None) == "gateway:tool_note"]
    assert len(notes) in (0, 2)
    assert [c["body"] for c in stack.tool_calls("get_weather")] == [{"city": "Paris"}]


def test_raw_event_iteration_reads_a_stream_with_tool_notes(client: openai.OpenAI, stack: Stack) -> None:
    ensure_noted_deployment(stack)
    events: list[Any] = list(
        client.responses.create(model=MODEL, input='!call weather_noted {"city": "Rome"}', stream=True)
    )

    types = [getattr(e, "type", None) for e in events]
    assert types[-1] == "response.completed"
    assert types.index("response.mcp_call.in_progress") < types.index("response.mcp_call.completed")
    notes = [e for e in events if getattr(e, "type", None) == "gateway:tool_note"]
    # Raw iteration hands the extension events over as they came, labels rendered.
    assert [getattr(n, "label", None) for n in notes] == [
        "Looking up the weather in Rome",
        "It is sunny in Rome",
    ]
    assert events[-1].response.output[0].type == "mcp_call"
