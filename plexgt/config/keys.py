"""``plexgt train --help``'s list of configuration keys, generated from the dataclasses of
:mod:`plexgt.config` (their field docstrings read from the source) so that it cannot fall
behind them. Apart from the schema because only the command line reads it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from plexgt.config import TrainConfig


@dataclass(frozen=True)
class KeyDoc:
    """One configuration key as ``plexgt train --help`` lists it."""

    key: str
    """Dotted ('model.hidden')."""
    default: Any
    doc: str
    """The field's docstring ('' where the source cannot be read)."""

    def summary(self, width: int = 1000) -> str:
        """The docstring's first sentence on one line of at most ``width`` characters: cut
        where the last clause that fits ends (': ', '; ', ', ' outside parentheses) when that
        keeps most of the line, else at a word; marked '…'."""
        text = " ".join(self.doc.replace("``", "").split())
        m = re.search(r"(?<=\.)\s(?=[A-Z'(0-9])", text)
        text = text[: m.start()] if m else text
        if len(text) <= width:
            return text
        depth, cut = 0, 0
        for i, ch in enumerate(text[: width - 1]):
            depth += (ch in "([") - (ch in ")]")
            if depth == 0 and ch in ":;," and text[i + 1: i + 2] == " ":
                cut = i
        if cut < 0.6 * width:
            cut = text.rfind(" ", 0, width - 1)
        return text[:cut].rstrip(":;, ") + " …"


def field_docs(cls: type) -> dict[str, str]:
    """{field: docstring} of a dataclass: the string literal after each field, read from the
    source with ast (Python keeps no attribute docstrings at run time); {} when the source is
    not available (an installation without .py files)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def describe_keys(cls: type = None, prefix: str = "") -> list[KeyDoc]:  # type: ignore[assignment]
    """Every leaf key of the configuration (tables flattened, dotted) with its default and
    docstring, in declaration order: the list ``plexgt train --help`` prints, generated from
    the dataclasses so it cannot fall behind them."""
    cls = TrainConfig if cls is None else cls
    hints = get_type_hints(cls)
    docs = field_docs(cls)
    out: list[KeyDoc] = []
    for f in fields(cls):
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            out.extend(describe_keys(typ, f"{prefix}{f.name}."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append(KeyDoc(prefix + f.name, default, docs.get(f.name, "")))
    return out
