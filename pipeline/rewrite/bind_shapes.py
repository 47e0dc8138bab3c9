"""Bind a model's input shapes and give its subgraphs what shape inference needs.

The static stage binds the spec's shapes before it simplifies; the coverage stage binds them
before it predicts what each compiler can take. Both take these from here (a stage does not
import another stage).
"""
from __future__ import annotations

from .graph_edit import subgraphs


def bind_inputs(model, shapes: dict) -> None:
    """Write the spec's shapes into the graph inputs; drop stale value_info and output dims."""
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[vi.name]:
                dims.add().dim_value = size
    del model.graph.value_info[:]  # old exports carry -1 dims here that contradict the new shapes
    for vi in model.graph.output:
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()


def localize_subgraphs(graph, outer: dict | None = None) -> None:
    """Give every subgraph its own copies of the outer initializers it reads, and drop the
    shapes recorded inside it (stale symbolic dims), so that shape inference reaches it."""
    visible = {**(outer or {}), **{t.name: t for t in graph.initializer}}
    for sub in subgraphs(graph):
        del sub.value_info[:]
        for value in sub.output:
            value.type.tensor_type.ClearField("shape")
        defined = ({t.name for t in sub.initializer} | {i.name for i in sub.input}
                   | {o for n in sub.node for o in n.output})
        used = {i for n in sub.node for i in n.input if i}
        for name in sorted(used - defined):
            if name in visible:
                sub.initializer.append(visible[name])
        localize_subgraphs(sub, visible)
