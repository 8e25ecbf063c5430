"""The one knob grammar: how a dotted knob path names one value of a harness config, read, set and enumerated.

A knob is `<section>.<field>[.<field>...]` (`env.min_distance`, `recipe.temperature`, `reward.partial_credit`). A list
of entries is indexed by the value of its entries' key field, which the task names (`Task.entry_key`): with
`entry_key = "size"`, `env.sizes.5.hole_ratio` is the `hole_ratio` of the entry whose `size` is 5. The vet step, the
engineers and the tasks all use these functions, so the grammar exists once.

Ranges offered to the engineer come from the config models' fields: declared bounds (`ge`/`le`/`gt`/`lt`), else a
`knob_range` in the field's `json_schema_extra` (for fields whose model checks bounds in a validator). A numeric
field with neither is not a knob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

WEIGHT = "data_ratio"  # the field that weighs each keyed entry of a mixture (its share of the instances)
# `env.mixture` names the whole mixture of a task with the `Mixture` capability: its value is {slice value: weight},
# every entry's weight at once (one factor: the training mix, re-weighted together)
MIXTURE = "env.mixture"
MIXTURE_DIGITS = 3  # a mixture's weights are normalised to sum 1 and rounded to this many decimals
# `env.entry` names one keyed entry of the mixture as a whole: its value is {slice value: {field: value, ...}}, the
# entry's fields set together (one factor: that slice's instances made like the target's), its weight untouched
ENTRY = "env.entry"
# `env.target` names the training env as a whole made the judge's distribution (the run's target generator config): its
# value is that config, every field, entry and weight at once (one factor: "train on what you are judged on")
TARGET = "env.target"


class KnobError(ValueError):
    """A knob path that does not name one value of the config (names the missing part and what exists there)."""


def split(path: str, section: str | None = None) -> list[str]:
    """Parts of a knob path; a leading `section.` (e.g. `env.`) is dropped when given."""
    parts = [p for p in str(path).split(".") if p != ""]
    if section and parts and parts[0] == section:
        parts = parts[1:]
    return parts


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def _entry(node: list, part: str, entry_key: str | None, knob: str, add: bool) -> dict:
    if not entry_key:
        raise KnobError(f"knob {knob!r}: {part!r} indexes a list, but this task's config has no keyed lists")
    hits = [e for e in node if isinstance(e, dict) and str(e.get(entry_key)) == part]
    if hits:
        return hits[0]
    if add:
        new: dict[str, Any] = {entry_key: int(part) if part.lstrip("-").isdigit() else part}
        node.append(new)
        return new
    have = ", ".join(str(e.get(entry_key)) for e in node if isinstance(e, dict))
    raise KnobError(f"knob {knob!r}: no entry with {entry_key} {part} (the entries have {entry_key} {have}); add an "
                    f"entry with {entry_key} {part} first")


def get_value(data: dict[str, Any], parts: list[str], entry_key: str | None = None, knob: str = "") -> Any:
    """The value a knob names in plain (JSON-like) config data."""
    knob = knob or ".".join(parts)
    node: Any = data
    for part in parts:
        if isinstance(node, list):
            node = _entry(node, part, entry_key, knob, add=False)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            keys = ", ".join(map(str, node)) if isinstance(node, dict) else type(node).__name__
            raise KnobError(f"knob {knob!r}: {part!r} does not exist (there: {keys})")
    if isinstance(node, dict) or (isinstance(node, list) and node and isinstance(node[0], dict)):
        raise KnobError(f"knob {knob!r} names a whole entry; name one field of it")
    return node


def set_value(data: dict[str, Any], parts: list[str], value: Any, entry_key: str | None = None, knob: str = "",
              add_entry: bool = False, new_fields: bool = False) -> Any:
    """Set the leaf a knob names in plain config data (in place); returns the old value (None for a new field).
    `add_entry`: a missing keyed entry is added (its other fields at the model's defaults); `new_fields`: a field the
    data does not spell out yet may be set (the model's default applies until then)."""
    knob = knob or ".".join(parts)
    if not parts:
        raise KnobError("an empty knob path names nothing")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if last:
                raise KnobError(f"knob {knob!r} names a whole entry; name one field, e.g. {knob}.<field>")
            node = _entry(node, part, entry_key, knob, add=add_entry)
            continue
        if not isinstance(node, dict) or (part not in node and not (last and new_fields)):
            keys = ", ".join(map(str, node)) if isinstance(node, dict) else type(node).__name__
            raise KnobError(f"knob {knob!r}: {part!r} does not exist (there: {keys})")
        if last:
            old = node.get(part)
            if not _is_scalar(old) and not (isinstance(old, list) and all(_is_scalar(x) for x in old)):
                raise KnobError(f"knob {knob!r} is not a single value (it holds a {type(old).__name__}): one knob = "
                                "one leaf, so a candidate changes exactly one factor")
            node[part] = value
            return old
        node = node[part]
    return None  # unreachable


def read(config: BaseModel, path: str, entry_key: str | None, section: str = "env") -> Any:
    """The value a knob path (`env.` prefix optional) names in a config model; an entry's key field is not a knob."""
    parts = split(path, section)
    if entry_key and parts and parts[-1] == entry_key:
        raise KnobError(f"unknown knob {path!r}: an entry's `{entry_key}` is its key, not a knob")
    return get_value(config.model_dump(mode="json"), parts, entry_key, knob=path)


def check_mixture(entries: list, list_field: str, entry_key: str, keys: str, example: str,
                  weight: str = WEIGHT) -> list:
    """The validator of a weighted mixture of keyed entries (a config field like `levels`): not empty, keys unique,
    some entry with weight > 0. `keys` is the key's plural for messages ("digits", "depths"); `example` an entry to
    suggest when the list is empty."""
    if not entries:
        raise ValueError(f"{list_field} is empty; add at least one entry like {example}")
    seen = [getattr(e, entry_key) for e in entries]
    dup = sorted({k for k in seen if seen.count(k) > 1})
    if dup:
        raise ValueError(f"{list_field} must have unique {keys}; {dup[0]} appears {seen.count(dup[0])} times")
    if not any(getattr(e, weight) > 0 for e in entries):
        raise ValueError(f"at least one entry of {list_field} needs {weight} > 0 (all have weight 0)")
    return entries


def canonical_mixture(weights: dict[Any, Any]) -> dict[str, float]:
    """A mixture as one canonical value: string keys in slice order (numbers numerically), weights normalised to sum 1
    and rounded to MIXTURE_DIGITS decimals, zero weights dropped. Two mixtures that draw the same distribution have the
    same canonical form. Raises ValueError for a weight that is not a finite number >= 0, or all weights zero."""
    import math

    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"a mixture is a non-empty mapping {{slice value: weight}}, got {weights!r:.120}")
    w: dict[str, float] = {}
    for k, v in weights.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"mixture weight of {k!r} must be a finite number >= 0, got {v!r}")
        key = slice_key(k)
        w[key] = w.get(key, 0.0) + float(v)
    total = sum(w.values())
    if total <= 0:
        raise ValueError("a mixture needs some weight > 0 (all weights are 0)")
    out = {k: round(v / total, MIXTURE_DIGITS) for k, v in w.items()}
    return {k: out[k] for k in sorted(out, key=order_key) if out[k] > 0}


