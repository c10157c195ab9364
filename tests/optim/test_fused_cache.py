"""The fused CPU kernels' sources, switch and cache (ms_optim/optim/_fused.py, _fused.cc, _thor_fused.cc).

* The C++ source is a real file shipped as package data and compiles with -Wall -Wextra -Werror.
* One switch (``_fused.fused_switch_on``: CPU and ``MS_OPTIM_FUSED`` not 0) decides for Lamb, LARS and ASGD.
* The cache: a truncated, random or foreign library under the cached name is detected before it is
  loaded (SHA-256 recorded at build time), rebuilt with one warning, and the numbers equal a clean
  run's; a world-writable cache directory is never loaded from (a planted library's constructor never
  runs); a new cache directory is created 0700; when no library can be had (no g++, an unusable cache
  path) one warning names the reason and ``MS_OPTIM_FUSED``, and the composite ops give the same numbers.
Every cache case runs in a subprocess with its own ``MS_OPTIM_CACHE_DIR``, so a crash (SIGBUS from a
damaged library) fails the test instead of killing pytest.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from support import REPO

import ms_optim
from ms_optim.optim import _fused

GXX = shutil.which("g++")

CHILD = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    from mindspore import Parameter, Tensor
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from ms_optim.optim import _fused
        from ms_optim.nn import Lamb
        rng = np.random.default_rng(0)
        w = Parameter(Tensor(rng.standard_normal((4, 3)).astype(np.float32)), name="w")
        opt = Lamb([w], 0.1, weight_decay=0.01)
        g = Tensor(rng.standard_normal((4, 3)).astype(np.float32))
        for _ in range(3):
            opt((g,))
    messages = [str(x.message) for x in caught if issubclass(x.category, _fused.FusedKernelWarning)]
    print("RESULT" + json.dumps({"fused": bool(opt.use_fused), "w": w.asnumpy().tolist(), "warnings": messages,
                                 "library": _fused._library}))
""")

# A library with MindSpore's aot entry point that "succeeds" without updating anything, and whose
# constructor leaves a marker file: what an attacker would plant under the cached name.
PLANTED = textwrap.dedent("""
    #include <cstdint>
    #include <cstdio>
    #include <cstdlib>
    __attribute__((constructor)) static void Planted() {
      const char *path = std::getenv("MS_OPTIM_TEST_MARKER");
      if (path != nullptr) { FILE *f = std::fopen(path, "w"); if (f != nullptr) std::fclose(f); }
    }
    extern "C" int MsOptimLambStep(int, void **, int *, int64_t **, const char **, void *, void *) { return 0; }
""")


