"""``hf_disk`` and ``hf_hub``: a Hugging Face dataset, saved with ``save_to_disk`` or loaded by name or path with
``load_dataset``; one chunk per row range of the (memory-mapped) dataset, which is cheap to reopen in a worker."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import polars as pl
from pydantic import Field

from codemill.data.sources.base import ChunkSpec, SourceError, TableSource, table_rows

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


class HfSource(TableSource):
    """What both dataset kinds share: the split, the row-range chunks and the dataset's own fingerprint."""

    hf_split: str = Field("train", description="The split to read.")

    def options(self) -> dict[str, Any]:
        return {**super().options(), "hf_split": self.hf_split}

    @staticmethod
    def load(path: str, options: dict[str, Any]) -> Any:
        """The dataset (or dataset dict) at ``path``, as the kind loads it."""
        raise NotImplementedError

    @classmethod
    def open(cls, path: str, options: dict[str, Any]) -> Any:
        """The split to read of the dataset at ``path``; fails naming a dataset that does not load, a missing
        split or a missing content column."""
        import datasets
        label = options["label"]
        try:
            ds = cls.load(path, options)
        except FileNotFoundError as exc:
            raise SourceError(f"{label}: not found: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - datasets raises many types; all mean "cannot load"
            raise SourceError(f"{label}: cannot load the dataset: {exc}") from exc
        if isinstance(ds, datasets.DatasetDict):
            if options["hf_split"] not in ds:
                raise SourceError(f"{label}: no split {options['hf_split']!r} (splits: {', '.join(ds)})")
            ds = ds[options["hf_split"]]
        if options["content_column"] not in ds.column_names:
            raise SourceError(f"{label}: no column {options['content_column']!r} "
                              f"(columns: {', '.join(ds.column_names)}); set content_column")
        return ds

    def dataset(self) -> Any:
        return self.open(str(self.path), self.options())

    @property
    def revision(self) -> str | None:
        """The dataset revision the fingerprint records as its commit."""
        return None

    def chunks(self, index: int, chunk_files: int, languages: Mapping[str, str]) -> Iterator[ChunkSpec]:
        n, repo = len(self.dataset()), self.default_repo()
        for s in range(0, n, chunk_files):
            yield ChunkSpec(index, self.kind, str(self.path), repo, (s, min(s + chunk_files, n)),
                            options=self.options())

    @classmethod
    def read(cls, spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
        """The chunk's rows; a row without a path is named ``row-<index>``."""
        start, end = spec.items
        ds = cls.open(spec.location, spec.options).select(range(start, end))
        frame = pl.from_arrow(ds.data.table)
        assert isinstance(frame, pl.DataFrame)
        return table_rows(spec, frame, max_bytes, [f"row-{i}" for i in range(start, end)])

    def fingerprint(self, languages: Mapping[str, str]) -> dict[str, Any]:
        """The dataset's own fingerprint (a hash of its Arrow files and transforms)."""
        return {"root": str(self.path), "fingerprint": self.dataset()._fingerprint, "files": None,
                "commit": self.revision}


class HfDiskSource(HfSource):
    """A dataset saved with `save_to_disk` (a dataset dict gives its `hf_split`)."""

    DIGEST_COMPAT = {"hf_name": None, "hf_revision": None}

    kind: Literal["hf_disk"] = "hf_disk"

    @staticmethod
    def load(path: str, options: dict[str, Any]) -> Any:
        import datasets
        return datasets.load_from_disk(path)


class HfHubSource(HfSource):
    """A dataset by hub name or local path, read with `load_dataset`."""

    kind: Literal["hf_hub"] = "hf_hub"
    hf_name: str | None = Field(None, description="The dataset's config name.")
    hf_revision: str | None = Field(None, description="The dataset revision (commit, tag or branch).")

    def options(self) -> dict[str, Any]:
        return {**super().options(), "hf_name": self.hf_name, "hf_revision": self.hf_revision}

    @property
    def revision(self) -> str | None:
        return self.hf_revision

    @staticmethod
    def load(path: str, options: dict[str, Any]) -> Any:
        import datasets
        return datasets.load_dataset(path, options["hf_name"], split=options["hf_split"],
                                     revision=options["hf_revision"])


SOURCES = (HfDiskSource, HfHubSource)