def slice_key(value: Any) -> str:
    """A slice value as one string: a number however it is written (" 7", "+7", "07", "7.0", 7, another script's
    digits) as its plain form ("7"; "0.25" for a fraction), anything else as its text. Why: a mixture's keys came
    through as written, and pydantic read each spelling as the same entry, so a refuted mixture that adds a size came
    back respelt as a fresh test of the same env (an outside review: five spellings, five byte-identical env.yaml)."""
    import math

    text = str(value).strip()
    try:
        f = float(text)
    except ValueError:
        return str(value)
    if not math.isfinite(f):
        return str(value)
    return str(int(f)) if f.is_integer() else repr(f)


def order_key(value: str) -> tuple[int, float, str]:
    """Slice values in numeric order where they are numbers (3 < 10), else after them by name."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def mixture_of(config: BaseModel, list_field: str, entry_key: str, weight: str = WEIGHT) -> dict[str, float]:
    """{entry key (as the slice value string): weight} of a weighted mixture of keyed entries, weights as written."""
    return {slice_key(getattr(e, entry_key)): float(getattr(e, weight)) for e in getattr(config, list_field)}


def with_mixture(config: BaseModel, list_field: str, entry_key: str, weights: dict[Any, Any],
                 weight: str = WEIGHT) -> BaseModel:
    """A new, validated config whose entries are weighted by `weights` (normalised, `canonical_mixture`): an entry
    not named gets weight 0 (it stays, with its other fields), a key not in the config adds an entry at the entry
    model's defaults (as a per-entry knob on a missing key does). Entries keep their order; added ones follow, and
    numeric keys are sorted."""
    w = canonical_mixture(weights)
    data = config.model_dump(mode="json")
    entries = data[list_field]
    have = {slice_key(e[entry_key]) for e in entries}  # as `canonical_mixture` spells the keys (1.0 and "01": "1")
    for e in entries:
        e[weight] = w.get(slice_key(e[entry_key]), 0.0)
    for k in w:
        if k not in have:
            entries.append({entry_key: int(k) if k.lstrip("-").isdigit() else k, weight: w[k]})
    if all(isinstance(e[entry_key], int) for e in entries):
        entries.sort(key=lambda e: e[entry_key])
    return type(config).model_validate(data)


def pick(entries: list, rng, weight: str = WEIGHT):
    """One entry of a weighted mixture, drawn with numpy Generator `rng` in proportion to `weight`."""
    import numpy as np

    w = np.array([getattr(e, weight) for e in entries], dtype=float)
    return entries[int(rng.choice(len(w), p=w / w.sum()))]


def one_entry(config: BaseModel, field: str, rng, weight: str = WEIGHT) -> BaseModel:
    """`config` with its weighted list `field` cut to the one entry `rng` picks (`pick`): a level chosen once, so a
    generator that draws again within it (`harness.seeds.held_apart`) keeps the configured mix in every split."""
    return config.model_copy(update={field: [pick(getattr(config, field), rng, weight)]})


def entry_configs(config: BaseModel, list_field: str, entry_key: str, knob: str,
                  weight: str = WEIGHT) -> list[tuple[str, BaseModel]]:
    """One config per keyed entry a knob touches, that entry alone at full weight: a per-entry knob
    (`env.<list_field>.<key>.<field>`) its entry; any other knob every entry with weight > 0. What a task's
    `vet_configs` generates from when its config is a weighted mixture of keyed entries."""
    parts = split(knob, "env")
    only = parts[1] if len(parts) == 3 and parts[0] == list_field else None
    out = []
    for e in getattr(config, list_field):
        key = getattr(e, entry_key)
        if (only is None and getattr(e, weight) > 0) or str(key) == only:
            one = {**config.model_dump(mode="json"), list_field: [{**e.model_dump(mode="json"), weight: 1.0}]}
            out.append((f"{entry_key} {key}", type(config).model_validate(one)))
    return out


def fill(template: str, values: dict[str, Any]) -> tuple[str | None, list[str]]:
    """A knob template with its `{<slice>}` fields filled from `values` (a finding's slice): (knob, []), or
    (None, the missing field names)."""
    import string

    names = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    missing = [n for n in names if n not in values]
    if missing:
        return None, missing
    return (template.format(**{n: values[n] for n in names}) if names else template), []


@dataclass(frozen=True)
class KnobSpec:
    path: str
    lo: float
    hi: float
    integer: bool
    current: float | int
    help: str = ""


def field_range(info: Any) -> tuple[float | None, float | None]:
    """A field's knob range: its declared bounds, else `json_schema_extra['knob_range']`."""
    lo = hi = None
    for m in info.metadata:
        for attr, is_lo in (("ge", True), ("gt", True), ("le", False), ("lt", False)):
            v = getattr(m, attr, None)
            if v is not None:
                if is_lo:
                    lo = float(v)
                else:
                    hi = float(v)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if (lo is None or hi is None) and "knob_range" in extra:
        lo, hi = (float(x) for x in extra["knob_range"])
    return lo, hi


def walk(model: BaseModel, prefix: str, entry_key: str | None = None) -> list[KnobSpec]:
    """Every knob of a config model instance: bounded numeric fields, nested models, and lists of entries keyed by
    `entry_key` (the key field itself is not a knob)."""
    out: list[KnobSpec] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}.{name}"
        if isinstance(value, BaseModel):
            out += walk(value, path, entry_key)
        elif (entry_key and isinstance(value, list) and value
              and all(isinstance(v, BaseModel) and hasattr(v, entry_key) for v in value)):
            for v in value:
                out += walk(v, f"{path}.{getattr(v, entry_key)}", entry_key)
        elif isinstance(value, int | float) and not isinstance(value, bool) and name != entry_key:
            lo, hi = field_range(info)
            if lo is not None and hi is not None:
                out.append(KnobSpec(path=path, lo=lo, hi=hi, integer=isinstance(value, int), current=value,
                                    help=info.description or ""))
    return out


