"""`tierfeed index` labels from WebDataset's ``.cls``/``.cls2`` members, and class names from a
``classes.txt``-style map."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierfeed import Writer, index_shards, open_store
from tierfeed.cli import main
from tierfeed.errors import PackError
from tierfeed.format.labels import CLS_MAX_BYTES

from .test_shards import make_shard

SHARD = [
    ("000001.jpg", b"j1"),
    ("000001.cls", b"3"),
    ("000002.jpg", b"j2"),
    ("000002.cls", b" 0\n"),
    ("000003.jpg", b"j3"),
]


def labels_of(store_dir: Path) -> tuple[list[int], list[str]]:
    with open_store(store_dir) as store:
        return [store.read_sample(i).label for i in range(len(store))], store.classes


def test_cls_members_become_labels(tmp_path: Path) -> None:
    make_shard(tmp_path / "s-000.tar", SHARD)
    index_shards([tmp_path / "s-000.tar"], tmp_path, progress=False, overwrite=True)
    assert labels_of(tmp_path) == ([3, 0, -1], ["0", "1", "2", "3"])
    with open_store(tmp_path) as store:
        assert store.read_sample(0).fields == {"cls": b"3", "jpg": b"j1"}  # still data as well


def test_classes_map_names_the_classes(tmp_path: Path) -> None:
    make_shard(tmp_path / "s-000.tar", SHARD)
    (tmp_path / "classes.txt").write_text("cat\ndog\nfish\nbird\n")
    index_shards(
        [tmp_path / "s-000.tar"], tmp_path, classes=tmp_path / "classes.txt", progress=False
    )
    assert labels_of(tmp_path) == ([3, 0, -1], ["cat", "dog", "fish", "bird"])
    with pytest.raises(PackError, match=r"'000001' has cls label 3.*only 2 classes"):
        index_shards(
            [tmp_path / "s-000.tar"],
            tmp_path,
            classes=["cat", "dog"],
            progress=False,
            overwrite=True,
        )
    with pytest.raises(PackError, match="'cat' is named twice"):
        index_shards(
            [tmp_path / "s-000.tar"],
            tmp_path,
            classes=["cat", "cat"],
            progress=False,
            overwrite=True,
        )


def test_cls2_when_no_cls_and_modes(tmp_path: Path) -> None:
    make_shard(
        tmp_path / "s.tar",
        [("a.jpg", b"1"), ("a.cls2", b"2"), ("b.cls", b"1"), ("b.cls2", b"0"), ("c.jpg", b"")],
    )
    shard = [tmp_path / "s.tar"]
    index_shards(shard, tmp_path, progress=False, overwrite=True)
    assert labels_of(tmp_path) == ([2, 1, -1], ["0", "1", "2"])
    index_shards(shard, tmp_path, labels="none", progress=False, overwrite=True)
    assert labels_of(tmp_path) == ([-1, -1, -1], [])
    with pytest.raises(PackError, match="'c' has none"):
        index_shards(shard, tmp_path, labels="cls", progress=False, overwrite=True)


def test_folder_rule_without_cls_members(tmp_path: Path) -> None:
    make_shard(tmp_path / "s.tar", [("dog/1.jpg", b"1"), ("cat/2.jpg", b"2")])
    index_shards([tmp_path / "s.tar"], tmp_path, progress=False, overwrite=True)
    assert labels_of(tmp_path) == ([1, 0], ["cat", "dog"])
    with pytest.raises(PackError, match="no sample has a cls"):
        index_shards([tmp_path / "s.tar"], tmp_path, classes=["a"], progress=False, overwrite=True)


@pytest.mark.hostile
@pytest.mark.parametrize(
    "text", [b"cat", b"1.5", b"", b"-2", b"9" * 12, b"1" * (CLS_MAX_BYTES + 5), "٣".encode()]
)
def test_bad_cls_text_is_an_error_naming_shard_and_member(tmp_path: Path, text: bytes) -> None:
    make_shard(tmp_path / "s.tar", [("a.jpg", b"1"), ("a.cls", text)])
    with pytest.raises(PackError, match=r"s\.tar: member 'a\.cls'.*(integer text|outside)"):
        index_shards([tmp_path / "s.tar"], tmp_path, progress=False, overwrite=True)
    index_shards(
        [tmp_path / "s.tar"], tmp_path, labels="none", progress=False, overwrite=True
    )  # plain data


def test_writer_store_reindexed_keeps_its_labels(tmp_path: Path) -> None:
    """A Writer's chunks are WebDataset shards: `tierfeed index` gives the same labels."""
    with Writer(tmp_path / "st", classes=["cat", "dog"]) as w:
        for i in range(6):
            w.write({"__key__": f"{i:04d}", "jpg": b"x" * i, "cls": i % 2})
    before = labels_of(tmp_path / "st")
    (tmp_path / "st" / "index.tfi").unlink()
    index_shards(
        sorted((tmp_path / "st" / "chunks").iterdir()),
        tmp_path / "st",
        classes=["cat", "dog"],
        progress=False,
    )
    assert labels_of(tmp_path / "st") == before == ([0, 1, 0, 1, 0, 1], ["cat", "dog"])


def test_cli_classes_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_shard(tmp_path / "s-000.tar", SHARD)
    (tmp_path / "classes.txt").write_text("a\nb\nc\nd\n")
    argv = ["index", str(tmp_path / "s-000.tar"), "--out", str(tmp_path), "-q"]
    assert main([*argv, "--classes", str(tmp_path / "classes.txt")]) == 0
    assert labels_of(tmp_path) == ([3, 0, -1], ["a", "b", "c", "d"])
    assert main(["inspect", str(tmp_path)]) == 0
    assert "classes   4 (a, b, c, d)" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_a_fifo_as_classes_file_is_refused_without_blocking(tmp_path: Path) -> None:
    from tierfeed.format.labels import load_classes

    fifo = tmp_path / "classes.txt"
    os.mkfifo(fifo)
    with pytest.raises(PackError, match="not a regular file"):
        load_classes(fifo)
