"""Round-trip edits of harness YAML files (ruamel.yaml): change one leaf, keep every other byte.

    from harness.yamledit import set_leaf_text
    new_text = set_leaf_text(old_text, ["sizes", "5", "hole_ratio"], 0.3, entry_key="size")   # a one-line diff

A candidate changes one knob, so its commit should change one line: `git show` of a promotion is then the change and
nothing else, and the comments a person wrote in env.yaml or recipe.yaml survive every promotion. PyYAML cannot do
this (it drops comments and re-flows the file); ruamel.yaml's round-trip mode keeps comments, key order, flow or
block style and quoting. The file's own indentation is detected and reused.

Lists of mappings are addressed by their entries' key field, which the task names (`Task.entry_key`, the knob grammar
of `harness.tasks.knobs`: with key `size`, `sizes.5.hole_ratio` is the entry whose size is 5). A missing last key is added to its mapping (one added line, or one added `key: value` inside a flow
mapping); a missing intermediate raises KeyError, and callers fall back to rewriting the file.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.util import load_yaml_guess_indent

_NULL = re.compile(r"(?::|^\s*-)[ \t]+(null|~)[ \t]*$")


def _null_spelling(text: str) -> str | None:
    """How the file writes null where it writes it at all (`null` or `~`, the more frequent; comments left out), or
    None: empty values, ruamel's own spelling."""
    seen = [m.group(1) for line in text.splitlines() if not line.lstrip().startswith("#")
            and (m := _NULL.search(re.sub(r"[ \t]+#.*$", "", line)))]
    return max(("null", "~"), key=seen.count) if seen else None


def _float(representer: RoundTripRepresenter, value: float):
    """A float as YAML 1.1 readers (PyYAML, which loads every harness file) read a float: ruamel writes 1e-05, which
    PyYAML reads as the string '1e-05' (its float needs a point and a signed exponent), so a learning rate below 1e-4
    rewrote the whole recipe.yaml (its comments gone) and an env.yaml value became a string for plain readers (an
    outside review). Now 1.0e-05."""
    text = repr(value)
    if not math.isfinite(value) or "e" not in text:
        return RoundTripRepresenter.represent_float(representer, value)
    mantissa, exponent = text.split("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent[0] not in "+-":
        exponent = "+" + exponent
    return representer.represent_scalar("tag:yaml.org,2002:float", f"{mantissa}e{exponent}")


class _Representer(RoundTripRepresenter):
    """ruamel's round-trip representer, floats written as YAML 1.1 reads them (`_float`)."""


_Representer.add_representer(float, _float)


def _yaml(text: str) -> tuple[YAML, Any]:
    _, indent, block_seq_indent = load_yaml_guess_indent(text)
    y = YAML()  # round-trip
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long lines
    indent = indent or 2
    offset = block_seq_indent or 0
    y.indent(mapping=indent, sequence=max(indent, offset + 2), offset=offset)
    y.Representer = _Representer
    # ruamel writes every null as an empty value, so a file that spells them `null` (what PyYAML writes: a run's
    # config.yaml) or `~` would change on every line that holds one; keep the file's own spelling
    if spelled := _null_spelling(text):
        y.Representer = _NULL_AS[spelled]
    return y, y.load(text)


def _spelling(token: str) -> type:
    """A round-trip representer that writes null as `token` (a subclass: ruamel's registry is per class)."""
    cls = type(f"NullAs{token.title()}", (_Representer,), {})
    cls.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", token))
    return cls


_NULL_AS = {"null": _spelling("null"), "~": _spelling("~")}


def set_leaf_text(text: str, parts: list[str], value: Any, entry_key: str | None = None) -> str:
    """`text` with the leaf at `parts` set to `value` (added when only the last key is missing). KeyError when the path
    does not exist in the file; ValueError when the text is not a YAML mapping."""
    y, doc = _yaml(text)
    if not hasattr(doc, "keys"):
        raise ValueError("not a YAML mapping")
    node: Any = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            hits = [e for e in node if entry_key and hasattr(e, "get") and str(e.get(entry_key)) == part]
            if not hits or last:
                raise KeyError(".".join(parts[: i + 1]))
            node = hits[0]
            continue
        if not hasattr(node, "keys"):
            raise KeyError(".".join(parts[: i + 1]))
        if last:
            node[part] = value
            break
        if part not in node:
            raise KeyError(".".join(parts[: i + 1]))
        node = node[part]
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue()