def keyed_list(data: dict[str, Any], entry_key: str) -> str | None:
    """The field of plain config data that holds the keyed entries (a list of objects with `entry_key`), or None."""
    for name, v in data.items():
        if isinstance(v, list) and v and all(isinstance(e, dict) and entry_key in e for e in v):
            return name
    return None


def entry_differences(train: BaseModel, target: BaseModel, entry_key: str,
                      weight: str = WEIGHT) -> dict[str, dict[str, list[Any]]]:
    """{slice value: {field: [training mix's value, target's value]}} for each keyed entry both configs have, over the
    fields (not the key, not the weight) where they differ. Empty when either config has no keyed entries."""
    a, b = train.model_dump(mode="json"), target.model_dump(mode="json")
    la, lb = keyed_list(a, entry_key), keyed_list(b, entry_key)
    if la is None or lb is None:
        return {}
    mine = {str(e[entry_key]): e for e in a[la]}
    out: dict[str, dict[str, list[Any]]] = {}
    for e in b[lb]:
        k = str(e[entry_key])
        if k not in mine:
            continue
        diff = {f: [mine[k].get(f), v] for f, v in e.items() if f not in (entry_key, weight) and mine[k].get(f) != v}
        if diff:
            out[k] = diff
    return out


def config_differences(train: BaseModel, target: BaseModel, entry_key: str | None,
                       weight: str = WEIGHT) -> list[str]:
    """The ways the training config differs from the target, in words, one per change a finer knob would make: the
    weights of the keyed entries (`env.mixture`, an entry only one side weighs included), each entry both have made
    differently (`env.entry`), each other field (its own knob). Empty when the two draw the same instances."""
    a, b = train.model_dump(mode="json"), target.model_dump(mode="json")
    la = keyed_list(a, entry_key) if entry_key else None
    lb = keyed_list(b, entry_key) if entry_key else None
    out: list[str] = []
    for f in [*a, *(f for f in b if f not in a)]:
        if f in (la, lb) and la is not None and lb is not None:
            continue
        if a.get(f) != b.get(f):
            out.append(f"{f} {json.dumps(a.get(f))[:80]} (target {json.dumps(b.get(f))[:80]})")
    if la is None or lb is None:
        return out
    wa = {str(e[entry_key]): float(e.get(weight, 1.0)) for e in a[la]}
    wb = {str(e[entry_key]): float(e.get(weight, 1.0)) for e in b[lb]}
    try:
        ca, cb = canonical_mixture(wa), canonical_mixture(wb)
    except ValueError:
        ca, cb = wa, wb
    if ca != cb:
        out.append("weights " + ", ".join(f"{entry_key}={k} {ca.get(k, 0.0):.2f} (target {cb.get(k, 0.0):.2f})"
                                          for k in sorted({*ca, *cb}, key=order_key)))
    for k, diff in entry_differences(train, target, entry_key, weight).items():
        if cb.get(k, 0.0) > 0:  # an entry the target never draws is no difference on the target
            out.append(f"{entry_key}={k}: {entry_diff_text(diff)}")
    return out


