"""The one loader for YAML a user (or anyone) hands the CLI: run configs, experiment configs, generator configs, recipes,
engineer scripts, a run folder's config.yaml. Safe (PyYAML's SafeLoader) and bounded.

    from sandbox.yamlload import load_yaml, load_yaml_text
    data = load_yaml(Path("examples/mapf_quick.yaml"))     # YamlError (a ValueError) names the file on any problem

Why bounded: YAML aliases repeat an anchored node without copying it, so ~700 bytes of nested `*a` references (the
"billion laughs") load instantly as shared objects and then expand to ~10^9 nodes the moment anything walks them
(pydantic validation of a free-form mapping, a dump, an error message that prints the input), hanging the CLI until
memory runs out. Here the composed node graph is measured as if every alias were expanded, before anything is
constructed, and a document above `MAX_NODES` is refused; so is an alias that refers to its own anchor (a cycle) and
nesting deeper than Python can walk. The measure costs one pass over the distinct nodes; the same pass refuses a mapping
that names one key twice (PyYAML would keep the last without a word).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_NODES = 100_000  # expanded nodes; the largest shipped config has a few hundred


class YamlError(ValueError):
    """A YAML document that cannot be loaded: invalid, too large once its aliases are expanded, or self-referencing."""


def _expanded_size(root: yaml.Node, source: str) -> int:
    """Nodes in `root` with every alias expanded (shared nodes counted once per reference), stopping at MAX_NODES."""
    memo: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in open_:
            raise YamlError(f"{source}: an alias refers to the node that contains it (a cycle); write the value out")
        open_.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
            seen: dict[str, int] = {}
            for k, _ in node.value:  # PyYAML keeps the last of two equal keys without a word: a typo's silent twin
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if k.value in seen:
                        raise YamlError(f"{source}: key {k.value!r} appears twice in one mapping (lines "
                                        f"{seen[k.value] + 1} and {k.start_mark.line + 1}); keep one")
                    seen[k.value] = k.start_mark.line
        else:
            children = []
        for child in children:
            n += size(child)
            if n > MAX_NODES:
                raise YamlError(f"{source}: the YAML expands to more than {MAX_NODES:,} values once its aliases (*name) "
                                "are expanded (an alias bomb?); write the values out or shorten the file")
        open_.discard(key)
        memo[key] = n
        return n

    return size(root)


def load_yaml_text(text: str, source: str) -> Any:
    """The value of one YAML document in `text` (None when empty); `source` names it in errors."""
    try:  # the reader checks the characters as the loader is made: a control character is a YAMLError there
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise YamlError(f"{source}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    loader.name = source  # error marks name the file
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlError(f"{source}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise YamlError(f"{source}: the YAML nests too deeply to read; flatten it") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """The value of the YAML file at `path` (None when empty); YamlError names the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise YamlError(f"{path}: not UTF-8 text; a config is a YAML file") from None
    except IsADirectoryError:
        raise YamlError(f"{path} is a folder; pass a YAML file") from None
    return load_yaml_text(text, str(path))
