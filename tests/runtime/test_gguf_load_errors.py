"""A GGUF file that cannot be served fails at load with a ValueError naming the file and the cause
(never an OverflowError, KeyError or ZeroDivisionError from inside the parser or the loader)."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is a radixflow dependency")

from gguf_writer import write_gguf  # noqa: E402  (tests/runtime is on sys.path via conftest)

from radixflow.runtime.model.demo import demo_model  # noqa: E402
from radixflow.runtime.model.model_config import load_model_args  # noqa: E402
from radixflow.runtime.text.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_gguf(demo_model("tiny"), str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"), "Q8_0")


def _rewrite(src: str, dst: Path, *, drop_keys: tuple[str, ...] = (), drop_tensors: tuple[str, ...] = (),
             set_keys: dict[str, tuple[object, gguf.GGUFValueType]] | None = None) -> str:
    """Copy a GGUF without some metadata keys or tensors, with some keys set to other values."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys or key in (set_keys or {}):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for key, (value, vtype) in (set_keys or {}).items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name not in drop_tensors:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(dst)


@pytest.mark.parametrize("offset", [8, 16])  # num_tensors, num_kv
def test_header_count_past_the_file_is_named(good_gguf: str, tmp_path: Path, offset: int) -> None:
    data = bytearray(Path(good_gguf).read_bytes())
    data[offset:offset + 8] = struct.pack("<Q", 2**60)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"bad\.gguf.*(truncated|corrupt)"):
        load_model_args(str(bad))


def test_array_count_past_the_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    key = b"x.values"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                    + struct.pack("<IIQ", 9, 4, 2**40) + b"\0" * 64)  # an array of 2**40 u32
    with pytest.raises(ValueError, match=r"bad\.gguf.*(truncated|corrupt)"):
        load_model_args(str(bad))


def test_missing_token_embedding_is_named(good_gguf: str, tmp_path: Path) -> None:
    bad = _rewrite(good_gguf, tmp_path / "bad.gguf", drop_tensors=("token_embd.weight",))
    with pytest.raises(ValueError, match=r"bad\.gguf.*token_embd\.weight"):
        load_model_args(bad)


@pytest.mark.parametrize("value, vtype", [(0, gguf.GGUFValueType.UINT32), ("four", gguf.GGUFValueType.STRING),
                                          (2.5, gguf.GGUFValueType.FLOAT32)])
def test_invalid_head_count_is_named(good_gguf: str, tmp_path: Path, value: object, vtype: object) -> None:
    bad = _rewrite(good_gguf, tmp_path / "bad.gguf", drop_keys=("llama.attention.key_length",),
                   set_keys={"llama.attention.head_count": (value, vtype)})
    with pytest.raises(ValueError, match=r"bad\.gguf.*llama\.attention\.head_count"):
        load_model_args(bad)


def test_kv_heads_that_do_not_divide_heads_are_named(good_gguf: str, tmp_path: Path) -> None:
    bad = _rewrite(good_gguf, tmp_path / "bad.gguf",
                   set_keys={"llama.attention.head_count_kv": (3, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ValueError, match=r"bad\.gguf.*num_key_value_heads 3"):
        load_model_args(bad)


def test_broken_chat_template_fails_at_load(good_gguf: str, tmp_path: Path) -> None:
    bad = _rewrite(good_gguf, tmp_path / "bad.gguf",
                   set_keys={"tokenizer.chat_template": ("{% if %}", gguf.GGUFValueType.STRING)})
    with pytest.raises(ValueError, match=r"bad\.gguf.*chat_template.*does not compile"):
        Tokenizer.from_pretrained(bad)
    assert os.path.isfile(bad)