def entry_diff_text(diff: dict[str, list[Any]]) -> str:
    """One slice's `entry_differences` as words: `hole_ratio 0.45 (target 0.2), agents 3 (target 2)`."""
    return ", ".join(f"{f} {m} (target {t})" for f, (m, t) in diff.items())


def with_entry(config: BaseModel, entry_key: str, value: Any, weight: str = WEIGHT) -> tuple[BaseModel, dict]:
    """A new, validated config with ONE keyed entry's fields set (`env.entry`): `value` is {slice value: {field:
    value}}; the entry must exist, the fields must be its fields, not its key or weight. Returns (config, the old
    values of the fields set). Raises ValueError naming the problem."""
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"{ENTRY} takes one entry, {{<{entry_key}>: {{field: value, ...}}}}; got {value!r:.160}")
    (key, fields), = value.items()
    if not isinstance(fields, dict) or not fields:
        raise ValueError(f"{ENTRY}: the entry's fields must be a non-empty object {{field: value}}, got {fields!r:.120}")
    data = config.model_dump(mode="json")
    lst = keyed_list(data, entry_key)
    if lst is None:
        raise ValueError(f"{ENTRY}: the config has no keyed entries (by {entry_key}) to set")
    hits = [e for e in data[lst] if str(e[entry_key]) == str(key)]
    if not hits:
        have = ", ".join(str(e[entry_key]) for e in data[lst])
        raise ValueError(f"{ENTRY}: no entry with {entry_key} {key} (there: {have}); add it with {MIXTURE} first")
    entry, old = hits[0], {}
    for f, v in fields.items():
        if f in (entry_key, weight):
            raise ValueError(f"{ENTRY}: {f!r} is the entry's {'key' if f == entry_key else 'weight'}, not one of its "
                             f"fields to set ({'re-weight with ' + MIXTURE if f == weight else 'name another entry'})")
        if f not in entry:
            raise ValueError(f"{ENTRY}: entry {key} has no field {f!r} (its fields: "
                             f"{', '.join(x for x in entry if x not in (entry_key, weight))})")
        old[f] = entry[f]
        entry[f] = v
    if old == {f: fields[f] for f in old}:
        raise ValueError(f"{ENTRY} = {value!r:.160} is entry {key} as it is: the change does nothing")
    return type(config).model_validate(data), {str(key): old}
