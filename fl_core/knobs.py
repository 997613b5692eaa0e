"""Knobs: typed dataclass fields with help, allowed values and bounds, declared beside the code
that uses them (common knobs in `config.py`, each method's in its algorithm file).

One declaration serves everything: validation (`check_fields` gives one error naming the value
and what is allowed), the CLIs (`add_knob_arguments` builds argparse flags for
`python -m fl_core` and for every study), the config hash, Parquet columns and MLflow params.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import math
import re
import sys
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar


class ConfigError(ValueError):
    """A knob has a value outside what is allowed; the message names both."""


@dataclass(frozen=True)
class Space:
    """Where a study with `tune` searches a knob by default: a range (`low`..`high`, log-uniform
    with `log`) or a tuple of `choices`, and `source`: where the range comes from (the paper's
    grid where it gives one, else why we chose it)."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()
    source: str = ""

    def __post_init__(self) -> None:
        ranged = self.low is not None and self.high is not None
        if ranged == bool(self.choices) or (ranged and not self.low < self.high) or not self.source:
            raise ValueError(f"a search space is a range low < high or choices, with its source: {self}")

    def __str__(self) -> str:
        if self.choices:
            return "{" + ", ".join(f"{c:g}" if isinstance(c, float) else str(c) for c in self.choices) + "}"
        return f"{'log-uniform' if self.log else 'uniform'}({self.low:g}, {self.high:g})"


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """" (did you mean X?)" for the closest of `candidates` to a misspelt `name`, else ""."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.7)
    return f" (did you mean {close[0]}?)" if close else ""


def portable_name(text: str) -> str:
    """`text` (e.g. a method's name) as a file or folder name that Linux, macOS and Windows all
    accept: an external method's `package.module:Class` reads `package.module.Class`, and every
    other character but ASCII letters, digits, `.`, `_` and `-` becomes `_` (Windows refuses
    `<>:"/\\|?*`, macOS's Finder shows `:` as `/`); no leading or trailing dot."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text.replace(":", ".")).strip(".") or "_"


def knob(default: Any, help: str, *, choices: tuple | None = None, low: float | None = None,
         high: float | None = None, low_open: bool = False, high_open: bool = False, data: bool = False,
         semantic: bool = True, added: bool = False, search: Space | None = None,
         also: Callable[[Any], bool] | None = None) -> Any:
    """A dataclass field with its help and what is allowed.

    `low`/`high` bound numbers (closed unless `low_open`/`high_open`); `None` is allowed only when
    the type says so. `data=True` marks a knob that decides the client data (the data spec);
    `semantic=False` one that changes where or how fast a run happens, not what it computes (left
    out of the config hash, the Parquet rows and the MLflow params). `added=True` marks a knob
    added after results were first stored: while it keeps its default it stays out of the config
    hash, so the hashes of every earlier run (and the sweeps that can resume them) do not move.
    `search`: the knob's default search space under a study's `tune` (sweeps/spec.py). `also`:
    values beyond `choices` that are allowed too (`algorithm`: an external `package.module:Class`).
    """
    metadata = dict(help=help, choices=choices, low=low, high=high, low_open=low_open, high_open=high_open,
                    data=data, semantic=semantic, added=added, search=search, also=also)
    return field(default=default, metadata=metadata)


def _meta(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata or {}


def knob_fields(cls_or_obj) -> list[dataclasses.Field]:
    """The knob fields of a knob dataclass (fields declared with `knob`)."""
    return [f for f in dataclasses.fields(cls_or_obj) if "help" in _meta(f)]


def search_spaces(cls_or_obj) -> dict[str, Space]:
    """knob name -> its declared default search space (`knob(..., search=...)`), in field order."""
    return {f.name: _meta(f)["search"] for f in knob_fields(cls_or_obj) if _meta(f).get("search") is not None}


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def base_type(cls, f: dataclasses.Field) -> tuple[type, bool]:
    """(int | float | str | bool, nullable) of a knob field."""
    hint = _hints(cls)[f.name]
    args = typing.get_args(hint)
    nullable = type(None) in args
    kinds = [a for a in args if a is not type(None)] or [hint]
    kind = typing.get_origin(kinds[0]) or kinds[0]
    return kind, nullable


def check_fields(obj) -> None:
    """Check every knob of `obj` against its declaration; raise one ConfigError naming the first
    bad value and what is allowed."""
    for f in knob_fields(obj):
        meta, value = _meta(f), getattr(obj, f.name)
        kind, nullable = base_type(type(obj), f)
        if value is None:
            if not nullable:
                raise ConfigError(f"{f.name}=None is not allowed; give a {kind.__name__}")
            continue
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{f.name}={value!r} must be true or false")
            continue
        if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                     or (kind is int and not float(value).is_integer())):
            raise ConfigError(f"{f.name}={value!r} must be {'an integer' if kind is int else 'a number'}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{f.name}={value!r} must be a finite number")
        if meta.get("choices") and value not in meta["choices"] and not (meta.get("also") and meta["also"](value)):
            raise ConfigError(f"{f.name}={value!r} is not allowed; choose one of "
                              f"{', '.join(map(str, meta['choices']))}")
        low, high = meta.get("low"), meta.get("high")
        if low is not None and (value <= low if meta.get("low_open") else value < low):
            raise ConfigError(f"{f.name}={value!r} is outside the allowed range {describe_range(meta)}")
        if high is not None and (value >= high if meta.get("high_open") else value > high):
            raise ConfigError(f"{f.name}={value!r} is outside the allowed range {describe_range(meta)}")


def describe_range(meta: dict[str, Any]) -> str:
    low, high = meta.get("low"), meta.get("high")
    left = "(" if meta.get("low_open") or low is None else "["
    right = ")" if meta.get("high_open") or high is None else "]"
    return f"{left}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}{right}"


def normalise(obj) -> None:
    """Store ints given for float knobs as floats and integral floats given for int knobs as ints
    (so 1 and 1.0 hash alike, e.g. an int column read back from Parquet as float), numpy scalars
    as Python ones."""
    for f in knob_fields(obj):
        value = getattr(obj, f.name)
        if hasattr(value, "item"):  # numpy scalar
            value = value.item()
            object.__setattr__(obj, f.name, value)
        kind, _ = base_type(type(obj), f)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))
        elif kind is int and isinstance(value, float) and value.is_integer():
            object.__setattr__(obj, f.name, int(value))


