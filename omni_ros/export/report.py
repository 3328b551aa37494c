"""Which operators each method delegated to the backend and which stayed on portable CPU kernels."""

from __future__ import annotations

from collections import Counter
from typing import Any

# Graph plumbing, not work: tuple indexing of multi-output nodes.
_PLUMBING = {"getitem"}


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    # "aten.linear.default" -> "linear"; dim-order copies keep their namespace so they read as copies.
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return parts[1]
    return name


def delegation_report(edge: Any, methods: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per method: delegated subgraphs, delegated op counts by backend, ops left to portable kernels.

    `edge` is the EdgeProgramManager returned by `to_edge_transform_and_lower`.
    """
    report: dict[str, dict[str, Any]] = {}
    for method in methods:
        gm = edge.exported_program(method).graph_module
        delegated: Counter[str] = Counter()
        portable: Counter[str] = Counter()
        backends: Counter[str] = Counter()
        subgraph_sizes: list[int] = []
        for node in gm.graph.nodes:
            if node.op == "get_attr" and str(node.target).startswith("lowered_module"):
                lowered = getattr(gm, node.target)
                backends[lowered.backend_id] += 1
                ops = [_op_name(n.target) for n in lowered.original_module.graph.nodes if n.op == "call_function"]
                ops = [op for op in ops if op not in _PLUMBING]
                subgraph_sizes.append(len(ops))
                delegated.update(ops)
            elif node.op == "call_function":
                name = _op_name(node.target)
                if name not in _PLUMBING and name != "executorch_call_delegate":
                    portable[name] += 1
        n_delegated, n_portable = sum(delegated.values()), sum(portable.values())
        report[method] = {
            "delegated_subgraphs": sum(backends.values()),
            "backends": dict(backends),
            "delegated_ops": n_delegated,
            "portable_ops": n_portable,
            "delegated_fraction": round(n_delegated / max(1, n_delegated + n_portable), 4),
            "largest_subgraph_ops": max(subgraph_sizes, default=0),
            "delegated": dict(sorted(delegated.items())),
            "portable": dict(sorted(portable.items())),
        }
    return report


def format_report(report: dict[str, dict[str, Any]]) -> str:
    """A short human-readable table of `delegation_report`."""
    lines = [f"{'method':<14}{'subgraphs':>10}{'delegated':>11}{'portable':>10}  portable ops"]
    for method, r in report.items():
        portable = ", ".join(f"{k} x{v}" for k, v in r["portable"].items()) or "-"
        lines.append(
            f"{method:<14}{r['delegated_subgraphs']:>10}{r['delegated_ops']:>11}{r['portable_ops']:>10}  {portable}"
        )
    return "\n".join(lines)
