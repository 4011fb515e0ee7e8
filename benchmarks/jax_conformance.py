"""JAX's own test files on trn2 and on XLA:CPU, side by side.

Point it at a checkout of jax at the installed jax's tag (it fetches nothing):

    git clone --branch jax-v0.10.2 --depth 1 https://github.com/jax-ml/jax /tmp/jax
    python benchmarks/jax_conformance.py --jax-checkout /tmp/jax
    python benchmarks/jax_conformance.py --jax-checkout /tmp/jax \\
        --files memories_test array_test --platform both -k "not Pallas"

Each file runs in its own pytest process with jax's pytest settings (the checkout's
pyproject.toml: warnings are errors), once per platform:

- trn2: `JAX_PLATFORMS=trn2,cpu JAX_TRN2_TOPOLOGY=trn2.3xlarge JAX_TRN2_LNC=1`, a machine
  of 8 devices, the default backend, so jax's tests run on it as on an accelerator;
- cpu: `JAX_PLATFORMS=cpu` with 8 host devices (`--xla_force_host_platform_device_count`).

It prints, per file, the tests passed, failed and skipped and the wall seconds on each
platform, then the tests that pass on the CPU but not on trn2 (with the first line of
their failure) and those that fail on trn2 where the CPU skips them. The junit xml files
stay in --output-dir.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

PLATFORMS = ("trn2", "cpu")
DEVICES = 8  # both platforms: jax's multi-device tests are written for 8 devices
# After a file's timeout pytest gets SIGINT, writes the junit xml of the tests it ran
# and exits; this many seconds later it is killed.
INTERRUPT_GRACE_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class JaxTestFile:
    """A test file of jax's tests/ directory, optionally one class of it and the tests a
    -k expression selects, with environment variables of its own."""

    path: str
    test_class: str | None = None
    k: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def label(self) -> str:
        """The file as the table names it: with its class and -k expression."""
        label = self.name + (f"::{self.test_class}" if self.test_class else "")
        return label + (f" -k '{self.k}'" if self.k else "")


DEFAULT_FILES = (
    JaxTestFile("tests/shard_map_test.py", test_class="ShardMapTest"),
    JaxTestFile("tests/pjit_test.py"),
    JaxTestFile("tests/array_test.py"),
    JaxTestFile("tests/api_test.py", k="jit"),
    JaxTestFile("tests/lax_test.py", k="add or dot or convert or reduce"),
    JaxTestFile("tests/debugging_primitives_test.py"),
    JaxTestFile("tests/memories_test.py"),
    JaxTestFile("tests/export_test.py"),
    JaxTestFile("tests/layout_test.py"),
    JaxTestFile("tests/random_test.py"),
    # jax's own sampler (fixed seed) keeps one case of each parameterized test: 511
    # tests of the file's 3,242 at its default of 10.
    JaxTestFile("tests/lax_numpy_test.py", env=(("JAX_NUM_GENERATED_CASES", "1"),)),
    JaxTestFile("tests/checkify_test.py"),
)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One test's outcome: "passed", "failed" (a failure or an error) or "skipped"."""

    test_id: str
    outcome: str
    message: str = ""


@dataclasses.dataclass(frozen=True)
class FileRun:
    """A file's run on one platform: its tests' results and the process's wall time."""

    results: tuple[CaseResult, ...]
    seconds: float
    timed_out: bool = False
    returncode: int = 0

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)


def resolve_files(names: list[str] | None) -> list[JaxTestFile]:
    """The files to run: DEFAULT_FILES, or for each name the default entry of that name
    (`memories_test`) or else a path under the checkout, `tests/x_test.py[::Class]`."""
    if not names:
        return list(DEFAULT_FILES)
    by_name = {f.name: f for f in DEFAULT_FILES}
    files = []
    for name in names:
        stem = name.removesuffix(".py")
        if stem in by_name:
            files.append(by_name[stem])
            continue
        path, _, test_class = name.partition("::")
        files.append(JaxTestFile(path, test_class=test_class or None))
    return files