def _run(cache_dir, marker=None, path=None, fused="1"):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["MS_OPTIM_CACHE_DIR"] = str(cache_dir)
    env["MS_OPTIM_FUSED"] = fused
    env["GLOG_v"] = "3"
    if marker is not None:
        env["MS_OPTIM_TEST_MARKER"] = str(marker)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A run that builds into a fresh cache: the library, its digest, and the weights it gives."""
    cache = tmp_path_factory.mktemp("clean") / "cache"
    result = _run(cache)
    assert result["fused"] and result["warnings"] == [], result
    return cache, result


@pytest.fixture(scope="module")
def composite(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("composite") / "cache", fused="0")


def _library(cache):
    names = [n for n in os.listdir(cache) if n.endswith(".so")]
    assert len(names) == 1, names
    return cache / names[0]


def _copy_cache(clean_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(clean_cache, cache)
    os.chmod(cache, 0o700)
    return cache, _library(cache)


def _planted_library(tmp_path):
    source = tmp_path / "planted.cc"
    source.write_text(PLANTED)
    out = tmp_path / "planted.so"
    subprocess.run([GXX, "-shared", "-fPIC", "-o", str(out), str(source)], check=True, timeout=120)
    return out


def _same_numbers(result, expected):
    np.testing.assert_array_equal(np.array(result["w"]), np.array(expected["w"]))


# ---- the source file --------------------------------------------------------------------------------

def test_fused_source_compiles_with_warnings_as_errors(tmp_path):
    assert GXX is not None, "g++ is needed to test the fused kernels' source"
    assert [os.path.basename(p) for p in _fused.SOURCE_FILES] == ["_fused.cc", "_thor_fused.cc"]
    assert all(os.path.dirname(p).endswith(os.path.join("ms_optim", "optim")) for p in _fused.SOURCE_FILES)
    out = tmp_path / "fused.so"
    proc = subprocess.run([GXX, "-Wall", "-Wextra", "-Werror", "-std=c++17", "-O3", "-shared", "-fPIC",
                           "-o", str(out), *_fused.SOURCE_FILES], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(out)], capture_output=True, text=True).stdout
    for name in ("MsOptimLambStep", "MsOptimLarsMomentum", "MsOptimLarsMomentumNesterov", "MsOptimSetSgemm",
                 "MsOptimPatchGram", "MsOptimRowGram", "MsOptimIdCounts", "MsOptimBlockPrecondition",
                 "MsOptimBlockInverse", "MsOptimBlockInverseOut"):
        assert name in symbols, name
    assert not hasattr(_fused, "_SOURCE"), "the kernels must not live in a Python string"


def test_fused_source_is_shipped_as_package_data(tmp_path):
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for source in _fused.SOURCE_FILES:
        shipped = tmp_path / "ms_optim" / "optim" / os.path.basename(source)
        assert shipped.is_file()
        with open(source, encoding="utf-8") as handle:
            assert shipped.read_text(encoding="utf-8") == handle.read()


# ---- the one switch ---------------------------------------------------------------------------------

def _three_optimizers():
    def params():
        return [Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")]
    return (ms_optim.nn.Lamb(params(), 0.1), ms_optim.nn.LARS(nn.Momentum(params(), 0.1, 0.9)),
            ms_optim.nn.ASGD(params(), 0.1))


def test_one_fused_switch_decides_for_lamb_lars_and_asgd(monkeypatch):
    assert ms.get_context("device_target") == "CPU"
    assert all(opt.use_fused for opt in _three_optimizers()), _fused._failed
    monkeypatch.setattr(_fused, "fused_switch_on", lambda: False)
    assert not any(opt.use_fused for opt in _three_optimizers())
    monkeypatch.undo()
    monkeypatch.setenv("MS_OPTIM_FUSED", "0")
    assert not _fused.fused_switch_on()
    assert not any(opt.use_fused for opt in _three_optimizers())


# ---- the cache --------------------------------------------------------------------------------------

def test_clean_build_records_a_digest_in_a_private_cache(clean, composite):
    cache, result = clean
    library = _library(cache)
    assert result["library"] == str(library)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert (cache / (library.name + ".sha256")).read_text().strip() == _fused._sha256(str(library))
    assert [n for n in os.listdir(cache) if n not in (library.name, library.name + ".sha256")] == []
    assert not composite["fused"] and composite["warnings"] == []
    # same numbers either way (each path is also checked against the float64 oracle in test_lamb.py)
    np.testing.assert_allclose(np.array(result["w"]), np.array(composite["w"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "another library"])
def test_damaged_or_foreign_library_is_rebuilt_before_loading(clean, tmp_path, damage):
    cache, library = _copy_cache(clean[0], tmp_path)
    marker = tmp_path / "planted-ran"
    if damage == "truncated":
        with open(library, "r+b") as handle:
            handle.truncate(os.path.getsize(library) // 2)
    elif damage == "random bytes":
        library.write_bytes(np.random.default_rng(1).bytes(os.path.getsize(library)))
    else:
        shutil.copyfile(_planted_library(tmp_path), library)
    result = _run(cache, marker=marker)
    assert len(result["warnings"]) == 1, result["warnings"]
    assert str(library) in result["warnings"][0] and "rebuilding" in result["warnings"][0]
    assert result["fused"]
    assert not marker.exists(), "the foreign library was loaded"
    _same_numbers(result, clean[1])
    assert _fused._sha256(str(library)) == (cache / (library.name + ".sha256")).read_text().strip()


def test_world_writable_cache_is_never_loaded_from(clean, tmp_path):
    cache, library = _copy_cache(clean[0], tmp_path)
    # a planted library with a digest that matches it: only the directory check can refuse it
    shutil.copyfile(_planted_library(tmp_path), library)
    (cache / (library.name + ".sha256")).write_text(_fused._sha256(str(library)) + "\n")
    os.chmod(cache, 0o777)
    marker = tmp_path / "planted-ran"
    result = _run(cache, marker=marker)
    assert not marker.exists(), "a library from a world-writable directory was loaded"
    assert len(result["warnings"]) == 1 and "not loading from it" in result["warnings"][0], result["warnings"]
    assert result["fused"] and not result["library"].startswith(str(cache))
    _same_numbers(result, clean[1])


def test_no_compiler_falls_back_with_one_warning(tmp_path, composite):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    result = _run(tmp_path / "cache", path=str(empty_bin))
    assert not result["fused"]
    assert len(result["warnings"]) == 1, result["warnings"]
    assert "g++ not found" in result["warnings"][0] and "MS_OPTIM_FUSED=0" in result["warnings"][0]
    assert "\n" not in result["warnings"][0]
    _same_numbers(result, composite)


def test_unusable_cache_path_falls_back_with_one_warning(tmp_path, composite):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = _run(blocker / "cache")
    assert not result["fused"]
    assert len(result["warnings"]) == 1, result["warnings"]
    assert str(blocker) in result["warnings"][0] and "MS_OPTIM_FUSED=0" in result["warnings"][0]
    _same_numbers(result, composite)
