"""Compiles, on a machine without a GPU or a CUDA torch, every translation unit whose code differs
under MMTRAIN_CUDA, against the CUDA build's own headers, so that the CUDA path cannot rot between
GPU runs. .ci/run calls it after the CPU build.

    python3 scripts/check_cuda_compile.py [BUILD_DIR]     (default: build)

- Headers: the wheels pinned in scripts/cuda_wheels.txt (torch 2.14.1's CUDA build, NCCL, the CUDA
  runtime and its crt/ headers, the CUDA math libraries), fetched with `pip download --no-deps` and
  unpacked, headers only (~70 MB), into .cache/cuda-headers/<hash of the pins>; a second run reuses
  them. No CUDA toolkit is needed.
- Translation units: every src/ .cpp with an `#if...MMTRAIN_CUDA` line, every src/ .cpp that
  includes a header with one, and RUNTIME_CUDA_UNITS (CUDA code chosen at run time). Each is compiled with its own command from BUILD_DIR's
  compile_commands.json (the CPU build's flags and defines), its torch include paths swapped for the
  CUDA wheel's, the CUDA build's defines added (MMTRAIN_CUDA, USE_C10D_NCCL and torch_cuda's
  USE_NVSHMEM) and the precompiled header's source included first, as the real build does.
- The full CUDA link (several GB of libraries) stays in scripts/build_cuda.sh.

Prints one line per file with its time; exits non-zero naming each file that fails, with the
compiler's errors. Environment: JOBS (nproc), MMTRAIN_CUDA_HEADERS (the cache folder)."""
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINS_FILE = os.path.join(REPO, "scripts", "cuda_wheels.txt")
CUDA_DEFINES = ["-DMMTRAIN_CUDA", "-DUSE_C10D_NCCL", "-DUSE_NVSHMEM"]
PCH_SOURCE = os.path.join(REPO, "src", "core", "pch.h")
# Files without an #if whose CUDA side is chosen at run time (NCCL's native collectives, ATen's CUDA
# flash attention): compiled too, as they call what only the CUDA wheel's headers may change.
RUNTIME_CUDA_UNITS = ["src/dist/comm.cpp", "src/nn/attention.cpp"]
CUDA_GUARD = re.compile(r"^\s*#\s*if.*\bMMTRAIN_CUDA\b", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def fail(message):
    print(f"check_cuda_compile: {message}", file=sys.stderr)
    sys.exit(1)


def read_pins():
    pins = [line.strip() for line in open(PINS_FILE) if line.strip() and not line.startswith("#")]
    if not pins or not pins[0].startswith("torch=="):
        fail(f"{PINS_FILE}: the first pin must be torch==VERSION")
    return pins


def headers_dir(pins):
    """The unpacked headers of the pinned wheels: <cache>/torch/include and <cache>/nvidia/*/include."""
    key = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]
    cache = os.environ.get("MMTRAIN_CUDA_HEADERS", os.path.join(REPO, ".cache", "cuda-headers"))
    target = os.path.join(cache, key)
    if os.path.exists(os.path.join(target, "complete")):
        return target
    start = time.time()
    os.makedirs(cache, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="staging-", dir=cache)
    with tempfile.TemporaryDirectory(dir=cache) as wheels:
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                                 "-d", wheels, *pins], capture_output=True, text=True)
        if result.returncode != 0:
            fail(f"pip download {' '.join(pins)} failed:\n{result.stderr}")
        for name in sorted(os.listdir(wheels)):
            with zipfile.ZipFile(os.path.join(wheels, name)) as wheel:
                for member in wheel.namelist():
                    parts = member.split("/")
                    wanted = member.startswith("torch/include/") or (len(parts) > 3 and parts[0] == "nvidia" and parts[2] == "include")
                    # The wheels' own names are data: nothing outside the staging folder is written.
                    if wanted and ".." not in parts and not member.startswith("/"):
                        wheel.extract(member, staging)
            os.remove(os.path.join(wheels, name))  # one wheel on disk at a time (torch's is 0.5 GB)
    open(os.path.join(staging, "complete"), "w").write("\n".join(pins) + "\n")
    os.rename(staging, target)
    print(f"check_cuda_compile: unpacked the headers of {len(pins)} wheels into {os.path.relpath(target, REPO)} "
          f"({time.time() - start:.0f} s)")
    return target


