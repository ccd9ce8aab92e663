"""Host-to-device copies that never make the host wait for the device.

A copy from pageable host memory with `non_blocking=False` (what `torch.tensor(values,
device=...)` and `.to(device)` do) synchronizes the stream: the host waits for every kernel
queued before it. With overlap scheduling the step in flight is queued there, so one such copy
while the next step is prepared undoes the overlap. Everything the engine thread sends to the
device per step goes through `upload`: packed into one pinned buffer, copied asynchronously.
"""
from __future__ import annotations

import torch


def upload(parts: list, device: torch.device) -> list[torch.Tensor]:
    """int64 tensors on `device` of `parts` (sequences of ints), with one host-to-device copy:
    packed into one host buffer, pinned on CUDA so the copy does not block the host (the caching
    host allocator keeps the buffer until the copy is done), then split into views."""
    sizes = [len(part) for part in parts]
    host_t = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=device.type == "cuda")
    host, pos = host_t.numpy(), 0
    for part, n in zip(parts, sizes):
        host[pos: pos + n] = part
        pos += n
    return list(host_t.to(device, non_blocking=True).split(sizes))


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, through a pinned copy on CUDA (see the module doc)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
