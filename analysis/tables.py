"""Loading a results directory and formatting tables as markdown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ursa_ray.results import Location, NotAResultsDirectory, ResultsDirectory, is_uri


@dataclass
class Results:
    trials: pd.DataFrame
    metrics: pd.DataFrame
    points: pd.DataFrame


def load_results(path: str | Path | Location) -> Results:
    """The Parquet tables of a results directory, local or an object-store URI such as ``s3://bucket/prefix``
    (empty frames for the ones a run did not produce)."""
    where = path if isinstance(path, Location) else Location.parse(path if is_uri(path) else Path(path))
    if not (where / "trials.parquet").exists():
        raise NotAResultsDirectory(f"{path}: no trials.parquet; is this an ursa-ray results directory?")

    tables = ResultsDirectory(where)
    return Results(tables.read("trials"), tables.read("metrics"), tables.read("points"))


def format_number(value: object, digits: int = 3) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 10**-digits):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(frame: pd.DataFrame, digits: int = 3, index: bool = True) -> str:
    """A GitHub-flavoured markdown table of ``frame`` (floats rounded to ``digits``)."""
    table = frame.reset_index() if index else frame
    header = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(format_number(v, digits) for v in row) + " |")
    return "\n".join(lines)
