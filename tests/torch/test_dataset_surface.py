"""`Dataset`'s public surface is what a user calls: it holds its feed rather than being one, so
a new public member is a choice made here, not one inherited from `Feed`."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import IterableDataset

from tests.torch.test_loader import PermPlan, decode
from tierfeed.loader.feed import Feed
from tierfeed.loader.resume import Resume
from tierfeed.plan import Done
from tierfeed.torch import Dataset
from tierfeed.torch.dataset import feed_of, loader_view

# What README.md, docs/ and bench/ call on a Dataset (``ds.store`` for `DeviceJpegDecoder`),
# besides ``len(ds)`` and ``iter(ds)``, and what a training loop or a sampler-style caller
# asks of it. The plan, the resume and the workers' slices are the feed's (`feed_of`).
PUBLIC = {"batch_size", "close", "drop_last", "epoch", "set_epoch", "store", "world"}


def test_the_public_surface_is_what_a_user_calls() -> None:
    torch_own = set(dir(IterableDataset))
    public = {n for n in dir(Dataset) if not n.startswith("_") and n not in torch_own}
    assert public == PUBLIC
    assert not issubclass(Dataset, Feed)


def test_the_feed_is_reached_through_feed_of_and_a_view_leaves_the_dataset(
    store_dir: Path,
) -> None:
    ds = Dataset(store_dir, PermPlan(64), batch_size=16, decode=decode)
    try:
        feed = feed_of(ds)
        assert isinstance(feed, Feed) and not isinstance(ds, Feed)
        assert (ds.batch_size, ds.drop_last, ds.world) == (16, False, feed.world)
        assert len(ds) == feed.num_batches() == 4
        view = loader_view(ds, feed.for_loader(Resume(0, done=Done(prefix=16))))
        assert type(view) is Dataset and feed_of(view) is not feed
        assert feed_of(view).continuous and not feed.continuous
        ds.set_epoch(2)
        assert view.epoch == feed.epoch == 2  # one epoch, shared with the view
        assert len(list(ds)) == 4  # the dataset alone still yields whole epochs of data
    finally:
        ds.close()
