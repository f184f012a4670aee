"""Rules in, shardings out: each row applies one primitive's record directly — its sharding rule to operand
layouts, its finish to a plan, its pull to a wanted layout — and compares with the expected answer, written
out by hand. (The end-to-end runs are in ``test_completeness.py`` and ``tests/propagation``.)

Layouts are written per axis: ``()`` replicated, ``("i",)`` sharded over ``i``, ``"?"`` created (the axis
adopts what it meets).
"""

import itertools

import numpy as np
import pytest
from jax.lax import GatherDimensionNumbers, GatherScatterMode

from shardprop.core.types import ValueType, whole
from shardprop.errors import ConflictKind
from shardprop.expr.graph import Aval, Graph, Node
from shardprop.ops import lookup
from shardprop.propagation import ShardedGraph
from shardprop.core.rules import CREATED, OpenTracker, RuleConflict, RuleContext
from shardprop.core.layouts import Sharded, TensorSharding
from shardprop.splitting import CollectiveKind, Decisions

MESH = {"i": 4, "j": 2, "k": 2}
F32 = np.dtype(np.float32)
Ii, J, IJ, NO, NEW = ("i",), ("j",), ("i", "j"), (), "?"  # Ii: `I` reads like a 1


def apply(op, operands, out_shapes, **params):
    """``operands``: ``[(shape, layout), ...]``; returns (output layouts, needs) with created axes as ``"?"``."""
    ctx = RuleContext(tuple(Aval(s, F32) for s, _ in operands), tuple(Aval(s, F32) for s in out_shapes), MESH,
                      itertools.count(), OpenTracker())
    shardings = [TensorSharding(shape, tuple(ctx.root(k, n, m) if m else None
                                             for k, (n, m) in enumerate(zip(shape, layout, strict=True))))
                 for shape, layout in operands]
    result = lookup(op).propagate(ctx, *shardings, **params)
    outs = tuple(tuple(NEW if a is CREATED else a.mesh_axes if isinstance(a, Sharded) else NO for a in o.axes)
                 for o in result.outputs)
    return outs, tuple(result.needs)


