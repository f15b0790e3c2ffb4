"""Print the requirement lines of the given files that the running Python does not satisfy.

``python3 scripts/requirements_missing.py FILE...`` prints one unsatisfied line per line (nothing
when all are met) and exits 0; exit code 2 on an unreadable file or a line that is not a
requirement. "Satisfied" means: a distribution of that name is installed, its version is inside the
specifier (pre-releases allowed), and, for ``name[extra]``, every requirement the extra adds is
installed too. Markers are evaluated for this interpreter (a line whose marker is false is skipped).
Only the standard library and pip's own vendored ``packaging`` are used, so this runs on a machine
where nothing of the project is installed yet; it takes well under a second, which is what lets
``scripts/install.sh`` skip pip entirely on a second run.
"""

from __future__ import annotations

import importlib.metadata as md
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a bare interpreter: pip always vendors packaging
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement


def requirement_lines(path: str) -> list[str]:
    """The requirement lines of one file (comments, blank lines and pip options removed)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
            if line and not line.startswith(("#", "-")):
                out.append(line)
    return out


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


def missing(paths: list[str]) -> list[str]:
    """Unsatisfied requirement lines of ``paths``, in file order.

    Raises:
        OSError: a file cannot be read. ValueError: a line is not a valid requirement (names it).
    """
    out = []
    for path in paths:
        for line in requirement_lines(path):
            try:
                req = Requirement(line)
            except InvalidRequirement as exc:
                raise ValueError(f"{path}: not a requirement line: {line!r} ({exc})") from exc
            if not satisfied(req):
                out.append(line)
    return out


def main(argv: list[str]) -> int:
    """Print the missing lines of the files named in ``argv``; exit code 2 on a bad file."""
    try:
        lines = missing(argv)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
