"""The training wrappers built on the collectives (DistributedModel, Horovod's
DistributedOptimizer with its Adasum variant, SyncBatchNorm).

distributed_model.py (its other jobs in model_forward.py, model_state_dicts.py
and sharded_claims.py) and optimizer.py are the entry points; gradient_sync.py
(DistributedOptimizer's gradient contract), adasum_optimizer.py, buckets.py,
parameter_names.py and step_marks.py serve them (hvdtorch/autotune.py tunes
their buckets). optimizer.py
hands ``DistributedOptimizer(shard=...)`` to zero/optimizer.py. hvdtorch
re-exports the public names. Nothing here is imported eagerly by this file.
"""
