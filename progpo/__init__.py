"""ProGPO: step-level, critic-free, group-based RL advantage estimation for multi-turn LLM agents.

Sub-packages, each importing only those below it: ``cli`` (entry points) -> ``bench`` / ``lab``
(benchmarks; the credit-assignment lab) -> ``trainer`` / ``openrlhf`` (the local and the OpenRLHF
backend) -> ``run`` (what both backends share) -> ``agents`` (prompts, parsing, episode loop) ->
``envs`` (text environments) -> ``advantages`` (pure estimators).
"""

__version__ = "0.1.0"
