"""The PyTorch face of tierfeed: the only package that imports torch.utils.data."""

from tierfeed.errors import INSTALL_TORCH

try:
    import torch as _torch  # noqa: F401  (present, or say how to get it)
except ImportError as _missing:
    raise ImportError(f"tierfeed.torch needs PyTorch: {INSTALL_TORCH}") from _missing

from tierfeed.torch.dataset import Batch, Dataset, OrderPlan, TierConfig
from tierfeed.torch.fields import collate_fields, decoded_fields, sample_fields
from tierfeed.torch.imagefolder import IMG_EXTENSIONS, ImageFolder, pil_loader
from tierfeed.torch.job import job_dataset
from tierfeed.torch.loader import Loader
from tierfeed.torch.mapdataset import MapDataset

__all__ = [
    "IMG_EXTENSIONS",
    "Batch",
    "Dataset",
    "ImageFolder",
    "Loader",
    "MapDataset",
    "OrderPlan",
    "TierConfig",
    "collate_fields",
    "decoded_fields",
    "job_dataset",
    "pil_loader",
    "sample_fields",
]
