"""The layout problem's edge prices (``search/build._move``): one plan per canonical shape, its axes sorted, its bytes
scaled, equal to the move planner's own price for the shape itself, its axes as they are. Oracle:
``core.moves.move_bytes`` on the real shape."""

import jax
from hypothesis import given, settings
from hypothesis import strategies as st

from shardprop.core.moves import move_bytes
from shardprop.core.types import ValueType
from shardprop.search.build import _candidate_layouts, _move

MESHES = [(("i", 8),), (("i", 4), ("j", 2)), (("i", 2), ("j", 2), ("k", 2))]
SIZES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 40, 48, 96, 100]
DTYPES = ["float32", "bfloat16", "bool", "int8", "float64", jax.random.key(0).dtype]  # (a key: flax's dropout)


@st.composite
def moves(draw):
    mesh = draw(st.sampled_from(MESHES))
    shape = tuple(draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=4)))
    layouts = _candidate_layouts(shape, mesh)
    have, want = draw(st.sampled_from(layouts)), draw(st.sampled_from(layouts))
    used = {m for axes in have for m in axes}
    partial = draw(st.sampled_from([()] + [(name,) for name, _ in mesh if name not in used]))
    return shape, draw(st.sampled_from(DTYPES)), ValueType(have, partial), ValueType(want), mesh


@settings(max_examples=300, deadline=None)
@given(moves())
def test_an_edge_costs_what_the_planner_prices_for_the_shape_itself(move):
    shape, dtype, have, want, mesh = move
    assert _move(shape, dtype, have, want, mesh) == move_bytes(shape, dtype, have, want, dict(mesh))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MESHES), st.lists(st.sampled_from(SIZES), min_size=1, max_size=3), st.data())
def test_an_edge_matrix_read_from_the_table_is_the_planner_cell_by_cell(mesh, sizes, data):
    """``_Prices`` keeps the moves of one shape priced by type; its matrices, asked in any order and growing the table
    as new types come, are the planner's bytes for every pair."""
    from shardprop.search.build import _Prices

    shape = tuple(sizes)
    types = [ValueType(layout) for layout in _candidate_layouts(shape, mesh)]
    prices = _Prices(shape, "float32", mesh)
    for _ in range(3):
        haves = data.draw(st.lists(st.sampled_from(types), min_size=1, max_size=6))
        wants = data.draw(st.lists(st.sampled_from(types), min_size=1, max_size=6))
        matrix = prices.matrix(haves, wants)
        assert matrix.shape == (len(haves), len(wants))
        for a, have in enumerate(haves):
            for b, want in enumerate(wants):
                assert matrix[a, b] == move_bytes(shape, "float32", have, want, dict(mesh))
