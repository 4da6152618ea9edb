"""The PyTorch face of tierfeed: the only package that imports torch.utils.data."""

from tierfeed.errors import INSTALL_TORCH

try:
    import torch as _torch  # noqa: F401  (present, or say how to get it)
except ImportError as _missing:
    raise ImportError(f"tierfeed.torch needs PyTorch: {INSTALL_TORCH}") from _missing

from tierfeed.torch.dataset import Batch, Dataset, OrderPlan, TierConfig
from tierfeed.torch.decoders import (
    ImageDecoder,
    JpegBatch,
    JpegBytes,
    collate_images,
    collate_jpegs,
)
from tierfeed.torch.devicedecode import DeviceJpegDecoder
from tierfeed.torch.fields import collate_fields, decoded_fields, sample_fields
from tierfeed.torch.imagefolder import IMG_EXTENSIONS, ImageFolder, pil_loader
from tierfeed.torch.imagetransform import IMAGENET_MEAN, IMAGENET_STD, ImageTransform
from tierfeed.torch.job import job_dataset
from tierfeed.torch.loader import Loader
from tierfeed.torch.mapdataset import MapDataset
from tierfeed.torch.prefetch import DevicePrefetcher

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMG_EXTENSIONS",
    "Batch",
    "Dataset",
    "DeviceJpegDecoder",
    "DevicePrefetcher",
    "ImageDecoder",
    "ImageFolder",
    "ImageTransform",
    "JpegBatch",
    "JpegBytes",
    "Loader",
    "MapDataset",
    "OrderPlan",
    "TierConfig",
    "collate_fields",
    "collate_images",
    "collate_jpegs",
    "decoded_fields",
    "job_dataset",
    "pil_loader",
    "sample_fields",
]
