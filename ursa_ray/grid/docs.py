"""README's grid reference, generated from the schema (:data:`ursa_ray.grid.schema.KEYS`): the example grid
(each key's ``example``, in the schema's order) and the "Also:" line (each key without an example, with its
help).  ``python -m ursa_ray.grid.docs`` rewrites README.md's copy; tests/test_grid_schema.py holds the two equal."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from ursa_ray.grid.schema import KEYS, Key

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- grid reference: generated from ursa_ray/grid/schema.py by `python -m ursa_ray.grid.docs` -->"
END = "<!-- end of the generated grid reference -->"
WIDTH = 110
"""README's prose width."""


def grid_reference(keys: tuple[Key, ...] = KEYS) -> str:
    """The Markdown of the grid reference: a YAML block of the keys' examples, then the other keys' help."""
    example = "\n".join(key.example for key in keys if key.example)
    also = "; ".join(f"`{key.name}`: {key.help}" for key in keys if not key.example)
    text = textwrap.fill(f"Also: {also}.", WIDTH, break_on_hyphens=False, break_long_words=False)
    return f"```yaml\n{example}\n```\n\n{text}"


def with_reference(readme: str, keys: tuple[Key, ...] = KEYS) -> str:
    """``readme`` with the text between its :data:`BEGIN` and :data:`END` markers replaced by the reference."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"README has no generated grid reference: add the lines {BEGIN} and {END}")
    return f"{head}{BEGIN}\n{grid_reference(keys)}\n{END}{tail}"


def main(path: Path = README) -> int:
    """Rewrite ``path``'s grid reference from the schema; print whether it changed."""
    old = path.read_text(encoding="utf-8")
    new = with_reference(old)
    if new != old:
        path.write_text(new, encoding="utf-8")
    print(f"{path}: grid reference {'rewritten' if new != old else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else README))
