"""The sentence encoder for ProGPO's semantic expansion, loaded only when an estimator first calls it."""

from __future__ import annotations

import time

import numpy as np


class LazyEncoder:
    """``list[str] -> np.ndarray [n, dim]`` unit vectors: ``progpo.advantages.embeddings.default_encoder()``
    (all-MiniLM-L6-v2, offline, CPU), loaded on the first call so that runs whose estimator never
    embeds anything pay nothing. ``seconds`` accumulates load + encode time.
    """

    def __init__(self) -> None:
        self._encoder = None
        self.seconds = 0.0

    def __call__(self, texts: list[str]) -> np.ndarray:
        t0 = time.perf_counter()
        if self._encoder is None:
            from progpo.advantages.embeddings import default_encoder

            self._encoder = default_encoder()
        out = np.asarray(self._encoder(list(texts)))
        self.seconds += time.perf_counter() - t0
        return out
