"""Stored responses (`store`, `previous_response_id`, GET / DELETE /v1/responses/{id}): a bounded
LRU in the API server's memory. Per process and lost on restart; `radixflow serve` with several
API server processes keeps none (frontend/server.py). Used on the event loop only: no lock."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from radixflow.frontend.responses_schemas import Item, ResponseObject

DEFAULT_MAX_RESPONSES = 1000  # `radixflow serve --max-stored-responses` with one API server process


@dataclass(frozen=True)
class StoredResponse:
    response: ResponseObject
    conversation: list[Item]  # the previous conversation, this input and this output (no instructions)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # this request's input items, with ids, in order


class ResponseStore:
    """At most `max_responses` responses; storing one more drops the least recently used.
    `max_responses` 0 stores nothing."""

    def __init__(self, max_responses: int) -> None:
        if max_responses < 0:
            raise ValueError(f"max_responses must be >= 0, got {max_responses}")
        self.max_responses = max_responses
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, entry: StoredResponse) -> None:
        if self.max_responses == 0:
            return
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.max_responses:
            self._entries.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
