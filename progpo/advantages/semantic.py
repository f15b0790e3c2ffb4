"""Semantic expansion of small depth-0 pools (spec component (4)) and node merging for E1.

An *encoder* is any callable ``list[str] -> np.ndarray [n, dim]`` of unit vectors. Each unique
anchor-observation text of the batch is embedded once. Candidates of a step are the steps of the same
task (and, with ``state_key='obs_inventory'``, the same inventory: inventory is discrete state, not
text to be paraphrased) whose observation embedding has cosine similarity ``>= tau``; each candidate
weighs its similarity (identical text: exactly 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from progpo.advantages._prep import Prepared, combine, factorize, group_stats

logger = logging.getLogger(__name__)

Encoder = Callable[[list[str]], np.ndarray]


def embed_unique(p: Prepared, encoder: Encoder) -> np.ndarray:
    """``[n_text, dim]`` unit embeddings of the batch's unique anchor texts (row = ``p.obs_code()``).

    Raises:
        ValueError: the encoder returned the wrong shape or non-finite / zero vectors.
    """
    if "emb" in p.cache:
        return p.cache["emb"]
    p.obs_code()
    table = p.cache["obs"]
    texts_sorted = p.batch.anchor_obs[p.order]
    first_row = np.full(table[1], -1, dtype=np.int64)
    codes = p.obs_code()
    first_row[codes[::-1]] = np.arange(p.S)[::-1]
    texts = [str(texts_sorted[i]) for i in first_row]
    p.cache["emb"] = embed_texts(encoder, texts)
    return p.cache["emb"]


def embed_texts(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """``[len(texts), dim]`` unit vectors of ``texts`` from ``encoder`` (checked and normalised).

    Raises:
        ValueError: the encoder returned the wrong shape or non-finite / zero vectors.
    """
    out = encoder(texts)
    try:
        emb = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError) as e:  # strings, ragged rows, None items
        raise ValueError(f"encoder returned {type(out).__name__} that is not a float array [n, dim]: {e}") from None
    if emb.ndim != 2 or emb.shape[0] != len(texts):
        raise ValueError(f"encoder returned shape {emb.shape}, expected ({len(texts)}, dim)")
    norm = np.linalg.norm(emb, axis=1, keepdims=True)
    if not np.all(np.isfinite(emb)) or np.any(norm == 0):
        raise ValueError("encoder returned non-finite or zero vectors")
    return emb / norm


def _domain(p: Prepared) -> np.ndarray:
    """``[S]`` expansion domain: task, or (task, inventory) with ``state_key='obs_inventory'``."""
    if p.cfg.state_key == "obs_inventory":
        return combine(p.task, p.extra_code())[0]
    return p.task


def expand_depth0(p: Prepared, encoder: Encoder, need: np.ndarray, loo: bool):
    """Similarity-weighted depth-0 pool statistics for the steps in ``need`` (spec (4)).

    Args:
        need: ``[S]`` bool, steps whose exact depth-0 pool has fewer than ``min_peers`` members.
        loo: leave the step's own trajectory out of its pool.
    Returns:
        (rows ``[Q]``, n_eff ``[Q]``, mu ``[Q]``, ssd ``[Q]``, used ``[Q]`` bool): weighted mean
        ``sum w G / sum w``, effective size ``(sum w)^2 / sum w^2``, ``ssd = n_eff * sum w (G-mu)^2 / sum w``
        (so that ``(n-1) s2`` of the unweighted case becomes ``ssd``), ``used`` = some other text joined.
        ``n_eff = 0`` where the pool is empty (loo only).
    """
    emb = embed_unique(p, encoder)
    rows = np.flatnonzero(need)
    node, n_nodes = p.depth_keys(0)[0]
    text = p.obs_code()
    dom = _domain(p)
    # Node-level sums of x = G - task mean (centred: keeps the one-pass variance accurate).
    task_mean = group_stats(p.task, p.n_tasks, p.G)[1]  # exact when the task's G are all equal
    x = p.G - task_mean[p.task]
    c_node = np.bincount(node, minlength=n_nodes).astype(np.float64)
    s1_node = np.bincount(node, weights=x, minlength=n_nodes)
    s2_node = np.bincount(node, weights=x * x, minlength=n_nodes)
    node_text = np.zeros(n_nodes, dtype=np.int64)
    node_text[node] = text
    node_dom = np.zeros(n_nodes, dtype=np.int64)
    node_dom[node] = dom
    v1 = np.zeros(len(rows))
    v2 = np.zeros(len(rows))
    s1 = np.zeros(len(rows))
    s2 = np.zeros(len(rows))
    off = np.zeros(len(rows))
    q_nodes = node[rows]
    q_dom = dom[rows]
    # One similarity product for all queried texts against all texts (a few large BLAS calls are
    # much cheaper than one small call per task on a busy machine).
    q_texts, q_pos = np.unique(node_text[q_nodes], return_inverse=True)
    sim = emb[q_texts] @ emb.T  # [unique queried texts, all texts]
    for d in np.unique(q_dom):
        sel = np.flatnonzero(q_dom == d)
        cols = np.flatnonzero(node_dom == d)
        w = sim[q_pos.reshape(-1)[sel][:, None], node_text[cols][None, :]]
        w = np.where(w >= p.cfg.tau, w, 0.0)
        same = q_nodes[sel][:, None] == cols[None, :]
        w[same] = 1.0
        v1[sel] = w @ c_node[cols]
        v2[sel] = (w * w) @ c_node[cols]
        s1[sel] = w @ s1_node[cols]
        s2[sel] = w @ s2_node[cols]
        off[sel] = np.where(same, 0.0, w) @ c_node[cols]
    if loo:
        v1, v2, s1, s2, off = _subtract_own(p, emb, node, node_text, dom, rows, x, (v1, v2, s1, s2, off))
    n_eff = np.divide(v1 * v1, v2, out=np.zeros_like(v1), where=v2 > 0)
    mx = np.divide(s1, v1, out=np.zeros_like(v1), where=v1 > 0)
    bvar = np.maximum(np.divide(s2, v1, out=np.zeros_like(v1), where=v1 > 0) - mx * mx, 0.0)
    mu = task_mean[p.task[rows]] + mx
    return rows, n_eff, mu, n_eff * bvar, off > 0


def _subtract_own(p, emb, node, node_text, dom, rows, x, sums):
    """Remove each queried step's own-trajectory steps from its weighted sums (loo pools)."""
    v1, v2, s1, s2, off = (a.copy() for a in sums)
    starts = np.flatnonzero(p.first)
    q_traj = p.traj[rows]
    lens = p.traj_len[q_traj]
    q_rep = np.repeat(np.arange(len(rows)), lens)
    member = np.repeat(starts[q_traj], lens) + (np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens))
    qn, mn = node[rows][q_rep], node[member]
    w = np.einsum("ij,ij->i", emb[node_text[qn]], emb[node_text[mn]])
    w = np.where((w >= p.cfg.tau) & (dom[rows][q_rep] == dom[member]), w, 0.0)
    w[qn == mn] = 1.0
    n_q = len(rows)
    v1 -= np.bincount(q_rep, weights=w, minlength=n_q)
    v2 -= np.bincount(q_rep, weights=w * w, minlength=n_q)
    s1 -= np.bincount(q_rep, weights=w * x[member], minlength=n_q)
    s2 -= np.bincount(q_rep, weights=w * x[member] ** 2, minlength=n_q)
    off -= np.bincount(q_rep, weights=np.where(qn == mn, 0.0, w), minlength=n_q)
    # Weights are >= tau, so a non-empty pool has v1 >= tau: below half of it is rounding residue.
    tiny = 0.5 * p.cfg.tau
    for a, floor in ((v1, tiny), (v2, tiny * tiny), (off, tiny)):
        a[a < floor] = 0.0
    s1[v1 == 0] = 0.0
    s2[v1 == 0] = 0.0
    return v1, v2, s1, s2, off


