"""`DeviceJpegDecoder`: a batch's JPEG bytes decoded on the device in one call, transformed there.

The workers only move bytes (`JpegBytes`, `collate_jpegs`); in the training process, a
`DevicePrefetcher` hands each batch to this decoder on its side stream, which calls
``torchvision.io.decode_jpeg(list_of_byte_tensors, device=...)`` once for the whole batch
(nvJPEG's batched decode on CUDA) and crops, resizes, flips and normalizes on the device.
A JPEG the device cannot decode fails the batch's call; the images are then decoded one by
one to find which, and the error names that sample's key and chunk, as a worker's
`DecodeError` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tierfeed.errors import DecodeError
from tierfeed.loader.decode import describe_sample
from tierfeed.storage.store import Store
from tierfeed.torch.decoders import JpegBatch, torchvision_io
from tierfeed.torch.handover import map_leaves
from tierfeed.torch.imagetransform import ImageTransform, transform_images

__all__ = ["DeviceJpegDecoder"]

DecodeJpeg = Callable[..., Any]  # torchvision.io.decode_jpeg's signature


class DeviceJpegDecoder:
    """Decode every `JpegBatch` in a batch on ``device``; everything else passes unchanged.

    Args:
        transform: the crop, resize, flip and normalization, applied on the device.
        device: where to decode (``"cuda"``; ``"cpu"`` runs the same code on the CPU).
        store: the dataset's store, or a function opening it (``dataset.store``), to name a
            damaged image's chunk in the error; without it the error names the key only.
        decode_jpeg: the batch decode (default: ``torchvision.io.decode_jpeg``, imported on
            the first batch; a `ConfigError` says what to install when it does not import).
    """

    def __init__(
        self,
        transform: ImageTransform | None = None,
        device: str | torch.device = "cuda",
        store: Store | Callable[[], Store] | None = None,
        decode_jpeg: DecodeJpeg | None = None,
    ) -> None:
        self.transform = transform or ImageTransform()
        self.device = torch.device(device)
        self.store = store
        self._decode = decode_jpeg

    def _decoder(self) -> DecodeJpeg:
        if self._decode is None:
            io_ = torchvision_io()
            rgb = io_.ImageReadMode.RGB

            def decode(data: Any, device: torch.device) -> Any:
                return io_.decode_jpeg(data, mode=rgb, device=device)

            self._decode = decode
        return self._decode

    def __call__(self, batch: Any) -> Any:
        """``batch`` with each `JpegBatch` replaced by its images, ``N x 3 x size x size`` on
        the device (uint8, or float32 when the transform normalizes)."""
        return map_leaves(batch, lambda x: self.decode(x) if isinstance(x, JpegBatch) else x)

    def decode(self, jpegs: JpegBatch) -> torch.Tensor:
        """One batch of JPEGs decoded and transformed on the device.

        Raises:
            DecodeError: an image cannot be decoded (its key and chunk named).
        """
        data = jpegs.images()
        if not data:
            size = self.transform.size
            dtype = torch.float32 if self.transform.normalized else torch.uint8
            return torch.empty((0, 3, size, size), dtype=dtype, device=self.device)
        decode = self._decoder()
        try:
            images = decode(data, device=self.device)
        except Exception as exc:
            raise self._damaged(decode, data, jpegs.keys, exc) from exc
        return transform_images(list(images), self.transform, self.device)

    def _damaged(
        self,
        decode: DecodeJpeg,
        data: Sequence[torch.Tensor],
        keys: list[str],
        batch_exc: Exception,
    ) -> DecodeError:
        """The error naming the first image that fails alone (found by decoding each)."""
        for image, key in zip(data, keys, strict=True):
            try:
                decode([image], device=self.device)
            except Exception as exc:
                return self._error(key, exc)
        return DecodeError(
            f"the device decode of a batch of {len(keys)} JPEGs (keys {keys[0]!r} to "
            f"{keys[-1]!r}) failed with {type(batch_exc).__name__}: {batch_exc}, though each "
            "decodes alone; decode the images in the workers (tierfeed.torch.ImageDecoder)"
        )

    def _error(self, key: str, exc: Exception) -> DecodeError:
        where, chunk = f"sample {key!r}", None
        store = self.store() if callable(self.store) else self.store
        sample = store.index.find_sample(key) if store is not None else None
        if store is not None and sample is not None:
            where = describe_sample(store, sample)
            chunk = store.chunk_location(int(store.index.sample_chunk[sample]))
        return DecodeError(
            f"{where}: the device decode failed with {type(exc).__name__}: {exc} (its bytes "
            "were checked when read, so the packed file itself is not a JPEG the device "
            "decodes); fix or remove that file and re-pack, or decode in the workers "
            "(tierfeed.torch.ImageDecoder)",
            key=key,
            chunk=chunk,
        )
