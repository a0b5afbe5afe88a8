"""Webhooks of background responses, checked by the clients a receiver would use: the Standard Webhooks
reference library and openai-python's own `webhooks.unwrap`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import openai
from standardwebhooks import Webhook

from conftest import Stack


class Receiver:
    """A local HTTP server that keeps every request it is sent."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.arrived:
                    receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    receiver.arrived.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, n: int, timeout: float = 30) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.received) >= n, timeout), self.received

    def close(self) -> None:
        self.server.shutdown()


def test_a_background_responses_webhook_verifies_with_the_reference_library_and_the_sdk(
    client: openai.OpenAI, stack: Stack
) -> None:
    receiver = Receiver()
    endpoint = stack.admin("POST", f"/projects/{stack.project_id}/webhooks", {"url": receiver.url})
    try:
        response = client.responses.create(model="mock", input="Hi", background=True)
        receiver.wait_for(1)
        headers, body = receiver.received[0]

        payload = Webhook(endpoint["secret"]).verify(body, headers)
        assert payload["type"] == "response.completed"
        assert payload["data"] == {"id": response.id}
        assert headers["webhook-id"] == payload["id"]

        event = client.webhooks.unwrap(body, headers, secret=endpoint["secret"])
        assert event.type == "response.completed" and event.data.id == response.id

        # A body changed on the way fails the check.
        tampered = json.dumps({**payload, "data": {"id": "resp_other"}}).encode()
        try:
            Webhook(endpoint["secret"]).verify(tampered, headers)
            raise AssertionError("a tampered body verified")
        except Exception as error:  # the library's WebhookVerificationError
            assert "verif" in type(error).__name__.lower() or "signature" in str(error).lower()
    finally:
        stack.admin("DELETE", f"/projects/{stack.project_id}/webhooks/{endpoint['id']}")
        receiver.close()
