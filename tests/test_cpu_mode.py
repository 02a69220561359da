"""CPU mode: `import rope_kernels` turns the interpreter on by itself; a kernel file used with the
interpreter off refuses CPU tensors with an error that says how to fix it. Run in subprocesses,
because the interpreter is chosen once, when the kernels are defined."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(code: str, **env_changes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the package chooses compiled kernels")
def test_import_turns_interpreter_on_without_gpu():
    code = (
        "import torch, rope_kernels as rk\n"
        "t = torch.randn(4, 1, 2, 8)\n"
        "f = rk.RotaryPositionEmbedding(8)(4)\n"
        "out = rk.apply_rotary_pos_emb(t, f, fused=True)\n"
        "ok = torch.allclose(out, rk.rope_reference(t, f), atol=1e-5)\n"
        "print(rk.MODE, ok)\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "triton-interpreter (CPU) True"


@pytest.mark.parametrize("module,launcher", [("rope_1d", "rope_1d"), ("rope_2d", "rope_2d")])
def test_copied_kernel_file_explains_cpu_tensors_with_interpreter_off(module, launcher, tmp_path):
    """The kernel file alone, as a user copies it, with TRITON_INTERPRET=0."""
    (tmp_path / f"{module}.py").write_text((ROOT / "rope_kernels" / f"{module}.py").read_text())
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import torch\n"
        f"from {module} import {launcher}\n"
        "try:\n"
        f"    {launcher}(torch.randn(4, 1, 2, 8), torch.zeros(4, 1, 1, 8))\n"
        "except RuntimeError as e:\n"
        "    print('RuntimeError:', e)\n"
    )
    proc = _run(code, TRITON_INTERPRET="0")
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeError:" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout


@pytest.mark.parametrize("module,launcher", [("rope_1d", "rope_1d"), ("rope_2d", "rope_2d")])
def test_copied_kernel_file_works_alone(module, launcher, tmp_path):
    """Copy one kernel file out of the package: it imports only torch/triton/stdlib and runs."""
    _copy_alone(module, tmp_path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import torch\n"
        f"from {module} import {launcher}\n"
        f"t = torch.randn(5, 2, 3, 8, device={device!r})\n"
        "pos = torch.arange(5.0, device=t.device)[:, None]\n"
        "inv = 10000.0 ** (-torch.arange(0, 8, 2, device=t.device) / 8.0)\n"
        "f = torch.cat([pos * inv, pos * inv], -1).view(5, 1, 1, 8)\n"
        f"out = {launcher}(t, f)\n"
        "x1, x2 = t.chunk(2, -1)\n"
        "c, s = f.cos(), f.sin()\n"
        "ref = t * c + torch.cat([-x2, x1], -1) * s\n"
        "print(torch.allclose(out, ref, atol=1e-5))\n"
    )
    env = {} if device == "cuda" else {"TRITON_INTERPRET": "1"}
    proc = _run(code, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def _copy_alone(module: str, folder: pathlib.Path) -> None:
    """rope_kernels/<module>.py copied into ``folder``, as a user copies it: it imports only the
    standard library, torch and triton."""
    source = (ROOT / "rope_kernels" / f"{module}.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines()
               if line.startswith(("import ", "from "))}
    allowed = set(sys.stdlib_module_names) | {"__future__", "torch", "triton"}
    assert imports <= allowed, f"non-stdlib imports: {imports - allowed}"
    (folder / f"{module}.py").write_text(source)


def test_copied_mrope_file_works_alone(tmp_path):
    """rope_mrope.py copied out of the package: stdlib, torch and triton only, and it runs (a
    CPU copy with the interpreter off says how to turn it on)."""
    _copy_alone("rope_mrope", tmp_path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import torch\n"
        "from rope_mrope import rope_mrope\n"
        f"q = torch.randn(5, 2 * 8, device={device!r}); k = torch.randn(5, 8, device=q.device)\n"
        "pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 1, 1, 2], [0, 1, 0, 1, 0]], device=q.device)\n"
        "inv = 10000.0 ** (-torch.arange(0, 8, 2, device=q.device) / 8.0)\n"
        "f = torch.arange(5.0, device=q.device)[:, None] * inv\n"
        "cache = torch.cat([f.cos(), f.sin()], -1)\n"
        "try:\n"
        "    q_out, k_out = rope_mrope(pos, q, k, 8, cache, [2, 1, 1])\n"
        "except RuntimeError as e:\n"
        "    print('RuntimeError:', e); raise SystemExit\n"
        "sec = torch.tensor([0, 0, 1, 2], device=q.device)\n"
        "c = cache[pos, :4].gather(0, sec.expand(1, 5, 4))[0][:, None]\n"
        "s = cache[pos, 4:].gather(0, sec.expand(1, 5, 4))[0][:, None]\n"
        "x1, x2 = q.view(5, 2, 8).chunk(2, -1)\n"
        "ref = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).view(5, 16)\n"
        "print(torch.allclose(q_out, ref, atol=1e-5))\n"
    )
    env = {} if device == "cuda" else {"TRITON_INTERPRET": "1"}
    proc = _run(code, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    if device == "cpu":
        proc = _run(code, TRITON_INTERPRET="0")
        assert proc.returncode == 0, proc.stderr
        assert "RuntimeError:" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout
