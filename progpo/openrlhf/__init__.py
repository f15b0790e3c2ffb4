"""The OpenRLHF 0.11.2 backend: agent executor, per-step samples generator, experience maker, PPO trainer
and policy actors, and the CPU mode (subpackage ``cpu``: every CPU stand-in and the engine).

The only package that imports ``openrlhf``. The local backend is :mod:`progpo.trainer`.
"""
