"""Endpoint (HTTP, against a MockTransport server) and Engine (wrapping a fake runtime engine)."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

import radixflow.lang as rf


def mock_server(fake, api_key=None, calls=None):
    """An httpx transport answering the native routes with `fake` (and /v1/programs with rf.execute)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if calls is not None:
            calls.append((request.method, request.url.path, request.headers.get("authorization")))
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return httpx.Response(401, json={"error": {"message": "bad api key", "type": "auth"}})
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": "fake", "role_markers": fake.role_markers()})
        body = json.loads(request.content) if request.content else {}
        if request.url.path == "/v1/programs":
            try:
                return httpx.Response(200, json=rf.execute(body["program"], body["arguments"], fake))
            except ValueError as exc:
                return httpx.Response(400, json={"error": {"message": str(exc)}})
        if request.url.path == "/generate" and body.get("stream"):
            lines = [f"data: {json.dumps(c)}\n\n" for c in fake.generate_stream(body)] + ["data: [DONE]\n\n"]
            return httpx.Response(200, content="".join(lines).encode(), headers={"content-type": "text/event-stream"})
        if request.url.path == "/generate":
            return httpx.Response(200, json=fake.generate(body))
        return httpx.Response(404, json={"detail": "no such route"})

    return httpx.MockTransport(handle)


def endpoint(fake, api_key=None, calls=None):
    client = httpx.Client(transport=mock_server(fake, api_key, calls))
    return rf.Endpoint("http://server", api_key=api_key, client=client)


@rf.function
def chat(s, question):
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=8))
    s += rf.user("Pick one")
    s += rf.assistant(rf.select("pick", ["yes", "no"]))


def test_endpoint_runs_a_program_with_auth(fake):
    calls = []
    state = chat.run(question="Hi", backend=endpoint(fake, api_key="k", calls=calls))
    assert state.error() is None
    assert all(auth == "Bearer k" for _, _, auth in calls)
    assert ("GET", "/get_model_info", "Bearer k") in calls
    assert state.text().startswith("<s>[USER]Hi[/USER]\n[ASST]")
    assert state["pick"] in ("yes", "no")


def test_endpoint_non_200_raises_with_the_server_message(fake):
    ep = endpoint(fake, api_key="k")
    ep.client.headers["Authorization"] = "Bearer wrong"
    with pytest.raises(rf.BackendError, match="HTTP 401: bad api key"):
        ep.generate({"text": "x"})
    with pytest.raises(rf.BackendError, match="HTTP 401: bad api key"):
        list(ep.generate_stream({"text": "x"}))


def test_endpoint_streams_sse(make_fake):
    fake = make_fake(reply=lambda p, sp: "hello", chunk_chars=2)

    @rf.function
    def prog(s):
        s += "Say:" + rf.gen("x")

    state = prog.run(stream=True, backend=endpoint(fake))
    assert list(state.text_iter("x")) == ["he", "ll", "o"]
    assert fake.requests[0]["stream"] is True


def test_submit_posts_the_traced_program(fake):
    local = chat.run(question="Hi", backend=fake)
    remote = chat.submit(endpoint(fake), question="Hi")
    assert remote["variables"] == local.variables()
    assert remote["text"] == local.text()


def test_submit_error_is_the_server_message(fake):
    @rf.function
    def big(s, q):
        s += q + rf.gen("x", max_tokens=10**7)

    with pytest.raises(rf.BackendError, match="max_total_new_tokens"):
        big.submit(endpoint(fake), q="hi")


class FakeRuntimeEngine:
    """The slice of radixflow.runtime.Engine the Engine backend uses."""

    def __init__(self):
        self.calls = []
        self.closed = False
        self.tokenizer = type("Tok", (), {"role_markers": lambda self: {"bos": "", "user": ["<u>", "</u>"],
                                                                        "assistant": ["<a>", "</a>"]}})()

    def generate(self, prompt=None, sampling_params=None, input_ids=None, **kw):
        self.calls.append({"prompt": prompt, "sampling_params": sampling_params, "input_ids": input_ids, **kw})
        one = {"text": "ok", "output_ids": [1], "meta_info": {"prompt_tokens": 3}}
        return [one] * len(prompt) if isinstance(prompt, list) else one

    async def generate_stream(self, prompt=None, sampling_params=None, **kw):
        for text in ("o", "ok", "ok!"):
            yield {"text": text, "meta_info": {}}

    def shutdown(self):
        self.closed = True


def test_engine_backend_maps_body_keys():
    runtime = FakeRuntimeEngine()
    backend = rf.Engine(engine=runtime)
    backend.generate({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                      "logprob_start_len": 2, "return_text_in_logprobs": True})
    assert runtime.calls[0] == {"prompt": ["a", "b"], "sampling_params": {"max_new_tokens": 0}, "input_ids": None,
                                "return_logprob": True, "logprob_start_len": 2, "return_text_in_logprobs": True,
                                "top_logprobs_num": 0, "session_id": None, "priority": None,
                                "return_hidden_states": False}
    backend.generate({"text": "a", "return_logprob": True, "priority": 3})  # as over HTTP: output logprobs only
    assert runtime.calls[1]["logprob_start_len"] == -1 and runtime.calls[1]["priority"] == 3
    with pytest.raises(ValueError, match="priority"):
        backend.generate({"text": "a", "priority": 1 << 63})
    with pytest.raises(ValueError, match="logprob_start_len"):
        backend.generate({"text": "a", "return_logprob": True, "logprob_start_len": -3})
    with pytest.raises(ValueError, match="image_data"):
        backend.generate({"text": "a", "image_data": "x"})


def test_engine_backend_runs_programs_and_streams():
    runtime = FakeRuntimeEngine()

    @rf.function
    def prog(s):
        s += rf.user("hi") + rf.assistant(rf.gen("x"))

    with rf.Engine(engine=runtime) as backend:
        assert prog.run(backend=backend).text() == "<u>hi</u><a>ok</a>"
        state = prog.run(backend=backend, stream=True)
        assert list(state.text_iter("x")) == ["o", "k", "!"]
    assert not runtime.closed  # not ours to shut down


def test_import_loads_no_runtime_engine_or_torch():
    code = ("import sys, radixflow.lang as rf; rf.gen('x', max_tokens=3, temperature=0); "
            "rf.trace(rf.function(lambda s: s.__iadd__(rf.select('a', ['x', 'y'])))); "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'radixflow.runtime.engine', "
            "'radixflow.kernels', 'radixflow.radix', 'httpx'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lang_imports_runtime_only_inside_functions():
    """DESIGN: lang imports no runtime code at import time; inside functions only the sampling
    parameter declaration, the reasoning parser (text only: separate_reasoning) and (in the
    Engine backend) the Engine itself."""
    import ast
    import pathlib

    root = pathlib.Path(rf.__file__).parent
    allowed_lazy = {"radixflow.runtime.sampling_params", "radixflow.runtime.text.reasoning", "radixflow.runtime"}
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for module in modules:
                if not module or not module.startswith("radixflow.") or module.startswith("radixflow.lang"):
                    continue
                assert id(node) not in top_level, f"{path.name} imports {module} at import time"
                assert module in allowed_lazy, f"{path.name} imports {module}"
