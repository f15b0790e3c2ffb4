"""The local backend: Hugging Face ``generate`` rollouts and a PyTorch/DeepSpeed PPO update on one
machine (loop, actor, update, PPO loss, SFT, progress).

The OpenRLHF (Ray + vLLM + DeepSpeed) backend lives beside it in :mod:`progpo.openrlhf`, the only
package that imports ``openrlhf``; what both share is :mod:`progpo.run`.
"""
