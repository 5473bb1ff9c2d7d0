"""The compile worker: a script run by the FlyDSL interpreter (Python 3.11 + flydsl + CPU torch).

Never imported by moetune itself. compile.py runs it as a long-lived process per parallel slot:

    <flydsl python> compile_worker.py        # one JSON request per stdin line, one JSON answer per line

request: {"arch": "gfx942", "problem": {...Problem.to_dict()}, "config": {...}, "out": "/path/x.hsaco"}
The HSACO is written to "out"; the answer is either
    {"ok": true, "kernel_name": ..., "seconds": 1.23, "flydsl_version": ...}
or  {"ok": false, "kind": "config_invalid" | "compile_error", "error": "..."}.
The environment (ROCM_PATH with llvm/bin/ld.lld, ARCH, FLYDSL_GPU_ARCH) is set by the parent, one arch
per process. Starting the interpreter (torch, flydsl) costs seconds, more than many compiles, hence the
loop; a crash inside FlyDSL ends the process and costs only the request in flight (compile.py restarts it).
Anything FlyDSL or LLVM prints goes to stderr: stdout carries only answers.

The kernel package is loaded under a private name so that this script needs no installed moetune: the
folder's plan.py and kernel.py use only relative imports among themselves.
"""

import functools
import importlib
import json
import os
import sys
import time
import traceback
import types

PACKAGE = "_moetune_flydsl_worker"


@functools.cache
def _load_kernel_modules():
    here = os.path.dirname(os.path.abspath(__file__))
    package = types.ModuleType(PACKAGE)
    package.__path__ = [here]  # a package without running the folder's __init__ (it needs jax)
    sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.plan"), importlib.import_module(f"{PACKAGE}.kernel")


def _hsaco_of(compiled) -> bytes:
    """The code object inside the compiled module's gpu.binary (one object: the target arch)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    text = compiled._keepalive._ir_text
    with _create_mlir_context():
        module = ir.Module.parse(text)
        for op in module.body.operations:
            if op.operation.name == "gpu.binary":
                objects = list(ir.ArrayAttr(op.operation.attributes["objects"]))
                if len(objects) != 1:
                    raise RuntimeError(f"expected one GPU object, found {len(objects)}")
                return bytes(gpu.ObjectAttr(objects[0]).object)
    raise RuntimeError("the compiled module has no gpu.binary")


def compile_request(request: dict) -> dict:
    plan_mod, kernel_mod = _load_kernel_modules()
    try:
        plan = plan_mod.KernelPlan.of(request["arch"], request["problem"], request["config"])
        reasons = plan.violations()
    except (KeyError, TypeError, ValueError) as e:
        return {"ok": False, "kind": "config_invalid", "error": f"{type(e).__name__}: {e}"}
    if reasons:
        return {"ok": False, "kind": "config_invalid", "error": "; ".join(reasons)}

    import flydsl
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    started = time.perf_counter()
    try:
        launch = kernel_mod.build(plan)
        in_t = kernel_mod.element_type(plan.in_dtype)
        out_t = kernel_mod.element_type(plan.out_dtype)
        # Null pointers are compile placeholders: nothing touches a device.
        args = [
            flyc.from_c_void_p(in_t, None),
            flyc.from_c_void_p(in_t, None),
            flyc.from_c_void_p(fx.Int32, None),
            flyc.from_c_void_p(out_t, None),
        ]
        hints = {"waves_per_eu": plan.waves_per_eu} if plan.waves_per_eu else {}
        compiled = flyc.compile[hints](launch, *args) if hints else flyc.compile(launch, *args)
        hsaco = _hsaco_of(compiled)
    except Exception as e:  # the one edge where any compiler failure becomes data for the trial row
        detail = (
            "".join(traceback.format_exception(type(e), e, e.__traceback__)).strip()
            if os.environ.get("MOETUNE_FLYDSL_TRACE")
            else "".join(traceback.format_exception_only(type(e), e)).strip()
        )
        return {"ok": False, "kind": "compile_error", "error": detail[-4000:]}
    seconds = time.perf_counter() - started
    with open(request["out"], "wb") as f:
        f.write(hsaco)
    return {
        "ok": True,
        "kernel_name": plan.kernel_name,
        "seconds": seconds,
        "flydsl_version": flydsl.__version__,
    }


def main() -> int:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints, Python's or C's, go to stderr
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            answers.write(json.dumps(compile_request(json.loads(line))) + "\n")
            answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