def merge_nodes(p: Prepared, encoder: Encoder, cut: np.ndarray | None = None):
    """Graph nodes for E1: depth-0 states merged into connected components of similarity ``>= tau``
    (same task/inventory domain; identical texts have similarity exactly 1).

    ``cut`` (sorted rows of truncated last steps, with ``StepBatch.final_obs``): each one's final
    observation joins the same merging as a vertex of its step's domain (the last step's inventory), so
    a paraphrase of an anchor state lands in that state's node, exactly as an anchor observation would
    (not only by exact text). A final observation may thereby link
    two components, as any observation would.

    Returns:
        (node ``[S]`` dense codes, merged ``[S]`` bool: the step's node holds more than one observation
        text, fin ``[len(cut)]``: node of each final observation, -1 when its component holds no anchor
        state of the task (a node without data, value 0)).
    """
    emb = embed_unique(p, encoder)
    state, n_state = p.depth_keys(0)[0]
    text = p.obs_code()
    dom = _domain(p)
    st_text = np.zeros(n_state, dtype=np.int64)
    st_text[state] = text
    st_dom = np.zeros(n_state, dtype=np.int64)
    st_dom[state] = dom
    cut = np.zeros(0, dtype=np.int64) if cut is None else cut
    fin_text, emb = _final_texts(p, encoder, emb, cut)
    v_text = np.r_[st_text, fin_text]  # vertices: the anchor states, then the final observations
    v_dom = np.r_[st_dom, dom[cut]]
    label = np.arange(len(v_text))
    for d in np.unique(v_dom):
        ids = np.flatnonzero(v_dom == d)
        if len(ids) < 2:
            continue
        t_ids = v_text[ids]
        sim = emb[t_ids] @ emb[t_ids].T
        adj = (sim >= p.cfg.tau) | (t_ids[:, None] == t_ids[None, :])
        lab = np.arange(len(ids))
        while True:  # min-label propagation to a fixed point = connected components
            new = np.min(np.where(adj, lab[None, :], len(ids)), axis=1)
            new = np.minimum(new, lab)
            if np.array_equal(new, lab):
                break
            lab = new[new]
        label[ids] = ids[lab]
    merged_state = label[state]
    codes, _ = factorize(merged_state)
    n_text = np.bincount(label[:n_state], minlength=n_state)
    # a component's label is its smallest vertex id: an anchor state (< n_state) when it holds one
    node_of_label = np.full(len(v_text), -1, dtype=np.int64)
    node_of_label[merged_state] = codes
    fin = node_of_label[label[n_state:]]
    return codes, n_text[merged_state] > 1, fin


def _final_texts(p: Prepared, encoder: Encoder, emb: np.ndarray, cut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Text codes of the final observations of rows ``cut`` (anchor texts keep their code; new texts get
    new codes, embedded once) and the embeddings of all codes ``[n_text + new, dim]``."""
    if len(cut) == 0:
        return np.zeros(0, dtype=np.int64), emb
    anchors = p.batch.anchor_obs[p.order]
    code_of = dict(zip(anchors.tolist(), p.obs_code().tolist()))
    finals = [str(x) for x in p.batch.final_obs[p.order][cut]]
    new = [t for t in dict.fromkeys(finals) if t not in code_of]
    for k, t in enumerate(new):
        code_of[t] = emb.shape[0] + k
    if new:
        emb = np.vstack([emb, embed_texts(encoder, new)])
    return np.array([code_of[t] for t in finals], dtype=np.int64), emb
