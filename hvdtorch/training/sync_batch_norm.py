"""SyncBatchNorm: batch normalization whose batch statistics cover every
rank's batch, as Horovod's hvd.SyncBatchNorm (a drop-in for
torch.nn.BatchNorm1d/2d/3d; same arguments, buffers and state_dict keys).

    model = nn.Sequential(nn.Conv2d(3, 8, 3), hvd.SyncBatchNorm(8), nn.ReLU())

Training (or track_running_stats=False): forward and backward equal one
torch BatchNorm applied to the concatenation of every rank's batch; ranks may
hold different batch sizes, even empty ones.
  * forward: each rank computes, per channel, its count, mean and sum of
    squared deviations; one all-gather exchanges them and every rank merges
    them (the pairwise formula of Chan et al., stable where sum/sum-of-squares
    would cancel). running_mean/running_var move by momentum (or the
    cumulative average when momentum is None) towards the global mean and the
    unbiased global variance, exactly as torch's BatchNorm does.
  * backward: the per-channel sums of dy and dy*(x - mean) are all-reduced
    (one Sum) to form the input gradient. weight/bias gradients stay this
    rank's share, as with any parameter: the data-parallel wrapper
    (DistributedOptimizer / DistributedModel) reduces them.
Evaluation with running stats is the ordinary, local batch norm. With one
rank it is torch's batch norm.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .. import runtime
from ..collectives import ops


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _per_channel(t: torch.Tensor, x_dim: int) -> torch.Tensor:
    """A (C,) tensor shaped to broadcast against an input of x_dim dimensions."""
    return t.view((1, -1) + (1,) * (x_dim - 2))


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, process_set):
        channels = x.shape[1]
        reduce_dims = [0] + list(range(2, x.dim()))
        xa = x.to(_accumulation_dtype(x.dtype))
        count = x.numel() // channels if channels else 0
        if count > 0:
            local_mean = xa.mean(reduce_dims)
            local_m2 = (xa - _per_channel(local_mean, x.dim())).square().sum(reduce_dims)
        else:
            local_mean = local_m2 = torch.zeros(channels, dtype=xa.dtype, device=x.device)
        count_col = torch.tensor([float(count)], dtype=torch.float64, device=x.device)
        row = torch.cat([count_col, local_mean.double(), local_m2.double()])
        rows = ops.synchronize(
            ops.allgather_async(row.unsqueeze(0), name="sync_batch_norm.stats", process_set=process_set)
        )
        counts, means, m2s = rows[:, :1], rows[:, 1 : 1 + channels], rows[:, 1 + channels :]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(
                f"hvdtorch: rank {runtime.rank()}: SyncBatchNorm needs more than 1 value per channel "
                f"when training, got {int(total)} over all ranks (input shape here {tuple(x.shape)})"
            )
        mean = (counts * means).sum(0) / total
        m2 = (m2s + counts * (means - mean).square()).sum(0)
        if running_mean is not None:
            running_mean.mul_(1 - factor).add_((mean * factor).to(running_mean.dtype))
            running_var.mul_(1 - factor).add_((m2 / (total - 1) * factor).to(running_var.dtype))
        mean = mean.to(xa.dtype)
        invstd = torch.rsqrt((m2 / total).to(xa.dtype) + eps)
        y = (xa - _per_channel(mean, x.dim())) * _per_channel(invstd, x.dim())
        if weight is not None:
            y = y * _per_channel(weight.to(xa.dtype), x.dim())
        if bias is not None:
            y = y + _per_channel(bias.to(xa.dtype), x.dim())
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total = total
        ctx.process_set = process_set
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, invstd = ctx.saved_tensors
        channels = x.shape[1]
        reduce_dims = [0] + list(range(2, x.dim()))
        dy = grad_out.to(mean.dtype)
        xmu = x.to(mean.dtype) - _per_channel(mean, x.dim())
        sum_dy = dy.sum(reduce_dims)
        sum_dy_xmu = (dy * xmu).sum(reduce_dims)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # Every rank's input gradient depends on the global sums.
            both = ops.synchronize(
                ops.allreduce_async(
                    torch.cat([sum_dy, sum_dy_xmu]),
                    op=ops.Sum,
                    name="sync_batch_norm.grad",
                    process_set=ctx.process_set,
                )
            )
            g_sum_dy, g_sum_dy_xmu = both[:channels], both[channels:]
            scale = invstd if weight is None else invstd * weight.to(mean.dtype)
            grad_x = (
                dy
                - _per_channel(g_sum_dy / ctx.total, x.dim())
                - xmu * _per_channel(invstd.square() * g_sum_dy_xmu / ctx.total, x.dim())
            )
            grad_x = (grad_x * _per_channel(scale, x.dim())).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the union of every rank's batch (see the module docstring)."""

    def __init__(
        self,
        num_features,
        eps=1e-5,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        process_set=None,
        device=None,
        dtype=None,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        # Statistics cover the batches of this set's ranks (default: every rank).
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"hvdtorch: SyncBatchNorm expects at least 2D input (N, C, ...), got {input.dim()}D")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not self.training and self.track_running_stats:
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        running_mean = self.running_mean if self.track_running_stats else None
        running_var = self.running_var if self.track_running_stats else None
        if (self.process_set or ops.global_process_set).size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, True, factor, self.eps)
        return _SyncBatchNormFn.apply(
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor, self.process_set
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_set=None) -> torch.nn.Module:
        """Every BatchNorm*D layer of ``module`` (torch's SyncBatchNorm too)
        replaced by this SyncBatchNorm with the same options, parameters and
        running statistics, as torch.nn.SyncBatchNorm.convert_sync_batchnorm
        does (which refuses modules on the CPU; this one serves CPU and CUDA
        modules). Returns the converted module (``module`` itself is changed
        in place unless it is a BatchNorm layer)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
                process_set=process_set,
            )
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out
