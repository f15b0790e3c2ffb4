"""Print the requirements that the running Python does not satisfy, from pyproject.toml or a requirements file.

``python3 scripts/requirements_missing.py SOURCE...`` prints one unsatisfied requirement per line
(nothing when all are met) and exits 0; exit code 2 on an unreadable source, an extra the project
does not declare, or a line that is not a requirement. A SOURCE is either

* a project, as pip names it: ``.`` or ``.[cpu,tests]`` (a folder holding a ``pyproject.toml``; the
  ``[project] dependencies`` plus those of each ``[project.optional-dependencies]`` extra named), or
* a requirements file (comments, blank lines and pip options skipped), e.g. requirements-nodeps.txt.

``--all`` prints every requirement of the sources, met or not. "Satisfied" means: a distribution of
that name is installed, its version is inside the specifier (pre-releases allowed), and, for
``name[extra]``, every requirement the extra adds is installed too. Markers are evaluated for this
interpreter (a requirement whose marker is false is skipped). Only the standard library and pip's
own vendored ``packaging`` and ``tomli`` are used, so this runs on a machine where nothing of the
project is installed yet; it takes well under a second, which is what lets ``scripts/install.sh``
skip pip entirely on a second run.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a bare interpreter: pip always vendors packaging
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors tomli, tomllib's origin
    from pip._vendor import tomli as tomllib

_PROJECT = re.compile(r"^(?P<path>[^\[\]]+?)(?:\[(?P<extras>[^\[\]]*)\])?$")


def requirement_lines(path: str) -> list[str]:
    """The requirement lines of one requirements file (comments, blank lines and pip options removed)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
            if line and not line.startswith(("#", "-")):
                out.append(line)
    return out


def project_requirements(folder: str, extras: list[str]) -> list[str]:
    """``[project] dependencies`` of ``folder``/pyproject.toml plus those of each extra in ``extras``.

    Raises:
        OSError: no readable pyproject.toml. ValueError: the file is not TOML, has no ``[project]`` table, a
        dependency list that is not a list of strings (a string was read letter by letter), or an extra is not
        declared.
    """
    path = os.path.join(folder, "pyproject.toml")
    with open(path, "rb") as f:
        try:
            project = tomllib.load(f).get("project")
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not TOML ({exc})") from exc
    if not isinstance(project, dict):
        raise ValueError(f"{path}: no [project] table")
    declared = project.get("optional-dependencies", {})
    if not isinstance(declared, dict):
        raise ValueError(f"{path}: [project] optional-dependencies must be a table of lists")
    out = _strings(project.get("dependencies", []), f"{path}: [project] dependencies")
    for extra in extras:
        if extra not in declared:
            raise ValueError(f"{path}: no extra {extra!r} (declared: {', '.join(sorted(declared)) or 'none'})")
        out += _strings(declared[extra], f"{path}: extra {extra!r}")
    return out


def _strings(value: object, what: str) -> list[str]:
    """``value`` when it is a list of strings; ValueError naming ``what`` otherwise."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of requirement strings, got {value!r}")
    return list(value)


def source_requirements(source: str) -> list[str]:
    """The requirement strings of one SOURCE: a project folder (``.[cpu,tests]``) or a requirements file."""
    m = _PROJECT.match(source)
    if m and os.path.isdir(m["path"]):
        extras = [e.strip() for e in m["extras"].split(",")] if m["extras"] and m["extras"].strip() else []
        if not all(extras):
            raise ValueError(f"{source}: an empty extra name (extras: .[a,b])")
        return project_requirements(m["path"], extras)
    return requirement_lines(source)


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def satisfied(req: Requirement) -> bool:
    """True when ``req`` (and the requirements its extras add) is installed at an allowed version."""
    if req.marker is not None and not req.marker.evaluate():
        return True
    version = _installed(req.name)
    if version is None or (req.specifier and not req.specifier.contains(version, prereleases=True)):
        return False
    for extra in req.extras:
        for dep in md.requires(req.name) or []:
            sub = Requirement(dep)
            if sub.marker is not None and sub.marker.evaluate({"extra": extra}) and not sub.marker.evaluate({"extra": ""}):
                sub.marker = None
                if not satisfied(sub):
                    return False
    return True


def missing(sources: list[str], everything: bool = False) -> list[str]:
    """Unsatisfied requirements of ``sources``, in order, each once (all of them with ``everything``).

    Raises:
        OSError: a source cannot be read. ValueError: a requirement is not valid (names it), or an
        extra is not declared.
    """
    out: list[str] = []
    for source in sources:
        for line in source_requirements(source):
            try:
                req = Requirement(line)
            except InvalidRequirement as exc:
                raise ValueError(f"{source}: not a requirement line: {line!r} ({' '.join(str(exc).split())})") from exc
            if (everything or not satisfied(req)) and line not in out:
                out.append(line)
    return out


def main(argv: list[str]) -> int:
    """Print the missing requirements of the sources named in ``argv``; exit code 2 on a bad source."""
    everything = "--all" in argv
    sources = [a for a in argv if a != "--all"]
    unknown = [a for a in sources if a.startswith("-")]
    if unknown:
        sys.stderr.write(f"error: unknown option {unknown[0]} (expected --all, then SOURCE...)\n")
        return 2
    try:
        lines = missing(sources, everything)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
