"""Near-dedup like for like: codemill against rensa and datasketch, scored against exact all-pairs Jaccard.

Every method gets the same input: codemill's 5-gram shingle hashes of the same files (``data.shingles``,
timed once and separately), the same number of permutations (256) and the same bands (the config's, 25 x 10
at Jaccard 0.7). Timed per method: signatures, then LSH + clustering into duplicate groups (connected
components of the candidate graph). Scored without timing: the candidate pairs (two files sharing a band)
and the pairs placed in one group, each against the exact Jaccard of every pair of shingle sets (a sparse
shingle-incidence matrix product), so recall and precision are absolute, not relative to another method.

- codemill: ``data.minhash`` (one-permutation hashing with optimal densification, numba kernels, documents
  split over the CPUs) + its banding, and union-find components of the candidate pairs whose 128 x 16-bit
  sketches agree on >= threshold - 0.05: exactly what the ingest stage runs; its pairs are the verified
  ones. Its first call in a process (numba's import and cached machine code, 1-2 s) is made before the
  timing. "codemill unverified" is the same without the sketch check.
- rensa, fastest API: ``RMinHash.digest_matrix_from_flat_token_hashes`` (Rust, SIMD, threads) +
  ``RMinHashLSH.query_duplicate_flags_matrix_one_shot``. It only says which files have a candidate, not
  which groups they form, so it does less than the others: a lower bound on rensa's time. rensa's LSH needs
  bands x rows == num_perm, so it computes 250 permutations (the first 250 of its 256 with the same seed;
  25 x 10 bands never read the other 6 in any method). Its pairs are read off its digest matrix untimed.
- rensa + groups: the same digests, converted to numpy (``to_rows``, the only way out of the matrix), banded
  and clustered like codemill's: what rensa costs when the duplicate groups are needed.
- rensa flagged groups: rensa's flags, then only the flagged files' digests again, converted and clustered:
  the cheapest way I found to get rensa's groups (the same groups as the row above).
- datasketch, fast path: ``MinHash.bulk`` on the 64-bit shingle hashes (scheme ``affine64``, identity hash
  function: no SHA-1) + ``MinHashLSH`` with the same 25 x 10 bands, insertion session, one query per file.

    python -m benchmarks.near_dedup [--files 4000] [--repeats 3] [--quality-seeds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from codemill.data.config import IngestConfig
from codemill.data.filters import apply_filters, language_expr
from codemill.data.ingest import prepare
from codemill.data.minhash import ALGORITHM, VERIFY_MARGIN, band_keys, lsh_components, signatures, sketch
from codemill.data.shingles import NgramHashes, ngram_hashes
from codemill.data.sources import plan_chunks, read_chunk

LIBRARIES = ("numpy", "polars", "scipy", "rensa", "datasketch")


def sample_texts(cfg: IngestConfig, n_files: int) -> list[str]:
    """The first ``n_files`` distinct texts of the first source that pass the language and file filters (exact
    duplicates are gone before near-dedup in the stage too)."""
    texts: list[str] = []
    for spec in plan_chunks(0, cfg.sources[0], cfg.chunk_files):
        raw = read_chunk(spec, cfg.max_file_bytes)
        live = raw.filter(pl.col("reason").is_null()).with_columns(
            language_expr(pl.col("path"), cfg.languages).alias("language"))
        texts += apply_filters(live, cfg.filters).filter(pl.col("reason").is_null())["content"].to_list()
        if len(set(texts)) >= n_files:
            break
    return list(dict.fromkeys(t for t in texts if t))[:n_files]


def exact_pairs(ng: NgramHashes, threshold: float) -> set[tuple[int, int]]:
    """Every pair of files whose shingle sets have Jaccard >= threshold: X X^T over the binary incidence."""
    _, col = np.unique(ng.hashes, return_inverse=True)
    x = sp.csr_matrix((np.ones(len(col), np.float32), (ng.doc, col)), shape=(ng.n_docs, int(col.max()) + 1))
    x.sum_duplicates()
    x.data[:] = 1
    size = np.asarray(x.sum(axis=1)).ravel()
    inter = sp.triu(x @ x.T, k=1).tocoo()
    jac = inter.data / (size[inter.row] + size[inter.col] - inter.data)
    keep = jac >= threshold
    return set(zip(inter.row[keep].tolist(), inter.col[keep].tolist(), strict=True))


def band_pairs(keys: np.ndarray, valid: np.ndarray) -> set[tuple[int, int]]:
    """Every pair of valid files that share at least one band key (the LSH candidates)."""
    idx = np.flatnonzero(valid)
    pairs: set[tuple[int, int]] = set()
    for j in range(keys.shape[1]):
        col = keys[idx, j]
        order = np.argsort(col, kind="stable")
        ks = col[order]
        bounds = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1], True])
        for a in np.flatnonzero(np.diff(bounds) > 1):
            members = sorted(idx[order[bounds[a]:bounds[a + 1]]].tolist())
            pairs.update((x, y) for i, x in enumerate(members) for y in members[i + 1:])
    return pairs


def clusters_of(pairs: set[tuple[int, int]], n: int) -> np.ndarray:
    """Connected components of the candidate graph given as pairs (how datasketch's output is grouped)."""
    if not pairs:
        return np.arange(n)
    r, c = np.array(sorted(pairs)).T
    graph = sp.coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(n, n)).tocsr()
    return connected_components(graph, directed=False)[1]


