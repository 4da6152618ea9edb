"""Decoding a sample with the user's function: its failure names the sample key and chunk.

A decode that fails (PIL's ``cannot identify image file <_io.BytesIO ...>``, a JSON error)
knows only the bytes it was given. `decode_sample` re-raises its error as a `DecodeError`
that names the sample key and the chunk file, with the original chained as ``__cause__``.

`DecodeError` derives from `TierfeedError` and also from both ``ValueError`` (the bytes are
not what the decoder expects: json, unicode and numpy decoders raise ValueError) and
``OSError`` (what PIL raises for an image it cannot read, and what code written around
torchvision's loaders catches), so an ``except`` written for either kind of decoder keeps
catching it. Errors tierfeed itself raised while reading (a damaged chunk, a stuck read) are
already `TierfeedError` naming the chunk and pass through unchanged; a `DecodeError` that names
no sample (a codec's, which knows only the field: `tierfeed.format.codecs.open_image`) is
wrapped like any other decode failure.

With ``Dataset(..., on_error="skip")`` the decode is a `SkipFailures`: a sample it fails on is
not raised but handed on as a `Skipped` (its key and the error's line), which the batch leaves
out (`without_skipped`) and the Loader counts and lists in the epoch's record. Its position in
the plan is consumed all the same: each other sample is still delivered once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tierfeed.errors import DecodeError, TierfeedError
from tierfeed.storage.store import Sample, Store

__all__ = [
    "DecodeError",
    "SkipFailures",
    "Skipped",
    "decode_read",
    "decode_sample",
    "describe_sample",
    "skipped_record",
    "skipped_warning",
    "without_skipped",
]


@dataclass(frozen=True)
class Skipped:
    """A sample left out of its batch: its decode failed (``on_error="skip"``)."""

    key: str
    error: str  # what the decode raised: its type and message


@dataclass(frozen=True)
class SkipFailures:
    """``decode``, whose failures leave the sample out of its batch (`Skipped`) instead of
    ending the epoch. Errors of the read itself (a damaged chunk, a stuck read) still raise."""

    decode: Callable[[Sample], Any]

    def __call__(self, sample: Sample) -> Any:
        return self.decode(sample)


def without_skipped(items: Sequence[Any]) -> tuple[list[Any], tuple[str, ...]]:
    """A batch's decoded ``items`` without the `Skipped` ones, and the keys of those."""
    kept = [item for item in items if not isinstance(item, Skipped)]
    if len(kept) == len(items):
        return kept, ()
    return kept, tuple(item.key for item in items if isinstance(item, Skipped))


SKIPPED_LISTED = 1000  # keys an epoch's record lists at most


def skipped_record(keys: Sequence[str]) -> dict[str, Any]:
    """An epoch's skipped samples as its record holds them: how many, and their keys (the
    first `SKIPPED_LISTED`)."""
    return {"count": len(keys), "keys": list(keys[:SKIPPED_LISTED])}


def skipped_warning(epoch: int, keys: Sequence[str]) -> str:
    """The one warning of an epoch that left samples out."""
    shown = ", ".join(map(repr, keys[:3])) + (", ..." if len(keys) > 3 else "")
    return (
        f"epoch {epoch}: {len(keys)} sample(s) left out, their decode failed ({shown}); "
        'their keys are in loader.last_epoch["skipped"] (on_error="skip")'
    )


def _chunk_path(store: Store, sample: int) -> str:
    return store.chunk_location(int(store.index.sample_chunk[sample]))


def describe_sample(store: Store, sample: int) -> str:
    """``sample 'key' (chunk /path/to/chunk.tar)``: how errors name a sample."""
    return f"sample {store.index.key(sample)!r} (chunk {_chunk_path(store, sample)})"


def decode_sample(decode: Callable[[Sample], Any], store: Store, sample: int) -> Any:
    """``decode(store.read_sample(sample))``; a failure of ``decode`` becomes a `DecodeError`.

    Raises:
        DecodeError: ``decode`` raised (the original is chained).
        TierfeedError: the read failed (e.g. ChunkCorruptError), unchanged.
    """
    return decode_read(decode, store, sample, store.read_sample(sample))


def decode_read(decode: Callable[[Sample], Any], store: Store, sample: int, data: Sample) -> Any:
    """``decode(data)``, ``data`` being sample ``sample`` as read; a failure of ``decode``
    becomes a `DecodeError` (as `decode_sample`)."""
    try:
        return decode(data)
    except Exception as exc:
        if isinstance(exc, TierfeedError) and not (
            isinstance(exc, DecodeError) and exc.key is None
        ):
            raise
        if isinstance(decode, SkipFailures):
            return Skipped(data.key, f"{type(exc).__name__}: {exc}")
        checked = (
            "its bytes match the checksum taken when it was packed, so the packed file itself "
            "is not what decode expects"
            if store.verify_reads
            else "its bytes were read without a checksum check"
        )
        raise DecodeError(
            f"{describe_sample(store, sample)}: decode failed with {type(exc).__name__}: "
            f"{exc} ({checked}); fix or remove that file and re-pack, handle it in decode, or "
            "leave files that are not samples out (a README, .DS_Store): "
            "Dataset(..., samples=ImageFolder(store).sample_ids) reads the class folders' "
            "images only, or give sample ids or a mask of your own",
            key=data.key,
            chunk=_chunk_path(store, sample),
        ) from exc
