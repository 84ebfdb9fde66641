"""The transformer layers of an exported graph: which nodes compute each one.

Both int8 backends put whole layers back in float when all-int8 changes too many
annotations (:func:`spacy_accelerate.verify.plan_search.float_layer_ladder`); this says
which nodes a layer is, in any graph derived from the export (ONNX Runtime's prepared
model, the ONNX file OpenVINO converts).
"""

from __future__ import annotations

import onnx

from spacy_accelerate.architectures.spec import EncoderSpec


def nodes_by_layer(graph: onnx.ModelProto, spec: EncoderSpec) -> dict[int, list[onnx.NodeProto]]:
    """The nodes of each transformer layer (1-based), found by what the graph's outputs
    depend on: layer k's nodes feed ``hidden_state_k`` but not ``hidden_state_{k-1}``.
    No node names are read, so every family's export is split the same way."""
    producers = {out: node for node in graph.graph.node for out in node.output}
    ancestors: list[set[int]] = []
    seen: set[int] = set()  # node identities: a node's name may be empty
    for name in spec.hidden_state_names:  # each layer's ancestors include the previous ones
        stack = [name]
        while stack:
            node = producers.get(stack.pop())
            if node is not None and id(node) not in seen:
                seen.add(id(node))
                stack.extend(node.input)
        ancestors.append(set(seen))
    return {
        layer: [node for node in graph.graph.node if id(node) in fresh]
        for layer, fresh in ((k, ancestors[k] - ancestors[k - 1]) for k in range(1, len(ancestors)))
    }
