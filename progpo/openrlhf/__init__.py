"""The OpenRLHF 0.11.2 backend: agent executor (``agent``), per-step samples generator (``samples``),
rank-equal batches (``balance``), failed-episode accounting (``failures``), experience maker
(``experience``), PPO trainer (``trainer``), policy and reference actors (``actors``), the launch
(``launch``: our flags, their checks, task files, Ray start) and the CPU mode (subpackage ``cpu``: every
CPU stand-in and the engine, applied only with ``--rollout.backend hf``).

The only package that imports ``openrlhf``. The local backend is :mod:`progpo.trainer`; what both
share is :mod:`progpo.run`.
"""
