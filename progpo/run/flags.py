"""The one dataclass -> command-line flag generator of every CLI (``train``, ``train_ray``, ``sft``, ``evaluate``).

A CLI describes its settings as a frozen dataclass whose fields are either leaves (one flag each) or
nested settings dataclasses (a dotted prefix each), so ``--env.max_steps`` is the field ``max_steps``
of the field ``env``, and the parsed result is that dataclass: ``args.env.max_steps`` (OpenRLHF's
``hierarchize`` shape, typed). The dataclass is the only source of defaults: a flag that is not given
leaves the field at its dataclass default (a section's default instance may override its class's
defaults, e.g. ``rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(temperature=0.4))``).

Help text sits beside each field, as an attribute docstring (cleanrl's ``Args`` style)::

    max_steps: int | None = None
    \"\"\"decisions per episode (None: the env spec's)\"\"\"

(a ``name: text`` line in the class docstring is read too, for classes documented that way).

Field types with a flag mapping: ``bool`` (``--x`` alone means true; ``--x false`` also parses),
``int``, ``float``, ``str``, ``Literal[...]`` and ``enum.Enum`` (choices), ``X | None`` (the type of
``X``; the value ``none`` gives None), ``tuple[float, float]``-like fixed tuples (``nargs``) and
``tuple[str, ...]``-like variable ones (one or more values).
Section fields may carry ``metadata={"flags": (...)}`` (expose only these fields) or
``metadata={"skip": (...)}``; a leaf field may carry ``metadata={"choices": values or a function
returning them}`` (e.g. the env registry's ids) and ``metadata={"flag": False}`` (no flag).

Numbers: every float field (``float``, ``float | None``, tuples of floats) takes a finite number in its
declared range (:mod:`progpo.bounds`: ``lr: float = number(1e-6, "> 0")``; any finite number where none is
declared). :func:`build` checks every such field on every CLI, so NaN, +-inf and out-of-range values are refused
in one line naming the flag and the value (``--actor.adam.lr must be a finite number > 0, got inf``).
A negative number is read as a value, ``--actor.adam.lr -1e-5`` as ``--actor.adam.lr=-1e-5``
(:func:`accept_negative_numbers`).

Errors: a value the type rejects is argparse's error (exit 2, naming the flag); a value the
dataclass's ``__post_init__`` rejects becomes :class:`FlagError` naming the flag (``--env.max_steps:
must be >= 1, got 0``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import enum
import functools
import inspect
import math
import os
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from progpo import bounds as _bounds

MISSING = dataclasses.MISSING


class FlagError(ValueError):
    """A setting's value is invalid; ``flag`` names the command-line flag (``--env.max_steps``).

    ``str()`` is ``"<flag>: <message>"``, or ``text`` when given (a message that already starts with the flag).
    """

    def __init__(self, flag: str, message: str, text: str | None = None) -> None:
        super().__init__(text or f"{flag}: {message}")
        self.flag = flag
        self.message = message


def as_flag_error(exc: ValueError) -> FlagError:
    """``exc`` as a :class:`FlagError`: itself, or one whose flag is the ``--flag`` its message starts with
    (every settings check in this project starts its message with the flag) or ``--*``."""
    if isinstance(exc, FlagError):
        return exc
    text = str(exc)
    m = re.match(r"^(--[\w.]+)[:]? (.*)$", text, re.DOTALL)
    return FlagError(m.group(1), m.group(2), text=text) if m else FlagError("--*", text)


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case) -> bool; argparse's error otherwise."""
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# ---- help beside each field ---------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def field_help(cls: type) -> Mapping[str, str]:
    """``field name -> help`` of dataclass ``cls`` (and its dataclass bases).

    Read from attribute docstrings (a string literal right after the field) and, where a field has
    none, from ``name: text`` lines of the class docstring (continuation lines joined).
    """
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        out.update(_docstring_lines(klass.__doc__ or ""))
        out.update(_attribute_docstrings(klass))
    return types.MappingProxyType(out)


