"""Shared by the benchmark drivers: the two libraries, building a C benchmark, running it."""
import datetime
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def libraries():
    """{name: path} for our release build and the stock 1.9.1 wheel's library."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None:
        sys.exit("the stock mxnet 1.9.1 wheel is not installed (run scripts/test.sh once, or "
                 "pip install mxnet==1.9.1 'numpy<1.24' into .venv)")
    # MXNET_RT_BENCH_LIB: measure another build of ours (say, a non-incremental one).
    ours = os.environ.get("MXNET_RT_BENCH_LIB")
    libs = {"mxnet-rt": Path(ours) if ours else ROOT / "target" / "release" / "libmxnet.so",
            "stock 1.9.1": Path(list(spec.submodule_search_locations)[0]) / "libmxnet.so"}
    for name, lib in libs.items():
        if not lib.is_file():
            sys.exit(f"{name}: {lib} not found (cargo build --release)")
    return libs


def run_python(lib_name: str, lib: Path, script: str, *args: str, timeout: float = 600):
    """Run `script` with the stock frontend in a fresh interpreter on one library (ours through
    MXNET_LIBRARY_PATH when `lib_name` is "mxnet-rt", else the wheel's own) and return the JSON
    value its last line of output prints."""
    env = dict(os.environ)
    env.pop("MXNET_LIBRARY_PATH", None)
    if lib_name == "mxnet-rt":
        env["MXNET_LIBRARY_PATH"] = str(lib)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script, *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{lib_name}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build(source: str) -> Path:
    exe = ROOT / "build" / Path(source).stem
    exe.parent.mkdir(exist_ok=True)
    subprocess.run(["cc", "-O2", "-std=c99", "-I", str(ROOT / "include"), str(ROOT / "bench" / source),
                    "-o", str(exe), "-ldl", "-pthread"], check=True)
    return exe


def run(exe, lib, args, **env_extra):
    env = dict(os.environ, MXNET_LIBRARY_PATH=str(lib), **{k: str(v) for k, v in env_extra.items()})
    out = subprocess.run([str(exe), *map(str, args)], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{lib} {args}: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# A results file is the latest run's table, then this line and the log of earlier runs, newest
# first. write_result replaces the table and moves the one it replaces into the log.
HISTORY = "<!-- HISTORY: the log of earlier runs; write_result keeps it and adds to it -->\n\n## Earlier runs, newest first\n"


def write_result(name: str, table: str):
    """Writes the run's table at the top of bench/results/<name> (the previous table moves to the
    file's log of earlier runs, dated) and prints it."""
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / name
    old = path.read_text() if path.exists() else ""
    previous, _, log = old.partition(HISTORY)
    previous = previous.strip()
    if previous and previous != table.strip():
        today = datetime.date.today().isoformat()
        log = f"\n### Replaced on {today}\n\n{previous}\n" + log
    path.write_text(table + "\n" + ("\n" + HISTORY + log if log else ""))
    print(table)
