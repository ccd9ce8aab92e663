"""POST /v1/responses (OpenAI's Responses API) on the chat path, and GET / DELETE
/v1/responses/{id}: a request becomes the chat request it means (responses_input.py), runs as one
(frontend/openai_route.prepare: limits, sampling, grammar, tool plan, prompt, engine streams), and
its text and tool calls become output items (responses_output.py), whole or as stream events."""
from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, read_json
from radixflow.frontend.chat import ChatShape, to_logprobs
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_common import now, usage
from radixflow.frontend.openai_route import Job, finish_reason, prepare
from radixflow.frontend.openai_schemas import ChatRequest
from radixflow.frontend.response_store import ResponseStore, StoredResponse
from radixflow.frontend.responses_input import LOGPROBS, chat_request, check_request, read_items, wants_logprobs
from radixflow.frontend.responses_output import (
    OutputItems, conversation_items, listed_items, response_usage, status_of,
)
from radixflow.frontend.responses_schemas import (
    DeletedResponse, IncompleteDetails, Item, OutputItem, Reasoning, ResponseError, ResponseObject,
    ResponsesRequest, ResponseUsage, TextConfig,
)
from radixflow.frontend.streams import Fanout, EventStream
from radixflow.frontend.tool_calls import Event, Parser

log = logging.getLogger(__name__)

# the chat request's field names in errors from the chat path → the Responses request's
_PARAMS = {"messages": "input", "json_schema": "text", "response_format": "text"}


class ResponsesShape(ChatShape):
    """The chat shape under the Responses request's names (errors name `input`, `max_output_tokens`)."""

    id_prefix = "resp"
    prompt_param = "input"

    def max_tokens_param(self, req: ChatRequest) -> str:
        return "max_output_tokens"


SHAPE = ResponsesShape()


@dataclass
class Turn:
    """One Responses request on its way: what its response object echoes, and what storing it keeps."""

    req: ResponsesRequest
    id: str
    created_at: int
    conversation: list[Item]  # the previous response's conversation, then this input
    store: bool
    inputs: list[Item]  # this input

    def response(self, status: str, output: list[OutputItem], usage: ResponseUsage | None,
                 incomplete: IncompleteDetails | None = None, error: ResponseError | None = None) -> ResponseObject:
        req = self.req
        return ResponseObject(
            id=self.id, created_at=self.created_at, status=status, error=error, incomplete_details=incomplete,
            instructions=req.instructions, max_output_tokens=req.max_output_tokens, model=req.model, output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
            reasoning=req.reasoning or Reasoning(), store=self.store, temperature=req.temperature,
            text=req.text or TextConfig(),
            tool_choice=req.tool_choice or "auto", tools=req.tools or [], top_p=req.top_p, usage=usage,
            user=req.user, metadata=req.metadata or {})

    def keep(self, store: ResponseStore, response: ResponseObject) -> None:
        if self.store:
            store.put(StoredResponse(response, self.conversation + conversation_items(response.output),
                                     listed_items(self.inputs, self.req.input)))


def _stores(req: ResponsesRequest, store: ResponseStore) -> bool:
    """Whether this response is kept: unless `store` is false, where the server keeps responses."""
    if req.store and store.max_responses == 0:
        raise APIError(400, "this server keeps no responses (--max-stored-responses 0, or several API server "
                       "processes); send store false", param="store")
    return req.store is not False and store.max_responses > 0


def _previous(store: ResponseStore, response_id: str | None) -> list[Item]:
    if response_id is None:
        return []
    entry = store.get(response_id)
    if entry is None:
        kept = (f"the last {store.max_responses} are kept in this API server's memory until it restarts"
                if store.max_responses else "this server keeps no responses")
        raise APIError(404, f"Previous response with id {response_id!r} not found ({kept}).",
                       param="previous_response_id", code="previous_response_not_found")
    return entry.conversation


async def create_response(request: Request) -> Response:
    server = request.app.state.server
    store: ResponseStore = server.responses
    req = await read_json(request, ResponsesRequest)
    check_request(req, getattr(server.engine, "supports_grammar", False))
    if wants_logprobs(req) and server.reasoning_parser is not None:
        raise APIError(400, f"include {LOGPROBS!r} is not supported with --reasoning-parser (the output's tokens "
                       "are not split between reasoning and text)", param="include")
    inputs = read_items(req.input)
    turn = Turn(req, "resp_" + uuid.uuid4().hex, now(), _previous(store, req.previous_response_id) + inputs,
                _stores(req, store), inputs)
    try:
        job, fanout = await prepare(request, SHAPE, chat_request(req, turn.conversation))
    except APIError as exc:
        exc.param = _PARAMS.get(exc.param or "", exc.param)
        exc.message = exc.message.replace("].function.", "].")  # chat's tools nest what Responses' keep flat
        raise
    tokenizer = server.engine.tokenizer
    if req.stream:
        return EventStream(_stream(turn, job, fanout, store, tokenizer))
    [result] = await fanout.finish(request.receive)
    reason = finish_reason(result["meta_info"])
    output = OutputItems()
    _logprobs(output, result["meta_info"], tokenizer)
    for event in _parsed(job.state.parser(), result["text"], True):
        output.add(event)
    status, incomplete = status_of(reason)
    output.finish(status)
    response = turn.response(status, output.items, _usage(job, result["meta_info"]), incomplete)
    turn.keep(store, response)
    return json_response(response)


