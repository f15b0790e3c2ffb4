"""The single-process rendezvous of the local backend cannot lose a race for a TCP port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

SCRIPT = """
import socket, sys, torch
import progpo.trainer.actor as actor
held = int(sys.argv[1])
actor._free_port = lambda: held  # the port another process took between the pick and the bind
actor.init_single_process_distributed()
t = torch.ones(2)
torch.distributed.all_reduce(t)
print("world", torch.distributed.get_world_size(), "sum", float(t.sum()))
"""


def test_a_taken_port_does_not_stop_the_single_process_rendezvous(tmp_path):
    with socket.socket() as taken:  # a listening socket holds the port the trainer would pick
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE",
                                                                  "LOCAL_RANK")}
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(taken.getsockname()[1])], env=env, cwd=os.getcwd(),
                             capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "world 1 sum 2.0" in out.stdout
