"""What autograd keeps of shard=3's gathered buckets between forward and
backward: their positions, not the tensors.

Contract:
  * While the DistributedModel's forward runs (ParameterUnits.forward()
    installs _pack and _unpack as ``saved_tensors_hooks``), autograd saves
    tensors that alias a gathered bucket (a weight, its transpose) as
    (bucket, offset, sizes, strides) instead of the tensor; unpacking one
    in backward gathers the bucket again if it was freed (and prefetches
    the bucket before it). So what autograd keeps between forward and
    backward holds no gathered bucket, and backward reads the values the
    shards hold.
  * A saved tensor on a stand-in (a parameter used outside the forward of
    its unit) raises, naming the parameter and the fixes: backward would
    read NaN.
  * Any other tensor (another storage, a bucket's storage in another dtype,
    not strided, on the meta device) is saved as it is.
"""

from typing import Tuple

import torch

from .. import runtime


class _SavedView:
    """What autograd keeps instead of a tensor that aliases a gathered bucket."""

    __slots__ = ("bucket", "offset", "size", "stride")

    def __init__(self, bucket: int, offset: int, size: Tuple[int, ...], stride: Tuple[int, ...]):
        self.bucket, self.offset, self.size, self.stride = bucket, offset, size, stride


class _SavedTensors:
    """ParameterUnits' saved-tensor hooks (a mixin; the state is
    ParameterUnits.__init__'s): reads _bucket_of_storage,
    _stand_in_of_storage, _names and _full; an unpack marks backward as
    running (_in_backward) and gathers (_finish, _prefetch)."""

    def _pack(self, t: torch.Tensor):
        if t.layout != torch.strided or t.device.type == "meta":
            return t
        ptr = t.untyped_storage().data_ptr()
        j = self._bucket_of_storage.get(ptr)
        if j is None:
            i = self._stand_in_of_storage.get(ptr)
            if i is not None:
                raise RuntimeError(
                    f"hvdtorch: rank {runtime.rank()}: parameter {self._names[i]!r} is used outside the forward "
                    "of the module that holds it: shard=3 gathers a module's parameters for its own forward "
                    "only. Use it through its module, register it on the module that uses it too (tied "
                    "weights), or pass reshard_after_forward=False (units stay gathered until backward)"
                )
            return t
        if t.dtype != self._full[j].dtype:
            return t
        return _SavedView(j, t.storage_offset() - self._full[j].storage_offset(), tuple(t.size()), tuple(t.stride()))

    def _unpack(self, saved):
        if not isinstance(saved, _SavedView):
            return saved
        self._in_backward()
        full = self._full[saved.bucket]
        if full is None:
            full = self._finish(saved.bucket)
            self._prefetch(saved.bucket, -1)
        return full.as_strided(saved.size, saved.stride, full.storage_offset() + saved.offset)
