"""ZeRO sharding, where ShardedOptimizer keeps each rank's share of the
optimizer state (shard=1), of the gradients (shard=2) and of the parameters
(shard=3).

optimizer.py (ShardedOptimizer; its other jobs in optimizer_options.py,
flat_parameters.py, optimizer_gradients.py, gathers_after_step.py,
join_phases.py and optimizer_state_dicts.py) on top of layout.py (the flat
buckets and who owns what), state.py (optimizer state sharded or whole),
gradients.py (how the gradients travel), parameter_units.py (shard=3:
gathering and freeing the parameters around forward and backward; its other
jobs in unit_plan.py, gather_routes.py, stand_ins.py, saved_tensors.py,
gathered_parameters.py, parameter_state_dicts.py and join_replay.py),
join.py (stepping on after hvd.join()) and checkpoint.py. Built on
training/distributed_model.py and the collectives. Nothing here is imported
eagerly by this file.
"""
