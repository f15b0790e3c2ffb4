"""``python -m research clone``: where a warm-started policy agrees with the expert, per kind of decision.

A cloned policy that wins few episodes on unseen tasks can fail anywhere along the way; the win rate does not
say where. This probe walks the expert's own trajectory on ``--eval.num_tasks`` tasks of ``--env.eval_split`` of a synthetic env
(:mod:`progpo.envs.synthetic`: the expert knows the latent state), and at every step asks the policy for an
answer to the prompt the episode loop would build there (the env's registered template, the last
``--env.history_length`` (observation, action) turns, the step counter; :func:`progpo.agents.templates.build_prompt`),
sampled at ``--rollout.temperature`` by the local backend's generator (:class:`progpo.run.generation.HFGenerator`)
and parsed by the env's action parser (:func:`progpo.agents.parsing.parse_action`). Per decision kind
(:meth:`decision_kind` of the family task, e.g. WebShop-like ``results: item`` = clicking a product title on a
results page) it reports the steps, the share of answers equal to the expert's action and the share the env
admits, each with a Wilson 95% interval. Because the trajectory is the expert's, every kind is visited as
often as the expert visits it, whatever the policy would have done.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from progpo.agents.templates import HistoryTurn, build_prompt
from progpo.agents.types import SamplingParams
from progpo.envs.alfworld import wilson_interval
from progpo.cli.evaluate import ModelSettings
from progpo.run.settings import EnvSettings, EvalSettings, RolloutSettings
from research import settings as lab_settings


@dataclass
class ProbeStep:
    """One expert step: its decision ``kind``, the expert's ``action``, the admissible actions and the prompt."""

    kind: str
    action: str
    admissible: list[str]
    prompt_ids: list[int]


def decision_kind(task, state, action: str) -> str:
    """``task.decision_kind(state, action)`` where the family defines it, else the action's verb (the text before
    the first ``[`` or space)."""
    if hasattr(task, "decision_kind"):
        return str(task.decision_kind(state, action))
    return action.split("[")[0].split(" ")[0]


def expert_steps(env_name: str, tokenizer, *, split: str, tasks: int, history: int, max_steps: int) -> list[ProbeStep]:
    """The prompts along the expert's trajectory on tasks ``0..tasks-1`` of ``split`` (reset seed 0 each).

    Raises:
        ValueError: ``env_name`` is not a synthetic env (no expert that knows the latent state).
    """
    from progpo.envs import make_env, spec

    env = make_env(env_name, max_steps=max_steps)
    if not hasattr(env, "task"):
        raise ValueError(f"--env.name {env_name!r}: the probe needs a synthetic env (its expert knows the latent state)")
    template = spec(env_name).load("template")
    out: list[ProbeStep] = []
    for index in range(tasks):
        obs, info = env.reset(split=split, index=index)
        task, turns = env.task(split, index), []
        for t in range(max_steps):
            action = info["expert_action"]
            if not action:
                break
            built = build_prompt(tokenizer, template, task=info["task"], observation=obs,
                                 admissible_actions=info["admissible_actions"],
                                 history=turns[len(turns) - history:] if history else [], step_count=t)
            out.append(ProbeStep(decision_kind(task, info["latent_state"], action), action,
                                 list(info["admissible_actions"]), built.prompt_ids))
            turns.append(HistoryTurn(info["anchor_observation"], action))
            res = env.step(action)
            obs, info = res.observation, res.info
            if res.terminated or res.truncated:
                break
    return out


def answers(model_path: str, tok, steps: list[ProbeStep], *, temperature: float, max_new_tokens: int,
            seed: int) -> list[str]:
    """The policy's sampled answer text to every step's prompt (``tok``: its tokenizer; batched by the local
    backend's generator)."""
    import torch
    from transformers import AutoModelForCausalLM

    from progpo.agents.templates import decode_response
    from progpo.run.generation import HFGenerator

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    gen = HFGenerator(model, tok, max_batch_size=64, seed=seed)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)

    async def run() -> list[str]:
        outs = await asyncio.gather(*(gen(s.prompt_ids, params) for s in steps))
        return [decode_response(tok, o.token_ids) for o in outs]

    with torch.no_grad():
        return asyncio.run(run())


