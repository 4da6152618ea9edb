"""Opening a dataset another tool wrote, for `tierfeed convert`: MosaicML Streaming's MDS or
LitData's optimized format, told apart by their ``index.json``."""

from __future__ import annotations

import os
from pathlib import Path

from tierfeed.errors import PackError
from tierfeed.format.litdata import LitDataDataset
from tierfeed.format.mds import MdsDataset
from tierfeed.format.peercolumns import PeerDataset
from tierfeed.format.peerfiles import INDEX_JSON, read_index_json

__all__ = ["open_peer"]


def open_peer(src: str | os.PathLike[str]) -> PeerDataset:
    """The MDS or LitData dataset in the directory ``src``, its index read and checked (its
    shards are read as it is iterated).

    Raises:
        PackError: ``src`` holds no ``index.json``, or one of neither format, or a layout
            tierfeed does not convert (the message says which, and what to do).
    """
    root = Path(src)
    index = read_index_json(root)
    if isinstance(index, dict) and "shards" in index:
        return MdsDataset(root, index)
    if isinstance(index, dict) and "chunks" in index and "config" in index:
        return LitDataDataset(root, index)
    raise PackError(
        f"{root / INDEX_JSON}: neither an MDS index (it lists 'shards') nor a LitData index (it "
        "has 'chunks' and 'config'); convert takes the directory that streaming's MDSWriter or "
        "litdata.optimize wrote"
    )
