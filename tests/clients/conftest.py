"""Harness of the client conformance suite.

One session starts the real processes: a fresh Postgres database, the testkit's `mock-model`,
`example-tools` and `example-mcp` binaries, and `gateway serve` (whose `tools.mcp_allowed_private_urls` names
the MCP server's exact address), each on port 0. It configures the gateway through the admin API (plain HTTP):
a project with a key, a deployment `mock` without server tools, a deployment `mock-tools` in another group
whose server tools are `get_weather`, `add` and `fail`, and a deployment `mock-mcp` in a third group whose
tools come from the MCP server as the operator's MCP source `calc` (names prefixed `calc_`).
Tests talk to the gateway only through the published SDKs; they script and inspect the mocks through
their `/_mock/*`, `/_tools/*` and `/_mcp/*` control endpoints. Everything is torn down at the end.

The binaries are taken from the cargo target dir (`CARGO_TARGET_DIR` or `<repo>/target`, profile
`debug`); `run.sh` builds them first. Postgres comes from `TEST_DATABASE_URL` (default
`postgres://postgres@127.0.0.1:5432/postgres`).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

REPO = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug"
SERVER_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
STARTUP_TIMEOUT_S = 60.0
# Per request: a hung gateway fails the test instead of stalling the suite (the SDK default is 600 s).
SDK_TIMEOUT_S = 60.0

# The provider kind of the deployments the suite runs against (`run.sh` runs each in turn): the mock model answers
# every kind from the same script, and `model_requests` shows what the gateway sent in Chat's shape, so that one
# set of scenarios checks all three adapters.
PROVIDER = os.environ.get("CLIENTS_PROVIDER", "openai_chat")

# The gateway retries a failing upstream this many times; scripts that make the model fail must
# queue one error per attempt.
UPSTREAM_MAX_RETRIES = 2

# Server tools of `mock-tools`, with the schemas of the testkit's example tools.
SERVER_TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "description": "Get the weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "add": {
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
    "fail": {
        "description": "Always fail with HTTP 500.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


class Process:
    """A child process whose stdout and stderr are copied to a log file by reader threads.

    `wait_for(predicate)` returns the first stdout line for which `predicate` returns a value.
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w", encoding="utf-8", buffering=1)
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream: Any, is_stdout: bool) -> None:
        for line in stream:
            self._log.write(line)
            if is_stdout:
                self._lines.put(line.rstrip("\n"))
        if is_stdout:
            self._lines.put(None)

    def wait_for(self, predicate: Callable[[str], Optional[str]]) -> str:
        while True:
            try:
                line = self._lines.get(timeout=STARTUP_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError(f"{self.name} printed no readiness line in time; see {self.log_path}")
            if line is None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.wait()} before it was ready; see {self.log_path}:\n"
                    + self.log_path.read_text(encoding="utf-8")[-4000:]
                )
            found = predicate(line)
            if found is not None:
                return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for thread in self._threads:
            thread.join(timeout=5)
        self._log.close()


def testkit_address(line: str) -> Optional[str]:
    """The address of the testkit binaries' readiness line `listening on http://HOST:PORT`."""
    prefix = "listening on "
    return line[len(prefix) :] if line.startswith(prefix) else None


