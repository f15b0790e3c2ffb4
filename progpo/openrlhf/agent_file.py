"""The file ``--train.agent_func_path`` points to (``python -m progpo.cli.train_ray`` sets it).

OpenRLHF 0.11.2 loads the agent file with ``importlib.util.spec_from_file_location`` under the name
``agent_module`` without registering it in ``sys.modules``; dataclasses with postponed annotations
cannot be defined in such a module. So this file only re-exports the executor from the normally
imported ``progpo.openrlhf.agent`` (``progpo`` must be importable on every Ray worker:
installed, or inside the job's ``working_dir``).
"""

from progpo.openrlhf.agent import AgentExecutor

__all__ = ["AgentExecutor"]
