"""The launch configurations compile for an H100/H200 (sm90) without a GPU: Triton's own ptxas, no driver.

Catches GPU-only compile errors (dot shapes, dtypes, shared memory) that the
interpreter cannot see. Slow (tens of seconds): `pytest -m slow tests/kernels`.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import os
os.environ.pop("TRITON_INTERPRET", None)  # a fresh process: kernels must build as compiled JITFunctions
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from radixflow.kernels._attention import dot_precision
from radixflow.kernels.decode_attention import _decode_stage1_kernel, _decode_stage2_kernel
from radixflow.kernels.extend_attention import _extend_attention_kernel, _launch_config
from radixflow.kernels.logits_mask import _apply_token_bitmask_kernel
from radixflow.kernels.store_kv import _store_kv_kernel

NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
SMEM_BYTES = 227 * 1024  # H100 / H200 per-block maximum

def build(fn, types, consts, num_warps, num_stages):
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    assert kernel.metadata.shared <= SMEM_BYTES, (fn.__name__, consts, kernel.metadata.shared)

for dtype, fp8 in ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)):
    dt = NAMES[dtype]
    cache = "*u8" if fp8 else "*" + dt
    attn = {"q": "*" + dt, "k_cache": cache, "v_cache": cache, "req_to_token": "*i32", "req_rows": "*i64",
            "qk_scale": "fp32", "v_scale": "fp32"}
    common = dict(IS_FP8=fp8, DOT_PRECISION=dot_precision(dtype), USE_WHILE=False)
    for head_dim in (80, 128):
        cfg = _launch_config(dtype, 128, True)
        build(_extend_attention_kernel, {**attn, "out": "*" + dt, "prefix_lens": "*i64", "extend_lens": "*i64",
              "extend_starts": "*i64"}, dict(GROUP_SIZE=4, HEAD_DIM=head_dim, BLOCK_D=128, BLOCK_M=cfg["BLOCK_M"],
              BLOCK_N=cfg["BLOCK_N"], **common), cfg["num_warps"], cfg["num_stages"])
    build(_decode_stage1_kernel, {**attn, "seq_lens": "*i64", "part_out": "*fp32", "part_lse": "*fp32"},
          dict(GROUP_SIZE=4, HEAD_BLOCKS=1, HEAD_DIM=128, NUM_SPLITS=8, BLOCK_H=16, BLOCK_N=32, BLOCK_D=128,
               **common), 4, 2)
    build(_store_kv_kernel, {"k_cache": cache, "v_cache": cache, "slots": "*i64", "k": "*" + dt, "v": "*" + dt,
          "k_scale": "fp32", "v_scale": "fp32"}, dict(BLOCK_H=8, BLOCK_D=128, IS_FP8=fp8), 4, 3)
build(_decode_stage2_kernel, {"part_out": "*fp32", "part_lse": "*fp32", "out": "*bf16", "v_scale": "fp32"},
      dict(HEAD_DIM=128, NUM_SPLITS=8, BLOCK_S=8, BLOCK_D=128), 4, 2)
build(_apply_token_bitmask_kernel, {"logits": "*fp32", "bitmask": "*i32", "rows": "*i64"},
      dict(HAS_ROWS=True, BLOCK=1024), 4, 3)
print("compiled")
"""


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
