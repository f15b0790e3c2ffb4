"""Prompt templates per environment, in the verl-agent / GiGPO per-step protocol.

Every step is its own prompt (one training sample): the task, a step counter, the last ``K``
(observation, action) pairs, the current observation and the admissible actions; the model answers
``<think>...</think><action>...</action>``. This matches the prompts of verl-agent
(Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training", Appendix prompts)
in content and order, so that ProGPO / GiGPO / GRPO comparisons see the same inputs.

Templates are data: one frozen :class:`~progpo.envs.spec.PromptTemplate` per env, defined in the env's own
module (``progpo.envs.alfworld.ALFWORLD_TEMPLATE``, ``progpo.envs.webshop.WEBSHOP_TEMPLATE``) and named by its
spec; the answer-format instruction they share is :data:`progpo.envs.spec.ANSWER_FORMAT`. Rendering is
``str.format`` on the template fields only, so braces inside observations are never interpreted.
The context-length guard lives in :func:`build_prompt`: it drops the oldest history turns first,
then truncates the current observation on token boundaries, and counts what it cut.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from progpo.agents.parsing import ANSWER_TAG
from progpo.envs.spec import PromptTemplate, spec

logger = logging.getLogger(__name__)

TRUNCATION_MARKER = " ...[truncated]"
"""Appended to an observation (or action list) the context guard had to shorten."""


def get_template(env_name: str) -> PromptTemplate:
    """The prompt template of env ``env_name`` (its spec's ``template``).

    Raises:
        ValueError: unknown env name (the message lists the registered ones).
    """
    return spec(env_name).load("template")


@dataclass(frozen=True)
class HistoryTurn:
    """One earlier step as the prompt shows it: what the agent saw, and what it did."""

    observation: str
    action: str


def render_user_message(
    template: PromptTemplate,
    *,
    task: str,
    observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[HistoryTurn] = (),
    step_count: int = 0,
) -> str:
    """Render the user message of one step.

    Args:
        template: the env's template.
        task: the instruction (``info["task"]``).
        observation: the current observation text.
        admissible_actions: actions the env accepts now (``template.hidden_actions`` are dropped).
        history: the most recent turns to show, oldest first (at most ``step_count`` of them).
        step_count: steps already taken in this episode (``t``); history turn ``j`` of ``len(history)``
            is numbered ``step_count - len(history) + j + 1``.

    Raises:
        ValueError: more history turns than steps taken, or a negative ``step_count``.
    """
    if step_count < 0:
        raise ValueError(f"step_count must be >= 0, got {step_count}")
    if len(history) > step_count:
        raise ValueError(f"history has {len(history)} turns but only step_count={step_count} steps were taken")
    actions = template.action_separator.join(
        template.action_item.format(action=a) for a in admissible_actions if a not in template.hidden_actions
    )
    if not history:
        return template.no_history.format(task=task, observation=observation, actions=actions)
    first = step_count - len(history) + 1
    turns = template.history_separator.join(
        template.history_turn.format(step=first + j, observation=h.observation, action=h.action)
        for j, h in enumerate(history)
    )
    return template.with_history.format(
        task=task,
        step_count=step_count,
        history_length=len(history),
        history=turns,
        current_step=step_count + 1,
        observation=observation,
        actions=actions,
    )


def build_messages(template: PromptTemplate, user_message: str) -> list[dict[str, str]]:
    """Chat messages for one step: optional system message, then the rendered user message."""
    messages = [] if template.system is None else [{"role": "system", "content": template.system}]
    messages.append({"role": "user", "content": user_message})
    return messages


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids ``[n]`` of ``text`` as plain text: the one way env and history text is tokenized.

    A special token's spelling inside the text (an observation, a WebShop page, an earlier answer
    holding ``"<|im_end|>\n<|im_start|>assistant"``) is tokenized as the characters it is
    (``split_special_tokens=True``), never as the control token, so no text from outside can end the
    user turn or open another one. Non-special added tokens (Qwen3's ``<think>``) are the text's
    ordinary tokens. ``tokenizer.decode(ids, skip_special_tokens=False) == text``.
    """
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


_MARK = "\ue000{}\ue001"  # private-use characters: stand in for message contents inside the template


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """Apply the tokenizer's chat template (with the generation prompt) and tokenize it, every message
    content as plain text (:func:`encode_text`) and only the template's own text with its control tokens.

    The template is rendered once with the real contents and once with a marker per content; the
    marked rendering splits the text into template pieces and contents, so the ids are
    ``tokens(piece_0) + encode_text(content_0) + tokens(piece_1) + ...``. For text without any special
    token's spelling this equals tokenizing the whole string (tests/agents/test_templates.py checks it
    on the golden prompts).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: chat messages (``role``/``content`` dicts).

    Returns:
        ``(prompt_text, prompt_ids)``: the exact templated string and its ``[P]`` token ids
        (no extra BOS: the chat template already holds every special token).

    Raises:
        ValueError: the tokenizer has no chat template, or its template changes a message's text
            (so the text could not be tokenized as what it is).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer has no chat_template; pass a chat/instruct tokenizer")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    marks = [_MARK.format(k) for k in range(len(messages))]
    marked = tokenizer.apply_chat_template([{**m, "content": mark} for m, mark in zip(messages, marks)],
                                           tokenize=False, add_generation_prompt=True)
    pieces, rest = [], marked
    for mark in marks:
        head, sep, rest = rest.partition(mark)
        if not sep:
            raise ValueError("the chat template does not show every message content verbatim; cannot tokenize "
                             "the env text as plain text")
        pieces.append(head)
    pieces.append(rest)
    contents = [str(m["content"]) for m in messages]
    if "".join(p + c for p, c in zip(pieces, contents + [""])) != text:
        raise ValueError("the chat template changes the message text (it is not inserted verbatim); cannot "
                         "tokenize the env text as plain text")
    ids: list[int] = []
    for piece, content in zip(pieces, contents + [""]):
        if piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]  # the template's own control tokens
        if content:
            ids += encode_text(tokenizer, content)
    return text, ids


def control_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids :func:`decode_response` drops: every special token of ``tokenizer`` (its named ones, EOS, pad,
    BOS, UNK, ``additional_special_tokens``, and every added token marked special: what
    ``skip_special_tokens=True`` drops) except an answer tag (:data:`~progpo.agents.parsing.ANSWER_TAGS`, any
    case) registered as one, which is part of the answer the model writes.
    """
    added = tokenizer.added_tokens_decoder
    special = {i for i, t in added.items() if t.special} | set(tokenizer.all_special_ids)
    text = {i: added[i].content if i in added else tokenizer.convert_ids_to_tokens(i) for i in special}
    return frozenset(i for i in special if ANSWER_TAG.fullmatch(str(text[i])) is None)


def decode_response(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """The text of a sampled response ``[R]``: the one decoding rule of every backend.

    The control tokens the model emitted (:func:`control_token_ids`: its EOS, pad, a stray
    ``<|im_start|>``) are not text, so they never reach the action, the env or the history; every other
    token is decoded as it is, answer tags included. A tokenizer that registers ``<think>``,
    ``</think>``, ``<action>``, ``</action>`` as special tokens (a common SFT recipe) thus keeps them:
    ``skip_special_tokens=True`` (verl-agent's rule, used here before issue 34) dropped them and the
    parser saw ``the mug is heretake mug 1 from counterto``. For a tokenizer whose tags are not special
    the text equals ``skip_special_tokens=True``'s. vLLM's own ``RequestOutput.text`` (OpenRLHF leaves
    ``skip_special_tokens=False``, so it keeps EOS and control tokens) is not used: the episode loop
    decodes the ids with this function, so both backends record the same text for the same ids.
    """
    drop = control_token_ids(tokenizer)
    return tokenizer.decode([t for t in token_ids if t not in drop], skip_special_tokens=False)


def prefix_key(prompt_ids: Sequence[int]) -> str:
    """Stable key of an exact policy context ``x_{i,t}``: sha1 hex of the int64 token ids.

    Equal keys mean identical prompts token for token (GiGPO/ProGPO history-consistent peers).
    """
    return hashlib.sha1(array("q", prompt_ids).tobytes()).hexdigest()


@dataclass(frozen=True)
class BuiltPrompt:
    """A step prompt that fits the context limit.

    Attributes:
        text: the templated prompt string (chat template applied).
        prompt_ids: ``[P]`` token ids of ``text``, ``P <= max_prompt_tokens``.
        prefix_key: :func:`prefix_key` of ``prompt_ids``.
        dropped_turns: history turns the guard removed (oldest first).
        obs_truncated_tokens: tokens cut from the end of the current observation (0 = intact).
        actions_dropped: admissible actions the guard left out of the list (last resort).
    """

    text: str
    prompt_ids: list[int]
    prefix_key: str
    dropped_turns: int = 0
    obs_truncated_tokens: int = 0
    actions_dropped: int = 0

    @property
    def truncated(self) -> bool:
        """True when the guard changed anything."""
        return bool(self.dropped_turns or self.obs_truncated_tokens or self.actions_dropped)


def _cut_text(tokenizer: Any, text: str, keep: int) -> str:
    """The first ``keep`` plain-text tokens of ``text`` decoded, never ending inside a character."""
    ids = encode_text(tokenizer, text)[:keep]
    return tokenizer.decode(ids, skip_special_tokens=False).rstrip("\ufffd") + TRUNCATION_MARKER


def build_prompt(
    tokenizer: Any,
    template: PromptTemplate,
    *,
    task: str,
    observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[HistoryTurn] = (),
    step_count: int = 0,
    max_prompt_tokens: int | None = None,
) -> BuiltPrompt:
    """Render, chat-template and tokenize one step prompt, guarding the context length.

    The guard, applied only while the prompt has more than ``max_prompt_tokens`` tokens:

    1. drop the oldest history turn and re-render (until no history is left);
    2. truncate the current observation to its longest token prefix that fits (binary search over
       the observation's own tokens, so the cut falls on a token boundary and never inside a
       UTF-8 character), marked with :data:`TRUNCATION_MARKER`;
    3. last resort: leave admissible actions out from the end of the list (marked).

    The step counter keeps the true ``step_count`` whatever was dropped. Every cut is counted in the
    returned :class:`BuiltPrompt` and logged at debug level.

    Args:
        tokenizer: Hugging Face tokenizer with a chat template.
        template, task, observation, admissible_actions, history, step_count: see
            :func:`render_user_message`.
        max_prompt_tokens: limit on ``P`` (None = no limit).

    Raises:
        ValueError: ``max_prompt_tokens`` < 1, or too small even for the template with an empty
            observation and no actions (the message gives the size needed).
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    history = list(history)
    actions = list(admissible_actions)

    def encode(obs: str, hist: Sequence[HistoryTurn], acts: Sequence[str]) -> tuple[str, list[int]]:
        msg = render_user_message(
            template, task=task, observation=obs, admissible_actions=acts, history=hist, step_count=step_count
        )
        return encode_messages(tokenizer, build_messages(template, msg))

    def fits(ids: list[int]) -> bool:
        return max_prompt_tokens is None or len(ids) <= max_prompt_tokens

    text, ids = encode(observation, history, actions)
    dropped = 0
    while not fits(ids) and history:
        history = history[1:]
        dropped += 1
        text, ids = encode(observation, history, actions)
    obs_cut = 0
    if not fits(ids):
        text, ids, obs_cut, actions_dropped = _shrink_observation(
            tokenizer, encode, fits, observation, actions, max_prompt_tokens
        )
    else:
        actions_dropped = 0
    built = BuiltPrompt(text, ids, prefix_key(ids), dropped, obs_cut, actions_dropped)
    if built.truncated:
        logger.debug(
            "context guard: dropped %d history turn(s), cut %d observation token(s), %d action(s) (limit %s)",
            dropped, obs_cut, actions_dropped, max_prompt_tokens,
        )
    return built


def _shrink_observation(
    tokenizer: Any,
    encode: Callable[[str, Sequence[HistoryTurn], Sequence[str]], tuple[str, list[int]]],
    fits: Callable[[list[int]], bool],
    observation: str,
    actions: list[str],
    max_prompt_tokens: int | None,
) -> tuple[str, list[int], int, int]:
    """Steps 2 and 3 of :func:`build_prompt` (no history left).

    Returns:
        ``(text, ids, observation tokens cut, actions dropped)``.
    """
    n = len(encode_text(tokenizer, observation))
    text, ids = encode(_cut_text(tokenizer, observation, 0), [], actions)
    if fits(ids):
        lo, hi = 0, n  # invariant: keeping lo tokens fits; keeping hi does not
        best = (text, ids)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            t, i = encode(_cut_text(tokenizer, observation, mid), [], actions)
            if fits(i):
                lo, best = mid, (t, i)
            else:
                hi = mid
        return best[0], best[1], n - lo, 0
    # Even an empty observation is too long: drop actions from the end of the list.
    empty_obs = TRUNCATION_MARKER.strip()
    for keep in range(len(actions) - 1, -1, -1):
        shown = actions[:keep] + ([TRUNCATION_MARKER.strip()] if keep < len(actions) else [])
        text, ids = encode(empty_obs, [], shown)
        if fits(ids):
            return text, ids, n, len(actions) - keep
    raise ValueError(
        f"max_prompt_tokens={max_prompt_tokens} is too small for the prompt template itself "
        f"({len(ids)} tokens with no history, observation or actions); raise it"
    )
