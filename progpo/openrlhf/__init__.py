"""The OpenRLHF 0.11.2 backend: agent executor, per-step samples generator, rank-equal batches
(``balance``), failed-episode accounting (``failures``), experience maker, PPO trainer, policy and
reference actors (``actors``), and the CPU mode (subpackage ``cpu``: every CPU stand-in and the engine).

The only package that imports ``openrlhf``. The local backend is :mod:`progpo.trainer`.
"""
