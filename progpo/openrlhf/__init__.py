"""The OpenRLHF 0.11.2 backend: agent executor, per-step samples generator, experience maker and PPO trainer actor.

The only package that imports ``openrlhf``. The local backend is :mod:`progpo.trainer`.
"""