def cuda_translation_units():
    """src/ .cpp files whose code differs under MMTRAIN_CUDA (directly or through a src/ header)."""
    src = os.path.join(REPO, "src")
    texts = {}
    for root, _, files in os.walk(src):
        for name in files:
            if name.endswith((".cpp", ".h")):
                path = os.path.join(root, name)
                texts[os.path.relpath(path, src)] = open(path, encoding="utf-8").read()
    guarded_headers = {p for p, t in texts.items() if p.endswith(".h") and CUDA_GUARD.search(t)}
    units = [p for p, t in texts.items() if p.endswith(".cpp") and
             (CUDA_GUARD.search(t) or guarded_headers & set(INCLUDE.findall(t)))]
    return sorted({os.path.join("src", p) for p in units} | set(RUNTIME_CUDA_UNITS))


def cuda_command(entry, headers, output):
    """The CPU build's command for one file, turned into the CUDA build's."""
    args = shlex.split(entry["command"])
    compiler, rest, out = args[0], [], []
    i = 1
    while i < len(args):
        arg = args[i]
        if arg in ("-o", "-c", "-include"):  # the output, the source and the PCH come back below
            i += 2
            continue
        if arg == "-isystem" and "/torch/include" in args[i + 1]:
            i += 2
            continue
        if arg == "-Winvalid-pch":
            i += 1
            continue
        rest.append(arg)
        i += 1
    torch_include = os.path.join(headers, "torch", "include")
    includes = ["-isystem", torch_include, "-isystem", os.path.join(torch_include, "torch", "csrc", "api", "include")]
    nvidia = os.path.join(headers, "nvidia")
    for package in sorted(os.listdir(nvidia)):
        includes += ["-isystem", os.path.join(nvidia, package, "include")]
    launcher = [shutil.which("ccache")] if shutil.which("ccache") else []
    return launcher + [compiler, *rest, *CUDA_DEFINES, *includes, "-include", PCH_SOURCE,
                       "-c", entry["file"], "-o", output]


def main():
    build_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build"))
    commands_file = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(commands_file):
        fail(f"no {commands_file}: configure the CPU build first (make build)")
    start = time.time()
    headers = headers_dir(read_pins())
    by_file = {os.path.relpath(e["file"], REPO): e for e in json.load(open(commands_file))}
    units = cuda_translation_units()
    missing = [u for u in units if u not in by_file]
    if missing:
        fail(f"not in {commands_file}: {', '.join(missing)} (re-run cmake)")
    with tempfile.TemporaryDirectory() as objects:
        def compile_one(unit):
            output = os.path.join(objects, unit.replace("/", "_") + ".o")
            began = time.time()
            result = subprocess.run(cuda_command(by_file[unit], headers, output),
                                    cwd=by_file[unit]["directory"], capture_output=True, text=True)
            return unit, result, time.time() - began

        jobs = int(os.environ.get("JOBS", os.cpu_count() or 1))
        failed = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for unit, result, seconds in pool.map(compile_one, units):
                print(f"check_cuda_compile: {unit}: {'ok' if result.returncode == 0 else 'FAILED'} ({seconds:.1f} s)")
                if result.returncode != 0:
                    failed.append(unit)
                    sys.stderr.write(result.stderr)
    if failed:
        fail(f"{len(failed)} of {len(units)} files do not compile as the CUDA build: {', '.join(failed)}")
    print(f"check_cuda_compile: {len(units)} files compile as the CUDA build ({read_pins()[0]}) "
          f"in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
