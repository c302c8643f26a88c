"""Argument parsing for `python -m train_entry` (what torchrun runs on every node).

    torchrun --standalone --nproc-per-node 2 -m train_entry --strategy ddp --run-dir runs/demo --max-steps 60
    python -m train_entry --config my.yaml --optim.lr=3e-4 --print-config

Errors in the flags or the config: one line on stderr (rank 0 only under torchrun), exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from typing import NoReturn

from hpctrain.kernel import failures, fatal, hffolder, jobenv
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError, ValidationError
from train_entry.config import STRATEGIES, TrainConfig, check_sizes, keys_help, load_config
from train_entry.trackers import check_installed

# named flag -> the config key it sets (the dotted form works for every key too)
NAMED = {
    "strategy": "strategy",
    "max_steps": "train.max_steps",
    "checkpoint_every": "checkpoint.every_steps",
    "model": "model.factory",
    "data": "data.factory",
    "collate": "data.collate",
    "profile_steps": "profile.active",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit 2 itself
        raise UserError(f"{message}; see python -m train_entry --help")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m train_entry",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train with DDP, FSDP2 or DeepSpeed ZeRO; resumes from the newest verified "
        "checkpoint in the run folder by itself.",
        epilog="example:\n  torchrun --standalone --nproc-per-node 2 -m train_entry --strategy fsdp "
        "--run-dir runs/demo --max-steps 60 --optim.lr=3e-3\n\n"
        "every config key can be set with a dotted flag (default, meaning):\n"
        + keys_help()
        + "\n\nexit codes: 0 finished, 2 bad config or input, 75 preempted (checkpoint saved)",
    )
    p.add_argument("--config", metavar="FILE.yaml", help="YAML config (sections as listed below)")
    p.add_argument(
        "--strategy", help=f"one of {', '.join(STRATEGIES)} (default {strategy_names.DEFAULT})"
    )
    p.add_argument(
        "--run-dir",
        default=None,
        help=f"run folder (default ${jobenv.RUN_DIR}); checkpoints, logs and metrics go here",
    )
    p.add_argument("--max-steps", type=int, metavar="N", help="= --train.max_steps")
    p.add_argument("--checkpoint-every", type=int, metavar="N", help="= --checkpoint.every_steps")
    p.add_argument("--model", metavar="PKG.MOD:FACTORY", help="= --model.factory (your nn.Module)")
    p.add_argument("--data", metavar="PKG.MOD:FACTORY", help="= --data.factory (your dataset)")
    p.add_argument("--collate", metavar="PKG.MOD:FN", help="= --data.collate")
    p.add_argument(
        "--profile-steps", type=int, metavar="N", help="= --profile.active (torch.profiler)"
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate at $WORLD_SIZE (batch arithmetic, factories importable, DeepSpeed "
        "present and accepting the config), print the resolved settings as JSON, exit "
        "(`hpctrain submit` runs this before queueing)",
    )
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, TrainConfig, int]:
    """Returns (args, config, grad_accum); every check that needs no process group is done here."""
    args, rest = parser().parse_known_args(argv)
    flags = {key: getattr(args, name) for name, key in NAMED.items()}
    cfg = load_config(args.config, rest, flags)
    if args.print_config:
        return args, cfg, 0
    accum = check_sizes(cfg)
    if cfg.train.tracker != "none":
        check_installed(cfg.train.tracker)
    specs = {
        "model.factory": cfg.model.factory,
        "data.factory": cfg.data.factory,
        "data.collate": cfg.data.collate,
    }
    if any(specs.values()):
        # lazy: it imports torch (this module stays torch-free); user code resolved before any
        # process group
        from train_entry.model import load_object

        for what, spec in specs.items():
            if spec:
                load_object(spec, what)
        if hffolder.folder_of(cfg.model.factory):  # the folder against its config, the TP plan
            from train_entry.pretrained.build import check  # lazy: it imports torch

            check(cfg)
    if strategy_names.info(
        cfg.strategy
    ).parse_check:  # e.g. DeepSpeed's own checks, no processes yet
        from train_entry.strategies import strategy_class  # lazy: it imports torch

        strategy_class(cfg.strategy).validate(
            cfg, world=int(os.environ.get("WORLD_SIZE", "1")), accum=accum
        )
    args.run_dir = args.run_dir or jobenv.get(jobenv.RUN_DIR)
    if not args.run_dir and not args.check:
        raise UserError(f"no run folder: pass --run-dir DIR or set {jobenv.RUN_DIR}")
    return args, cfg, accum


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = None
    try:
        args, cfg, accum = parse(argv)
        run_dir = args.run_dir
        if args.print_config:
            if os.environ.get("RANK", "0") == "0":
                sys.stdout.write(cfg.to_yaml())
            return 0
        if args.check:
            t = cfg.train
            print(
                json.dumps(
                    {
                        "strategy": cfg.strategy,
                        "global_batch": t.global_batch,
                        "micro_batch": t.micro_batch,
                        "grad_accum": accum,
                        "max_steps": t.max_steps,
                    }
                )
            )
            return 0
        refused = fatal.refused_start(args.run_dir)  # before torch: a restart that leaves is quick
        if refused is not None:
            print(refused[1], file=sys.stderr, flush=True)
            return refused[0]
        from train_entry.trainer import Trainer  # lazy: torch is imported only past this line

        return Trainer(cfg, run_dir=args.run_dir, grad_accum=accum).run()
    except UserError as e:
        one = e.problems[0] if isinstance(e, ValidationError) and len(e.problems) == 1 else None
        _fatal(argv, f"error: {one if one is not None else e.format_message()}")
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {one if one is not None else e.format_message()}", file=sys.stderr)
        return 2
    except Exception as e:
        _record(run_dir, e)
        if fatal.lost_peer(e):  # a secondary failure: the rank that died first says why
            print(
                f"hpctrain: rank {os.environ.get('RANK', '?')} stopped: another rank failed first "
                "(its error is in the logs)",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if type(e).__name__ != "RunFailed":  # train_entry.trainer.RunFailed (torch-free here)
            _fatal(argv, fatal.cause(e, os.environ.get("RANK", "?")))  # repeats: never restarted
            raise
        _fatal(argv, str(e))  # its line says what failed where, and the fix
        if not getattr(e, "every_rank", False) or os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)  # said once
        return 1


def _fatal(argv: list[str], line: str) -> None:
    """Inside a job: the FATAL file, so no in-job restart trains into this error again."""
    if jobenv.get(jobenv.JOB_ID) is None:
        return
    try:
        run_dir = parser().parse_known_args(argv)[0].run_dir or jobenv.get(jobenv.RUN_DIR)
    except UserError:  # the flags themselves are the error
        run_dir = jobenv.get(jobenv.RUN_DIR)
    if run_dir:
        fatal.write(run_dir, line.removeprefix("error: "))


def _record(run_dir: str | None, e: BaseException) -> None:
    """failures/<job>-<restart>/rank-<R>.json: what ended this rank, so `status` can tell the
    rank that failed first from those that lost it (a record that cannot be written is skipped:
    the traceback still reaches the node log)."""
    if run_dir is None:
        return
    line = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
    with contextlib.suppress(OSError):
        failures.record(run_dir, int(os.environ.get("RANK", "0")), line[0] if line else repr(e))