# ---------------------------------------------------------------------------- method parameters
@dataclass(frozen=True)
class MethodParams:
    """Base of a method's own knobs. A method declares a frozen subclass with `knob` fields and may
    override `validate` (cross-field checks) and `label` (how the method is named in tables).
    `common_search` replaces the declared search space of a common knob for this method (e.g. the
    learning rate of a method that only fine-tunes; `fl_core.config.search_space`)."""

    common_search: ClassVar[dict[str, Space]] = {}

    def __post_init__(self) -> None:
        normalise(self)
        check_fields(self)
        self.validate()

    def validate(self) -> None:
        """Checks beyond one field's range; raise ConfigError."""

    def label(self, display: str) -> str:
        """The method's name in tables and legends, from its display name (e.g. `FedSelect` ->
        `FedSelect (layer B)` for an ablation)."""
        return display

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in knob_fields(self)}


@dataclass(frozen=True)
class NoParams(MethodParams):
    """A method without knobs of its own."""


# ---------------------------------------------------------------------------- command lines
class OneLineParser(argparse.ArgumentParser):
    """An argument parser for commands with hundreds of knob flags. Errors are one line (the
    error, a guess for a misspelt flag, where help is), never the usage. `--help` is a summary of
    one line per flag outside the method groups; `--help METHOD` lists one method's knobs (those
    `method_knobs` names, filled by `fl_core.config.add_run_arguments`); `--help all` is
    argparse's full help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, add_help=False, **kwargs)
        self.method_knobs: dict[str, list[str]] = {}
        self.add_argument("-h", "--help", nargs="?", const="", metavar="METHOD|all", action=_HelpAction,
                          help="this summary; --help METHOD: that method's knobs; --help all: every flag in full")

    def error(self, message: str) -> typing.NoReturn:
        if message.startswith("unrecognized arguments: "):
            flag = message.removeprefix("unrecognized arguments: ").split()[0].split("=")[0]
            message += did_you_mean(flag, [o for a in self._actions for o in a.option_strings])
        self.exit(2, f"{self.prog}: error: {message} (all flags: {self.prog} --help)\n")

    def help_text(self, topic: str) -> str:
        """What `--help [topic]` prints (see the class docstring)."""
        if topic == "all":
            return self.format_help()
        if topic:
            if topic not in self.method_knobs:
                self.error(f"--help {topic}: not a method{did_you_mean(topic, self.method_knobs)}; one of "
                           f"{', '.join(self.method_knobs)}, or all")
            wanted = set(self.method_knobs[topic])
            lines = [f"{topic}'s own knobs (set them as --flag VALUE; the common knobs: {self.prog} --help):"]
            return "\n".join(lines + [_flag_line(a) for a in self._actions
                                       if a.dest in wanted and a.help != argparse.SUPPRESS]) + "\n"
        mine = {a.dest for names in self.method_knobs.values() for a in self._actions if a.dest in names}
        lines = [f"usage: {self.prog} [--FLAG VALUE ...]", "", (self.description or "").split("\n")[0], ""]
        for group in self._action_groups:
            shown = [a for a in group._group_actions
                     if a.dest not in mine and a.option_strings and a.help != argparse.SUPPRESS]
            if shown:
                lines += [f"{group.title}:", *map(_flag_line, shown), ""]
        if self.method_knobs:
            lines.append(f"Each method's own knobs: {self.prog} --help METHOD, METHOD one of "
                         f"{', '.join(self.method_knobs)}.")
        lines.append(f"Every flag with its allowed values: {self.prog} --help all")
        return "\n".join(lines) + "\n"


class _HelpAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        sys.stdout.write(parser.help_text(values or ""))
        parser.exit(0)


def _flag_line(action: argparse.Action, width: int = 118) -> str:
    """One line for a flag: its name, what its help says first (cut to the width, never inside
    brackets) and its default."""
    text, default = summary_help(action)
    head = f"  {', '.join(action.option_strings):<30} "
    room = width - len(head) - len(" (default: )")  # a long default keeps 40 characters, more beside a short help
    tail = "" if default is None else f" (default: {shorten(default, max(40, room - len(text)))})"
    return head + shorten(text, width - len(head) - len(tail)) + tail


def summary_help(action: argparse.Action) -> tuple[str, str | None]:
    """(what a flag's help says first, its default) for a one-line summary: the help's first
    sentence, or its part before the allowed values `add_knob_arguments` appends ("; one of",
    "; in [a, b]"), and the default as the help states it, "(default: ...)", else as the parser
    holds it (None: nothing to show, e.g. a switch)."""
    text = (action.help or "").replace("%%", "%")
    default = None
    if (start := text.find(" (default: ")) >= 0:
        end = _closing(text, start + 1)
        text, default = text[:start] + text[end + 1:], text[start + len(" (default: "):end]
    elif action.default not in (argparse.SUPPRESS, None) and action.default is not False and action.nargs != 0:
        shown = action.default
        default = " ".join(map(str, shown)) if isinstance(shown, (list, tuple)) else str(shown)
    default = "empty" if default == "" else default
    depth = 0
    for i, char in enumerate(text):
        depth = max(depth + (char in "([{") - (char in ")]}"), 0)
        if depth or char not in ".;":
            continue
        if char == ";" and re.match(r"; (one of |in [\[(])", text[i:]):
            return text[:i], default
        if char == "." and text[i + 1:i + 2] in ("", " ") and not re.search(r"\b(e\.g|i\.e|cf|vs)$", text[:i]):
            return text[:i], default
    return text, default


def _closing(text: str, opening: int) -> int:
    """Where the bracket at `opening` closes (the text's end if it never does)."""
    depth = 0
    for i in range(opening, len(text)):
        depth += (text[i] in "([{") - (text[i] in ")]}")
        if depth == 0:
            return i
    return len(text)


def shorten(text: str, room: int) -> str:
    """`text` if it fits in `room` characters, else its longest start that does with "…", cut
    after a word outside any bracket (never "(e.g…"); where every word is inside one, after a
    word with the open brackets closed after the "…"."""
    if len(text) <= room:
        return text
    opened: list[str] = []
    outside, anywhere = "", ""
    for i, char in enumerate(text):
        if char == " " and text[:i].strip():
            cut = text[:i].rstrip(",;: ") + "…" + "".join(reversed(opened))
            if len(cut) > room:
                break
            outside, anywhere = (cut if not opened else outside), cut
        if char in "([{":
            opened.append(")]}"["([{".index(char)])
        elif char in ")]}" and opened:
            opened.pop()
    return outside or anywhere or text[:max(room - 1, 0)] + "…"


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false)")


def add_knob_arguments(group, cls, *, skip: tuple[str, ...] = (), defaults: dict[str, Any] | None = None,
                       suppress_defaults: bool = False, many: tuple[str, ...] = (),
                       wrap_type: Any = None) -> list[str]:
    """Add one flag per knob of dataclass `cls` to an argparse parser or group.

    Flags are the knob names with dashes; help shows the allowed values and the default.
    `suppress_defaults=True` leaves a flag out of the parsed namespace unless it is given (method
    knobs: only given values are passed on, so a run's other-method knobs never appear).
    Knobs named in `many` take one or more values (a study's swept axes). `wrap_type(parse, kind)`
    may replace a flag's value parser (a study accepts search ranges). Returns the knob names added.
    """
    added = []
    defaults = defaults or {}
    for f in knob_fields(cls):
        if f.name in skip:
            continue
        meta = _meta(f)
        kind, nullable = base_type(cls, f)
        default = defaults.get(f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
        allowed = ""
        if meta.get("choices"):
            allowed = f"; one of {', '.join(map(str, meta['choices']))}"
        elif meta.get("low") is not None or meta.get("high") is not None:
            allowed = f"; in {describe_range(meta)}"
        shown = "none" if default is None else "empty" if default == "" else default
        help_text = f"{meta['help']}{allowed} (default: {shown})".replace("%", "%%")
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"help": help_text, "dest": f.name,
                                  "default": argparse.SUPPRESS if suppress_defaults else default}
        if kind is bool and default is False and f.name not in many:
            kwargs["action"] = "store_true"
        else:
            parse = _parse_bool if kind is bool else kind
            kwargs["type"] = _parse_optional(parse) if nullable else parse
            if wrap_type is not None:
                kwargs["type"] = wrap_type(kwargs["type"], kind)
            if f.name in many:
                kwargs["nargs"] = "+"
                if not suppress_defaults:
                    kwargs["default"] = [default]
            if meta.get("choices"):
                kwargs["metavar"] = "{" + ",".join(map(str, meta["choices"])) + "}"
        group.add_argument(flag, **kwargs)
        added.append(f.name)
    return added
