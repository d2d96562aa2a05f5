"""Reading a grid file: UTF-8 YAML read by :class:`GridLoader` (no repeated keys, no alias bombs), then checked
by the schema (:func:`ursa_ray.grid.schema.parse_grid`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from ursa_ray.grid.expand import Grid
from ursa_ray.grid.fields import GridError
from ursa_ray.grid.schema import parse_grid

MAX_YAML_NODES = 100_000
"""The most YAML nodes a grid file may hold once its aliases are expanded (a few hundred in a real grid; a
"billion laughs" alias bomb is refused before anything reads it)."""


class GridLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (YAML would keep the last silently) and
    a document of more than :data:`MAX_YAML_NODES` nodes once its aliases are expanded (an alias bomb), counted
    on the composed node graph before anything is built from it."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _count_nodes(node, {}, node.start_mark)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        line_of: dict[Any, int] = {}  # each scalar key -> the line it first appears on
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in line_of:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice (first on line {line_of[key]}); give each key once",
                    key_node.start_mark,
                )
            line_of[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _count_nodes(node: yaml.Node, memo: dict[int, int], mark: yaml.Mark) -> int:
    """The number of nodes under ``node`` with every alias expanded (each shared node counted once per use,
    computed once: linear in the file's size); a ConstructorError past :data:`MAX_YAML_NODES`."""
    if id(node) not in memo:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        memo[id(node)] = 0  # a recursive structure (an alias inside its own anchor) counts what is seen so far
        total = 1 + sum(_count_nodes(child, memo, mark) for child in children)
        if total > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"expands to more than {MAX_YAML_NODES:,} values through its aliases (&anchor / *alias)",
                mark,
            )
        memo[id(node)] = total
    return memo[id(node)]


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid file (UTF-8 YAML, read by :class:`GridLoader`)."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"{path}: cannot read the grid file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise GridError(
            f"{path}: byte {exc.start}: not UTF-8 text ({exc.reason}); a grid file is YAML saved as UTF-8"
        ) from None
    try:
        raw = yaml.load(text, Loader=GridLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        raise GridError(f"{path}: {where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise GridError(
            f"{path}: YAML: nested too deeply to read; a grid is a few levels of mappings and lists"
        ) from None
    return dataclasses.replace(parse_grid(raw, path), source=text)
