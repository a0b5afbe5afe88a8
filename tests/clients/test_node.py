"""Published Node clients against the gateway: openai-node, the Vercel AI SDK and the Codex CLI (`codex exec`).

Each test runs a script or the CLI from `node/` (packages pinned in `node/package-lock.json`, installed by
`run.sh` with `npm ci`) with the gateway's URL and key, then checks what the client printed and what the gateway
sent upstream.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from conftest import Stack

NODE_DIR = Path(__file__).resolve().parent / "node"
CODEX = NODE_DIR / "node_modules" / ".bin" / "codex"
TIMEOUT_S = 120


def run_script(stack: Stack, script: str) -> dict[str, Any]:
    """Runs `node/<script>` against the gateway; returns the JSON it printed last."""
    env = {**os.environ, "GATEWAY_URL": stack.gateway_url, "GATEWAY_KEY": stack.key}
    done = subprocess.run(
        ["node", script],
        cwd=NODE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def codex_exec(stack: Stack, home: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    """`codex exec` with Codex's default configuration, except that its model provider is the gateway."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        "\n".join(
            [
                'model = "mock"',
                'model_provider = "gateway"',
                "[model_providers.gateway]",
                'name = "gateway"',
                f'base_url = "{stack.gateway_url}/v1"',
                'env_key = "GATEWAY_API_KEY"',
                'wire_api = "responses"',
                "",
            ]
        )
    )
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_API_KEY": stack.key}
    work = home / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", prompt],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def test_openai_node_text_stream_chain_and_input_items(stack: Stack) -> None:
    stack.script({"text": "Hi there."}, {"text": "Hi again."})

    out = run_script(stack, "openai_node.mjs")

    assert out["first"] == "Hi there."
    assert out["second"] == "Hi again."
    assert out["types"][0] == "response.created"
    assert out["types"][-1] == "response.completed"
    assert "response.output_text.delta" in out["types"]
    first_input = out["inputItems"][0]
    assert first_input["type"] == "message"
    assert first_input["content"] == [{"type": "input_text", "text": "hello"}]


def test_ai_sdk_multi_turn_with_its_default_store_sends_item_references(stack: Stack) -> None:
    stack.script({"text": "Paris."}, {"text": "Berlin."})

    out = run_script(stack, "ai_sdk_multi_turn.mjs")

    assert out["first"] == "Paris."
    assert out["second"] == "Berlin."
    sent = out["sentSecond"]
    sent = json.loads(sent) if isinstance(sent, str) else sent
    assert any(item.get("type") == "item_reference" for item in sent["input"]), sent["input"]
    second = stack.model_requests()[1]["messages"]
    assert [(m["role"], m.get("content")) for m in second] == [
        ("user", "What is the capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Germany?"),
    ]


def test_codex_exec_with_its_default_configuration_completes_a_turn(stack: Stack, tmp_path: Path) -> None:
    stack.script({"text": "Hello from the gateway."})

    done = codex_exec(stack, tmp_path / "codex", "Say hello")

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "Hello from the gateway." in done.stdout
    request = stack.model_requests()[0]
    offered = [t["function"]["name"] for t in request.get("tools", [])]
    assert "exec_command" in offered, offered
    assert any(name.startswith("multi_agent_v1__") for name in offered), "namespaced tools, flattened: " + str(offered)
    if os.environ.get("CLIENTS_PROVIDER", "openai_chat") != "anthropic":
        # Anthropic's Messages API has no such field; the others get it as Codex sent it.
        assert isinstance(request.get("prompt_cache_key"), str), "Codex's prompt_cache_key is passed on"
    assert request["messages"][-1] == {"role": "user", "content": "Say hello"} or "Say hello" in json.dumps(
        request["messages"][-1]
    )


def test_codex_exec_completes_a_function_call_round(stack: Stack, tmp_path: Path) -> None:
    # `get_goal` is one of Codex's own function tools that it runs in-process (no sandbox needed here).
    stack.script(
        {"tool_calls": [{"id": "call_goal", "name": "get_goal", "arguments": {}}]},
        {"text": "Checked the goal."},
    )

    done = codex_exec(stack, tmp_path / "codex", "Check the goal, then say so")

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "Checked the goal." in done.stdout
    requests = stack.model_requests()
    assert len(requests) == 2, requests
    answered = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answered] == ["call_goal"], requests[1]["messages"]
    assert "unsupported call" not in answered[0]["content"], answered[0]
