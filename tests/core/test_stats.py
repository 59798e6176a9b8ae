"""Batch-wide statistics (rlexp/core/stats.py): ``masked_whiten``, ``batch_std`` and ``batch_mean`` over this
process's rows, or, inside ``batch_spread_over``, over every process's (the distributed step's advantages).

Default: hand-computed values on one process, and with a reducer that stands for a second process holding the same
rows. Long: two real gloo processes, each with its share of the rows, whiten as one process does with all of them
(``Distributed.sum_tensors``)."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.core.stats import batch_is_spread, batch_mean, batch_spread_over, batch_std, masked_whiten

VALUES = torch.tensor([[1.0, 2.0], [3.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # tokens 1, 2, 3 (the 7 is padding)


def test_whiten_mean_and_std_of_one_process_by_hand():
    # mean 2, Bessel variance ((1-2)^2 + 0 + (3-2)^2) / 2 = 1
    assert torch.allclose(masked_whiten(VALUES, MASK, eps=0.0) * MASK, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    assert float(batch_std(torch.tensor([1.0, 2.0, 3.0]))) == pytest.approx(1.0)
    assert float(batch_mean(torch.tensor([1.0, 2.0, 6.0]))) == pytest.approx(3.0)
    assert float(batch_std(torch.tensor([5.0]))) == 0.0 and not batch_is_spread()


def test_spread_statistics_count_the_other_process_rows():
    """A reducer that doubles every sum: a second process holding the same rows. Tokens 1, 2, 3 twice: mean 2,
    variance 4 / 5 (Bessel over 6 tokens), so 1 whitens to -1/sqrt(0.8)."""
    with batch_spread_over(lambda xs: [2 * x for x in xs]):
        assert batch_is_spread()
        got = masked_whiten(VALUES, MASK, eps=0.0) * MASK
        std = float(batch_std(torch.tensor([1.0, 2.0, 3.0])))
        mean = float(batch_mean(torch.tensor([1.0, 2.0, 6.0])))
    s = math.sqrt(0.8)
    assert torch.allclose(got, torch.tensor([[-1 / s, 0.0], [1 / s, 0.0]]))
    assert std == pytest.approx(s) and mean == pytest.approx(3.0)
    assert not batch_is_spread()


def _whiten_share(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from rlexp.trainer.distributed import Distributed, DistributedSettings

    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    two = Distributed(DistributedSettings(), 0, world_size=2, rank=rank, local_rank=rank, device="cpu")
    rows = slice(0, 1) if rank == 0 else slice(1, 2)
    with two.batch_statistics():
        whitened = masked_whiten(VALUES[rows], MASK[rows], eps=0.0) * MASK[rows]
        std = batch_std(VALUES[rows, 0])
    torch.save({"whitened": whitened, "std": std}, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.long
def test_two_processes_whiten_as_one(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "share")
    mp.spawn(_whiten_share, args=(str(tmp_path / "store"), out), nprocs=2)
    shares = [torch.load(f"{out}.{r}") for r in (0, 1)]
    whole = masked_whiten(VALUES, MASK, eps=0.0) * MASK
    assert torch.allclose(torch.cat([s["whitened"] for s in shares]), whole)
    assert all(float(s["std"]) == pytest.approx(float(VALUES[:, 0].std())) for s in shares)  # std of 1 and 3
