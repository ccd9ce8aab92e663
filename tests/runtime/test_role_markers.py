"""Role markers reproduce the chat template exactly: rendering a conversation turn by turn from
the markers equals transformers' apply_chat_template text, for ChatML (SmolLM2, with its BOS
`<|im_start|>` and default system turn), Llama-3, Mistral and Qwen2.5 templates."""
from __future__ import annotations

import pytest
import tokenizers

import radixflow.lang as rf
from radixflow.lang.roles import RoleMarkers
from radixflow.runtime.model.demo import TOKENIZER_PATH
from radixflow.runtime.text.tokenizer import Tokenizer

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# name -> (template, bos, eos, supports a system turn)
TEMPLATES = {
    "smollm2": (SMOLLM2, "<|im_start|>", "<|im_end|>", True),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", True),
    "mistral": (MISTRAL, "<s>", "</s>", False),
    "qwen2.5": (QWEN25, "<|endoftext|>", "<|im_end|>", True),
}
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<s>", "</s>", "<|endoftext|>"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris"}, {"role": "user", "content": "And of Italy?"}],
]


def _tokenizers(name: str):
    from transformers import PreTrainedTokenizerFast

    template, bos, eos, _ = TEMPLATES[name]
    backend = tokenizers.Tokenizer.from_file(str(TOKENIZER_PATH))
    backend.post_processor = None  # encoding adds no BOS: the templates write it
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    ours = Tokenizer(backend, bos_token_id=backend.token_to_id(bos), eos_token_ids=[backend.token_to_id(eos)],
                     chat_templates={"default": template}, template_tokens={"bos_token": bos, "eos_token": eos})
    ref = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)
    ref.chat_template = template
    return ours, ref


def _render(markers: dict, messages: list[dict]) -> str:
    """A conversation as the language renders it: markers around each turn, then the assistant prompt."""
    text = markers["bos"] + (markers.get("default_system", "") if messages[0]["role"] != "system" else "")
    for m in messages:
        begin, end = markers[m["role"]]
        text += begin + m["content"] + end
    return text + markers["assistant"][0]


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_markers_reproduce_apply_chat_template(name):
    ours, ref = _tokenizers(name)
    markers = ours.role_markers()
    _, _, _, has_system = TEMPLATES[name]
    assert ("system" in markers) == has_system
    for messages in CONVERSATIONS:
        if messages[0]["role"] == "system" and not has_system:
            continue
        expected = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert _render(markers, messages) == expected


def test_smollm2_bos_is_a_turn_opener_not_stripped():
    markers = _tokenizers("smollm2")[0].role_markers()
    assert markers["bos"] == ""
    assert markers["system"] == ["<|im_start|>system\n", "<|im_end|>\n"]
    assert markers["user"] == ["<|im_start|>user\n", "<|im_end|>\n"]
    assert markers["default_system"].startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_llama3_bos_written_once_before_the_first_turn():
    markers = _tokenizers("llama3")[0].role_markers()
    assert markers["bos"] == "<|begin_of_text|>" and markers["default_system"] == ""
    assert markers["user"][0] == "<|start_header_id|>user<|end_header_id|>\n\n"


@rf.function
def _program(s, with_system):
    if with_system:
        s += rf.system("You answer in one word.")
    s += rf.user("Capital of France?")
    s += rf.assistant("Paris")
    s += rf.user("And of Italy?")
    s += rf.assistant_begin()


class _MarkersOnly:
    """A backend that only answers role_markers (the program below generates nothing)."""

    def __init__(self, markers: dict) -> None:
        self.markers = markers

    def role_markers(self) -> dict:
        return self.markers

    def generate(self, body: dict) -> dict:
        raise AssertionError("no generation expected")

    def generate_stream(self, body: dict):
        raise AssertionError("no generation expected")


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5", "llama3"])
@pytest.mark.parametrize("with_system", [True, False])
def test_language_program_renders_the_template(name, with_system):
    ours, ref = _tokenizers(name)
    state = _program.run(with_system=with_system, backend=_MarkersOnly(ours.role_markers()))
    messages = CONVERSATIONS[2] if with_system else CONVERSATIONS[2][1:]
    assert state.text() == ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert RoleMarkers.from_dict(ours.role_markers()).default_system == ours.role_markers()["default_system"]