def _docstring_lines(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = textwrap.dedent("\n".join(doc.splitlines()[1:])).splitlines()
    current, indent = None, 0
    for line in lines:
        m = re.match(r"^(\s*)(\w+(?:, \w+)*): (.+)$", line)
        if m and (current is None or len(m.group(1)) <= indent):
            current, indent = [n.strip() for n in m.group(2).split(",")], len(m.group(1))
            for name in current:
                out[name] = m.group(3).strip()
        elif current is not None and line.strip() and len(line) - len(line.lstrip()) > indent:
            for name in current:
                out[name] += " " + line.strip()
        else:
            current = None
    return out


def _attribute_docstrings(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    out: dict[str, str] = {}
    if not isinstance(body, ast.ClassDef):
        return out
    stmts = body.body
    for stmt, nxt in zip(stmts, stmts[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[stmt.target.id] = " ".join(nxt.value.value.split())
    return out


# ---- walking the settings tree ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Flag:
    """One leaf setting and its flag.

    Attributes:
        path: field names from the root (``("env", "max_steps")``).
        option: the flag (``--env.max_steps``).
        hint: the field's resolved type.
        default: its default (from the section instance that holds it).
        help: its help text.
        choices: the values it takes, where the field lists them.
        bounds: the declared range of a float field (:mod:`progpo.bounds`); None for other fields.
    """

    path: tuple[str, ...]
    option: str
    hint: Any
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    bounds: _bounds.Range | None = None

    def refusal(self, value: Any) -> FlagError | None:
        """The error of ``value`` (parsed) outside :attr:`bounds`: ``--actor.adam.lr must be > 0, got -1e-05``;
        None when it lies inside (or the field holds no float)."""
        return _number_refusal(self.option, value, self.bounds)

    @property
    def dest(self) -> str:
        """argparse ``dest``: the dotted path (``env.max_steps``)."""
        return ".".join(self.path)


def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(cls, vars(module) if module else None)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def iter_flags(cls: type, prefix: Sequence[str] = (), defaults: Any = None, *, only: Sequence[str] | None = None,
               skip: Sequence[str] = ()) -> Iterator[Flag]:
    """Every leaf setting of dataclass ``cls`` (depth first, in field order).

    Args:
        cls: a settings dataclass. prefix: path of ``cls`` in the tree (``("env",)``).
        defaults: an instance of ``cls`` whose values are the defaults shown (None: the class's own).
        only, skip: field names of ``cls`` to expose / leave out (a section field's ``metadata``
            ``flags`` / ``skip`` does the same one level down; a dotted name in ``skip``, ``adam.lr``,
            leaves out a field of a section).
    """
    hints = _hints(cls)
    helps = field_help(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or (only is not None and f.name not in only) or f.metadata.get("flag") is False:
            continue
        default = getattr(defaults, f.name) if defaults is not None else _default(f)
        hint = hints[f.name]
        path = (*prefix, f.name)
        if _is_section(hint):
            below = tuple(s.split(".", 1)[1] for s in skip if s.startswith(f.name + "."))
            yield from iter_flags(hint, path, None if default is MISSING else default,
                                  only=f.metadata.get("flags"), skip=(*f.metadata.get("skip", ()), *below))
        else:
            choices = f.metadata.get("choices")
            if callable(choices):
                choices = choices()
            yield Flag(path, "--" + ".".join(path), hint, default, helps.get(f.name, ""),
                       tuple(choices) if choices is not None else None, _bounds.declared(f, hint))


# ---- argparse -----------------------------------------------------------------------------------
def _optional_inner(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; anything else -> ``(hint, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _none_or(parse):
    def fn(text: str) -> Any:
        return None if str(text).strip().lower() == "none" else parse(text)

    fn.__name__ = getattr(parse, "__name__", "value")
    return fn


def argparse_kwargs(flag: Flag) -> dict[str, Any]:
    """``add_argument`` keyword arguments of one leaf (type, choices, nargs, metavar).

    Raises:
        TypeError: a field type with no flag mapping (extend this function, not the settings).
    """
    inner, optional = _optional_inner(flag.hint)
    kwargs: dict[str, Any] = {}
    if typing.get_origin(inner) is typing.Literal:
        choices = typing.get_args(inner)
        kwargs.update(type=type(choices[0]), choices=choices)
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        kwargs.update(type=str, choices=[m.value for m in inner])
    elif inner is bool:
        kwargs.update(type=parse_bool, nargs="?", const=True, metavar="{true,false}")
    elif inner in (int, float, str):
        kwargs.update(type=inner, metavar={int: "N", float: "X", str: "TEXT"}[inner])
    elif typing.get_origin(inner) is tuple and Ellipsis not in typing.get_args(inner):
        items = typing.get_args(inner)
        if len(set(items)) != 1 or items[0] not in (int, float, str):
            raise TypeError(f"{flag.dest}: no command-line mapping for {flag.hint!r}")
        kwargs.update(type=items[0], nargs=len(items), metavar={int: "N", float: "X", str: "TEXT"}[items[0]])
    elif typing.get_origin(inner) is tuple and typing.get_args(inner)[1:] == (Ellipsis,):
        item = typing.get_args(inner)[0]
        if item not in (int, float, str):
            raise TypeError(f"{flag.dest}: no command-line mapping for {flag.hint!r}")
        kwargs.update(type=item, nargs="+", metavar={int: "N", float: "X", str: "TEXT"}[item])
    else:
        raise TypeError(f"{flag.dest}: no command-line mapping for type {flag.hint!r}")
    if flag.choices is not None:
        kwargs["choices"] = flag.choices
        kwargs.pop("metavar", None)
    if optional and "choices" not in kwargs and kwargs.get("nargs") is None:
        kwargs["type"] = _none_or(kwargs["type"])
    return kwargs


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    return repr(value) if isinstance(value, str) else str(value)


def add_flags(parser: argparse.ArgumentParser, cls: type, *, prefix: Sequence[str] = (), defaults: Any = None,
              only: Sequence[str] | None = None, skip: Sequence[str] = (), taken: Sequence[str] = (),
              title: str | None = None) -> list[Flag]:
    """Add one flag per leaf setting of ``cls`` to ``parser``.

    Flags default to "not given" (``argparse.SUPPRESS``), so :func:`build` keeps the dataclass's
    default; the help shows that default.

    Args:
        parser: the CLI's parser. cls, prefix, defaults, only, skip: as :func:`iter_flags`.
        taken: flags another parser part already defines (OpenRLHF's): not added here, and
            :func:`build` reads their values under the same dest.
        title: argument group title (None: no group).

    Returns:
        The flags of ``cls`` (including the ``taken`` ones).
    """
    if isinstance(parser, argparse.ArgumentParser):
        accept_negative_numbers(parser)
        one_line_errors(parser)
    target = parser.add_argument_group(title) if title else parser
    flags = list(iter_flags(cls, prefix, defaults, only=only, skip=skip))
    for flag in flags:
        if flag.option in taken:
            continue
        kwargs = argparse_kwargs(flag)
        required = flag.default is MISSING
        shown = "required" if required else f"default: {_show(flag.default)}"
        target.add_argument(flag.option, dest=flag.dest, default=argparse.SUPPRESS, required=required,
                            help=f"{flag.help} ({shown})".strip(), **kwargs)
    return flags


def error_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """The hint line under a flag error of ``parser``: close flag names for an unknown flag, else where to look."""
    help_hint = f"{parser.prog} --help lists every flag"
    m = re.search(r"unrecognized arguments: (\S+)", message)
    if m:
        wrong = m.group(1).split("=", 1)[0]
        close = difflib.get_close_matches(wrong, option_strings(parser), n=3, cutoff=0.6)
        if close:
            return f"did you mean {' or '.join(close)}? ({help_hint})"
    m = re.search(r"argument (--[\w.]+)", message)
    if m:
        return f"{parser.prog} --help | grep -A2 -- '{m.group(1)}' shows what it takes"
    return help_hint


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser.error`` print ``<prog>: error: <message>`` and one hint line (:func:`error_hint`; no usage
    dump), exit 2; and take no prefix of a flag for the flag (``allow_abbrev``: ``--est`` was read as
    ``--estimators``, ``--n`` as ``--n_rollouts``). :func:`add_flags` does this to every parser it is given."""

    def error(message: str) -> typing.NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n  hint: {error_hint(parser, message)}\n")

    parser.allow_abbrev = False
    parser.error = error  # type: ignore[method-assign]
    return parser


def comma_list(text: str | None, flag: str) -> list[str]:
    """The entries of comma-list flag ``flag``, stripped, in order; ``""`` (or None) is the empty list.

    Raises:
        ValueError: an empty entry (``1,,2``, ``a,``, ``,``), naming ``flag``: it was dropped without a word.
    """
    if text is None or not str(text).strip():
        return []
    items = [s.strip() for s in str(text).split(",")]
    if not all(items):
        raise ValueError(f"{flag} has an empty entry, got {text!r} (a comma list: a,b,c)")
    return items


def check_writable(path: str | None, flag: str, *, folder: bool = True) -> None:
    """Refuse, before any work, an output path the run could only fail to write at its end.

    ``path`` (a folder, or with ``folder=False`` a file; None: no output) must not be empty, must not be a file
    where a folder is wanted or a folder where a file is, and its nearest existing parent must be a folder this
    process may write.

    Raises:
        ValueError: naming ``flag`` and the path.
    """
    if path is None:
        return
    if not str(path).strip():
        raise ValueError(f"{flag} must name a {'folder' if folder else 'file'}, got {path!r}")
    p = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.exists(p) and os.path.isdir(p) != folder:
        raise ValueError(f"{flag} {path} is a {'file' if folder else 'folder'}; choose a {'folder' if folder else 'file'}")
    probe = p if folder and os.path.isdir(p) else os.path.dirname(p)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"{flag} {path} lies under {probe}, which is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {probe} is not writable")


#: what argparse reads as a value, not an option, after a flag: a negative number in any form ``float`` takes.
_NEGATIVE_NUMBER = re.compile(r"^-(\d|\.\d|inf$|infinity$|nan$)", re.IGNORECASE)


def accept_negative_numbers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` read ``--flag -1e-5`` (and ``-inf``, ``-.5``) as the flag's value.

    argparse takes only ``-1`` and ``-1.5`` for numbers; ``-1e-5`` looked like an unknown option, and the flag
    got argparse's "expected one argument" instead of a line about its value. A parser that has options
    spelled like negative numbers is left as it is.
    """
    if not parser._has_negative_number_optionals:  # noqa: SLF001
        parser._negative_number_matcher = _NEGATIVE_NUMBER  # noqa: SLF001
    return parser


def check_numbers(parser: argparse.ArgumentParser, values: argparse.Namespace,
                  declared: Mapping[str, _bounds.Range]) -> None:
    """Refuse NaN, +-inf and out-of-range values of the float flags of a parser written by hand (OpenRLHF's).

    Every flag whose argparse ``type`` is ``float`` and whose parsed value is not its default is checked: against
    ``declared[option]`` when given (the range of the same setting on ``train``), else as any finite number;
    +-inf passes where the flag's own default is infinite (its "no limit", OpenRLHF's ``--ckpt.max_mem``).

    Raises:
        FlagError: the first such value, naming the flag and the value.
    """
    given = _given(values)
    for action in parser._actions:  # noqa: SLF001
        value = given.get(action.dest)
        if action.type is not float or not action.option_strings or value is None or value == action.default:
            continue
        option = action.option_strings[0]
        rng = declared.get(option, _bounds.ANY_FINITE)
        items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        defaults = action.default if isinstance(action.default, (list, tuple)) else (action.default,)
        no_limit = option not in declared and any(isinstance(d, float) and math.isinf(d) for d in defaults)
        bad = next((v for v in items if v not in rng and not (no_limit and math.isinf(v))), None)
        if bad is not None:
            raise _number_error(option, f"{rng.rule(bad)}, got {' '.join(map(str, items))}")


# ---- building the settings ----------------------------------------------------------------------
def _given(values: Mapping[str, Any] | argparse.Namespace) -> dict[str, Any]:
    return dict(vars(values)) if isinstance(values, argparse.Namespace) else dict(values)


def _flag_error(exc: Exception, cls: type, path: Sequence[str]) -> FlagError:
    """Map a ``__post_init__`` error of section ``cls`` at ``path`` to the flag it names."""
    text = str(exc)
    m = re.match(r"^(--[\w.]+)[:]? (.*)$", text, re.DOTALL)
    if m:  # the check named the flag itself: keep its words
        return FlagError(m.group(1), m.group(2), text=text)
    names = {f.name for f in dataclasses.fields(cls)}
    m = re.match(rf"^{re.escape(cls.__name__)}\.(\w+)", text)
    if m and m.group(1) in names:  # the field the message is about, though it may name longer ones after it
        return FlagError("--" + ".".join((*path, m.group(1))), text)
    for f in sorted(dataclasses.fields(cls), key=lambda f: len(f.name), reverse=True):
        m = re.search(rf"(?:\b{re.escape(cls.__name__)}\.|\b){re.escape(f.name)}\b", text)
        if m:
            return FlagError("--" + ".".join((*path, f.name)), text)
    return FlagError("--" + ".".join(path) + ".*" if path else "--*", text)


def _check_number(f: dataclasses.Field, hint: Any, path: Sequence[str], value: Any) -> None:
    """Refuse ``value`` of a float field outside its declared range (:meth:`Flag.refusal`); any other field: nothing."""
    error = _number_refusal("--" + ".".join(path), value, _bounds.declared(f, hint))
    if error:
        raise error


def _number_refusal(option: str, value: Any, rng: _bounds.Range | None) -> FlagError | None:
    """:func:`_number_error` for ``value`` outside ``rng`` (None: a field with no float, nothing refused)."""
    words = None if rng is None else _bounds.refusal(value, rng)
    return None if words is None else _number_error(option, words)


def _number_error(option: str, words: str) -> FlagError:
    """The one-line refusal of a number: ``--actor.adam.lr must be > 0, got -1e-05``."""
    return FlagError(option, words, text=f"{option} {words}")


def build(cls: type, values: Mapping[str, Any] | argparse.Namespace, *, prefix: Sequence[str] = (),
          defaults: Any = None, convert: bool = True) -> Any:
    """An instance of ``cls`` from parsed flag values (dotted dests); ungiven fields keep their defaults.

    Args:
        cls: the settings dataclass. values: ``dest -> value`` (an argparse namespace or dict).
        prefix: path of ``cls`` in the tree. defaults: an instance holding the defaults (None: the class's).
        convert: turn enum and tuple values into the field's type.

    Raises:
        FlagError: a value the dataclass rejects (names the flag), or a float field's value outside its declared
            range (NaN and +-inf included; :mod:`progpo.bounds`), naming the flag and the value.
    """
    given = _given(values)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        hint = hints[f.name]
        default = getattr(defaults, f.name) if defaults is not None else _default(f)
        if _is_section(hint):
            sub_given = any(k == ".".join(path) or k.startswith(".".join(path) + ".") for k in given)
            if sub_given or default is MISSING:
                kwargs[f.name] = build(hint, given, prefix=path, defaults=None if default is MISSING else default,
                                       convert=convert)
            else:
                kwargs[f.name] = default
            continue
        dest = ".".join(path)
        if dest in given:
            value = given[dest]
            inner, _ = _optional_inner(hint)
            if convert and value is not None and isinstance(inner, type) and issubclass(inner, enum.Enum):
                value = inner(value)
            if convert and isinstance(value, list):
                value = tuple(value)
            kwargs[f.name] = value
        elif default is not MISSING:
            kwargs[f.name] = default
        _check_number(f, hint, path, kwargs.get(f.name))
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise _flag_error(exc, cls, prefix) from exc


def given_flags(values: Mapping[str, Any] | argparse.Namespace, prefix: str) -> dict[str, Any]:
    """The values given under ``prefix.`` (dest ``prefix.name`` -> ``name``), e.g. every ``--progpo.*``."""
    return {k[len(prefix) + 1:]: v for k, v in _given(values).items() if k.startswith(prefix + ".")}


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--flag`` of ``parser`` (for did-you-mean hints and tests)."""
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]  # noqa: SLF001


def markdown_table(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> str:
    """The visible flags of ``parser`` (or those whose dest starts with one of ``only``) as a Markdown
    table: flag, default, meaning (the help text beside each field; hidden flags are left out)."""
    rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for action in parser._actions:  # noqa: SLF001
        if action.help is argparse.SUPPRESS or not action.option_strings or action.option_strings[0] in ("-h", "--help"):
            continue
        if only is not None and not str(action.dest).startswith(tuple(only)):
            continue
        text = " ".join(str(action.help or "").split())
        m = re.match(r"^(.*?) ?\((default: .*|required)\)$", text)
        meaning, default = (m.group(1), m.group(2).removeprefix("default: ")) if m else (text, "")
        if not m and action.default not in (None, argparse.SUPPRESS):
            default = _show(action.default)
        default = f"`{default.strip(chr(39))}`" if default else ""
        rows.append(f"| `{action.option_strings[0]}` | {default.replace('|', '/')} | {meaning.replace('|', '/')} |")
    return "\n".join(rows)
