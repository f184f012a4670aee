"""The vocabulary every pass and every primitive's record speaks, below all of them.

``layouts.py``      the Nx data model: shards with parents, per-axis shardings, layouts and specs
``types.py``        a value's type: its layout, the mesh axes over which it is still a partial sum, and where
                    an op left its rows (``Placement``: mirrored, rotated, routed)
``moves.py``        the move planner: the steps from one type to another, fewest bytes first (``plan_move``) —
                    every data movement; ``steps.py`` one step and its price, ``rounds.py`` rows moved between
                    blocks in pieces, ``move_search.py`` the search, ``subaxes.py`` a mesh axis cut in two
                    inside a move
``rules.py``        what a sharding rule sees and returns (``RuleContext``, ``RuleOutput``, bodies)
``boxes.py``        the element sets lineage talks about, and what a lineage rule sees
``blocks.py``       what a per-block piece sees (``Blocks``) and the helpers it binds primitives with
``collectives.py``  how a node computed on blocks is finished (``Collective``), and a ``Finish``'s price
``transfers.py``    one collective's price (``Transfer``), for estimates and compiled HLO alike

Nothing here imports ``ops`` or a pass: they import this.
"""