def check_checkout(checkout: Path, files: list[JaxTestFile]) -> str:
    """The checkout's jax version, checked against the installed jax's: jax's test files
    test the jax of their own version. Raises SystemExit naming what is wrong."""
    version_file = checkout / "jax" / "version.py"
    if not version_file.is_file():
        raise SystemExit(f"--jax-checkout {checkout}: no jax/version.py; expected a "
                         "checkout of https://github.com/jax-ml/jax")
    found = re.search(r'^_version\s*=\s*"([^"]+)"', version_file.read_text(), re.M)
    if not found:
        raise SystemExit(f"{version_file}: no `_version = \"...\"` line")
    checkout_version = found.group(1)
    installed = importlib.metadata.version("jax")
    if checkout_version != installed.split("+")[0].split(".dev")[0]:
        raise SystemExit(
            f"the checkout at {checkout} is jax {checkout_version} but jax {installed} is "
            f"installed: check out the tag of the installed version "
            f"(`git -C {checkout} checkout jax-v{installed}`)")
    missing = [f.path for f in files if not (checkout / f.path).is_file()]
    if missing:
        raise SystemExit(f"not in {checkout}: {', '.join(missing)} (--files takes paths "
                         "tests/x_test.py or the names "
                         f"{', '.join(f.name for f in DEFAULT_FILES)})")
    return checkout_version


def platform_env(platform: str, base: dict[str, str]) -> dict[str, str]:
    """The environment of a run on `platform`: `base` with the platform's variables."""
    env = dict(base)
    if platform == "trn2":
        env.update(JAX_PLATFORMS="trn2,cpu", JAX_TRN2_TOPOLOGY="trn2.3xlarge",
                   JAX_TRN2_LNC="1")
    elif platform == "cpu":
        flag = f"--xla_force_host_platform_device_count={DEVICES}"
        env.update(JAX_PLATFORMS="cpu",
                   XLA_FLAGS=" ".join(filter(None, [env.get("XLA_FLAGS"), flag])))
    else:
        raise ValueError(f"platform {platform!r} is not one of {PLATFORMS}")
    return env


def pytest_command(test_file: JaxTestFile, checkout: Path, junit_xml: Path,
                   k: str | None) -> list[str]:
    """pytest on one file of `checkout`, which finds jax's settings in its pyproject.toml.
    It runs in the checkout's tests/ directory (see run_file)."""
    target = str(checkout / test_file.path) + \
        (f"::{test_file.test_class}" if test_file.test_class else "")
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
               "-q", f"--junitxml={junit_xml}", target]
    expressions = [e for e in (test_file.k, k) if e]
    if expressions:
        command += ["-k", " and ".join(f"({e})" for e in expressions)]
    return command


