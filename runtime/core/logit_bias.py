"""logit_bias: each request's token → bias table added to its logits, one scatter per batch."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from radixflow.runtime.core.upload import to_device, upload

if TYPE_CHECKING:
    from radixflow.runtime.core.sampler import SampleRow


def apply_logit_bias(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Add each `biased` row's logit_bias to its row of logits [B, vocab], in place: one
    scatter for the batch. A row's (ids, values) tensors are made on its first step and kept in
    its state (RowState.bias_ids / bias_values); per step only the row positions are uploaded."""
    biased = [i for i, r in enumerate(rows) if r.biased]
    if not biased:
        return
    device = logits.device
    tables = [_bias_of(rows[i], device) for i in biased]
    row_of = upload([np.repeat(biased, [ids.shape[0] for ids, _ in tables])], device)[0]  # [N]: entries' rows
    ids = torch.cat([ids for ids, _ in tables])  # [N] int64
    values = torch.cat([values for _, values in tables]).to(logits.dtype)  # [N]
    logits.index_put_((row_of, ids), values, accumulate=True)


def _bias_of(row: SampleRow, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """row's token ids [K] int64 and biases [K] fp32 on `device`, made once per request."""
    st = row.state
    if st.bias_ids is None or st.bias_ids.device != device:
        sp = row.sampling
        st.bias_ids = upload([sp.logit_bias_ids], device)[0]
        st.bias_values = to_device(torch.tensor(list(sp.logit_bias.values()), dtype=torch.float32), device)
    return st.bias_ids, st.bias_values
