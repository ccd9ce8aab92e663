"""Structured extraction: `gen(json_schema=...)` makes every output parse and validate;
`run_batch` shares the instruction and worked-example prefix across inputs.

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


EXAMPLE_NOTE = "Maria from Rome, 41, phoned to ask about her order."
EXAMPLE_JSON = '{"name": "Maria", "city": "Rome", "age": 41, "customer": true, "channel": "phone"}'


@rf.function
def extract(s, note):
    s += rf.system("You read short customer notes and extract the contact they describe as one JSON "
                   "object with the fields name, city, age, customer and channel. Use the exact "
                   "words of the note; guess the channel from how the person got in touch.")
    s += rf.user(EXAMPLE_NOTE)  # one worked example: the shared prefix every note's prompt reuses
    s += rf.assistant(EXAMPLE_JSON)
    s += rf.user(note)
    s += rf.assistant(rf.gen("contact", json_schema=CONTACT, max_tokens=64, temperature=0))


def main(backend: rf.Engine) -> None:
    before = backend.engine.stats()
    states = extract.run_batch([{"note": n} for n in NOTES], backend=backend, num_threads=3)
    contacts = [json.loads(st["contact"]) for st in states]
    for note, contact in zip(NOTES, contacts):
        print(f"{note[:40]:40s} -> {contact}")
        assert set(contact) == set(CONTACT["required"])
        assert isinstance(contact["age"], int) and 0 <= contact["age"] <= 120
        assert contact["channel"] in ("email", "phone", "chat") and isinstance(contact["customer"], bool)
    assert sum(c["city"] in note for c, note in zip(contacts, NOTES)) >= 2, "cities come from the notes"
    report_cache(backend, before)


if __name__ == "__main__":
    main(backend_from_args(__doc__))