def run_file(test_file: JaxTestFile, platform: str, checkout: Path, output_dir: Path,
             k: str | None, timeout: float) -> FileRun:
    """Runs one file on one platform in its own process; its output goes to a log file
    beside its junit xml. The process runs in the checkout's tests/ directory, which
    `python -m` puts on the import path: the checkout's root, holding jax's sources,
    would stand in for the installed jax."""
    stem = f"{re.sub(r'[^A-Za-z0-9]+', '_', test_file.label).strip('_')}.{platform}"
    junit_xml, log = output_dir / f"{stem}.xml", output_dir / f"{stem}.log"
    junit_xml.unlink(missing_ok=True)
    env = platform_env(platform, dict(os.environ) | dict(test_file.env))
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(pytest_command(test_file, checkout, junit_xml, k),
                                   cwd=checkout / "tests",
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=INTERRUPT_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    seconds = time.perf_counter() - start
    results = parse_junit(junit_xml.read_text()) if junit_xml.exists() else ()
    return FileRun(tuple(results), seconds, timed_out, process.returncode)


def parse_junit(text: str) -> list[CaseResult]:
    """The tests of a pytest junit xml report (`--junitxml`), each passed, failed (a
    <failure> or an <error>, in the test or its setup or teardown) or skipped."""
    results = []
    for case in ET.fromstring(text).iter("testcase"):
        test_id = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        if problem is not None:
            results.append(CaseResult(test_id, "failed", first_line(problem)))
        elif case.find("skipped") is not None:
            results.append(CaseResult(test_id, "skipped", first_line(case.find("skipped"))))
        else:
            results.append(CaseResult(test_id, "passed"))
    return results


def first_line(element: ET.Element) -> str:
    """A failure's or skip's message: its message attribute's first line, else its
    text's last line (the exception of a traceback)."""
    message = element.get("message") or ""
    if message.strip():
        return message.strip().splitlines()[0]
    lines = (element.text or "").strip().splitlines()
    return lines[-1] if lines else ""


def table(runs: dict[JaxTestFile, dict[str, FileRun]], platforms: tuple[str, ...]) -> str:
    """Per file and in total, passed / failed / skipped and wall seconds per platform."""
    header = f"{'file':<48}" + "".join(
        f"  {p + ' pass/fail/skip':>21} {'s':>6}" for p in platforms)
    lines = [header, "-" * len(header)]
    totals = {p: [0, 0, 0, 0.0] for p in platforms}
    for test_file, by_platform in runs.items():
        row = f"{test_file.label[:48]:<48}"
        for p in platforms:
            run = by_platform[p]
            counts = [run.count("passed"), run.count("failed"), run.count("skipped")]
            totals[p] = [t + c for t, c in zip(totals[p], counts + [run.seconds])]
            mark = "*" if run.timed_out else ("!" if not run.results else " ")
            row += f"  {'/'.join(map(str, counts)):>20}{mark} {run.seconds:>6.0f}"
        lines.append(row)
    lines.append("-" * len(header))
    lines.append(f"{'total':<48}" + "".join(
        f"  {'/'.join(str(int(n)) for n in totals[p][:3]):>20}  {totals[p][3]:>6.0f}"
        for p in platforms))
    if len(platforms) == 2 and totals[platforms[1]][3] > 0:
        ratio = totals[platforms[0]][3] / totals[platforms[1]][3]
        lines.append(f"wall time {platforms[0]} / {platforms[1]}: {ratio:.2f}x")
    if any(r.timed_out for by in runs.values() for r in by.values()):
        lines.append("* timed out: the tests it ran before the timeout")
    if any(not r.results for by in runs.values() for r in by.values()):
        lines.append("! no junit results: the file did not run (see its .log)")
    return "\n".join(lines)


def differences(runs: dict[JaxTestFile, dict[str, FileRun]]) -> str:
    """The tests that fail on trn2 where the CPU passes them, then those it skips."""
    sections = {"pass on the CPU, fail on trn2": "passed",
                "fail on trn2, skipped on the CPU": "skipped"}
    lines = []
    for title, cpu_outcome in sections.items():
        found = []
        for test_file, by_platform in runs.items():
            cpu = {r.test_id: r for r in by_platform["cpu"].results}
            found += [f"  {test_file.name}: {r.test_id}: {r.message[:160]}"
                      for r in by_platform["trn2"].results
                      if r.outcome == "failed" and r.test_id in cpu
                      and cpu[r.test_id].outcome == cpu_outcome]
        lines += [f"{len(found)} tests {title}:"] + found
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jax-checkout", type=Path, required=True, metavar="PATH",
                        help="a checkout of jax at the installed jax's tag (jax-vX.Y.Z)")
    parser.add_argument("--files", nargs="+", metavar="FILE",
                        help="default entries by name (memories_test, api_test, ...) or "
                             "tests/x_test.py[::Class]; default: "
                             + ", ".join(f.label for f in DEFAULT_FILES))
    parser.add_argument("--platform", choices=(*PLATFORMS, "both"), default="both")
    parser.add_argument("-k", help="a pytest -k expression, and-ed with each file's own")
    parser.add_argument("--timeout", type=float, default=1800, metavar="SECONDS",
                        help="per file and platform (default 1800); then the tests run "
                             "so far are reported")
    parser.add_argument("--output-dir", type=Path,
                        help="where the junit xml and logs go (default: a new temp dir)")
    args = parser.parse_args()

    checkout = args.jax_checkout.resolve()
    files = resolve_files(args.files)
    version = check_checkout(checkout, files)
    platforms = PLATFORMS if args.platform == "both" else (args.platform,)
    output_dir = args.output_dir or Path(tempfile.mkdtemp(prefix="jax_conformance."))
    output_dir.mkdir(parents=True, exist_ok=True)
    print(f"jax {version} tests from {checkout}; junit xml and logs in {output_dir}",
          flush=True)

    runs: dict[JaxTestFile, dict[str, FileRun]] = {}
    for test_file in files:
        runs[test_file] = {}
        for platform in platforms:
            run = run_file(test_file, platform, checkout, output_dir, args.k, args.timeout)
            runs[test_file][platform] = run
            print(f"{test_file.label} on {platform}: {run.count('passed')} passed, "
                  f"{run.count('failed')} failed, {run.count('skipped')} skipped in "
                  f"{run.seconds:.0f} s" + (" (timed out)" if run.timed_out else ""),
                  flush=True)
    print()
    print(table(runs, platforms))
    if len(platforms) == 2:
        print()
        print(differences(runs))


if __name__ == "__main__":
    main()
