"""The collectives with Horovod's names and semantics, and what every op shares.

handles.py (the handle table, below every op), ops.py (all-reduce, all-gather,
broadcast, join, with their autograd), alltoall.py, reducescatter.py,
sparse.py, broadcast.py (the object and parameter broadcasts), process_sets.py
and process_set_table.py (which ranks an op runs on), compression.py (the
wire codecs an op or a gradient reducer applies). Imports only runtime,
exceptions and the compiled core from outside; hvdtorch re-exports the public
names (``hvd.allreduce``, ...). Nothing here is imported eagerly by this file.
"""
