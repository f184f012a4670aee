"""Our flat expression graph: the product of tracing, the input of every later pass.

A ``Graph`` is a topologically ordered tuple of ``Node``s over integer *values*. Every value is
produced by exactly one node: ``parameter`` nodes stand for the function's flat inputs, ``constant`` nodes
for literals and closed-over arrays, every other node for one JAX primitive application (calls such as
nested ``jit`` are already inlined). ``str(graph)`` prints a jaxpr-like listing::

    { lambda ;
        a:f32[8,8]   # x
        b:f32[8,8]   # y
      let
        c:f32[8,8] = add a b                       # f.py:3
        ...
      in (i,) }
"""

from __future__ import annotations

import warnings

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jax
import networkx as nx
import numpy as np

PARAMETER = "parameter"
CONSTANT = "constant"


@dataclass(frozen=True, slots=True)
class Aval:
    """Shape and dtype of one value."""

    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or JAX's extended dtype (PRNG keys)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{short_dtype(self.dtype)}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """One operation: ``outputs = op(*operands, **params)``, at the user's ``source`` line (``file:line``).

    ``operands`` and ``outputs`` are value ids into ``Graph.avals``. ``primitive`` is the JAX primitive
    to bind when executing (None for ``parameter`` and ``constant`` nodes).
    """

    id: int
    op: str
    operands: tuple[int, ...]
    outputs: tuple[int, ...]
    params: Mapping[str, Any]
    source: str | None
    primitive: Any = field(default=None, repr=False)
    # The user's own line that called into the library ``source`` is in (an optax update, a flax layer), if it is.
    caller: str | None = field(default=None, repr=False)

    @property
    def output(self) -> int:
        """The single output value (most ops have exactly one)."""
        (out,) = self.outputs
        return out


@dataclass(frozen=True, eq=False)
class Graph:
    """A traced function. ``inputs``/``outputs`` are flat value ids; the trees rebuild the user's pytrees.

    ``weak_inputs``/``weak_outputs`` say which inputs and outputs are weakly typed, as under ``jax.jit`` (a
    Python scalar argument, or a result computed only from such scalars): a program returns its outputs with
    the same weak types ``jax.jit`` would.
    """

    nodes: tuple[Node, ...]
    avals: tuple[Aval, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    in_tree: Any
    out_tree: Any
    weak_inputs: tuple[bool, ...] = ()
    weak_outputs: tuple[bool, ...] = ()
    # Calls with custom derivative rules that were inlined (``custom_jvp_call``, ``custom_vjp_call``, ...): the
    # graph computes their forward only, so a Program differentiates the user's function instead.
    custom_derivatives: frozenset[str] = frozenset()
    # The names jax.jit's messages give the argument leaves (``params['w'][0]``: the parameter and the key path)
    names: tuple[str, ...] = ()

    @cached_property
    def producer(self) -> tuple[int, ...]:
        """``producer[value]`` is the id of the node that computes ``value``."""
        prod = [0] * len(self.avals)
        for node in self.nodes:
            for v in node.outputs:
                prod[v] = node.id
        return tuple(prod)

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """``consumers[value]`` lists the ids of the nodes that read ``value`` (in graph order)."""
        cons: list[list[int]] = [[] for _ in self.avals]
        for node in self.nodes:
            for v in dict.fromkeys(node.operands):
                cons[v].append(node.id)
        return tuple(tuple(c) for c in cons)

    @cached_property
    def digraph(self) -> nx.DiGraph:
        """The node-level dependency graph as a ``networkx.DiGraph`` (edges producer → consumer)."""
        g = nx.DiGraph()
        g.add_nodes_from(n.id for n in self.nodes)
        producer = self.producer
        g.add_edges_from((producer[v], n.id) for n in self.nodes for v in n.operands)
        return g

    @cached_property
    def argument_keys(self) -> tuple[tuple, ...]:
        """Each flat argument's key path (``jax.tree_util`` keys: ``(SequenceKey(0), DictKey('w'))``)."""
        if self.in_tree is None:  # a loop's or a cond's body: its inputs are a flat list
            return tuple((jax.tree_util.SequenceKey(k),) for k in range(len(self.inputs)))
        skeleton = jax.tree_util.tree_unflatten(self.in_tree, list(range(len(self.inputs))))
        return tuple(path for path, _ in jax.tree_util.tree_flatten_with_path(skeleton)[0])

    @cached_property
    def argument_paths(self) -> tuple[str, ...]:
        """Each flat argument's key path as ``jax.tree_util.keystr`` prints it (``[0]['w']``: argument 0's key
        ``'w'``)."""
        return tuple(jax.tree_util.keystr(path) for path in self.argument_keys)

    @cached_property
    def output_paths(self) -> tuple[str, ...]:
        """Each flat output's name: ``out`` and its key path as ``jax.tree_util.keystr`` prints it (``out[0]``,
        ``out[1]['w']``; ``out`` for a single array returned)."""
        if self.out_tree is None:  # a loop's or a cond's body: its outputs are a flat list
            return tuple(f"out[{k}]" for k in range(len(self.outputs)))
        skeleton = jax.tree_util.tree_unflatten(self.out_tree, list(range(len(self.outputs))))
        paths = jax.tree_util.tree_flatten_with_path(skeleton)[0]
        return tuple(f"out{jax.tree_util.keystr(path)}" for path, _ in paths)

    @cached_property
    def argument_names(self) -> tuple[str, ...]:
        """Each flat argument's name as ``jax.jit``'s messages give it: the parameter's name and the leaf's key path
        (``params['w'][0]``, ``opt_state[0].mu['w']``); ``args[0]['w']`` where the parameters are unknown."""
        return self.names or tuple(f"args{path}" for path in self.argument_paths)

    @cached_property
    def node_avals(self) -> tuple[tuple[tuple[Aval, ...], tuple[Aval, ...]], ...]:
        """``node_avals[node]``: the avals of the node's operands and of its outputs (the walks of every pass ask)."""
        avals = self.avals
        return tuple((tuple([avals[v] for v in n.operands]), tuple([avals[v] for v in n.outputs])) for n in self.nodes)

    @cached_property
    def argument_only(self) -> frozenset[int]:
        """The nodes that read arguments and constants only, through other such nodes (a broadcast bias, a cast of
        a weight)."""
        found: set[int] = set()
        nodes, producer, leaves = self.nodes, self.producer, (PARAMETER, CONSTANT)
        for node in nodes:
            if node.op not in leaves and all(nodes[producer[v]].op in leaves or producer[v] in found
                                             for v in node.operands):
                found.add(node.id)
        return frozenset(found)

    def topological_order(self) -> list[int]:
        return list(nx.topological_sort(self.digraph))

    def ancestors(self, node_id: int) -> set[int]:
        """Ids of every node ``node_id`` depends on, transitively."""
        return nx.ancestors(self.digraph, node_id)

    def value_name(self, value: int) -> str:
        return value_name(value)

    def __str__(self) -> str:
        return render(self)

    def __repr__(self) -> str:
        return f"<Graph {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs>"


