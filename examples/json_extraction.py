"""Structured extraction: `gen(json_schema=...)` makes every output parse and validate, even
from a random-weight model; `run_batch` shares the instruction prefix across inputs.

    python examples/json_extraction.py
"""
from __future__ import annotations

import json

import radixflow.lang as rf
from _common import backend_from_args, report_cache

CONTACT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "city": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "customer": {"type": "boolean"},
        "channel": {"enum": ["email", "phone", "chat"]},
    },
    "required": ["name", "city", "age", "customer", "channel"],
    "additionalProperties": False,
}
NOTES = ["Ana from Lisbon, 34, called about her invoice.", "Tom (52, Leeds) wrote in by email.",
         "A new visitor from Osaka asked about prices on the chat."]


@rf.function
def extract(s, note):
    s += rf.system("You read short customer notes and extract the contact they describe as one JSON "
                   "object with the fields name, city, age, customer and channel. Use the exact "
                   "words of the note; guess the channel from how the person got in touch.")
    s += rf.user(note)
    s += rf.assistant(rf.gen("contact", json_schema=CONTACT, max_tokens=96, temperature=1.0))


if __name__ == "__main__":
    backend = backend_from_args(__doc__)
    before = backend.engine.stats()
    states = extract.run_batch([{"note": n} for n in NOTES], backend=backend, num_threads=3)
    for note, st in zip(NOTES, states):
        contact = json.loads(st["contact"])
        print(f"{note[:40]:40s} -> {contact}")
        assert set(contact) == set(CONTACT["required"])
        assert isinstance(contact["age"], int) and 0 <= contact["age"] <= 120
        assert contact["channel"] in ("email", "phone", "chat") and isinstance(contact["customer"], bool)
    report_cache(backend, before)