DOT = (((1,), (0,)), ((), ()))
ROWS = [
    # (id, op, operands, output shapes, params, expected output layouts, expected needs)
    ("add_same", "add", [((8, 4), (Ii, J)), ((8, 4), (Ii, J))], [(8, 4)], {}, ((Ii, J),), ((Ii, J), (Ii, J))),
    ("add_replicated_is_cut_locally", "add", [((8, 4), (Ii, NO)), ((8, 4), (NO, NO))], [(8, 4)], {},
     ((Ii, NO),), ((Ii, NO), (Ii, NO))),
    ("add_refinement_takes_the_finer", "add", [((8, 4), (IJ, NO)), ((8, 4), (Ii, NO))], [(8, 4)], {},
     ((IJ, NO),), ((IJ, NO), (IJ, NO))),
    ("mul_broadcast_size_one", "mul", [((8, 4), (Ii, J)), ((1, 4), (NO, J))], [(8, 4)], {},
     ((Ii, J),), ((Ii, J), (NO, J))),
    ("reduce_sum_drops_the_axis", "reduce_sum", [((8, 4), (Ii, J))], [(8,)], {"axes": (1,)}, ((Ii,),), ((Ii, NO),)),
    ("argmax_keeps_the_other", "argmax", [((8, 4), (Ii, J))], [(4,)], {"axes": (0,), "index_dtype": np.int32},
     ((J,),), ((NO, J),)),
    # scanned block by block (the split pass finishes it with the prefix of the block totals)
    ("cumsum_scans_its_blocks", "cumsum", [((8, 4), (Ii, J))], [(8, 4)], {"axis": 0, "reverse": False},
     ((Ii, J),), ((Ii, J),)),
    ("dot_free_axes", "dot_general", [((8, 4), (Ii, NO)), ((4, 6), (NO, J))], [(8, 6)], {"dimension_numbers": DOT},
     ((Ii, J),), ((Ii, NO), (NO, J))),
    ("dot_contracting_dropped", "dot_general", [((8, 4), (Ii, J)), ((4, 6), (J, NO))], [(8, 6)],
     {"dimension_numbers": DOT}, ((Ii, NO),), ((Ii, NO), (NO, NO))),
    ("dot_free_axes_share_a_mesh_axis", "dot_general", [((8, 4), (Ii, NO)), ((4, 8), (NO, Ii))], [(8, 8)],
     {"dimension_numbers": DOT}, ((Ii, NO),), ((Ii, NO), (NO, NO))),
    ("broadcast_creates_axes", "broadcast_in_dim", [((4,), (J,))], [(8, 4)],
     {"shape": (8, 4), "broadcast_dimensions": (1,), "sharding": None}, ((NEW, J),), ((J,),)),
    ("reshape_keeps_the_major_axis", "reshape", [((8, 4), (Ii, J))], [(32,)],
     {"new_sizes": (32,), "dimensions": None, "sharding": None}, ((Ii,),), ((Ii, NO),)),
    ("transpose", "transpose", [((8, 4), (Ii, J))], [(4, 8)], {"permutation": (1, 0)}, ((J, Ii),), ((Ii, J),)),
    # an indexed axis sliced whole keeps its sharding: the window starts at 0 (a vmapped dynamic_slice's)
    ("gather_of_an_indexed_axis_sliced_whole", "gather", [((8, 4), (Ii, J)), ((6, 2), (NO, NO))], [(6, 4)],
     {"dimension_numbers": GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                                  start_index_map=(0, 1)),
      "slice_sizes": (1, 4), "mode": GatherScatterMode.CLIP, "fill_value": None},
     ((NO, J),), ((NO, J), (NO, NO))),
    # a narrower type adds a minor axis (an element's bytes) held whole; a wider one needs its operand's whole
    ("bitcast_to_narrower_adds_a_whole_minor_axis", "bitcast_convert_type", [((8, 4), (Ii, J))], [(8, 4, 4)],
     {"new_dtype": np.uint8}, ((Ii, J, NO),), ((Ii, J),)),
    ("bitcast_to_wider_needs_the_minor_axis_whole", "bitcast_convert_type", [((8, 4, 4), (Ii, NO, J))], [(8, 4)],
     {"new_dtype": np.float32}, ((Ii, NO),), ((Ii, NO, NO),)),
    # each piece kept in place over j, ranged (the need reads the operand's rows in place: its span, layout ())
    ("split_pieces_stay_in_place", "split", [((8, 4), (Ii, J))], [(8, 2), (8, 2)], {"sizes": (2, 2), "axis": 1},
     ((Ii, J), (Ii, J)), ((Ii, NO),)),
    ("split_of_a_whole_axis_creates_the_pieces_axis", "split", [((8, 4), (Ii, NO))], [(8, 2), (8, 2)],
     {"sizes": (2, 2), "axis": 1}, ((Ii, NEW), (Ii, NEW)), ((Ii, NO),)),
    ("stack_new_axis_is_created", "stack", [((8, 4), (Ii, J)), ((8, 4), (Ii, NO))], [(8, 2, 4)], {"axis": 1},
     ((Ii, NEW, J),), ((Ii, J), (Ii, J))),
    ("unstack_needs_its_axis", "unstack", [((2, 8), (J, Ii))], [(8,), (8,)], {"axis": 0}, ((Ii,), (Ii,)), ((NO, Ii),)),
    ("tile_repeated_axis_is_created", "tile", [((8, 4), (Ii, J))], [(8, 12)], {"reps": (1, 3)},
     ((Ii, NEW),), ((Ii, NO),)),
    ("slice_cut_axis_stays_sharded", "slice", [((8, 4), (Ii, J))], [(8, 2)],
     {"start_indices": (0, 1), "limit_indices": (8, 3), "strides": None}, ((Ii, J),), ((Ii, NO),)),
    ("concatenate_joined_axis_stays_sharded", "concatenate", [((8, 4), (Ii, J)), ((8, 2), (Ii, NO))], [(8, 6)],
     {"dimension": 1}, ((Ii, J),), ((Ii, NO), (Ii, NO))),
    ("iota_creates_every_axis", "iota", [], [(8, 4)], {"shape": (8, 4), "dimension": 0, "dtype": np.int32,
                                                        "sharding": None}, ((NEW, NEW),), ()),
    ("batched_cholesky_keeps_the_batch", "cholesky", [((4, 6, 6), (Ii, J, NO))], [(4, 6, 6)], {},
     ((Ii, NO, NO),), ((Ii, NO, NO),)),
    ("batched_solve_merges_batches", "triangular_solve", [((4, 6, 6), (Ii, NO, NO)), ((4, 6, 2), (NO, NO, J))],
     [(4, 6, 2)], {}, ((Ii, NO, NO),), ((Ii, NO, NO), (Ii, NO, NO))),
    ("fft_last_axis_whole", "fft", [((8, 4), (Ii, J))], [(8, 4)], {"fft_type": 0, "fft_lengths": (4,)},
     ((Ii, NO),), ((Ii, NO),)),
    # a 2x2 pool's windows lie within the blocks of j: each device scatters into its own block (no halo)
    ("max_pool_gradient", "select_and_scatter_add", [((8, 2), (Ii, NO)), ((8, 4), (Ii, J))], [(8, 4)],
     {"select_prim": None, "window_dimensions": (1, 2), "window_strides": (1, 2), "padding": ((0, 0), (0, 0))},
     ((Ii, J),), ((Ii, J), (Ii, J))),
    ("ragged_dot_keeps_rhs_free_axes", "ragged_dot_general", [((8, 4), (Ii, NO)), ((2, 4, 6), (NO, NO, J)),
                                                              ((2,), (NO,))], [(8, 6)],
     {"ragged_dot_dimension_numbers": type("RDN", (), {"dot_dimension_numbers": (((1,), (1,)), ((), ())),
                                                        "lhs_ragged_dimensions": (0,),
                                                        "rhs_group_dimensions": (0,)})()},
     ((NO, J),), ((NO, NO), (NO, NO, J), (NO,))),
    ("device_put_passes_through", "device_put", [((8, 4), (Ii, J))], [(8, 4)],
     {"devices": (None,), "srcs": (None,), "copy_semantics": (None,)}, ((Ii, J),), ((Ii, J),)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_rule_table(row):
    _, op, operands, out_shapes, params, outputs, needs = row
    assert apply(op, operands, out_shapes, **params) == (outputs, needs)


@pytest.mark.parametrize("op,operands,out_shapes,params", [
    ("add", [((8, 4), (Ii, NO)), ((8, 4), (J, NO))], [(8, 4)], {}),
    ("add", [((8, 4), (IJ, NO)), ((8, 4), (J, NO))], [(8, 4)], {}),  # neither refines the other
])
def test_rule_conflicts(op, operands, out_shapes, params):
    with pytest.raises(RuleConflict) as caught:
        apply(op, operands, out_shapes, **params)
    assert caught.value.kind is ConflictKind.MISMATCH and len(caught.value.layouts) == 2


def _decisions(shapes, layouts, op, params, out_shape, dtype=F32):
    """A one-node graph ``op(*inputs)`` whose inputs are laid out as ``layouts``, as the strategies see it."""
    n = len(shapes)
    avals = tuple(Aval(s, dtype) for s in shapes) + (Aval(out_shape, dtype),)
    nodes = tuple(Node(k, "parameter", (), (k,), {"index": k}, None) for k in range(n)) + (
        Node(n, op, tuple(range(n)), (n,), params, None),)
    graph = Graph(nodes, avals, tuple(range(n)), (n,), None, None)
    ctx = RuleContext(avals[:n], avals[n:], MESH, itertools.count(), OpenTracker())
    inputs = [TensorSharding(s, tuple(ctx.root(k, d, m) if m else None
                                      for k, (d, m) in enumerate(zip(s, lay, strict=True))))
              for s, lay in zip(shapes, layouts, strict=True)]
    result = lookup(op).propagate(ctx, *inputs, **params)
    sharded = ShardedGraph(graph, None, (*inputs, *result.outputs), ((),) * n + (result.needs,), ("",) * (n + 1),
                           frozenset())
    return Decisions.propagated(sharded), nodes[n]


@pytest.mark.parametrize("op,layout,dtype,expected", [
    ("reduce_sum", (Ii, J), F32, (CollectiveKind.PSUM, ("j",))),
    ("reduce_max", (Ii, J), F32, (CollectiveKind.PMAX, ("j",))),
    ("reduce_or", (Ii, J), np.dtype(bool), (CollectiveKind.PMAX, ("j",))),
    ("reduce_or", (Ii, J), np.dtype(np.int32), None),  # bitwise over integers: no collective is exact
    ("reduce_sum", (Ii, NO), F32, None),  # the reduced axis is not sharded: nothing to finish
    ("reduce_prod", (Ii, J), F32, (CollectiveKind.PPROD, ("j",))),  # an all-reduce multiplying (jax.jit's)
    ("reduce_xor", (Ii, J), np.dtype(np.int32), None),  # no collective xors
])
def test_finish_of_reductions(op, layout, dtype, expected):
    decisions, node = _decisions([(8, 4)], [layout], op, {"axes": (1,)}, (8,), dtype)
    record = lookup(op)
    found = record.finish(decisions, node) if record.finish else None
    assert (None if found is None else (found[1].kind, found[1].mesh_axes)) == expected
    if found is not None:
        assert found[0] == (ValueType((Ii, J)),)  # consumed as it is: no gather


def test_finish_of_a_contraction_sharded_alike_on_both_sides():
    decisions, node = _decisions([(8, 4), (4, 6)], [(Ii, J), (J, NO)], "dot_general", {"dimension_numbers": DOT},
                                 (8, 6))
    needs, collective = lookup("dot_general").finish(decisions, node)
    assert needs == whole(((Ii, J), (J, NO))) and (collective.kind, collective.mesh_axes) == (CollectiveKind.PSUM, J)


def test_pull_of_elementwise_and_broadcast():
    decisions, node = _decisions([(8, 4), (1, 4)], [(NO, NO), (NO, NO)], "add", {}, (8, 4))
    assert lookup("add").pull(decisions.graph, node, (Ii, J)) == ((Ii, J), (NO, J))
    decisions, node = _decisions([(4,)], [(NO,)], "broadcast_in_dim",
                                 {"shape": (8, 4), "broadcast_dimensions": (1,), "sharding": None}, (8, 4))
    assert lookup("broadcast_in_dim").pull(decisions.graph, node, (Ii, J)) == ((J,),)
    assert lookup("reduce_sum").pull is None and lookup("dot_general").pull is None
