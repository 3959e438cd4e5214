"""``plexgt prep``'s source on its command line, read through a :class:`FormatRegistry`.

``--format`` (its choices and its help), ``--input`` and every format's options are added to
the parser from the registry; the source is opened by the spec the run names (or ``--format
auto`` recognises), once every option it would ignore has been refused: each had been dropped
without a word (``--one-based`` on a SNAP file had prepared its ids 0-based).
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from plexgt.data.formats.detect import detect_format
from plexgt.data.formats.spec import AUTO, FormatOption, FormatRegistry, FormatSpec
from plexgt.data.source import GeneratedFeatures, GraphSource
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import UsageError


def _generators(formats: FormatRegistry) -> list[str]:
    return [s.name for s in formats if s.input is None]


def add_arguments(p: argparse.ArgumentParser, formats: FormatRegistry) -> None:
    """``--format``, ``--input`` and the formats' options, each in its ``--help`` group; the
    formats themselves, a line each, after the options."""
    gens = _generators(formats)
    p.add_argument("--format", default=AUTO, choices=(AUTO, *formats.names()),
                   help=f"input format (default {AUTO}: recognised from the --input path"
                   + (f"; the generators {', '.join(gens)} are named" if gens else "")
                   + "; each is described below)")
    inputs = "; ".join(f"{s.name}: {s.input}" for s in formats if s.input is not None)
    p.add_argument("--input", type=Path, help=f"input file or directory ({inputs})")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in formats.options():
        readers = formats.readers(opt)
        title = opt.group or (f"--format {readers[0].name}" if readers else "read by none")
        if title not in groups:
            groups[title] = p.add_argument_group(title)
        target = groups[title]
        if len(opt.arguments) > 1:
            target = target.add_mutually_exclusive_group()
        for flag, kw in opt.arguments:
            kw = dict(kw)
            if opt.group is not None and 0 < len(readers) < len(formats):
                kw["help"] = f"{kw.get('help', '')} (--format {', '.join(s.name for s in readers)})"
            target.add_argument(flag, **kw)
    p.epilog = _format_list(formats)
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def _format_list(formats: FormatRegistry) -> str:
    """The epilog: each format's name and its line, wrapped (the formatter keeps it as is)."""
    width = max((len(s.name) for s in formats), default=0) + 4
    lines = [f"formats (--format; {AUTO}, the default, recognises one from the --input path):"]
    for s in formats:
        lines += textwrap.wrap(s.description, 79, initial_indent=f"  {s.name:<{width - 2}}",
                               subsequent_indent=" " * width)
    return "\n".join(lines)


def _refusal(opt: FormatOption, spec: FormatSpec, formats: FormatRegistry) -> UsageError:
    accepted = " or ".join(s.name for s in formats.readers(opt))
    return UsageError(opt.refused.format(label=opt.label, fmt=spec.name, accepted=accepted))


def check_options(args: argparse.Namespace, spec: FormatSpec, formats: FormatRegistry) -> None:
    """Refuse a size below 1, then any option ``spec`` would ignore (or given without the
    option it needs), in ``--help`` order."""
    opts = formats.options()
    for opt in opts:
        v = opt.value(args)
        if opt.positive and v is not None and v < 1:
            raise UsageError(f"{opt.label} {v}: must be positive")
    by_dest = {o.dest: o for o in opts}
    for opt in opts:
        if not opt.given(args):
            continue
        if not formats.reads(spec, opt):
            raise _refusal(opt, spec, formats)
        if opt.requires is not None and not by_dest[opt.requires].given(args):
            raise _refusal(opt, spec, formats)


def resolve(args: argparse.Namespace, formats: FormatRegistry) -> FormatSpec:
    """The spec ``--format`` names (``auto``: recognised from ``--input``), its input checked."""
    name = args.format
    if name == AUTO:
        if args.input is None:
            gens = _generators(formats)
            raise UsageError(f"--format {AUTO} needs --input PATH"
                             + (f" (or name a generator: --format {'|'.join(gens)})"
                                if gens else ""))
        name = detect_format(args.input, formats)
    spec = formats.get(name)
    if spec.input is None:
        if args.input is not None:
            raise UsageError(f"--input is not used with --format {name}")
    elif args.input is None:
        raise UsageError(f"--format {name} needs --input PATH")
    return spec


def open_source(args: argparse.Namespace, formats: FormatRegistry,
                comm: HostComm | None = None) -> GraphSource:
    """The source of the run's ``--format`` and options; ``comm`` may split a counting pass."""
    spec = resolve(args, formats)
    check_options(args, spec, formats)
    src = spec.open(args, comm)
    if spec.draws_node_data or not (args.features or args.classes):
        return src
    if args.features and src.num_features:
        raise UsageError(f"{src.name}: has features; --features only applies to featureless "
                         "inputs")
    if args.classes and src.labels() is not None:
        raise UsageError(f"{src.name}: has labels; --classes only applies to unlabelled inputs")
    return GeneratedFeatures(src, args.features or 0, args.classes or 0, args.seed)


def describe(args: argparse.Namespace, formats: FormatRegistry) -> dict[str, Any]:
    """How the run named its source, for the manifest and for ``--resume`` to compare: the
    format, the input and every option set (paths resolved; a flag only when raised)."""
    d: dict[str, Any] = {"format": args.format}
    for opt in formats.options():
        v = opt.value(args)
        if v is None or (v is False and opt.default is False):
            continue
        d[opt.dest] = str(Path(v).resolve()) if isinstance(v, Path) else v
    if args.input is not None:
        d["input"] = str(Path(args.input).resolve())
    return d