# The primitives whose result is their one operand's values, reshaped, broadcast, converted or placed: a constant
# stays a constant through them (jnp.pad's 0 is an int literal converted; flax's pad values pass through a reshard).
CARRY_VALUES = frozenset({"broadcast_in_dim", "reshape", "convert_element_type", "reshard", "sharding_constraint",
                          "device_put"})


def constant_behind(graph: Graph, value: int) -> Node | None:
    """The ``constant`` node whose values ``value`` is, through primitives that carry them (``CARRY_VALUES``); None
    where ``value`` is computed (in ``x * 2.0``, the 2.0 broadcast to ``x``'s shape is the constant 2.0)."""
    node = graph.nodes[graph.producer[value]]
    while node.op in CARRY_VALUES and len(node.operands) == 1:
        node = graph.nodes[graph.producer[node.operands[0]]]
    return node if node.op == CONSTANT else None


def short_dtype(dtype) -> str:
    if not isinstance(dtype, np.dtype):
        return str(dtype)  # extended dtypes such as key<fry>
    if dtype == np.bool_:
        return "bool"
    kind = {"f": "f", "i": "i", "u": "u", "c": "c", "V": "bf"}.get(dtype.kind, dtype.kind)
    if dtype.name == "bfloat16":
        return "bf16"
    return f"{kind}{dtype.itemsize * 8}"


