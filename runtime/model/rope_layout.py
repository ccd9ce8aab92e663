"""A checkpoint's RoPE layout (part of each head rotated: Phi-4-mini, GLM; pairs interleaved: GLM,
ERNIE 4.5) on the whole-head rotate-half kernels: each q and k head's dims are reordered once at
load so that the rotated pairs become the kernels' pairs and the other dims sit where the tables
turn by nothing (model.rope_tables).

A checkpoint's head of D dims rotates its first r: as rotate-half pairs (i, i + r/2), or
interleaved pairs (2i, 2i + 1); the rest pass through. The kernels pair (j, j + D/2). Ours:

    | a: each pair's first dim | c: half the pass dims | b: each pair's second dim | d: the other pass dims |

so that pair j < r/2 = (a_j, b_j) rotates with frequency j and j >= r/2 = (c, d) does not.
q . k is unchanged by any order both share, so attention is; the KV pool holds k in this order.
"""
from __future__ import annotations

import torch


def rotary_order(head_dim: int, rotary_dim: int, interleaved: bool = False) -> torch.Tensor:
    """The checkpoint dim each of our head dims takes ([head_dim] int64)."""
    rest = (head_dim - rotary_dim) // 2
    if interleaved:
        first, second = torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)
    else:
        first, second = torch.arange(0, rotary_dim // 2), torch.arange(rotary_dim // 2, rotary_dim)
    return torch.cat([first, torch.arange(rotary_dim, rotary_dim + rest), second,
                      torch.arange(rotary_dim + rest, head_dim)])


def to_rotary_order(rows: torch.Tensor, head_dim: int, rotary_dim: int, interleaved: bool = False) -> torch.Tensor:
    """`rows` [heads * head_dim, ...] (a q or k projection's weight or bias, or an adapter's lora_B
    part) with each head's rows in our order."""
    heads = rows.shape[0] // head_dim
    order = rotary_order(head_dim, rotary_dim, interleaved).to(rows.device)
    return rows.reshape(heads, head_dim, *rows.shape[1:])[:, order].reshape(rows.shape)


def to_model_layout(args, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Our parameter `name` (a safetensors or GGUF tensor already joined) in our head order: a
    fused q | k | v projection's q and k heads, and the q / k norms' weights (per head, or over the
    whole projection: MiniMax-M2), where the model reorders its RoPE (ModelArgs.reorders_rope);
    other tensors as they are."""
    if args.mla:
        return latent_to_rotary_order(args, name, tensor)
    if args.reorders_rope and ".qkv_proj." in name:  # Phi-4-mini, GLM, ERNIE 4.5
        return qkv_to_rotary_order(tensor, args.q_size, args.kv_size, args.head_dim, args.rope_dim,
                                   args.rope_interleaved)
    if args.reorders_rope and (args.qk_norm or args.qk_norm_whole or args.qk_layer_norm) and name.endswith(
            ("q_norm.weight", "k_norm.weight")):  # one head's, every head's, or each head's own (Command R+)
        return to_rotary_order(tensor.reshape(-1), args.head_dim, args.rope_dim, args.rope_interleaved).view(
            tensor.shape)
    return tensor


def latent_to_rotary_order(args, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A latent-attention parameter (DeepSeek-V2 / V3) with its rotated rows de-interleaved where
    the checkpoint pairs them (2i, 2i + 1): each head's last qk_rope_head_dim rows of the query
    projection, and the shared key's rows after the latent in kv_a_proj_with_mqa."""
    rot = args.qk_rope_head_dim
    if not args.rope_interleaved or not name.endswith((".q_proj.weight", ".q_b_proj.weight",
                                                       ".kv_a_proj_with_mqa.weight", ".kv_a_proj_with_mqa.bias")):
        return tensor
    order = rotary_order(rot, rot, interleaved=True).to(tensor.device)
    if ".kv_a_proj_with_mqa." in name:
        latent, key = tensor.split([args.kv_lora_rank, rot])
        return torch.cat([latent, key[order]])
    heads = tensor.reshape(args.num_heads, args.qk_nope_head_dim + rot, *tensor.shape[1:])
    nope, query = heads.split([args.qk_nope_head_dim, rot], dim=1)
    return torch.cat([nope, query[:, order]], dim=1).reshape(tensor.shape)


def qkv_to_rotary_order(qkv: torch.Tensor, q_size: int, kv_size: int, head_dim: int, rotary_dim: int,
                        interleaved: bool = False) -> torch.Tensor:
    """A fused q | k | v projection's weight or bias with its q and k heads in our order."""
    q, k, v = qkv.split([q_size, kv_size, qkv.shape[0] - q_size - kv_size])
    return torch.cat([to_rotary_order(q, head_dim, rotary_dim, interleaved),
                      to_rotary_order(k, head_dim, rotary_dim, interleaved), v])


def pass_through_columns(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Our head dims that are not rotated (their table columns: cos 1, sin 0)."""
    half, rot_half = head_dim // 2, rotary_dim // 2
    return torch.cat([torch.arange(rot_half, half), torch.arange(half + rot_half, head_dim)])
