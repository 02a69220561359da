"""Project checks: the environment files agree, notebooks were run top to bottom, the README's
commands are what CI runs, and the recorded figures carry their provenance."""

from __future__ import annotations

import csv
import json
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _name_and_spec(requirement: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement)
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    tomllib = pytest.importorskip("tomllib")
    yaml = pytest.importorskip("yaml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(map(_name_and_spec, project["dependencies"]))
    for extra in project["optional-dependencies"].values():
        wanted |= set(map(_name_and_spec, extra))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_name_and_spec(r) for r in pip_section if not r.startswith("-e")}
    assert listed == wanted, (f"only in environment.yml: {sorted(listed - wanted)}; "
                              f"only in pyproject.toml: {sorted(wanted - listed)}")
    assert "-e ." in pip_section, "environment.yml must install this package itself"


def test_there_are_seven_numbered_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"], NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_was_run_top_to_bottom(path):
    """nbval silently passes cells that were never executed: require every code cell to have
    run, in order, in one clean session, without errors."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in code]
    assert None not in counts, f"{counts.count(None)} code cells never executed"
    assert counts == list(range(1, len(code) + 1)), f"not one top-to-bottom run: {counts}"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"stored error outputs: {[e.get('ename') for e in errors]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_intro_summary_exercises_and_solutions(path):
    nb = json.loads(path.read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for heading in ("What you will learn", "Summary", "Exercises"):
        assert heading in text, f"{path.name} lacks a '{heading}' section"
    stem = path.stem
    assert (ROOT / "notebooks" / "solutions" / f"{stem}.py").exists()
    assert (ROOT / "tests" / f"test_solutions_{stem[:2]}.py").exists()


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", readme, flags=re.S)
    setup = [line.strip() for line in blocks[0].splitlines() if line.strip()
             and not line.strip().startswith("#")]
    assert len(setup) == 2, f"the README's set-up block must hold two commands, got {setup}"
    ci = (ROOT / ".ci" / "run").read_text()
    positions = [ci.find(command) for command in setup]
    assert -1 not in positions, f"CI does not run {setup[positions.index(-1)]!r}"
    assert positions == sorted(positions), "CI runs the README's commands in another order"
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme, f"README does not link {path.name}"


def test_recorded_figures_carry_provenance():
    prov = json.loads((ROOT / "figures" / "provenance.json").read_text())
    for key in ("gpu", "torch", "triton", "date", "copy_gbps", "command"):
        assert prov.get(key), f"provenance.json lacks {key}"
    with open(ROOT / "figures" / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows, "figures/bench.csv is empty"
    needed = {"gpu", "impl", "direction", "tensor_format", "dtype", "seq_len", "batch", "heads",
              "head_dim", "rotary_dim", "ms", "gbps", "copy_gbps"}
    assert needed <= set(rows[0]), f"missing columns: {needed - set(rows[0])}"
    assert {r["gpu"] for r in rows} == {prov["gpu"]}
    for r in rows:  # bytes / time must agree with the reported bandwidth being plausible
        assert 0 < float(r["gbps"]) < 1.2 * float(r["copy_gbps"]), r
    assert list((ROOT / "figures").glob("*.png")), "no plots in figures/"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_provenance_names_the_commit_that_ran(tmp_path):
    """bench.provenance records bench.source_commit(): the checkout's commit, marked where tracked
    files differ from it, and 'unknown' outside a checkout."""
    from rope_kernels.bench import source_commit

    assert source_commit(tmp_path) == "unknown"

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                               "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "kernel.py").write_text("x = 1\n")
    git("add", "kernel.py")
    git("commit", "-q", "-m", "first")
    head = git("rev-parse", "HEAD")
    assert source_commit(tmp_path) == head[:12]
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert source_commit(tmp_path) == head[:12]
    (tmp_path / "kernel.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == head[:12] + "+changes"
    # A folder inside a checkout (a package installed into a venv there) is not that checkout.
    (tmp_path / "site-packages").mkdir()
    assert source_commit(tmp_path / "site-packages") == "unknown"


def test_source_digest_follows_the_code_and_nothing_else(tmp_path):
    """bench.source_digest: the same for the same kernel and script files, different when one
    changes, is renamed or is added; other files do not count."""
    from rope_kernels.bench import source_digest

    (tmp_path / "rope_kernels").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "rope_kernels" / "rope_2d.py").write_text("BLOCK_H = 4\n")
    (tmp_path / "scripts" / "run.sh").write_text("echo 1\n")
    first = source_digest(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    (tmp_path / "README.md").write_text("prose\n")
    (tmp_path / "rope_kernels" / "notes.txt").write_text("not code\n")
    (tmp_path / "scripts" / "README.md").write_text("what each script measures\n")
    assert source_digest(tmp_path) == first
    (tmp_path / "rope_kernels" / "rope_2d.py").write_text("BLOCK_H = 8\n")
    changed = source_digest(tmp_path)
    (tmp_path / "rope_kernels" / "rope_2d.py").write_text("BLOCK_H = 4\n")
    assert source_digest(tmp_path) == first
    (tmp_path / "rope_kernels" / "rope_2d.py").rename(tmp_path / "rope_kernels" / "rope_3d.py")
    renamed = source_digest(tmp_path)
    (tmp_path / "rope_kernels" / "rope_3d.py").rename(tmp_path / "rope_kernels" / "rope_2d.py")
    (tmp_path / "scripts" / "extra.py").write_text("")
    added = source_digest(tmp_path)
    assert len({first, changed, renamed, added}) == 4
    assert re.fullmatch(r"[0-9a-f]{16}", source_digest())  # this checkout


@pytest.mark.parametrize("path", sorted((ROOT / "figures").glob("*.json")), ids=lambda p: p.name)
def test_every_recorded_json_names_its_run(path):
    """Each measured file under figures/ says where, with what and how it was measured; those
    that report fractions of copy also carry the copy bandwidth they divide by."""
    data = json.loads(path.read_text())
    prov = data if path.name == "provenance.json" else data.get("provenance")
    assert isinstance(prov, dict), f"{path.name} has no provenance"
    for key in ("gpu", "torch", "triton", "date", "command"):
        assert prov.get(key), f"{path.name}: provenance lacks {key}"
    if prov["date"] > "2026-11-25":  # records made since bench.provenance names the code
        for key in ("commit", "source_digest"):
            assert prov.get(key), f"{path.name}: provenance lacks {key}"
    if "latency" not in path.name:
        assert float(prov.get("copy_gbps", 0)) > 0, f"{path.name}: provenance lacks copy_gbps"


def test_scripts_readme_names_every_script():
    """scripts/README.md describes every file in scripts/ (a new script gets its line there) and
    names no script that is gone."""
    text = (ROOT / "scripts" / "README.md").read_text()
    named = set(re.findall(r"\]\(([\w.]+)\)", text))
    present = {p.name for p in (ROOT / "scripts").iterdir()
               if p.is_file() and p.suffix in (".py", ".sh")}
    assert named == present, (sorted(present - named), sorted(named - present))