def scores(cands: set[tuple[int, int]], labels: np.ndarray | None, true: set[tuple[int, int]]) -> dict[str, float]:
    """Pair recall/precision of the candidates, and of 'same group' when the method forms groups."""
    hit = len(cands & true)
    out = {"pairs": len(cands), "recall": hit / max(1, len(true)), "precision": hit / max(1, len(cands))}
    if labels is not None:
        _, sizes = np.unique(labels, return_counts=True)
        grouped = int((sizes * (sizes - 1) // 2).sum())
        same = sum(labels[a] == labels[b] for a, b in true)
        out |= {"group_recall": same / max(1, len(true)), "group_precision": same / max(1, grouped)}
    return out


def offsets(ng: NgramHashes) -> np.ndarray:
    off = np.zeros(ng.n_docs + 1, dtype=np.uint64)
    off[1:] = np.cumsum(np.bincount(ng.doc, minlength=ng.n_docs))
    return off


CPU_LOG: list[float] = []  # CPU seconds (every thread of this process) of each timed section


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(result, wall seconds); the CPU seconds go to CPU_LOG (the machine may be shared: CPU is the steadier
    measure of work, wall is what a user waits)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    CPU_LOG.append(time.process_time() - c0)
    return out, wall


class Methods:
    """Each method: (signatures, lsh+clusters) timed; returns what the scorer needs."""

    def __init__(self, ng: NgramHashes, num_perm: int, bands: int, rows: int, seed: int, threshold: float):
        self.ng, self.num_perm, self.bands, self.rows, self.seed = ng, num_perm, bands, rows, seed
        self.threshold = threshold
        self.min_similarity = threshold - VERIFY_MARGIN
        self.valid = np.bincount(ng.doc, minlength=ng.n_docs) > 0
        self.off = offsets(ng)

    def codemill(self) -> tuple[float, float, set, np.ndarray]:
        """What the stage does: signatures, band keys + sketches, verified union-find components."""
        sig, t_sig = timed(lambda: signatures(self.ng, self.num_perm, self.seed))
        (keys, sk, labels), t_lsh = timed(lambda: self._verified(sig))
        need = self.min_similarity * sk.shape[1] - 1e-9
        pairs = {(a, b) for a, b in band_pairs(keys, self.valid) if (sk[a] == sk[b]).sum() >= need}
        return t_sig, t_lsh, pairs, labels

    def _verified(self, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keys, sk = band_keys(sig, self.bands, self.rows), sketch(sig)
        return keys, sk, lsh_components(keys, self.valid, sk, self.min_similarity)

    def codemill_unverified(self) -> tuple[float, float, set, np.ndarray]:
        """The same signatures and bands without the sketch check (v1 of the algorithm)."""
        sig, t_sig = timed(lambda: signatures(self.ng, self.num_perm, self.seed))
        (keys, labels), t_lsh = timed(lambda: self._cluster(sig))
        return t_sig, t_lsh, band_pairs(keys, self.valid), labels

    def _cluster(self, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = band_keys(sig, self.bands, self.rows)
        return keys, lsh_components(keys, self.valid)

    def _rensa_matrix(self) -> Any:
        from rensa import RMinHash  # type: ignore[import-untyped]

        return RMinHash.digest_matrix_from_flat_token_hashes(self.ng.hashes, self.off, self.bands * self.rows,
                                                             self.seed)

    def rensa_flags(self) -> tuple[float, float, set, None]:
        from rensa import RMinHashLSH

        m, t_sig = timed(self._rensa_matrix)
        n_perm = self.bands * self.rows
        flags, t_lsh = timed(lambda: RMinHashLSH(self.threshold, n_perm, self.bands)
                             .query_duplicate_flags_matrix_one_shot(m))
        pairs = band_pairs(band_keys(np.array(m.to_rows(), dtype=np.uint32), self.bands, self.rows), self.valid)
        flagged = {i for p in pairs for i in p}
        assert flagged == {i for i, f in enumerate(flags) if f and self.valid[i]}, "rensa's flags != its bands"
        return t_sig, t_lsh, pairs, None

    def rensa_groups(self) -> tuple[float, float, set, np.ndarray]:
        m, t_sig = timed(self._rensa_matrix)
        (keys, labels), t_lsh = timed(lambda: self._cluster(np.array(m.to_rows(), dtype=np.uint32)))
        return t_sig, t_lsh, band_pairs(keys, self.valid), labels

    def rensa_flagged_groups(self) -> tuple[float, float, set, np.ndarray]:
        """rensa's flags, then groups of the flagged files only: their digests again (a few per cent of the
        shingles), out through ``to_rows``, banded and clustered. The same groups as ``rensa_groups``."""
        from rensa import RMinHash, RMinHashLSH

        def groups(m: Any) -> tuple[np.ndarray, np.ndarray]:
            n_perm = self.bands * self.rows
            flags = np.array(RMinHashLSH(self.threshold, n_perm, self.bands)
                             .query_duplicate_flags_matrix_one_shot(m), dtype=bool) & self.valid
            docs = np.flatnonzero(flags)
            lo, hi = self.off[docs].astype(np.int64), self.off[docs + 1].astype(np.int64)
            sub = np.concatenate([self.ng.hashes[a:b] for a, b in zip(lo, hi, strict=True)]) if len(docs) else \
                np.empty(0, np.uint64)
            sub_off = np.r_[0, np.cumsum(hi - lo)].astype(np.uint64)
            rows = RMinHash.digest_matrix_from_flat_token_hashes(sub, sub_off, n_perm, self.seed).to_rows()
            keys = np.zeros((self.ng.n_docs, self.bands), dtype=np.uint64)
            if len(docs):
                keys[docs] = band_keys(np.array(rows, dtype=np.uint32), self.bands, self.rows)
            return keys, lsh_components(keys, flags)

        m, t_sig = timed(self._rensa_matrix)
        (keys, labels), t_lsh = timed(lambda: groups(m))
        return t_sig, t_lsh, band_pairs(keys, keys.any(axis=1)), labels

    def datasketch(self) -> tuple[float, float, set, np.ndarray]:
        from datasketch import LeanMinHash, MinHash, MinHashLSH  # type: ignore[import-untyped]

        def sigs() -> list[LeanMinHash]:
            sets = np.split(self.ng.hashes, self.off[1:-1].astype(np.int64))
            mhs = MinHash.bulk([s.tolist() for s in sets], num_perm=self.num_perm, seed=self.seed,
                               scheme="affine64", hashfunc=int)
            return [LeanMinHash(m) for m in mhs]

        def lsh(mhs: list[LeanMinHash]) -> tuple[set, np.ndarray]:
            index = MinHashLSH(threshold=self.threshold, num_perm=self.num_perm, params=(self.bands, self.rows))
            live = [i for i in range(len(mhs)) if self.valid[i]]
            with index.insertion_session() as session:
                for i in live:
                    session.insert(i, mhs[i])
            pairs = {(min(i, j), max(i, j)) for i in live for j in index.query(mhs[i]) if j != i}
            return pairs, clusters_of(pairs, len(mhs))

        mhs, t_sig = timed(sigs)
        (pairs, labels), t_lsh = timed(lambda: lsh(mhs))
        return t_sig, t_lsh, pairs, labels


def compare(texts: list[str], cfg: IngestConfig, repeats: int = 3, quality_seeds: int = 10,
            datasketch: bool = True) -> dict[str, dict[str, float]]:
    """Print the versions, the timing/accuracy table and the ratios; return the rows."""
    nd = cfg.near_dedup
    proc = prepare(cfg)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print("versions: python " + sys.version.split()[0] + ", "
          + ", ".join(f"{lib} {version(lib)}" for lib in LIBRARIES) + f"; codemill near-dedup {ALGORITHM}; "
          f"{os.cpu_count()} CPUs (codemill's threads and rensa's rayon pool both use them all)")
    t_sh = float("inf")
    for _ in range(repeats):
        ng, dt = timed(lambda: ngram_hashes(pl.Series(texts, dtype=pl.String), nd.ngram))
        t_sh = min(t_sh, dt)
    true = exact_pairs(ng, nd.threshold)
    print(f"near-dedup on {len(texts)} files ({mb:.1f} MB, {len(ng.hashes)} {nd.ngram}-gram shingles), "
          f"{nd.num_perm} permutations, {proc.bands} x {proc.rows} bands, Jaccard >= {nd.threshold}: "
          f"{len(true)} true pairs (exact all-pairs); best of {repeats}, interleaved")
    print(f"shingling (shared by every method: codemill's compiled tokenizer and n-gram kernels): {t_sh:.3f} s")
    m = Methods(ng, nd.num_perm, proc.bands, proc.rows, nd.seed, nd.threshold)
    m.codemill()  # untimed: numba's import and its cached machine code load once per process (~1-2 s)
    names = {"codemill": m.codemill, "codemill unverified": m.codemill_unverified,
             "rensa (flags only)": m.rensa_flags, "rensa + groups": m.rensa_groups,
             "rensa flagged groups": m.rensa_flagged_groups}
    if datasketch:
        names["datasketch"] = m.datasketch
    best: dict[str, list[float]] = {k: [float("inf")] * 4 for k in names}
    rows: dict[str, dict[str, float]] = {}
    for rep in range(repeats):
        for name, fn in names.items():
            if name == "datasketch" and rep > 0:
                continue  # seconds per run; one is plenty against a 100x gap
            logged = len(CPU_LOG)
            t_sig, t_lsh, pairs, labels = fn()
            best[name] = [min(best[name][0], t_sig), min(best[name][1], t_lsh),
                          min(best[name][2], t_sig + t_lsh), min(best[name][3], sum(CPU_LOG[logged:]))]
            rows[name] = scores(pairs, labels, true)
    head = (f"{'method':<20}{'signatures':>11}{'lsh+groups':>11}{'total s':>9}{'cpu s':>8}{'MB/s':>7}{'pairs':>7}"
            f"{'recall':>8}{'precision':>10}{'grp recall':>11}{'grp prec':>9}")
    print(head)
    for name, r in rows.items():
        t = best[name]
        r |= {"signatures_s": t[0], "lsh_s": t[1], "total_s": t[2], "cpu_s": t[3]}
        grp = (f"{r['group_recall']:>11.3f}{r['group_precision']:>9.3f}" if "group_recall" in r
               else f"{'-':>11}{'-':>9}")
        print(f"{name:<20}{t[0]:>11.4f}{t[1]:>11.4f}{t[2]:>9.4f}{t[3]:>8.4f}{mb / t[2]:>7.0f}{r['pairs']:>7}"
              f"{r['recall']:>8.3f}{r['precision']:>10.3f}{grp}")
    ours = rows["codemill"]["total_s"]
    for name in rows:
        if not name.startswith("codemill"):
            ratio = rows[name]["total_s"] / ours
            cpu = rows[name]["cpu_s"] / rows["codemill"]["cpu_s"]
            print(f"  codemill speed / {name}: {ratio:.2f}x wall, {cpu:.2f}x CPU  (codemill {ours:.4f} s, {name} "
                  f"{rows[name]['total_s']:.4f} s; > 1 means codemill is faster)")
    if quality_seeds > 1:
        seed_spread(m, true, quality_seeds)
    return rows


def seed_spread(m: Methods, true: set[tuple[int, int]], seeds: int) -> None:
    """Recall/precision of codemill and rensa over several seeds: with a few hundred true pairs one seed's
    difference between two equally good sketches is noise of a few points."""
    acc: dict[str, list[tuple[float, float]]] = {"codemill": [], "rensa": []}
    base = m.seed
    for s in range(seeds):
        m.seed = base + s
        for name, fn in (("codemill", m.codemill), ("rensa", m.rensa_flags)):
            r = scores(fn()[2], None, true)
            acc[name].append((r["recall"], r["precision"]))
    m.seed = base
    for name, v in acc.items():
        a = np.array(v)
        se = a.std(axis=0, ddof=1) / np.sqrt(len(a))
        print(f"  {name:<9} over seeds {base}..{base + seeds - 1}: recall {a[:, 0].mean():.3f} "
              f"(sd {a[:, 0].std(ddof=1):.3f}, se {se[0]:.3f}), precision {a[:, 1].mean():.3f} "
              f"(sd {a[:, 1].std(ddof=1):.3f}, se {se[1]:.3f})")
    diff = np.array(acc["codemill"]) - np.array(acc["rensa"])
    dse = diff.std(axis=0, ddof=1) / np.sqrt(len(diff))
    print(f"  codemill - rensa, mean over seeds: recall {diff[:, 0].mean():+.3f} (se {dse[0]:.3f}), "
          f"precision {diff[:, 1].mean():+.3f} (se {dse[1]:.3f})")


def main() -> None:
    from benchmarks.ingest import corpus_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4000, help="files in the sample")
    ap.add_argument("--repeats", type=int, default=3, help="timings: best of this many, interleaved")
    ap.add_argument("--quality-seeds", type=int, default=10, help="seeds for the recall/precision spread")
    ap.add_argument("--no-datasketch", action="store_true", help="skip datasketch (seconds per run)")
    args = ap.parse_args()
    cfg = corpus_config()
    compare(sample_texts(cfg, args.files), cfg, args.repeats, args.quality_seeds, not args.no_datasketch)


if __name__ == "__main__":
    main()
