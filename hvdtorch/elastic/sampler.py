"""ElasticSampler: shards an epoch over the current ranks and remembers what
was processed, so that after a restart (with the same or another number of
ranks) the epoch goes on with exactly the samples not processed yet.

Order: the epoch's permutation of the whole dataset (seeded by seed + epoch;
the identity without shuffle) with the processed samples taken out, in that
order, dealt round-robin to the ranks (rank r gets positions r, r+W, ...).
With the same number of ranks the shards after a restart are therefore the
tails of the shards before it: training resumed from a commit sees the same
batches as training that never stopped. When the remaining samples do not
divide by the number of ranks, the list is padded with its own first samples
(as torch's DistributedSampler does), so up to W-1 samples of the epoch's
last step are seen twice.

Processed indices are recorded per rank (record_batch/record_indices);
TorchState.commit() and sync() gather every rank's into one set.
"""

import math
from typing import Dict, Iterable, Iterator, List

import torch
from torch.utils.data import Sampler

from .. import runtime


def _world():
    if runtime.is_initialized():
        return runtime.size(), runtime.rank()
    return 1, 0


class ElasticSampler(Sampler):
    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` with nothing processed (call it when moving on
        to the next epoch, not when resuming one)."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def _order(self) -> List[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def reset(self) -> None:
        """Re-deals the samples not processed yet over the current ranks."""
        self.num_replicas, self.rank = _world()
        remaining = [i for i in self._order() if i not in self.processed_indices]
        self.num_samples = math.ceil(len(remaining) / self.num_replicas)
        total = self.num_samples * self.num_replicas
        padded = remaining + [remaining[i % len(remaining)] for i in range(total - len(remaining))] if remaining else []
        self.indices = padded[self.rank : total : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        """This rank's samples of batch `batch_idx` (counted since the last reset)."""
        return self.indices[batch_idx * batch_size : (batch_idx + 1) * batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Iterable[int]) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self) -> Dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: Dict) -> None:
        self.epoch = int(state["epoch"])
        self.processed_indices = set(state["processed_indices"])
        self.reset()
