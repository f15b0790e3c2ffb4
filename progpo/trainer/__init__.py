"""The local backend: Hugging Face ``generate`` rollouts and a PyTorch/DeepSpeed PPO update on one machine.

The OpenRLHF (Ray + vLLM + DeepSpeed) backend lives beside it in :mod:`progpo.openrlhf`, the only
package that imports ``openrlhf``.
"""