def _parsed(parser: Parser | None, text: str, last: bool) -> list[Event]:
    """Text and calls of a piece of output (the tool plan's parser, if any, holds back what may be a call)."""
    if parser is None:
        return [text]
    return parser.feed(text) + (parser.finish() if last else [])


def _logprobs(output: OutputItems, meta: dict, tokenizer: Any) -> None:
    """The token logprob entries of `meta` (when the request asked for them) to the output text."""
    entries = to_logprobs(meta, tokenizer)
    if entries is not None and entries.content:
        output.logprobs(entries.content)


def _usage(job: Job, meta: dict) -> ResponseUsage:
    return response_usage(usage({0: meta}, 1, job.shared))


def _frame(event: dict[str, Any], number: int) -> bytes:
    data = msgspec.json.encode({**event, "sequence_number": number})
    return b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"


async def _stream(turn: Turn, job: Job, fanout: Fanout, store: ResponseStore, tokenizer: Any) -> AsyncIterator[bytes]:
    """response.created / in_progress, the output items' events, then response.completed (or
    .incomplete) with the whole response; an engine failure after the 200 is response.failed.
    Closing the iterator (the client left) closes the fan-out: the engine aborts the request."""
    numbers = itertools.count()
    output = OutputItems()
    try:
        opening = turn.response("in_progress", [], None)
        for kind in ("response.created", "response.in_progress"):
            yield _frame({"type": kind, "response": opening}, next(numbers))
        parser, reason, meta = job.state.parser(), None, {}
        async for _, chunk in fanout:
            meta = chunk["meta_info"]
            reason = finish_reason(meta)
            _logprobs(output, meta, tokenizer)
            for event in _parsed(parser, chunk["text"], reason is not None):
                for frame in output.add(event):
                    yield _frame(frame, next(numbers))
        status, incomplete = status_of(reason)
        for frame in output.finish(status):
            yield _frame(frame, next(numbers))
        response = turn.response(status, output.items, _usage(job, meta), incomplete)
        turn.keep(store, response)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield _frame({"type": kind, "response": response}, next(numbers))
    except APIError as exc:  # the 200 is already sent: report in-band
        log.warning("responses stream failed: %s", exc.message)
        failed = turn.response("failed", output.items, None, error=ResponseError("server_error", exc.message))
        yield _frame({"type": "response.failed", "response": failed}, next(numbers))
    except Exception as exc:  # the 200 is already sent: report in-band
        log.exception("responses stream failed")
        failed = turn.response("failed", output.items, None, error=ResponseError("server_error", str(exc)))
        yield _frame({"type": "response.failed", "response": failed}, next(numbers))
    finally:
        await fanout.close()


def _stored(request: Request) -> StoredResponse:
    """The stored response the path names; 404 for an id not (or no longer) stored."""
    store: ResponseStore = request.app.state.server.responses
    response_id = request.path_params["response_id"]
    entry = store.get(response_id)
    if entry is None:
        raise APIError(404, f"No response with id {response_id!r} is stored (responses are kept in this API "
                       "server's memory until it restarts, the most recent first).", param="response_id",
                       code="response_not_found")
    return entry


async def response_by_id(request: Request) -> Response:
    """GET: a stored response; DELETE: forget it. 404 for an id not (or no longer) stored."""
    store: ResponseStore = request.app.state.server.responses
    entry = _stored(request)
    response_id = entry.response.id
    if request.method == "DELETE":
        store.delete(response_id)
        return json_response(DeletedResponse(response_id))
    return json_response(entry.response)


MAX_LISTED = 100  # OpenAI's bound on `limit`


async def input_items(request: Request) -> Response:
    """GET /v1/responses/{id}/input_items: the stored response's input items (this request's, not
    the previous response's or instructions), `order` desc (the default) or asc, `limit` 1-100
    (20), `after` an item id from an earlier page; no `include` (nothing to add)."""
    items = _stored(request).inputs
    query = request.query_params
    if "include" in query:
        raise APIError(400, "include is not supported: the items are listed whole", param="include")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be 'asc' or 'desc'", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LISTED:
        raise APIError(400, f"limit must be an integer from 1 to {MAX_LISTED}", param="limit")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if "after" in query:
        ids = [item["id"] for item in ordered]
        if query["after"] not in ids:
            raise APIError(400, f"after: no input item {query['after']!r} in this response", param="after")
        start = ids.index(query["after"]) + 1
    page = ordered[start:start + limit]
    return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)})
