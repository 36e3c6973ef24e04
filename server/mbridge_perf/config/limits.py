"""Bounds on untrusted input, applied before anything expands it.

Configs, dumps and tool arguments come from anywhere (an assistant steered by text it read, a
cloned repository), so every reader checks size, YAML aliases, nesting depth, the number of
nodes a tree expands to and the key types before the data is copied, merged or validated. Each
refusal is one ConfigError naming the limit. Real Megatron Bridge dumps are ~26 KB, depth < 10,
no anchors, ~2,500 nodes — the limits sit orders of magnitude above them.

The byte limit is the user's to raise (``MBRIDGE_PERF_MAX_CONFIG_BYTES``, the environment the
server or CLI was started with); the structural limits are fixed.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from mbridge_perf.config.errors import ConfigError

BYTES_ENV = "MBRIDGE_PERF_MAX_CONFIG_BYTES"
DEFAULT_MAX_BYTES = 1 << 20        # 1 MiB per config input
MAX_DEPTH = 32                     # nested mappings / lists
MAX_ALIASES = 100                  # YAML alias uses (*name) per document
MAX_NODES = 200_000                # values after alias expansion
MAX_OVERRIDES = 1_000              # --set items / overrides entries, perf flags

# Hydra / OmegaConf instantiation markers. Bridge dumps carry them as whole keys (read and
# dropped by config/bridge.py); anywhere else in a key (a dotted segment, padded with spaces)
# they would survive into a rendered override and name code to call, so they are refused.
HYDRA_MARKERS = frozenset({"_target_", "_partial_", "_call_", "_recursive_", "_convert_",
                           "_args_", "_name_"})


def max_config_bytes() -> int:
    """The per-input size cap: 1 MiB unless the user's environment raises it."""
    raw = os.environ.get(BYTES_ENV, "")
    try:
        value = int(raw) if raw.strip() else DEFAULT_MAX_BYTES
    except ValueError:
        value = DEFAULT_MAX_BYTES
    return value if value > 0 else DEFAULT_MAX_BYTES


def check_size(size: int, source: str) -> None:
    limit = max_config_bytes()
    if size > limit:
        raise ConfigError(source, f"{size:,} bytes is over the {limit:,}-byte limit for one "
                                  f"config (a Bridge dump is ~26 KB); pass the config itself, "
                                  f"or raise {BYTES_ENV} in your own environment")


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts alias uses and nesting while composing, so neither an alias
    bomb nor a deeply nested document is ever built."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Limit(f"more than {MAX_ALIASES} YAML aliases (*name); write the values "
                             "out instead of repeating anchors")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Limit(f"nested deeper than {MAX_DEPTH} levels; a Bridge config is a few "
                         "levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """Refuse a key written twice in one mapping (YAML would keep the last silently)."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or \
                        key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue
                if first is not None:
                    raise _Limit(f"the key {key!r} is written twice in one mapping (lines "
                                 f"{first} and {line}); YAML would keep only the second "
                                 "silently: keep one")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> Any:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return HugeInt(len(str(node.value)), node.start_mark.line + 1)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


class HugeInt:
    """An integer literal too long for Python to read (over ``sys.get_int_max_str_digits()``
    digits): kept as its size, so check_tree can name the field it sits in."""

    def __init__(self, digits: int, line: int | None = None) -> None:
        self.digits, self.line = digits, line


class _Limit(Exception):
    """Raised inside the loader; turned into a ConfigError naming the source."""


def load_yaml(text: str, source: str) -> Any:
    """YAML text → Python data under every limit (raises ConfigError or yaml.YAMLError)."""
    check_size(len(text.encode("utf-8", "surrogatepass")), source)
    loader = _BoundedLoader(text)
    try:
        data = loader.get_single_data()
    except _Limit as exc:
        raise ConfigError(source, str(exc)) from None
    finally:
        loader.dispose()
    check_tree(data, source)
    return data


def _key_name(key: Any, path: str, source: str) -> str:
    if not isinstance(key, str):
        where = path or "the top level"
        raise ConfigError(path or source, f"key {key!r} at {where} is not a name: keys must "
                                          "be text (quote it, e.g. \"1\": …)")
    if key not in HYDRA_MARKERS and has_marker(key.split(".")):
        where = f"{path}.{key}" if path else key
        raise ConfigError(where, f"the key {key!r} holds a Hydra marker "
                                 f"({', '.join(sorted(HYDRA_MARKERS))}) inside it; markers "
                                 "are read only as whole keys of a Bridge dump, never in a "
                                 "dotted or padded name")
    return key


def has_marker(parts: Any) -> bool:
    """Whether any segment of a key, once stripped of whitespace, is a Hydra marker."""
    return any(str(part).strip() in HYDRA_MARKERS for part in parts)


def check_tree(data: Any, source: str) -> None:
    """Walk ``data`` once, iteratively (no recursion), counting every node as expanded — a
    value reachable twice counts twice — and checking depth, key types and total text size;
    stops at the first limit crossed."""
    budget_bytes = max_config_bytes()
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    nodes = text = 0
    while stack:
        value, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigError(source, f"expands to more than {MAX_NODES:,} values (YAML "
                                      "aliases repeated inside each other?); write the "
                                      "config out plainly")
        if depth > MAX_DEPTH:
            raise ConfigError(path or source, f"nested deeper than {MAX_DEPTH} levels; a "
                                              "Bridge config is a few levels deep")
        if isinstance(value, str):
            text += len(value)
        elif isinstance(value, HugeInt):
            at = f" (line {value.line})" if value.line else ""
            raise ConfigError(path or source, f"an integer of {value.digits:,} digits{at} "
                                              "is too long to be a setting; write the "
                                              "real value")
        elif isinstance(value, dict):
            for key, child in value.items():
                name = _key_name(key, path, source)
                text += len(name)
                stack.append((child, f"{path}.{name}" if path else name, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((child, f"{path}.{i}" if path else str(i), depth + 1)
                         for i, child in enumerate(value))
        if text > budget_bytes:
            raise ConfigError(source, f"holds more than {budget_bytes:,} characters of text "
                                      f"after expansion; raise {BYTES_ENV} in your own "
                                      "environment if it is real")


def check_count(items: Any, source: str) -> None:
    """A list of overrides or flags: bounded in count and in total size."""
    if len(items) > MAX_OVERRIDES:
        raise ConfigError(source, f"{len(items):,} entries is over the limit of "
                                  f"{MAX_OVERRIDES:,}; put the values in the config itself")
    check_size(sum(len(str(i)) for i in items), source)
