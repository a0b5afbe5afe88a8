"""Conversations through the published clients: the SDK's conversations resource, openai-agents'
`OpenAIConversationsSession` and a run on a server-side `conversation_id`."""

from __future__ import annotations

import asyncio
from typing import Any

import agents
import openai
from agents import Agent, OpenAIConversationsSession, OpenAIResponsesModel, Runner

from conftest import Stack

agents.set_tracing_disabled(True)


def user_and_assistant_texts(request: dict[str, Any]) -> list[tuple[str, str]]:
    texts = []
    for message in request["messages"]:
        if message["role"] not in ("user", "assistant"):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        texts.append((message["role"], content or ""))
    return texts


def test_the_sdk_creates_pages_and_deletes_a_conversation(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(
        metadata={"topic": "demo"},
        items=[{"role": "user", "content": f"line {n}"} for n in range(5)],
    )
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "demo"}
    # The SDK's auto-paging follows `after` with the page's last id.
    listed = [item for item in client.conversations.items.list(conversation.id, order="asc", limit=2)]
    assert [item.content[0].text for item in listed] == [f"line {n}" for n in range(5)]
    assert all(item.type == "message" and item.status == "completed" for item in listed)
    again = client.conversations.items.retrieve(listed[0].id, conversation_id=conversation.id)
    assert again.id == listed[0].id
    client.conversations.items.delete(listed[0].id, conversation_id=conversation.id)
    assert len(list(client.conversations.items.list(conversation.id))) == 4
    updated = client.conversations.update(conversation.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    try:
        client.conversations.retrieve(conversation.id)
        raise AssertionError("a deleted conversation was found")
    except openai.NotFoundError as error:
        assert error.body["param"] == "conversation_id"


def test_a_response_created_with_conversation_sees_and_extends_it(client: openai.OpenAI, stack: Stack) -> None:
    conversation = client.conversations.create()
    first = client.responses.create(model="mock", input="I am Ada.", conversation=conversation.id)
    assert first.conversation is not None and first.conversation.id == conversation.id
    second = client.responses.create(model="mock", input="Who am I?", conversation={"id": conversation.id})
    assert second.output_text == "Echo: Who am I?"
    assert user_and_assistant_texts(stack.model_requests()[-1]) == [
        ("user", "I am Ada."),
        ("assistant", "Echo: I am Ada."),
        ("user", "Who am I?"),
    ]
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert [item.role for item in items] == ["user", "assistant", "user", "assistant"]
    assert items[-1].id == second.output[0].id


def test_an_agent_with_an_openai_conversations_session_remembers_the_first_turn(stack: Stack) -> None:
    async def main() -> tuple[str, list[Any], str]:
        async with stack.async_client() as sdk:
            model = OpenAIResponsesModel(model="mock", openai_client=sdk)
            agent = Agent(name="remembering", instructions="Be brief.", model=model)
            session = OpenAIConversationsSession(openai_client=sdk)
            await Runner.run(agent, "My name is Ada.", session=session)
            second = await Runner.run(agent, "What is my name?", session=session)
            items = await session.get_items()
            return second.final_output, items, await session._get_session_id()

    final_output, items, session_id = asyncio.run(main())

    assert session_id.startswith("conv_")
    assert final_output == "Echo: What is my name?"
    # The second run's model call saw the first turn, read back from the gateway's conversation.
    assert user_and_assistant_texts(stack.model_requests()[-1]) == [
        ("user", "My name is Ada."),
        ("assistant", "Echo: My name is Ada."),
        ("user", "What is my name?"),
    ]
    assert [item.get("role") for item in items] == ["user", "assistant", "user", "assistant"]


def test_an_agent_run_on_a_server_side_conversation_id_keeps_its_turns(client: openai.OpenAI, stack: Stack) -> None:
    conversation = client.conversations.create()

    async def main() -> str:
        async with stack.async_client() as sdk:
            agent = Agent(name="served", instructions="Be brief.", model=OpenAIResponsesModel(model="mock", openai_client=sdk))
            await Runner.run(agent, "Remember 42.", conversation_id=conversation.id)
            second = await Runner.run(agent, "What did I say?", conversation_id=conversation.id)
            return second.final_output

    assert asyncio.run(main()) == "Echo: What did I say?"
    assert user_and_assistant_texts(stack.model_requests()[-1]) == [
        ("user", "Remember 42."),
        ("assistant", "Echo: Remember 42."),
        ("user", "What did I say?"),
    ]
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert [item.role for item in items] == ["user", "assistant", "user", "assistant"]


def test_the_sdk_counts_input_tokens_without_calling_a_model(client: openai.OpenAI, stack: Stack) -> None:
    short = client.responses.input_tokens.count(model="mock", input="Hello.")
    longer = client.responses.input_tokens.count(
        model="mock",
        instructions="Answer in one word.",
        input="Hello there, how are you today? Tell me everything about the weather in Paris.",
    )
    assert short.object == "response.input_tokens"
    assert 0 < short.input_tokens < longer.input_tokens
    assert stack.model_requests() == []