def table(steps: list[ProbeStep], chosen: list[str]) -> str:
    """Markdown table per decision kind: steps, share equal to the expert's action, share admissible."""
    from progpo.envs.base import normalize_action

    by: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for s, a in zip(steps, chosen):
        cell = by[s.kind]
        cell[0] += 1
        cell[1] += normalize_action(a) == normalize_action(s.action)
        cell[2] += normalize_action(a) in {normalize_action(x) for x in s.admissible}
    by["all"] = [sum(c[i] for c in list(by.values())) for i in range(3)]

    def share(k: int, n: int) -> str:
        lo, hi = wilson_interval(k, n)
        return f"{k / n:.2f} [{lo:.2f}, {hi:.2f}]"

    lines = ["| decision | steps | = expert [95%] | admissible [95%] |", "|---|---|---|---|"]
    for kind, (n, same, adm) in by.items():
        lines.append(f"| {kind} | {n} | {share(same, n)} | {share(adm, n)} |")
    return "\n".join(lines)


def _synthetic_envs() -> list[str]:
    from progpo.run.agent_model import synthetic_env_names

    return list(synthetic_env_names())


@dataclass(frozen=True)
class ClonedModel(ModelSettings):
    """The policy probed (``--actor.*``)."""

    model_name_or_path: str
    """an sft/train run folder, a Hugging Face folder or an alias (tiny-agent)"""


@dataclass(frozen=True)
class CloneArgs:
    """The flags of ``python -m research clone``: the trainer's settings, with the probe's defaults."""

    actor: ClonedModel
    env: EnvSettings = field(default_factory=lambda: EnvSettings(name=_synthetic_envs()[0], eval_split="test",
                                                                 history_length=1, max_steps=8),
                             metadata={"flags": ("name", "eval_split", "history_length", "max_steps")})
    eval: EvalSettings = field(default_factory=lambda: EvalSettings(num_tasks=64, seed=0),
                               metadata={"flags": ("num_tasks", "seed")})
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(temperature=1.0, max_new_tokens=48),
                                     metadata={"flags": ("temperature", "max_new_tokens")})

    def __post_init__(self) -> None:
        envs = _synthetic_envs()
        if self.env.name not in envs:
            raise ValueError(f"--env.name must be a synthetic env of {envs}, got {self.env.name!r}")
        for flag, value in (("--eval.num_tasks", self.eval.num_tasks), ("--env.max_steps", self.env.max_steps)):
            if value is None or value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        from progpo.envs.synthetic.env import SyntheticEnv

        size = SyntheticEnv.split_sizes()[self.env.eval_split]
        if self.eval.num_tasks > size:
            raise ValueError(f"--eval.num_tasks must be <= {size} (tasks in the {self.env.eval_split} split), "
                             f"got {self.eval.num_tasks}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags (:class:`CloneArgs`) under the names the probe reads (``env``, ``model``, ``split``, ``tasks``, ...).

    Raises:
        ValueError: naming the flag: an env that is not synthetic, an unknown split, counts < 1 or more tasks than
            the split holds, temperature <= 0.
    """
    settings = lab_settings.parse(CloneArgs, argv, "python -m research clone", __doc__.split("\n\n")[0])
    return lab_settings.flat(settings, env="env.name", model="actor.model_name_or_path", split="env.eval_split",
                             tasks="eval.num_tasks", history="env.history_length", max_steps="env.max_steps",
                             temperature="rollout.temperature", max_new_tokens="rollout.max_new_tokens",
                             seed="eval.seed")


def main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m research clone``; prints the markdown table."""
    from transformers import AutoTokenizer

    from progpo.agents.parsing import parse_action
    from progpo.run.models import resolve_pretrain

    try:
        args = parse_args(argv)
        path = resolve_pretrain(args.model)
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m research clone: error: {exc}", file=sys.stderr)
        return 2
    tok = AutoTokenizer.from_pretrained(path)
    steps = expert_steps(args.env, tok, split=args.split, tasks=args.tasks, history=args.history,
                         max_steps=args.max_steps)
    texts = answers(path, tok, steps, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                    seed=args.seed)
    chosen = [parse_action(t, args.env)[0] for t in texts]
    print(f"`{args.env}`, {args.tasks} {args.split} tasks, expert trajectories, policy {args.model} sampled at T = "
          f"{args.temperature:g}, history {args.history}:\n")
    print(table(steps, chosen))
    return 0
