"""The README's and the coming-from guide's code blocks run as written (issue 33): every block
runs, in order, each Python block in a namespace of its own (issue 46: a block copied alone
works), on a small world made for it (an ImageFolder tree of real JPEGs where the docs say
/data/..., with an upper-case extension, a truncated JPEG and a linked file in each tree,
WebDataset shards plain and gzipped, an MDS and a LitData dataset their own writers made,
moto's S3 for s3://my-bucket with the plain shards under shards/), unless an HTML comment
right above it says why not (`<!-- not run: ... -->`, or `<!-- peer: not run -->` for another
library's example); a block not run still imports every name it uses, checked without running
it (but the reader's own, and another library's example). What the test changes, and only
that: the docs' absolute example paths are moved under the world, and their sizes made small
(8 workers -> 2, 90 epochs -> 2)."""

from __future__ import annotations

import builtins
import gzip
import io
import os
import re
import shutil
import subprocess
import symtable
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import ImageFile

from tests.objectstore import client, env

pytestmark = [pytest.mark.slow, pytest.mark.fuse, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "docs/coming-from.md"]
_FENCE = re.compile(r"^```(\w*)\s*$")
_REASON = re.compile(r"^<!--\s*(not run: .+|peer: not run)\s*-->\s*$")


@dataclass
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # why it is not run, as the comment above it says


def blocks(doc: str) -> list[Block]:
    lines = (ROOT / doc).read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = _REASON.match(lines[i - 1]) if i else None
        code = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(doc, i + 1, fence.group(1), code, above.group(1) if above else None))
        i = end + 1
    return out


def test_every_block_runs_or_says_why_not() -> None:
    for doc in DOCS:
        found = blocks(doc)
        assert found, doc
        for b in found:
            assert b.lang in ("sh", "python"), f"{doc}:{b.line}: a ```{b.lang} block"
            if b.skip is None:
                continue
            assert b.skip.startswith(("not run: ", "peer: ")), f"{doc}:{b.line}"


