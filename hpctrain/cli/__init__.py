"""The `hpctrain` command. Thin: each subcommand lives in its own module and is imported only
when it runs, so `hpctrain --help` and the render/submit/status paths never import torch."""

from __future__ import annotations

import atexit
import gc
import importlib

import click

from hpctrain import __version__
from hpctrain.kernel.errors import HpctrainError, UserError

# name -> "module:attribute"; one source of truth for the command list.
COMMANDS: dict[str, str] = {
    "profiles": "hpctrain.cli.profiles:profiles",
    "render": "hpctrain.cli.jobs:render",
    "submit": "hpctrain.cli.jobs:submit",
    "status": "hpctrain.cli.runs:status",
    "logs": "hpctrain.cli.runs:logs",
    "cancel": "hpctrain.cli.runs:cancel",
    "runs": "hpctrain.cli.runs:runs",
    "sweep": "hpctrain.cli.sweep:sweep",
    "resume": "hpctrain.cli.resume:resume",
    "preempt": "hpctrain.cli.preempt:preempt",
    "check-resume": "hpctrain.cli.check_resume:check_resume",
    "plan": "hpctrain.cli.plan:plan",
    "doctor": "hpctrain.cli.doctor:doctor",
    "report": "hpctrain.cli.report:report",
    "export": "hpctrain.cli.export:export",
}

SHORT_HELP: dict[str, str] = {
    "profiles": "List, show, validate, publish and diff site profiles.",
    "render": "Print the sbatch script that submit would hand to the scheduler.",
    "submit": "Submit a training run (Slurm, or this machine with the local profile).",
    "status": "Show the state of one run or of all runs.",
    "logs": "Show a run's logs, per node or rank.",
    "cancel": "Cancel a run's current job.",
    "runs": "List runs in a table.",
    "sweep": "Run a grid of arguments as one job array, a run folder per point.",
    "resume": "Resubmit a stopped run from its newest verified checkpoint.",
    "preempt": "Send a run the profile's preemption signal, as the scheduler would.",
    "check-resume": "Prove that interrupting and resuming your config is bit-exact.",
    "plan": "Estimate memory per GPU and pick a strategy before submitting.",
    "doctor": "Check the network, ports, GPUs and collectives on the allocated nodes.",
    "report": "Plot a run (loss, throughput, restarts) and summarise what it cost.",
    "export": "Write a run's model weights as safetensors or torch files (no hpctrain to load).",
}


# The optional extras (pyproject.toml), by the package a command needs: a command module that
# cannot import one says which extra to install, in one line; any other ImportError is a bug
# and surfaces as it is (never as "No such command").
EXTRAS: dict[str, str] = {
    "deepspeed": "deepspeed",
    "transformers": "hf",
    "accelerate": "hf",
    "lightning": "lightning",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "wandb": "wandb",
}


# The interpreter's last collections at exit walk every object the imports made: about 30 M CPU
# instructions of a 600 M `submit --dry-run` (benchmarks/cli.py). A command's process has nothing
# left to collect then, so the objects are frozen first (never collected again, as at any exit
# where Python does not promise to collect them).
atexit.register(gc.freeze)


class Failed(click.ClickException):
    """A domain error as click shows it: `Error: <message>`, exit with the error's code."""

    def __init__(self, error: HpctrainError) -> None:
        super().__init__(error.message)
        self.exit_code = error.exit_code  # type: ignore[misc]  # click reads it per instance
        self.error = error


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        # The one place where domain errors (hpctrain.kernel.errors) become click's: no traceback.
        try:
            return super().invoke(ctx)
        except HpctrainError as e:
            raise Failed(e) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as e:
            extra = EXTRAS.get((e.name or "").partition(".")[0])
            if extra is None:
                raise
            raise UserError(
                f"`hpctrain {name}` needs {e.name}, which is not installed: "
                f"pip install 'hpctrain[{extra}]'"
            ) from None
        command: click.Command = getattr(found, attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help without importing every command module.
        rows = [(name, SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpctrain")
def main() -> None:
    """Train on N nodes x G GPUs of your cluster, right the first time, surviving preemption.

    \b
    Example:
      hpctrain submit --nodes 2 --gpus 8 --profile mycluster --name gpt-small
      hpctrain status gpt-small
      hpctrain resume gpt-small
    """
