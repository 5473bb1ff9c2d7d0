"""The model benchmark's command line. It runs where only jax and numpy are installed (the GPU machine);
the measurement itself is moetune_lab/model/bench.py.

    python3 -m moetune_lab.model --model mixtral_8x7b --batch 1 --prompt 2048 --gen 128 --out model.json

Exit status: 0 when every path ran and matched the dense path, 1 otherwise (the JSON is written either way),
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Before jax loads: XLA's allocator takes 75% of GPU memory by default, which leaves too little beside
# Mixtral-8x7B's ~87 GiB of weights for the dense path's all-expert activations. An explicit value wins.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")

import dataclasses  # noqa: E402

from moetune.kernels.errors import MoetuneError  # noqa: E402 - after the allocator setting
from moetune.kernels.moe.pallas_mode import MODES  # noqa: E402
from moetune_lab.model.bench import (  # noqa: E402
    DEFAULT_MOE_TOKENS,
    DEFAULT_PATHS,
    FUSED_PATH,
    RUN_NAMES,
    run_model_bench,
    summary_lines,
)
from moetune_lab.model.config import MODELS  # noqa: E402
from moetune_lab.model.kernel_choices import (  # noqa: E402
    DEFAULT_CHOICES,
    HELP,
    MODE_FIELDS,
    RESIDUALS,
    KernelChoices,
)


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mixtral_8x7b", help=f"model preset ({', '.join(MODELS)})")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens per sequence")
    parser.add_argument("--gen", type=int, default=128, help="generated tokens per sequence")
    parser.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"MoE paths, comma-separated ({', '.join(RUN_NAMES)}; {FUSED_PATH}: the moetune path with "
        "moe_mlp's fused decode block asked for: kernel on a GPU, interpret elsewhere)",
    )
    parser.add_argument("--layers", type=int, default=None, help="layers to run (default: the preset's)")
    parser.add_argument("--out", type=Path, default=None, help="JSON result file")
    parser.add_argument(
        "--moe-tokens",
        type=_int_list,
        default=list(DEFAULT_MOE_TOKENS),
        help="token counts at which one MoE layer is timed alone",
    )
    parser.add_argument("--runs", type=int, default=3, help="timed runs per measurement")
    parser.add_argument(
        "--fp8",
        default="none",
        metavar="LAYOUT",
        help="also run the model with FP8 experts, scales in LAYOUT (tensor, row_channel, "
        f"block_1x128_128x128), on the moetune path (and on {FUSED_PATH} where --paths has it)",
    )
    parser.add_argument("--no-db", action="store_true", help="winners from config packs only, no database")
    # The kernel choices: one flag each.
    for name in MODE_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", choices=MODES, default="auto", help=HELP[name])
    tiling = str(DEFAULT_CHOICES.decode_attention_tiling)
    parser.add_argument("--decode-attention-tiling", default=tiling, help=HELP["decode_attention_tiling"])
    parser.add_argument(
        "--decode-residual", choices=RESIDUALS, default="accumulate", help=HELP["decode_residual"]
    )
    # Checked by KernelChoices, so that a bad value is one line naming the modes (exit 2).
    parser.add_argument(
        "--decode-block", default="auto", metavar="{" + ",".join(MODES) + "}", help=HELP["decode_block"]
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        fields = [field.name for field in dataclasses.fields(KernelChoices)]
        choices = KernelChoices.parse(**{name: getattr(args, name) for name in fields})
        result = run_model_bench(
            args.model,
            args.batch,
            args.prompt,
            args.gen,
            [p.strip() for p in args.paths.split(",") if p.strip()],
            args.layers,
            args.out,
            moe_tokens=args.moe_tokens,
            runs=args.runs,
            use_db=not args.no_db,
            choices=choices,
            fp8=args.fp8,
            command="python3 -m moetune_lab.model " + " ".join(argv),
        )
    except MoetuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(result)), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
