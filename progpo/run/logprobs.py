"""Token log-probabilities and entropies of a causal LM, the one implementation both backends use.

Dimension names: ``B`` samples (steps) in a micro-batch, ``L`` padded token length (prompt + response),
``V`` vocabulary. Log-probs and entropies are in nats and fp32 (the logits are cast before the softmax).

Used by the local actor (:mod:`progpo.trainer.actor`: old, reference and update passes, SFT) and by the
OpenRLHF path's weight-sync probe (:class:`progpo.openrlhf.sync_probe.ActorScorer`); both sit one layer
above, and may not import each other. The same math as OpenRLHF 0.11.2: :func:`entropy_from_logits` is
``openrlhf.models.utils.compute_entropy``, :func:`sequence_logprobs` its ``log_probs_from_logits`` on
temperature-scaled logits (``tests/openrlhf/test_loss_parity.py`` compares them).
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy (nats) of ``softmax(logits)``: ``[B, L, V] -> [B, L]``.

    ``H = logsumexp(z) - sum_v softmax(z)_v z_v`` (= ``-sum_v p_v log p_v``), in fp32.
    """
    z = logits.float()
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - torch.sum(p * z, dim=-1)


def sequence_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      temperature: float = 1.0, with_entropy: bool = False, start: int = 1):
    """Log-probability of each token given its prefix, computed only from position ``start`` on.

    Only the logits that score tokens ``start..L-1`` are materialised (HF ``logits_to_keep``), so the
    long prompt part of a step costs no ``[L, V]`` softmax: pass ``start`` = the shortest prompt
    length of the micro-batch.

    Args:
        model: causal LM (HF model or DeepSpeed engine). input_ids, attention_mask: ``[B, L]`` (right-padded).
        temperature: logits are divided by it (the sampling temperature; 1.0 = the raw policy).
        with_entropy: also return the entropy of each scored position's distribution.
        start: first token position to score (>= 1).

    Returns:
        ``logprobs [B, L]`` (fp32, nats) where ``logprobs[:, j]`` scores token ``j`` (0 for ``j < start``), and
        ``entropy [B, L]`` aligned the same way (or None).
    """
    length = input_ids.shape[1]
    start = max(1, min(int(start), length - 1))
    keep = length - start + 1
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=keep).logits
    logits = logits[:, -keep:-1].float() / temperature  # positions start-1 .. L-2 predict tokens start .. L-1
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = torch.gather(logp_all, -1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)
    lp = torch.nn.functional.pad(lp, (start, 0))
    ent = None
    if with_entropy:
        ent = torch.nn.functional.pad(entropy_from_logits(logits), (start, 0))
    return lp, ent
