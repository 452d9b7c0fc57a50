"""The collectives with Horovod's names and semantics, and what every op shares.

handles.py (the handle table, below every op), ops.py (all-reduce, all-gather,
broadcast, join, with their autograd), alltoall.py, reducescatter.py,
sparse.py, broadcast.py (the object and parameter broadcasts), process_sets.py
and process_set_table.py (which ranks an op runs on), compression.py (the
wire codecs an op or a gradient reducer applies), and api.py (the public
names, listed once: hvdtorch and mpi_ops re-export them, ``hvd.allreduce``,
...). Imports only runtime, exceptions and the compiled core from outside.
Nothing here is imported eagerly by this file (its modules ``broadcast``,
``alltoall`` and ``reducescatter`` share their names with functions).
"""