def _unbound(code: str) -> set[str]:
    """Names ``code`` reads that it neither binds nor imports (builtins aside)."""
    top = symtable.symtable(code, "block", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        for sym in table.get_symbols():
            outside = table is top or (sym.is_global() and not sym.is_declared_global())
            if sym.is_referenced() and outside:
                read.add(sym.get_name())
        tables.extend(table.get_children())
    return read - bound - set(dir(builtins))


def test_every_python_block_imports_what_it_uses() -> None:
    """A block the test does not run (a multi-rank job, a GPU) still works copied alone: it
    imports every name it uses but the reader's own (the transform, the decode, the samples)."""
    readers_own = set(_prelude())
    for doc in DOCS:
        for b in blocks(doc):
            if b.lang != "python" or (b.skip or "").startswith("peer:"):
                continue  # another library's example, as its own docs write it
            missing = _unbound(b.code) - readers_own
            assert not missing, f"{doc}:{b.line}: uses {sorted(missing)} without importing them"


def _jpeg(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (i * 5 % 256, 80, 160)).save(out, format="JPEG")
    return out.getvalue()


def _truncated_jpeg() -> bytes:
    """A JPEG cut off in its scan data, as an interrupted copy leaves one: PIL opens it and
    fails to load it ("image file is truncated") unless ``LOAD_TRUNCATED_IMAGES`` is set."""
    data = _jpeg(3)
    scan = data.index(b"\xff\xda") + 14  # past the start-of-scan header
    return data[: scan + (len(data) - scan) // 3]


def _world(root: Path) -> None:
    """What the docs' example paths point at: trees, shards and empty directories."""
    for tree in (root / "data/imagenet/train", root / "data/train"):
        for c, name in enumerate(("n01440764", "n01443537")):
            (tree / name).mkdir(parents=True)
            for i in range(50):
                (tree / name / f"img_{i}.jpg").write_bytes(_jpeg(i + 50 * c))
        # A real tree's mess: a camera's upper-case extension, a file linked in from elsewhere,
        # an image an interrupted copy cut short.
        (tree / "n01440764/IMG_0001.JPG").write_bytes(_jpeg(200))
        (tree / "n01443537/cut_short.jpg").write_bytes(_truncated_jpeg())
        (tree / "n01443537/linked.jpg").symlink_to(tree / "n01440764/img_7.jpg")
    for shards in (root / "data/shards", root / "shards"):
        shards.mkdir(parents=True)
        for s in range(2):
            with tarfile.open(shards / f"shard-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
                for i in range(8):
                    for ext, data in ((".jpg", _jpeg(i)), (".cls", str(i % 2).encode())):
                        info = tarfile.TarInfo(f"s{s}{i:03d}{ext}")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
    for d in ("scratch", "local", "mnt/train"):
        (root / d).mkdir(parents=True)
    for peer in ("mds", "litdata"):  # written by MosaicML Streaming and LitData themselves
        shutil.copytree(ROOT / "tests/data/peers" / peer, root / "data" / peer)
    (root / "data/shards-gz").mkdir(parents=True)
    for s in range(2):
        name = f"shard-{s:06d}.tar"
        plain = (root / "data/shards" / name).read_bytes()
        (root / "data/shards-gz" / f"{name}.gz").write_bytes(gzip.compress(plain))


def _moved(code: str, root: Path) -> str:
    """The docs' example paths under ``root``; their sizes small."""
    for prefix in ("/data/", "/scratch/", "/local/", "/mnt/"):
        code = re.sub(rf"(?<![\w./]){re.escape(prefix)}", f"{root}{prefix}", code)
    code = code.replace("num_workers=8", "num_workers=2").replace("workers=8", "workers=2")
    return code.replace("range(90)", "range(2)")


def _prelude() -> dict[str, Any]:
    """Names the README uses as the reader's own: a transform, a decode, samples to write."""
    import torch

    from tests.docs_samples import make_sample

    def transform(image: Any) -> Any:
        return torch.tensor(list(image.getdata()), dtype=torch.float32)

    def my_decode(sample: Any) -> Any:
        from PIL import Image

        return transform(Image.open(io.BytesIO(sample.fields["jpg"]))), sample.label

    my_samples = [(_jpeg(i), i % 2) for i in range(10)]
    return {"__name__": "__docs__", "transform": transform, "tf": transform,
            "my_decode": my_decode, "my_samples": my_samples, "make_sample": make_sample,
            "inputs": list(range(10))}  # fmt: skip


@pytest.mark.parametrize("doc", DOCS)
def test_the_code_blocks_run(
    doc: str, tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = tmp_path / "world"
    _world(world)
    for name, value in env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    s3 = client(s3_endpoint)
    s3.create_bucket(Bucket="my-bucket")
    for shard in sorted((world / "data/shards").glob("*.tar")):  # a bucket only read
        s3.put_object(Bucket="my-bucket", Key=f"shards/{shard.name}", Body=shard.read_bytes())
    monkeypatch.chdir(world)
    bin_dir = str(Path(sys.executable).parent)
    shell_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    try:
        for b in blocks(doc):
            if b.skip is not None:
                continue
            code = _moved(b.code, world)
            if b.lang == "sh":
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code],
                    capture_output=True, text=True, timeout=240, env=shell_env,
                )  # fmt: skip
                assert done.returncode == 0, f"{doc}:{b.line}\n{code}\n{done.stderr[-3000:]}"
            else:
                ImageFile.LOAD_TRUNCATED_IMAGES = False  # PIL's default, whatever a block set
                try:  # on its own: a reader copies one block, not the page before it
                    exec(compile(code, f"{doc}:{b.line}", "exec"), _prelude())
                except Exception as exc:
                    raise AssertionError(f"{doc}:{b.line} failed:\n{code}") from exc
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        subprocess.run(["fusermount3", "-uz", str(world / "mnt/train")], capture_output=True)
