"""Compile Triton kernels for an H100 (CUDA sm_90) on a machine without a GPU: the front end, TTGIR, LLVM IR, PTX
and the cubin (ptxas ships with triton's NVIDIA backend). What the interpreter cannot show (a construct the GPU
compiler rejects) fails here, on the CPU.

Run as a script, in a process without ``TRITON_INTERPRET`` (an interpreted kernel cannot be compiled):

    python triton_offline_compile.py MODULE CASES_JSON

CASES_JSON is a list of ``[kernel name, {constexpr: value}, num_warps]``; every other argument is typed from its
name (``*_ptr``: a float32 pointer, else a 32-bit integer). Prints one JSON object per case: kernel, num_warps,
ok, and the error's last lines when it failed.
"""

from __future__ import annotations

import importlib
import json
import sys

SM90 = ("cuda", 90, 32)  # backend, compute capability, warp size


def compile_kernel(kernel, constexprs: dict, num_warps: int) -> None:
    """Compile ``kernel`` (a ``triton.jit`` function) for sm_90 down to a cubin; raises what the compiler raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in kernel.arg_names:
        signature[name] = "constexpr" if name in constexprs else ("*fp32" if name.endswith("_ptr") else "i32")
    values = {(kernel.arg_names.index(name),): value for name, value in constexprs.items()}
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=values),
        target=GPUTarget(*SM90),
        options={"num_warps": num_warps},
    )
    if not compiled.asm.get("cubin"):
        raise RuntimeError("no cubin came out")


def main(module_name: str, cases_json: str) -> int:
    module = importlib.import_module(module_name)
    failed = 0
    for name, constexprs, num_warps in json.loads(cases_json):
        try:
            compile_kernel(getattr(module, name), constexprs, num_warps)
            result = {"kernel": name, "num_warps": num_warps, "ok": True}
        except Exception as error:  # reported per case; the exit status sums them up
            failed += 1
            lines = str(error).strip().splitlines() or [type(error).__name__]
            result = {"kernel": name, "num_warps": num_warps, "ok": False, "error": " | ".join(lines[-4:])[:800]}
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
