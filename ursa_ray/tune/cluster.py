"""Probing the Ray cluster before a run: whether a head answers at an address (:func:`unreachable`), joining it or
starting a local Ray (:func:`connect`), and whether some node (or a node type the autoscaler may add) has what
each of the grid's trials asks for (:func:`check_cluster_fits`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import ray

from ursa_ray.grid import Grid, GridError
from ursa_ray.tune.trainable import request


def unreachable(address: str) -> str | None:
    """Why no Ray cluster answers at ``address``, or None when its head accepts a TCP connection within 3 s
    (``ray.init`` would otherwise retry an absent head for minutes).  ``auto``: the cluster ``ray start`` left on
    this machine; ``ray://host:port``: a Ray Client server."""
    import socket

    from ray._private.services import canonicalize_bootstrap_address  # covered by tests/test_ray_internals.py

    try:
        head = canonicalize_bootstrap_address(address.removeprefix("ray://"))
    except ValueError as exc:
        return str(exc)
    if head is None:
        return "no running cluster found"
    host, _, port = head.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except (OSError, ValueError) as exc:
        return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return None


def connect(address: str | None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start a small local Ray."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    common = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address:
        ray.init(address=address, **common)
    else:  # "local": a new local Ray even when `ray start` left a cluster on this machine
        ray.init(address="local", object_store_memory=256 * 1024**2, **common)


def grid_requests(grid: Grid) -> dict[tuple[tuple[str, float], ...], list[tuple[str, str]]]:
    """Every distinct request of the grid's trials (both phases: a cell's search and final trials ask for the
    same; a reference trial the block's ``resources`` over its cell's), as sorted (resource, amount) pairs, each
    with the (method label, model) pairs that ask for it (label ``reference`` for a reference trial)."""
    out: dict[tuple[tuple[str, float], ...], list[tuple[str, str]]] = {}
    for label, model, resources in grid.trial_requests():
        pairs = out.setdefault(tuple(sorted(request(resources).items())), [])
        if (label, model) not in pairs:
            pairs.append((label, model))
    return out


def describe(need: Mapping[str, float]) -> str:
    """A request as ``CPU=1, GPU=0.25``."""
    return ", ".join(f"{k}={v:g}" for k, v in need.items())


# Written by the cluster launcher (`ray up`) on the head node: the node types its autoscaler may add.
LAUNCHER_CONFIG = Path("~/ray_bootstrap_config.yaml")


def launchable_node_resources() -> list[dict[str, float]]:
    """Resources of the node types an autoscaler may still add: the autoscaler v2 / KubeRay config in the GCS,
    else the launcher's config on a `ray up` head (worker types with max_workers 0 excluded)."""
    offers: list[dict[str, float]] = []
    try:
        config = ray._private.state.state.get_cluster_config()
    except Exception:  # noqa: BLE001 - no autoscaler config in this cluster's GCS
        config = None
    for group in getattr(config, "node_group_configs", None) or []:
        if group.max_count != 0:
            offers.append({k: float(v) for k, v in group.resources.items()})
    path = LAUNCHER_CONFIG.expanduser()
    if not offers and path.is_file():
        import yaml

        try:
            launcher = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            launcher = {}
        for name, node_type in (launcher.get("available_node_types") or {}).items():
            if node_type.get("max_workers", 1) != 0 or name == launcher.get("head_node_type"):
                offers.append({k: float(v) for k, v in (node_type.get("resources") or {}).items()})
    return offers


def check_cluster_fits(grid: Grid) -> None:
    """GridError when no alive node (nor any node type the autoscaler may add) has the resources that some
    trial of the grid asks for (Ray would wait forever), checked for each distinct request
    (:func:`grid_requests`).  The one-line message names the method and model asking for it, or says "each
    trial" when every trial of the grid asks for the same."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")] + launchable_node_resources()
    requests = grid_requests(grid)
    for key, pairs in requests.items():
        need = dict(key)
        if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
            continue
        offered = "; ".join(
            ", ".join(f"{k}={v:g}" for k, v in sorted(node.items()) if k in ("CPU", "GPU") or k in need)
            for node in nodes
        )
        short = {k: v for k, v in need.items() if not any(node.get(k, 0.0) >= v for node in nodes)}
        which = describe(short) or describe(need)
        if len(requests) == 1:
            who = "each trial"
        else:
            label, model = pairs[0]
            others = len(pairs) - 1
            asker = "the reference trial" if label == "reference" else f"method {label!r}"
            who = f"{asker} on model {model!r}" + (
                f" (and {others} other method/model pair{'s' if others > 1 else ''})" if others else ""
            )
        raise GridError(
            f"{grid.path}: resources: {who} asks for {which}, which no node of the Ray cluster has "
            f"(nodes offer: {offered or 'nothing'})"
        )
