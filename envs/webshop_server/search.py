"""BM25 product search with Lucene's defaults, without Java (bm25s + PyStemmer).

The original WebShop searches a pyserini (Lucene) index whose document text is, lower-cased,
``Title + " " + Description + " " + BulletPoints[0] + " " + option text`` where the option text is
``"name: v1, v2, and name2: ..."`` (``search_engine/convert_product_file_format.py``), analysed by
Lucene's English analyzer and ranked by Lucene's BM25 (k1 = 0.9, b = 0.4).

Here: the same document text; tokens are runs of word characters (one-character tokens kept) after
removing English possessives (``'s``), lower-cased, Lucene's 33 English stopwords removed, Porter
stemming (PyStemmer ``porter``). Score (Robertson et al. 1994; Lucene ``BM25Similarity``):

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

Differences from Lucene (documented in docs/webshop.md): Lucene's StandardTokenizer follows
Unicode word-break rules (keeps ``3.5`` or ``don't`` as one token) and stores document lengths in a
lossy one-byte norm; here lengths are exact. Hits are documents with a positive score, ordered by
score then ASIN, at most ``SEARCH_RETURN_N`` (50).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import orjson
import Stemmer

SEARCH_RETURN_N = 50
K1 = 0.9
B = 0.4
#: Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
_TOKEN = re.compile(r"\w+")
_POSSESSIVE = re.compile(r"['\u2019]s\b")
_local = threading.local()


def _stemmer() -> Any:
    st = getattr(_local, "stemmer", None)
    if st is None:
        st = _local.stemmer = Stemmer.Stemmer("porter")
    return st


def analyze(text: str) -> list[str]:
    """Text -> index terms (possessive removal, lower-case, \\w+ tokens, stopwords, Porter stems)."""
    text = _POSSESSIVE.sub("", text.lower())
    tokens = [t for t in _TOKEN.findall(text) if t not in LUCENE_STOPWORDS]
    return _stemmer().stemWords(tokens)


def document_text(product: dict[str, Any]) -> str:
    """The text the original indexes for a product (see module docstring)."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items()]
    bullets = product.get("BulletPoints") or [""]
    return " ".join([
        product["Title"], product["Description"], bullets[0] or "", ", and ".join(option_texts),
    ]).lower()



INDEX_FILES = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy",
               "vocab.index.json", "params.index.json")


