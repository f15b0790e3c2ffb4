"""A scripted ``GenerateFn``: no model, a Python policy maps the prompt text to the response.

Used by tests and by benchmarks that measure the env / episode-loop side alone. The responses are
real token ids of the given tokenizer; their logprobs are 0.0 (the script is deterministic, so
every sampled token has probability 1 under it). An answer longer than ``max_new_tokens`` is cut
there (``finish_reason`` "length"), as a sampled one would be.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from progpo.agents.templates import decode_response, encode_text
from progpo.agents.types import Generation, SamplingParams


class ScriptedGenerate:
    """``await gen(prompt_ids, sampling) -> Generation`` driven by ``policy(prompt_text) -> str``.

    Args:
        tokenizer: decodes the prompt for the policy and encodes its answer as plain text
            (``progpo.agents.templates.encode_text``; an expert's query copied from the task stays text).
        policy: maps the decoded prompt (chat template included) to the response text.
        append_eos: end the response ids with the tokenizer's EOS id, as a sampled answer would.

    Attributes:
        calls: ``(prompt_ids, sampling)`` of every request, in arrival order (for tests).
    """

    def __init__(self, tokenizer: Any, policy: Callable[[str], str], append_eos: bool = True) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.append_eos = append_eos
        self.calls: list[tuple[list[int], SamplingParams]] = []

    async def __call__(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        self.calls.append((list(prompt_ids), sampling))
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        text = self.policy(prompt)
        ids = encode_text(self.tokenizer, text)  # the answer is text: a spelled control token stays text
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if self.append_eos and eos is not None:
            ids.append(int(eos))
        cut = len(ids) > sampling.max_new_tokens
        ids = ids[: sampling.max_new_tokens]
        return Generation(
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            text=decode_response(self.tokenizer, ids),
            finish_reason="length" if cut else "stop",
        )


_ASIN_CLICK = re.compile(r"^click\[b[0-9a-z]{9}\]$")


def admissible_from_prompt(prompt: str) -> list[str]:
    """The quoted admissible actions of the last action list in a rendered prompt."""
    block = prompt.rsplit("admissible actions in the current situation are:", 1)[-1]
    return re.findall(r"'([^']*)'", block.split("].", 1)[0])


def webshop_shopper(prompt: str) -> str:
    """A scripted WebShop policy: search the task's words, open the first product, buy it.

    Returns the response in the answer format (``<think>...</think><action>...</action>``).
    """
    actions = admissible_from_prompt(prompt)
    if "search[<your query>]" in actions:
        m = re.search(r"Your task is to: (.*?)\.?\n", prompt)
        action = f"search[{m.group(1) if m else 'item'}]"
    elif any(_ASIN_CLICK.match(a) for a in actions):
        action = next(a for a in actions if _ASIN_CLICK.match(a))
    elif "click[buy now]" in actions:
        action = "click[buy now]"
    else:
        action = actions[0] if actions else "click[back to search]"
    return f"<think>shop</think><action>{action}</action>"
