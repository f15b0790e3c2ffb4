"""Start of a process that trains or evaluates (``train``, ``sft``, ``evaluate``, the benchmarks):
logging, offline Hugging Face defaults, and a SIGTERM / Ctrl-C unwind that stops a running decode."""

from __future__ import annotations

import logging
import os
import signal
import sys


def setup_logging(level: str = "INFO") -> None:
    """Log to stderr; keep DeepSpeed / HTTP libraries at WARNING."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for name in ("DeepSpeed", "deepspeed", "httpx", "urllib3", "sentence_transformers", "werkzeug"):
        logging.getLogger(name).setLevel(logging.WARNING)


def unwind_on_sigterm() -> None:
    """Make SIGTERM (kill, job schedulers) unwind like Ctrl-C, so context managers stop the WebShop
    server and the env pool instead of leaving them running. Both signals also stop a running decode
    at its next token (``generation.request_stop``); the unwind used to wait for the whole batch."""
    from progpo.run.generation import request_stop

    def on_sigterm(signum, frame):
        request_stop()
        sys.exit(128 + signum)

    def on_sigint(signum, frame):
        request_stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)


def prepare_process() -> None:
    """Start of a training CLI (``train``, ``sft``): offline Hugging Face and quiet tokenizers unless
    the environment says otherwise, logging at ``$PROGPO_LOG_LEVEL`` (INFO), and the signal unwind."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    setup_logging(os.environ.get("PROGPO_LOG_LEVEL", "INFO"))
    unwind_on_sigterm()