class IndexBuilder:
    """Streaming BM25 index builder: ``add`` documents in order, then ``finish`` (Lucene BM25, as bm25s).

    Documents are tokenised in chunks of ``chunk_docs``; each chunk becomes (document, term,
    term frequency) triples, kept in memory or spilled to ``spill_dir`` as ``.npy`` files, so
    memory holds one chunk of text plus the vocabulary, whatever the number of documents.
    ``finish`` computes document frequencies, idf and the per-posting scores (the formula of the
    module docstring, in float64, stored float32 exactly as bm25s' ``method="lucene"`` does) and
    places them term-major into the CSC arrays bm25s saves and loads (``data``, ``indices``,
    ``indptr``), written as memory-mapped ``.npy`` files when a folder is given.

    Args:
        spill_dir: folder for the chunk files (None: keep chunks in memory).
        chunk_docs: documents per chunk.
    """

    def __init__(self, spill_dir: Path | None = None, chunk_docs: int = 20_000) -> None:
        self.vocab: dict[str, int] = {}
        self._raw: dict[str, int] = {}  # raw token -> term id, -1 for a stopword
        self._texts: list[list[str]] = []
        self._chunks: list[Any] = []  # (doc, term, tf) arrays, or paths of their .npz files
        self._doc_len: list[np.ndarray] = []
        self._df = np.zeros(0, dtype=np.int64)
        self.num_docs = self.num_postings = 0
        self.spill_dir, self.chunk_docs = spill_dir, chunk_docs

    def add(self, text: str) -> None:
        """Append one document (its text as ``document_text`` makes it)."""
        self._texts.append(_TOKEN.findall(_POSSESSIVE.sub("", text.lower())))
        if len(self._texts) >= self.chunk_docs:
            self._flush()

    def _flush(self) -> None:
        if not self._texts:
            return
        raw, stem = self._raw, _stemmer().stemWord
        for token in sorted(set().union(*self._texts).difference(raw)):  # ids independent of hash seed
            raw[token] = -1 if token in LUCENE_STOPWORDS else self.vocab.setdefault(stem(token), len(self.vocab))
        lens = np.fromiter(map(len, self._texts), dtype=np.int64, count=len(self._texts))
        ids = np.fromiter(map(raw.__getitem__, itertools.chain.from_iterable(self._texts)),
                          dtype=np.int64, count=int(lens.sum()))
        docs = np.repeat(np.arange(len(self._texts), dtype=np.int64), lens)
        keep = ids >= 0
        ids, docs = ids[keep], docs[keep]
        self._doc_len.append(np.bincount(docs, minlength=len(self._texts)))
        vocab_size = len(self.vocab)
        keys, tf = np.unique(docs * vocab_size + ids, return_counts=True)
        doc = (keys // vocab_size + self.num_docs).astype(np.int32)
        term = (keys % vocab_size).astype(np.int32)
        if len(self._df) < vocab_size:
            self._df = np.concatenate([self._df, np.zeros(vocab_size - len(self._df), dtype=np.int64)])
        self._df[:vocab_size] += np.bincount(term, minlength=vocab_size)
        chunk = (doc, term, tf.astype(np.int32))
        if self.spill_dir is not None:
            path = Path(self.spill_dir) / f"chunk{len(self._chunks):05d}.npz"
            np.savez(path, doc=doc, term=term, tf=chunk[2])
            chunk = path
        self._chunks.append(chunk)
        self.num_docs += len(self._texts)
        self._texts = []

    def _chunk(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        chunk = self._chunks[i]
        if isinstance(chunk, Path):
            with np.load(chunk) as z:
                return z["doc"], z["term"], z["tf"]
        return chunk

    def finish(self, folder: Path | None = None) -> dict[str, Any]:
        """Score and place every posting; write bm25s files into ``folder`` when given.

        Returns:
            ``{"data": float32 [nnz], "indices": int32 [nnz] (document ids), "indptr": int64 [V + 1],
            "num_docs": N, "vocab": {stem: term id}}``; arrays memory-mapped when ``folder`` is given.

        Raises:
            ValueError: no documents were added.
        """
        self._flush()
        if self.num_docs == 0:
            raise ValueError("IndexBuilder needs at least one document")
        n, df = self.num_docs, self._df
        doc_len = np.concatenate(self._doc_len).astype(np.float64)
        avgdl = doc_len.mean()
        idf = np.zeros(len(df), dtype=np.float32)
        present = df > 0
        idf[present] = np.log(1 + (n - df[present] + 0.5) / (df[present] + 0.5))
        indptr = np.zeros(len(df) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        nnz = self.num_postings = int(indptr[-1])
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            open_mm = np.lib.format.open_memmap
            data = open_mm(folder / INDEX_FILES[0], mode="w+", dtype=np.float32, shape=(nnz,))
            indices = open_mm(folder / INDEX_FILES[1], mode="w+", dtype=np.int32, shape=(nnz,))
        else:
            data, indices = np.empty(nnz, dtype=np.float32), np.empty(nnz, dtype=np.int32)
        filled = np.zeros(len(df), dtype=np.int64)
        for i in range(len(self._chunks)):
            doc, term, tf = self._chunk(i)
            tf64 = tf.astype(np.float64)
            tfc = tf64 / (K1 * ((1 - B) + B * doc_len[doc] / avgdl) + tf64)  # bm25s' lucene tfc
            score = (idf[term].astype(np.float64) * tfc).astype(np.float32)
            order = np.argsort(term, kind="stable")  # keeps document order inside each term
            term_sorted = term[order]
            uniq, first, counts = np.unique(term_sorted, return_index=True, return_counts=True)
            rank = np.arange(len(order)) - np.repeat(first, counts)
            pos = indptr[term_sorted] + filled[term_sorted] + rank
            data[pos] = score[order]
            indices[pos] = doc[order]
            filled[uniq] += counts
            if isinstance(self._chunks[i], Path):
                self._chunks[i].unlink()
        out = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n, "vocab": self.vocab}
        if folder is not None:
            data.flush()
            indices.flush()
            np.save(folder / INDEX_FILES[2], indptr)
            with open(folder / INDEX_FILES[3], "wb") as f:
                f.write(orjson.dumps(self.vocab))
            params = {"k1": K1, "b": B, "delta": 0.5, "method": "lucene", "idf_method": "lucene",
                      "dtype": "float32", "int_dtype": "int32", "num_docs": n, "version": bm25s.__version__,
                      "backend": "numpy"}
            (folder / INDEX_FILES[4]).write_text(json.dumps(params, indent=4))
        return out


class SearchIndex:
    """BM25 index over products (Lucene parameters), in memory or memory-mapped from bm25s files.

    Args:
        products: product dicts (``asin``, ``Title``, ``Description``, ``BulletPoints``, ``options``);
            the index is built in memory with ``IndexBuilder``.

    Raises:
        ValueError: no products.
    """

    def __init__(self, products: Sequence[dict[str, Any]]) -> None:
        if not products:
            raise ValueError("SearchIndex needs at least one product")
        builder = IndexBuilder()
        for p in products:
            builder.add(document_text(p))
        asins = [p["asin"] for p in products]
        self._set(builder.finish(), asins, asin_ranks(asins))

    def _set(self, arrays: dict[str, Any], asins: Sequence[str], asin_rank: np.ndarray) -> None:
        if len(asins) != arrays["num_docs"] or len(asin_rank) != len(asins):
            raise ValueError(f"index holds {arrays['num_docs']} documents, catalog {len(asins)}")
        self.asins = asins
        self._data, self._indices, self._indptr = arrays["data"], arrays["indices"], arrays["indptr"]
        self._vocab = arrays["vocab"]
        self._asin_rank = asin_rank
        self.num_docs = int(arrays["num_docs"])

    @classmethod
    def load(cls, folder: Path, asins: Sequence[str], asin_rank: np.ndarray | None = None) -> "SearchIndex":
        """An index written by ``IndexBuilder.finish(folder)`` (bm25s format), memory-mapped.

        Args:
            asins: ASIN of each document, in index order; ``asin_rank``: their ranks in sorted order
                (computed when None).

        Raises:
            ValueError: the saved index does not fit ``asins``.
        """
        retriever = bm25s.BM25.load(str(folder), mmap=True)
        self = cls.__new__(cls)
        arrays = dict(retriever.scores, vocab=retriever.vocab_dict)
        self._set(arrays, asins, asin_ranks(asins) if asin_rank is None else asin_rank)
        return self

    def _terms(self, query: str) -> list[int]:
        return [t for t in map(self._vocab.get, analyze(query)) if t is not None]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every product for ``query``; float32 ``[n_products]``.

        Postings of one term hold each document once, so a plain indexed add accumulates them.
        """
        return self._accumulate(self._terms(query))

    def _accumulate(self, terms: list[int]) -> np.ndarray:
        scores = np.zeros(self.num_docs, dtype=np.float32)
        for t in terms:
            lo, hi = self._indptr[t], self._indptr[t + 1]
            scores[self._indices[lo:hi]] += self._data[lo:hi]
        return scores

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the top ``k`` products with a positive score, by score then ASIN.

        The candidates are the documents scoring at least the ``k``-th best score among the
        postings of one query term (the rarest with ``k`` or more postings): a lower bound of the
        overall ``k``-th best score, so the candidates hold the top ``k`` and ties, and the
        selection touches a few thousand documents instead of every one with a positive score.
        """
        terms = self._terms(query)
        scores = self._accumulate(terms)
        df = {t: int(self._indptr[t + 1] - self._indptr[t]) for t in terms}
        probe = min((t for t in df if df[t] >= k), key=df.__getitem__, default=None)
        if probe is None:  # every term is rare: few documents score at all
            hits = np.flatnonzero(scores > 0)
        else:
            sample = scores[self._indices[self._indptr[probe]:self._indptr[probe + 1]]]
            hits = np.flatnonzero(scores >= np.partition(sample, len(sample) - k)[len(sample) - k])
        if hits.size == 0:
            return []
        order = np.lexsort((self._asin_rank[hits], -scores[hits]))
        return [str(self.asins[i]) for i in hits[order[:k]]]


def asin_ranks(asins: Sequence[str]) -> np.ndarray:
    """Rank of each ASIN in sorted order; int64 ``[n]`` (ties in search are broken by it)."""
    order = sorted(range(len(asins)), key=asins.__getitem__)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def _builder_worker(conn: Any, spill_dir: str | None, chunk_docs: int) -> None:
    """Child process of ``BackgroundIndexBuilder``: builds the index from the texts it receives."""
    builder = IndexBuilder(Path(spill_dir) if spill_dir else None, chunk_docs)
    try:
        while (texts := conn.recv()) is not None:
            for text in texts:
                builder.add(text)
        folder = conn.recv()
        builder.finish(Path(folder))
        conn.send({"num_docs": builder.num_docs, "vocab": len(builder.vocab), "postings": builder.num_postings})
    except EOFError:  # the parent is gone: nothing to finish
        pass
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send({"error": f"{type(e).__name__}: {e}"})


class BackgroundIndexBuilder:
    """``IndexBuilder`` in a child process: ``add`` ships texts in chunks, so tokenising and
    indexing run on a second core while the caller parses (same files as ``IndexBuilder``).

    Raises:
        RuntimeError: (from ``add``/``finish``) the child failed, with its error.
    """

    def __init__(self, spill_dir: Path | None = None, chunk_docs: int = 20_000) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a clean interpreter, not a copy of the caller's memory
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_builder_worker, args=(child, str(spill_dir) if spill_dir else None,
                                                                chunk_docs), daemon=True, name="bm25-builder")
        self._proc.start()
        child.close()
        self._texts: list[str] = []
        self.chunk_docs = chunk_docs
        self.num_docs = self.num_postings = 0
        self.vocab_size = 0

    def _send(self, obj: Any) -> None:
        try:
            self._conn.send(obj)
        except (BrokenPipeError, EOFError, OSError) as e:
            raise RuntimeError(f"BM25 index builder process died (exit code {self._proc.exitcode}): {e}") from None

    def add(self, text: str) -> None:
        """Queue one document (its text as ``document_text`` makes it)."""
        self._texts.append(text)
        if len(self._texts) >= self.chunk_docs:
            self._send(self._texts)
            self._texts = []

    def finish(self, folder: Path) -> dict[str, int]:
        """Finish and write the index into ``folder``; returns its sizes."""
        if self._texts:
            self._send(self._texts)
        self._send(None)
        self._send(str(folder))
        try:
            out = self._conn.recv()
        except EOFError:
            out = {"error": f"exit code {self._proc.exitcode}"}
        self._proc.join()
        if "error" in out:
            raise RuntimeError(f"BM25 index builder process failed: {out['error']}")
        self.num_docs, self.vocab_size, self.num_postings = out["num_docs"], out["vocab"], out["postings"]
        return out

    def close(self) -> None:
        """Stop the child (after an error in the caller)."""
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
