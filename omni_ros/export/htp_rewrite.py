"""Rewrites of a float ONNX graph where Qualcomm's HTP needs them, before QDQ quantization (qnn_onnx)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Attention masks are additive biases of -1e30 (or -inf) in the float graph. Quantized, such a value stretches the
# range of the scores it is added to until every real score rounds to the same level, and in fp16 it is -inf. A
# bias of -100 still gives exp(-100) ~ 4e-44 to a masked key, and keeps the scores' range a few hundred at most.
HTP_MASK_VALUE = -100.0
MASK_SENTINEL = -1e9


def prepare_for_htp(path: Path, out: Path) -> dict[str, int]:
    """Rewrite a float graph where the HTP needs it; returns how many of each rewrite were made.

    - Reciprocal(x) -> Div(1, x): the HTP's quantized Reciprocal is far less accurate than its Div (measured on the
      emulator: a QDQ ViT block 0.2 away from the CPU EP with Reciprocal, 2.5e-3 with Div).
    - mask sentinels (constants <= -1e9, -inf) -> HTP_MASK_VALUE (see there).
    - Transpose(p) followed by its inverse Transpose -> neither. SmolVLA's prefill splits the heads of a K / V
      projection (a transpose for the backbone's attention) and merges them again for the expert's cross-attention
      re-projection; quantized, the QNN EP's layout pass leaves such a pair as a bare Transpose on quantized data
      that it cannot place, and the graph falls apart into CPU islands.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(path)
    counts = {"reciprocal_to_div": 0, "mask_constants": 0}
    counts["inverse_transposes"] = _cancel_inverse_transposes(model.graph)
    one = "omni_ros_one"
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Reciprocal":
            nodes.append(helper.make_node("Div", [one, node.input[0]], list(node.output), name=node.name))
            counts["reciprocal_to_div"] += 1
            continue
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and _is_mask_sentinel(numpy_helper.to_array(attr.t)):
                    value = numpy_helper.to_array(attr.t)
                    attr.t.CopyFrom(numpy_helper.from_array(np.full_like(value, HTP_MASK_VALUE), attr.t.name))
                    counts["mask_constants"] += 1
        nodes.append(node)
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if _is_mask_sentinel(value):
            init.CopyFrom(numpy_helper.from_array(np.full_like(value, HTP_MASK_VALUE), init.name))
            counts["mask_constants"] += 1
    if counts["reciprocal_to_div"]:
        model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), one))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    large = model.ByteSize() > 1.8e9
    onnx.save(model, out, save_as_external_data=large, location=f"{out.name}.data" if large else None)
    return counts


def _cancel_inverse_transposes(graph) -> int:
    """Remove every Transpose that undoes the Transpose feeding it (its readers read the first one's input);
    returns how many pairs were cancelled. The first Transpose stays while something else reads it."""
    from onnx import helper

    producer = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}

    def perm(node) -> list[int] | None:
        return next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "perm"), None)

    renamed: dict[str, str] = {}
    dropped = set()
    for node in graph.node:
        first = producer.get(node.input[0]) if node.op_type == "Transpose" else None
        if first is None or first.op_type != "Transpose" or node.output[0] in outputs:
            continue
        p1, p2 = perm(first), perm(node)
        if p1 is None or p2 is None or [p1[i] for i in p2] != list(range(len(p2))):
            continue
        renamed[node.output[0]] = first.input[0]
        dropped.add(id(node))
    if not renamed:
        return 0
    kept = [n for n in graph.node if id(n) not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
    read = {name for node in kept for name in node.input} | outputs
    kept = [n for n in kept if n.op_type != "Transpose" or any(o in read for o in n.output)]
    del graph.node[:]
    graph.node.extend(kept)
    return len(renamed)


def _is_mask_sentinel(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" and 0 < value.size <= 16 and bool(np.all(value <= MASK_SENTINEL))