def value_name(value: int) -> str:
    """jaxpr-style names: a, b, ..., z, ba, bb, ..."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    name = ""
    while True:
        name = letters[value % 26] + name
        value //= 26
        if value == 0:
            return name


def format_params(node: Node) -> str:
    """Short ``[k=v ...]`` for printable params; sub-jaxprs, arrays and Nones are left out."""
    shown = []
    for key, val in sorted(node.params.items()):
        if val is None or key == "value":
            continue
        if isinstance(val, (bool, int, float, str, np.dtype, np.generic, tuple)):
            plain = _plain(val)
            if plain is not None:
                shown.append(f"{key}={plain}")
    return f"[{' '.join(shown)}]" if shown else ""


def _plain(val):
    """``val`` with numpy scalars made Python ones (``np.int64(0)`` prints as ``0``), or None when it holds
    something that does not print briefly."""
    if isinstance(val, tuple):
        items = [_plain(x) for x in val]
        return None if any(x is None for x in items) else tuple(items)
    if isinstance(val, np.generic):
        return val.item()
    if isinstance(val, (bool, int, float, str, np.dtype)):
        return val
    return None


def format_constant(node: Node, aval: Aval) -> str:
    value = node.params["value"]
    if isinstance(value, np.ndarray) and value.size == 1:
        return f"{value.reshape(()).item()!r}"
    return f"<{aval}>"


def render(
    graph: Graph,
    type_of: Callable[[int], str] | None = None,
    before_node: Callable[[Node], list[str]] | None = None,
    order: Iterable[Node] | None = None,
    note: Callable[[Node], str] | None = None,
    after_node: Callable[[Node], list[str]] | None = None,
) -> str:
    """The jaxpr-like listing. ``type_of(value)`` overrides how a value's type prints (shardings do this);
    ``before_node(node)`` may return extra lines (stage headers) printed before a node, ``after_node(node)``
    after it (a loop's body); ``order`` lists the nodes in another topological order (stage by stage);
    ``note(node)`` adds text after the source line."""
    type_of = type_of or (lambda v: str(graph.avals[v]))
    rows: list[tuple[str, str | None]] = [(line, None) for line in  # (equation text, comment)
                                          argument_lines(graph, lambda v: f"{value_name(v)}:{type_of(v)}")]
    rows.append(("  let", None))
    extra_lines: set[int] = set(range(len(rows)))  # lines not aligned with the equations
    for node in graph.nodes if order is None else order:
        if node.op == PARAMETER:
            continue
        if before_node is not None:
            for line in before_node(node):
                extra_lines.add(len(rows))
                rows.append((f"  {line}", None))
        outs = " ".join(f"{value_name(v)}:{type_of(v)}" for v in node.outputs)
        if node.op == CONSTANT:
            rhs = f"constant {format_constant(node, graph.avals[node.output])}"
        else:
            rhs = " ".join([node.op + format_params(node), *(value_name(v) for v in node.operands)])
        comment = where(node, "") or None
        extra = note(node) if note is not None else ""
        rows.append((f"    {outs} = {rhs}", "  ".join(filter(None, [comment, extra])) or None))
        if after_node is not None:
            for line in after_node(node):
                extra_lines.add(len(rows))
                rows.append((f"  {line}", None))
    width = max((len(text) for k, (text, _) in enumerate(rows) if k not in extra_lines), default=0)
    lines = ["{ lambda ;"]
    for text, source in rows:
        lines.append(f"{text.ljust(width)}   # {source}" if source else text)
    outs = " ".join(value_name(v) for v in graph.outputs)
    lines.append(f"  in ({outs},) }}" if len(graph.outputs) == 1 else f"  in ({outs}) }}")
    return "\n".join(lines)


def argument_label(graph: Graph, index: int) -> str:
    """Argument leaf ``index`` as messages name it: ``argument params['w'] (d)`` — the user's name for it and its
    handle in the listing (once, where the two are the same: ``argument a``)."""
    name, handle = graph.argument_names[index], value_name(graph.inputs[index])
    return f"argument {name}" if name == handle else f"argument {name} ({handle})"


def argument_lines(graph: Graph, typed_value: Callable[[int], str]) -> list[str]:
    """A listing's head, one argument per line, its name aligned after it — ``a:f32[16@i,8]   # params['w']`` — so
    a model's hundred parameters read as a table, each under the name the user knows."""
    typed_values = [f"    {typed_value(v)}" for v in graph.inputs]
    width = max(map(len, typed_values), default=0)
    return [f"{text.ljust(width)}   # {name}" for text, name in zip(typed_values, graph.argument_names, strict=True)]


def where(node: Node, unknown: str = "an unknown line") -> str:
    """Where ``node`` is, for every message and listing that names a line: ``train.py:30``, or
    ``_update.py:9 (called from train.py:30)`` when its line is in a library the user called."""
    where = short_source(node.source, unknown)
    return where if node.caller is None else f"{where} (called from {short_source(node.caller)})"


def warn_at(site: Node | str | None, message: str, category) -> None:
    """Warn ``message`` at the user's line: of a node (the line that called into a library, when the op is inside
    one), or a ``file:line`` — so that Python's warning filters and the printed location name the user's code;
    shown once per traced program (a fresh registry), not once per process."""
    source = (site.caller or site.source) if isinstance(site, Node) else site
    filename, _, line = (source or "").rpartition(":")
    if filename and line.isdigit():
        warnings.warn_explicit(message, category, filename, int(line), registry={})
    else:
        warnings.warn(message, category, stacklevel=3)


def short_source(source: str | None, unknown: str = "") -> str:
    """``path/to/file.py:12`` → ``file.py:12``: listings and messages stay readable, the Node keeps the full
    path. ``unknown`` is said when JAX recorded no user line."""
    return source.rsplit("/", 1)[-1] if source else unknown
