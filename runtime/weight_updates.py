"""Engine's weight updates for RL loops (a mixin of Engine): another checkpoint's weights from
disk or a trainer's tensors, applied once the running requests have ended on the old ones;
weight version names; pausing and resuming generation (SGLang's APIs of these names)."""
from __future__ import annotations

import threading
from typing import Any

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.engine_loop import EngineLoop
from radixflow.runtime.core.model_runner import ModelRunner
from radixflow.runtime.core.scheduler import Scheduler
from radixflow.runtime.model.weight_update import PendingTensors, StagedWeights


class WeightUpdates:
    """Engine's weight-update methods (a mixin: Engine sets the state below)."""

    config: EngineConfig
    runner: ModelRunner
    scheduler: Scheduler
    loop: EngineLoop
    _weights_lock: threading.Lock          # one update at a time
    _pending_tensors: PendingTensors       # update_weights_from_tensor's parts so far

    def update_weights_from_disk(self, model_path: str, *, abort_all_requests: bool = False,
                                 weight_version: str | None = None) -> dict:
        """Serve the weights of `model_path`, a checkpoint of the same model (same architecture
        and config; its saved dtype may differ), from now on. The checkpoint loads while serving
        goes on; then nothing waiting is admitted until every running request has finished on the
        old weights (or, `abort_all_requests`, every request in flight is aborted), the weights
        are overwritten in place, the prefix cache (KV of the old weights) is dropped, and the
        queue runs on the new weights. The tokenizer stays. `weight_version`: the name
        `get_weight_version()` gives from then on. ValueError (nothing changed) when the
        checkpoint is missing, malformed or another model. Returns SGLang's reply:
        {"success": True, "message": ..., "num_paused_requests": requests that waited for it}."""
        if not isinstance(model_path, str) or not model_path:
            raise ValueError(f"model_path must be a non-empty string, got {model_path!r}")
        self._check_update_options(abort_all_requests, weight_version)
        with self._weights_lock:  # one update at a time: each stages a model's worth of memory
            staged = self.runner.stage_weights(model_path, self.config.quantization)
            paused = self._apply_staged(staged, abort_all_requests, weight_version)
            self._pending_tensors.discard()  # parts of a set meant for the weights replaced
        return {"success": True, "message": f"weights updated from {staged.model_path}", "num_paused_requests": paused}

    def update_weights_from_tensor(self, named_tensors: Any, *, abort_all_requests: bool = False,
                                   weight_version: str | None = None) -> dict:
        """As update_weights_from_disk, from tensors in memory named as in the model's Hugging
        Face checkpoint ((name, tensor) pairs or a dict; a trainer's `named_parameters()`). They
        may come in parts (buckets): each call's are kept, and the update applies, as from disk,
        with the call that completes the set (`weight_version` and `abort_all_requests` are that
        call's). A name the model is not loaded from, or a set that does not load (a shape), is a
        ValueError; the latter discards what was kept. Returns SGLang's reply, its message saying
        whether the weights changed and, until they do, how many tensors are still missing."""
        self._check_update_options(abort_all_requests, weight_version)
        with self._weights_lock:
            self._pending_tensors.add(named_tensors)
            missing = self._pending_tensors.num_missing
            if missing:
                return {"success": True, "num_paused_requests": 0,
                        "message": f"{len(self._pending_tensors.tensors)} tensors kept; the weights change once the "
                                   f"{missing} still missing have come"}
            staged = self.runner.stage_tensors(self._pending_tensors.take())
            paused = self._apply_staged(staged, abort_all_requests, weight_version)
        return {"success": True, "message": "weights updated from tensors", "num_paused_requests": paused}

    def _apply_staged(self, staged: StagedWeights, abort_all_requests: bool, weight_version: str | None) -> int:
        reason = {"type": "abort", "message": "aborted for a weight update"} if abort_all_requests else None
        return self.loop.call_when_idle(lambda: self._swap_weights(staged, weight_version), reason)

    @staticmethod
    def _check_update_options(abort_all_requests: object, weight_version: object) -> None:
        if weight_version is not None and not isinstance(weight_version, str):
            raise ValueError(f"weight_version must be a string, got {weight_version!r}")
        if not isinstance(abort_all_requests, bool):
            raise ValueError(f"abort_all_requests must be true or false, got {abort_all_requests!r}")

    def _swap_weights(self, staged: StagedWeights, version: str | None) -> int:
        """On the engine thread, no request holding KV: the old KV out, the new weights in."""
        cache = self.scheduler.cache
        cache.evict(cache.evictable_size(), self.runner.kv_pool.free)
        self.runner.apply_staged(staged)
        if version is not None:
            self.scheduler.weight_version = version
        return self.scheduler.num_waiting

    def update_weight_version(self, new_version: str, abort_all_requests: bool = True) -> None:
        """Name the weights served `new_version` without changing them (SGLang's; e.g. weights
        written into the engine by other means): requests admitted from now on carry the name.
        `abort_all_requests` (SGLang's default) first ends every request in flight, so no
        request runs under the old name."""
        if not isinstance(new_version, str):
            raise ValueError(f"new_version must be a string, got {new_version!r}")
        self._check_update_options(abort_all_requests, None)

        def rename() -> None:
            if abort_all_requests:
                self.loop.finish_all({"type": "abort", "message": "aborted for a weight version update"})
            self.scheduler.weight_version = new_version
        self.loop.call(rename)

    def pause_generation(self, mode: str = "abort") -> None:
        """Stop generating until continue_generation (SGLang's, e.g. around a weight update):
        `abort` ends every request in flight, `retract` sends the running back to the queue
        (their KV to the prefix cache), `in_place` stops stepping with the running keeping their
        KV. New requests wait in the queue meanwhile. ValueError for another mode."""
        self.loop.call(lambda: self.loop.pause(mode))

    def continue_generation(self) -> None:
        """Generate again after pause_generation."""
        self.loop.call(self.loop.resume)

    def get_weight_version(self) -> str:
        """The name of the weights served: "default", or the last update's `weight_version`
        (each result's meta_info names the one its request ran on)."""
        return self.scheduler.weight_version