def gateway_address(line: str) -> Optional[str]:
    """The address of the gateway's JSON log line `gateway listening` (field `address`)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    fields = record.get("fields", {}) if isinstance(record, dict) else {}
    if fields.get("message") == "gateway listening" and "address" in fields:
        return f"http://{fields['address']}"
    return None


def wait_healthy(http: httpx.Client, url: str) -> None:
    """Polls `url` until it answers 200 (the listener is bound before the log line, so this is quick)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            if http.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 in time")
        time.sleep(0.05)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def psql(sql: str) -> None:
    subprocess.run(
        ["psql", SERVER_URL, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def binary(name: str) -> str:
    path = TARGET / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: build it with `cargo build -p gateway -p gateway-testkit`")
    return str(path)


@dataclass
class Stack:
    """The running processes and what the admin set-up created."""

    gateway_url: str
    mock_url: str
    tools_url: str
    mcp_base_url: str
    admin_token: str
    key: str = ""
    project_id: str = ""
    ids: dict[str, str] = field(default_factory=dict)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def base_url(self) -> str:
        return f"{self.gateway_url}/v1"

    # Admin API (plain HTTP) ---------------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        response = self.http.request(
            method,
            f"{self.gateway_url}/admin/v1{path}",
            headers={"Authorization": f"Bearer {self.admin_token}"},
            json=body,
        )
        assert response.is_success, f"{method} {path} answered {response.status_code}: {response.text}"
        return response.json() if response.content else None

    def new_key(self, project_id: str, name: str) -> dict[str, Any]:
        return self.admin("POST", f"/projects/{project_id}/api_keys", {"name": name})

    # Mock model and tool server control -----------------------------------------------------------

    def script(self, *replies: dict[str, Any]) -> None:
        """Appends reply specs to the mock model's script (see the testkit's `ReplySpec`)."""
        response = self.http.post(f"{self.mock_url}/_mock/script", json=list(replies))
        assert response.status_code == 200, response.text

    def model_requests(self) -> list[dict[str, Any]]:
        """Every request the gateway sent upstream since the last reset, in Chat Completions' shape."""
        return [as_chat(r) for r in self.http.get(f"{self.mock_url}/_mock/requests").json()]

    def tool_calls(self, tool: Optional[str] = None) -> list[dict[str, Any]]:
        """Every request the tool server received since the last reset (of `tool` only, if given)."""
        calls = self.http.get(f"{self.tools_url}/_tools/calls").json()
        return [c for c in calls if tool is None or c["tool"] == tool]

    @property
    def mcp_url(self) -> str:
        """The MCP server's streamable HTTP endpoint, as a request's `mcp` tool names it."""
        return f"{self.mcp_base_url}/mcp"

    def mcp_calls(self) -> list[dict[str, Any]]:
        """Every `tools/call` the MCP server received since the last reset: `{"tool", "arguments"}`. Each call must
        carry its tool step's idempotency key in `_meta` (`<response id>:<step>`), which is checked here and left
        out of what is returned."""
        calls = self.http.get(f"{self.mcp_base_url}/_mcp/calls").json()["calls"]
        for call in calls:
            key = (call.get("meta") or {}).get("idempotencyKey", "")
            assert key.startswith("resp_") and ":" in key, f"an MCP call without its idempotency key: {call}"
        return [{"tool": call["tool"], "arguments": call["arguments"]} for call in calls]

    def mcp_lists(self) -> int:
        """How many `tools/list` requests the MCP server answered since the last reset."""
        return self.http.get(f"{self.mcp_base_url}/_mcp/calls").json()["lists"]

    def reset_mocks(self) -> None:
        assert self.http.post(f"{self.mock_url}/_mock/reset").status_code == 200
        assert self.http.post(f"{self.tools_url}/_tools/reset").status_code == 200
        assert self.http.post(f"{self.mcp_base_url}/_mcp/reset").status_code == 200

    # SDK clients ----------------------------------------------------------------------------------

    def client(self, **options: Any) -> OpenAI:
        options.setdefault("api_key", self.key)
        options.setdefault("timeout", SDK_TIMEOUT_S)
        return OpenAI(base_url=self.base_url, **options)

    def async_client(self, **options: Any) -> AsyncOpenAI:
        options.setdefault("api_key", self.key)
        options.setdefault("timeout", SDK_TIMEOUT_S)
        return AsyncOpenAI(base_url=self.base_url, **options)


def text_of(content: Any) -> Any:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def as_chat(request: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages or Responses request as the Chat Completions request it stands for."""
    if PROVIDER == "openai_chat" or not isinstance(request, dict):
        return request
    chat: dict[str, Any] = {k: v for k, v in request.items() if k not in ("messages", "input", "tools", "system")}
    messages: list[dict[str, Any]] = []
    system = request.get("system") or request.get("instructions")
    if isinstance(system, list):
        # Anthropic's system prompt as text blocks.
        system = "".join(block.get("text", "") for block in system)
    if system:
        messages.append({"role": "system", "content": system})
    if PROVIDER == "anthropic":
        for message in request.get("messages", []):
            text, calls = "", []
            for block in message["content"]:
                if block["type"] == "text":
                    text += block["text"]
                elif block["type"] == "tool_use":
                    arguments = json.dumps(block["input"], separators=(",", ":"))
                    calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
                elif block["type"] == "tool_result":
                    messages.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text_of(block["content"])})
            if calls:
                messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
            elif text:
                messages.append({"role": message["role"], "content": text})
        tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in request.get("tools", [])]
    else:
        for item in request.get("input", []):
            kind = item.get("type", "message")
            if kind == "message":
                messages.append({"role": item["role"], "content": text_of(item["content"])})
            elif kind == "function_call":
                call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                    last["tool_calls"].append(call)
                elif last is not None and last["role"] == "assistant":
                    last["tool_calls"] = [call]
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        tools = [{"type": "function", "function": {"name": t["name"], "parameters": t.get("parameters")}} for t in request.get("tools", [])]
        text_format = (request.get("text") or {}).get("format") or {}
        if text_format.get("type") == "json_schema":
            schema = {k: v for k, v in text_format.items() if k != "type"}
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    chat["messages"] = messages
    if tools:
        chat["tools"] = tools
    return chat


def provider_of(mock_url: str) -> dict[str, Any]:
    """The deployments' provider: Anthropic's base URL excludes the version, the OpenAI kinds' include it."""
    base_url = mock_url if PROVIDER == "anthropic" else f"{mock_url}/v1"
    return {"kind": PROVIDER, "base_url": base_url, "model": "mock-model"}


def configure(stack: Stack) -> None:
    """Project, key, deployments `mock` (no server tools), `mock-tools` (server tools) and `mock-mcp` (MCP source)."""
    provider = provider_of(stack.mock_url)
    project = stack.admin("POST", "/projects", {"name": "clients"})
    stack.project_id = project["id"]
    stack.key = stack.new_key(project["id"], "sdk")["key"]

    plain = stack.admin("POST", "/deployment_groups", {"name": "plain"})["id"]
    mock = stack.admin("POST", "/deployments", {"name": "mock", "provider": provider})["id"]
    stack.admin("PUT", f"/deployment_groups/{plain}/deployments/{mock}")
    stack.admin("PUT", f"/deployment_groups/{plain}/projects/{project['id']}")

    tools = stack.admin("POST", "/deployment_groups", {"name": "with-tools"})["id"]
    mock_tools = stack.admin("POST", "/deployments", {"name": "mock-tools", "provider": provider})["id"]
    stack.admin("PUT", f"/deployment_groups/{tools}/deployments/{mock_tools}")
    stack.admin("PUT", f"/deployment_groups/{tools}/projects/{project['id']}")
    for name, definition in SERVER_TOOLS.items():
        source = stack.admin(
            "POST", "/tool_sources", {"name": name, "url": f"{stack.tools_url}/tools/{name}", **definition}
        )
        stack.admin("PUT", f"/deployment_groups/{tools}/tool_sources/{source['id']}")

    mcp_group = stack.admin("POST", "/deployment_groups", {"name": "with-mcp"})["id"]
    mock_mcp = stack.admin("POST", "/deployments", {"name": "mock-mcp", "provider": provider})["id"]
    stack.admin("PUT", f"/deployment_groups/{mcp_group}/deployments/{mock_mcp}")
    stack.admin("PUT", f"/deployment_groups/{mcp_group}/projects/{project['id']}")
    calc = stack.admin(
        "POST", "/tool_sources", {"kind": "mcp", "name": "calc", "url": stack.mcp_url, "name_prefix": "calc_"}
    )
    stack.admin("PUT", f"/deployment_groups/{mcp_group}/tool_sources/{calc['id']}")
    stack.ids.update(
        plain_group=plain, tools_group=tools, mcp_group=mcp_group, mock=mock, mock_tools=mock_tools, mock_mcp=mock_mcp
    )


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log_dir = tmp_path_factory.mktemp("logs")
    database = f"gw_clients_{uuid.uuid4().hex}"
    psql(f'CREATE DATABASE "{database}"')
    processes: list[Process] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY__")}
    env.update(NO_COLOR="1", RUST_LOG="info")
    try:
        mock = Process("mock-model", [binary("mock-model"), "--bind", "127.0.0.1:0"], env, log_dir)
        processes.append(mock)
        tools = Process("example-tools", [binary("example-tools"), "--bind", "127.0.0.1:0"], env, log_dir)
        processes.append(tools)
        mcp = Process("example-mcp", [binary("example-mcp"), "--bind", "127.0.0.1:0"], env, log_dir)
        processes.append(mcp)
        mock_url = mock.wait_for(testkit_address)
        tools_url = tools.wait_for(testkit_address)
        mcp_base_url = mcp.wait_for(testkit_address)

        admin_token = f"admin-{uuid.uuid4().hex}"
        gateway_env = dict(
            env,
            DATABASE_URL=with_database(SERVER_URL, database),
            GATEWAY__SERVER__BIND="127.0.0.1:0",
            GATEWAY__ADMIN__TOKEN=admin_token,
            GATEWAY__LOG__FORMAT="json",
            GATEWAY__UPSTREAM__MAX_RETRIES=str(UPSTREAM_MAX_RETRIES),
            GATEWAY__UPSTREAM__BACKOFF_MS="1",
            # Loopback is admitted only by the private list, here naming the exact host and port.
            GATEWAY__TOOLS__MCP_ALLOWED_PRIVATE_URLS=json.dumps([f"{mcp_base_url}/"]),
        )
        gateway = Process(
            "gateway", [binary("gateway"), "--config", "config/default.toml", "serve"], gateway_env, log_dir
        )
        processes.append(gateway)
        gateway_url = gateway.wait_for(gateway_address)

        stack = Stack(
            gateway_url=gateway_url,
            mock_url=mock_url,
            tools_url=tools_url,
            mcp_base_url=mcp_base_url,
            admin_token=admin_token,
        )
        wait_healthy(stack.http, f"{gateway_url}/healthz")
        configure(stack)
        yield stack
        stack.http.close()
    finally:
        for process in reversed(processes):
            process.stop()
        psql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def fresh_mocks(stack: Stack) -> None:
    """Every test starts with an empty model script and no recorded requests or tool calls."""
    stack.reset_mocks()


@pytest.fixture
def client(stack: Stack) -> Any:
    with stack.client() as sdk:
        yield sdk
