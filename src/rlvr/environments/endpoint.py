"""The run's policy behind an OpenAI-compatible endpoint: chat completions and completions on
127.0.0.1, a free port, served from threads of the trainer's process over the run's engine.

A server of the run's own, not a front before vLLM's: the default engines (fast, hf) sample in
the trainer's process with no HTTP server, and the built-in model trains in seconds, so the
endpoint is where the engine is. The standard library's `ThreadingHTTPServer` serves it: no web
framework is a dependency of rlvr (FastAPI and uvicorn come with vLLM only), and a request here
is one small JSON body answered after a generation, which a thread per connection serves.

Each agent call has a base URL of its own, `http://127.0.0.1:PORT/rollouts/<id>/v1`, so any
client that takes a base URL records into its rollout (or the shared `.../rollouts/model/v1`,
the request's `model` being the rollout id). Requests are generated in batches
(`rlvr.environments.batcher`) with the run's sampling (temperature, top-p, top-k: a request's
own are ignored, the trained policy is the one that samples) and a completion budget of the
request's `max_tokens` (or `max_completion_tokens`), at most `rollout.max_new_tokens`. A chat
request is rendered with the tokenizer's chat template (with its `tools`, if it has them) and
spliced onto the rollout's earlier sampled ids (`Recorder.prompt_ids`); the reply to a request
with tools ends at its first call and is parsed into `tool_calls` (`rlvr.environments.chat`,
`rlvr.tools.replies`); a completions request
takes a prompt string or token ids. The response carries the sampled ids as `token_ids` and the
prompt's as `prompt_token_ids` (vLLM's names) beside the text. `<base>/../inference/v1/generate`
is vLLM's token route (ids in, ids and log-probs out), the one `verifiers`' training client
calls after rendering the prompt itself with the `renderers` package.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlvr.environments.batcher import Batcher
from rlvr.environments.chat import BadRequest, ChatPrompt, chat_prompt, echo
from rlvr.environments.recorder import AgentFault, Recorder, Turn
from rlvr.rollout import derive_seed
from rlvr.tools.replies import Reply, call_end, parse_reply

ROUTE = re.compile(
    r"^/rollouts/([A-Za-z0-9_.-]+)/(?:v1/(chat/completions|completions|models)|inference/v1/(generate))$"
)
MAX_BODY = 16 << 20  # bytes of one request's JSON
# `/rollouts/model/v1`: one base URL for every rollout, each request's `model` naming its
# rollout id; for clients cached by base URL (verifiers keeps one client per distinct endpoint
# config for as long as its server runs: a URL per rollout would hold one per rollout)
BY_MODEL = "model"


class _Server(ThreadingHTTPServer):
    """A thread per connection; a backlog for every agent call of a batch connecting at once
    (the standard library's 5 refuses connections under a batch of 16)."""

    request_queue_size = 1024
    daemon_threads = True


class Endpoint:
    """The server, its thread and its batcher; `close()` stops all three (twice is a no-op)."""

    def __init__(
        self,
        batcher: Batcher,
        recorder: Recorder,
        *,
        max_tokens: int,
        context: int | None,
        model_name: str,
    ):
        self.batcher, self.recorder = batcher, recorder
        self.max_tokens, self.context, self.model_name = max_tokens, context, model_name
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass  # no line per request on the run's console

            def do_GET(self):
                endpoint._handle(self, None)

            def do_POST(self):
                endpoint._handle(self, self._body())

            def _body(self):
                size = int(self.headers.get("Content-Length") or 0)
                if size > MAX_BODY:
                    return BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
                return self.rfile.read(size)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rlvr-endpoint", daemon=True
        )
        self._thread.start()
        self._closed = False
        self.failure: Exception | None = None  # the first error of the endpoint's own

    def base_url(self, rid: str) -> str:
        return f"http://127.0.0.1:{self.port}/rollouts/{rid}/v1"

    def shared_base_url(self) -> str:
        """The base URL of every rollout, each request naming its rollout id as `model`."""
        return self.base_url(BY_MODEL)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self.batcher.close()

    def _handle(self, handler: BaseHTTPRequestHandler, body) -> None:
        try:
            status, reply = HTTPStatus.OK, self._answer(handler.path, body)
        except BadRequest as e:
            status, reply = (
                e.status,
                {"error": {"message": str(e), "type": "invalid_request_error"}},
            )
        except Exception as e:  # the run's own failure (the engine's): the run ends on it
            if self.failure is None:
                self.failure = e
            message = f"the run's endpoint failed: {type(e).__name__}: {e}"
            status, reply = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": message}}
        data = json.dumps(reply).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, path: str, body) -> dict[str, Any]:
        m = ROUTE.match(path.split("?", 1)[0])
        if m is None:
            raise BadRequest(
                HTTPStatus.NOT_FOUND, f"no route {path}: use the base URL the agent was given"
            )
        rid, kind = m.group(1), m.group(2) or m.group(3)
        if kind == "models":
            card = {"id": self.model_name, "object": "model", "owned_by": "rlvr"}
            if self.context is not None:  # vLLM's field: a renderer's pre-flight reads it
                card["max_model_len"] = self.context
            return {"object": "list", "data": [card]}
        if body is None or isinstance(body, BadRequest):
            raise body or BadRequest(HTTPStatus.BAD_REQUEST, "POST a JSON body")
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {e}") from None
        if not isinstance(request, dict):
            raise BadRequest(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        if rid == BY_MODEL:  # the shared base URL: the request's model names the rollout
            rid = str(request.get("model"))
        trace = self.recorder.trace(rid)
        if trace is None or trace.closed:
            raise BadRequest(
                HTTPStatus.GONE,
                f"rollout {rid} is over (its agent call ended or passed env.timeout)",
            )
        try:
            return self._complete(rid, trace, kind, request)
        except AgentFault as fault:
            self.recorder.fail(rid, fault)
            raise BadRequest(HTTPStatus.BAD_REQUEST, str(fault)) from None

    def _complete(self, rid: str, trace, kind: str, request: dict) -> dict[str, Any]:
        if kind == "generate":
            request = self._generate_request(request)
        if request.get("n", 1) != 1:
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, "n: one completion a request (call again for more)"
            )
        if request.get("stop"):
            raise BadRequest(
                HTTPStatus.BAD_REQUEST,
                "stop: not supported; a completion ends at EOS or max_tokens",
            )
        budget = (
            request.get("max_completion_tokens") or request.get("max_tokens") or self.max_tokens
        )
        if not isinstance(budget, int) or budget < 1:
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, f"max_tokens: expected an int >= 1, got {budget!r}"
            )
        text, ids, chat = self._prompt(kind, request)
        ids = self.recorder.prompt_ids(trace, text, ids)
        budget = min(budget, self.max_tokens)
        if self.context is not None:
            budget = min(budget, self.context - len(ids))
            if budget < 1:
                raise AgentFault(
                    "context",
                    f"the prompt has {len(ids)} tokens: no room left in the model's context of {self.context}",
                )
        seed = derive_seed(trace.seed, "turn", len(trace.turns))
        done = self.batcher.submit(ids, budget, seed)
        turn = self._turn(text, ids, chat, *done.result())
        if not self.recorder.append(trace, turn):
            raise BadRequest(HTTPStatus.GONE, f"rollout {rid} is over")
        return self._reply(kind, turn)

    def _turn(self, text, ids, chat: ChatPrompt | None, completion, lps, truncated) -> Turn:
        """The request's record: a reply to tools ends at its first call's close (the
        sampled tokens after it dropped, `rlvr.tools.replies`) and is parsed into tool calls;
        any other is the sampled text."""
        tokenizer = self.recorder.tokenizer
        template = chat.template if chat is not None else None
        if template is not None and (end := call_end(tokenizer, template, completion)) is not None:
            completion, truncated = completion[:end], False
            lps = None if lps is None else lps[:end]
        eos = not truncated and completion and completion[-1] in self.recorder.eos_ids
        shown = completion[:-1] if eos else completion
        out = tokenizer.decode(shown, skip_special_tokens=False)
        reply, said = None, None
        if template is not None:
            reply = parse_reply(tokenizer, template, ids, completion, out)
            if reply.message != {"role": "assistant", "content": out}:
                said = echo(tokenizer, chat, text, reply.message, self.recorder.eos_texts)
        return Turn(text, ids, completion, lps, out, truncated, reply=reply, echo=said)

    def _generate_request(self, request: dict) -> dict:
        """vLLM's `/inference/v1/generate` body (`token_ids`, `sampling_params`) as the
        completions request it is: prompt ids in, sampled ids out. Its `stop_token_ids` must be
        the run's EOS ids (where the engine stops); sampling is the run's, as everywhere."""
        sp = request.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise BadRequest(HTTPStatus.BAD_REQUEST, "sampling_params: expected an object")
        stops = set(sp.get("stop_token_ids") or ())
        if not stops <= set(self.recorder.eos_ids):
            raise BadRequest(
                HTTPStatus.BAD_REQUEST,
                f"sampling_params.stop_token_ids: {sorted(stops)}, expected among the run's "
                f"EOS ids {sorted(self.recorder.eos_ids)} (where its engine stops)",
            )
        out = {"prompt": request.get("token_ids"), "n": sp.get("n", 1), "stop": sp.get("stop")}
        if "max_tokens" in sp:
            out["max_tokens"] = sp["max_tokens"]
        if not isinstance(out["prompt"], list) or not out["prompt"]:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "token_ids: expected a list of token ids")
        return out

    def _prompt(
        self, kind: str, request: dict
    ) -> tuple[str | None, list[int] | None, ChatPrompt | None]:
        """The prompt as text or ids, and for a chat request what it was rendered from."""
        tokenizer = self.recorder.tokenizer
        if kind in ("completions", "generate"):
            prompt = request.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str):
                return prompt, None, None
            if (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) and 0 <= t < len(tokenizer) for t in prompt)
            ):
                return None, list(prompt), None
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, "prompt: expected a string or a list of token ids"
            )
        text, chat = chat_prompt(tokenizer, request)
        return text, None, chat

    def _reply(self, kind: str, turn: Turn) -> dict[str, Any]:
        calls = turn.reply is not None and turn.reply.calls > 0
        finish = "tool_calls" if calls else "length" if turn.truncated else "stop"
        if kind == "generate":
            return _generate_reply(turn, finish)
        usage = {
            "prompt_tokens": len(turn.prompt_ids),
            "completion_tokens": len(turn.completion_ids),
            "total_tokens": len(turn.prompt_ids) + len(turn.completion_ids),
        }
        head = {
            "id": f"rlvr-{time.time_ns()}",
            "created": int(time.time()),
            "model": self.model_name,
            "usage": usage,
            "prompt_token_ids": turn.prompt_ids,
        }
        choice = {
            "index": 0,
            "finish_reason": finish,
            "logprobs": None,
            "token_ids": turn.completion_ids,
        }
        if kind == "completions":
            return {**head, "object": "text_completion", "choices": [{**choice, "text": turn.text}]}
        reply = turn.reply or Reply({"role": "assistant", "content": turn.text})
        message = reply.message
        return {**head, "object": "chat.completion", "choices": [{**choice, "message": message}]}


def _generate_reply(turn: Turn, finish: str) -> dict[str, Any]:
    """vLLM's `/inference/v1/generate` answer: the sampled ids (EOS included where it ended
    the turn, as vLLM returns it) with their sampling log-probs, by token id."""
    lps = turn.log_probs
    if lps is None:
        raise BadRequest(
            HTTPStatus.NOT_IMPLEMENTED,
            "inference/v1/generate: the run's engine returns no sampling log-probs",
        )
    content = [
        {"token": f"token_id:{t}", "logprob": float(lp)} for t, lp in zip(turn.completion_ids, lps)
    ]
    choice = {"index": 0, "token_ids": turn.completion_ids, "finish_reason": finish,
              "logprobs": {"content": content}}  # fmt: skip
    return {
        "request_id": f"rlvr-{time.time_ns()}",
        "prompt_token_ids": turn.prompt_ids,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(turn.prompt_ids),
            "completion_tokens": len(turn.completion_ids),
        },
    }
