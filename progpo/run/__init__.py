"""What both backends and every CLI share: models, checkpoints, metrics, evaluation, env setup, HF
generation, the tiny test model, the embedding encoder and process start-up.

Imports ``agents``, ``envs`` and ``advantages`` (and starts the WebShop server as a process); never a
backend (``trainer``, ``openrlhf``), ``lab``, ``bench`` or ``cli``.
"""
