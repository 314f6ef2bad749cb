"""llama.cpp's own `llama-server` and `llama-batched-bench`, built once from the installed source.

The llama-cpp-python source package of exactly the installed version carries the llama.cpp tree it
was built from (`vendor/llama.cpp`), so the C++ server is the same llama.cpp as our engine's. It is
built once per version and cached outside the repository:

    paths = llama_cpp_binaries()       # builds on the first call (minutes), then returns at once
    paths.server, paths.batched_bench

Cache: `$STREAMCHAT_CACHE` or `$XDG_CACHE_HOME/streamchat` or `~/.cache/streamchat`, holding
`sdists/llama_cpp_python-VERSION.tar.gz` (from `pip download`) and `llama.cpp-VERSION/bin/`.
A lock file serialises concurrent callers (tests and benchmarks may start together); the build runs
in a temporary folder and its result is renamed into place, so a half-built cache is never seen.

CPU only, Release, with the CMake defaults llama-cpp-python's own build keeps (GGML_NATIVE and
GGML_OPENMP on: see the sdist's CMakeLists.txt), so the two run the same kernels. No network at
build time: no prebuilt web UI fetched, no OpenSSL/CURL. Static, so the binaries survive the rename.

Run it by hand to build ahead of time: `python tests/llama_cpp_build.py [--jobs 2]`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)

DISTRIBUTION = "llama-cpp-python"
TARGETS = ("llama-server", "llama-batched-bench")
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_BACKEND_DL=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_METAL=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_HIP=OFF",
    "-DGGML_BLAS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
)


@dataclass(frozen=True)
class LlamaCppBinaries:
    version: str
    server: Path
    batched_bench: Path


def cache_root() -> Path:
    if explicit := os.environ.get("STREAMCHAT_CACHE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "streamchat"


def installed_version() -> str:
    return metadata.version(DISTRIBUTION)


def _binaries(install_dir: Path, version: str) -> LlamaCppBinaries:
    return LlamaCppBinaries(
        version=version,
        server=install_dir / "bin" / "llama-server",
        batched_bench=install_dir / "bin" / "llama-batched-bench",
    )


def _is_complete(found: LlamaCppBinaries) -> bool:
    return all(os.access(p, os.X_OK) for p in (found.server, found.batched_bench))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def source_package(version: str, root: Path) -> Path:
    """The sdist of `version`, downloaded once with pip (which reuses its own HTTP cache)."""
    folder = root / "sdists"
    name = f"llama_cpp_python-{version}.tar.gz"
    if not (folder / name).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        log.info("downloading %s==%s source package", DISTRIBUTION, version)
        # pip prepares the sdist's metadata (an isolated scikit-build-core), but builds nothing.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"{DISTRIBUTION}=={version}",
                "-d",
                str(folder),
            ],
            check=True,
        )
    return folder / name


def _build(version: str, root: Path, install_dir: Path, jobs: int) -> None:
    sdist = source_package(version, root)
    log.info("building llama.cpp %s with -j%d (minutes): log in %s", version, jobs, root)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"llama.cpp-{version}-", dir=root) as work_name:
        work = Path(work_name)
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
            # the "data" filter (Python >= 3.11.4) refuses links and paths out of `work`
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(work, members=members, **safe)
        source = next(work.glob("*/vendor/llama.cpp"))
        build = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        log_path = root / f"llama.cpp-{version}.build.log"
        with log_path.open("w") as out:
            for step in (
                ["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_OPTIONS],
                ["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)],
            ):
                out.write(f"$ {' '.join(step)}\n")
                out.flush()
                if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode:
                    tail = log_path.read_text(errors="replace")[-4000:]
                    raise RuntimeError(f"llama.cpp build failed (log: {log_path}):\n{tail}")
        staged = work / "install"
        (staged / "bin").mkdir(parents=True)
        for target in TARGETS:
            shutil.copy2(build / "bin" / target, staged / "bin" / target)
        elapsed = time.monotonic() - started
        (staged / "BUILD_INFO").write_text(
            f"{DISTRIBUTION} {version}\nbuild {elapsed:.0f} s with -j{jobs}\n"
            + " ".join(CMAKE_OPTIONS)
            + "\n"
        )
        staged.rename(install_dir)  # atomic: same filesystem, target absent
    log.info("built llama.cpp %s (%s) in %.0f s", version, ", ".join(TARGETS), elapsed)


def llama_cpp_binaries(version: str | None = None, jobs: int = 2) -> LlamaCppBinaries:
    """The cached binaries for `version` (default: the installed llama-cpp-python), built first if
    absent. `jobs` defaults to 2: the development machine has two cores shared with others."""
    version = version or installed_version()
    root = cache_root()
    install_dir = root / f"llama.cpp-{version}"
    found = _binaries(install_dir, version)
    if _is_complete(found):
        return found
    with _locked(root / f"llama.cpp-{version}.lock"):
        if not _is_complete(found):  # another caller may have built it while we waited
            if install_dir.exists():
                shutil.rmtree(install_dir)
            _build(version, root, install_dir, jobs)
    if not _is_complete(found):
        raise RuntimeError(f"llama.cpp build left no binaries in {install_dir}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", default=None, help="default: the installed llama-cpp-python")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    found = llama_cpp_binaries(args.version, args.jobs)
    print(found.server)
    print(found.batched_bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
