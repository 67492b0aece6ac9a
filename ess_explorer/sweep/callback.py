"""ESSCallback: ESS of fixed prompts during training, in the Trainer's logs and a sweep table.

    from ess_explorer import ESSCallback
    callback = ESSCallback(prompts, every_n_steps=100, layers=None, out="runs/ess")
    trainer = Trainer(model, args, train_dataset=..., callbacks=[callback])
    callback.attach(trainer)   # optional: first in line, so the reporters (TensorBoard...) see it

At every ``every_n_steps``-th optimizer step (after the update, i.e. on the weights a
checkpoint of that step holds), the model is analysed on each prompt (eval mode, no
gradients; training mode is restored) and, per analysed layer i, these are logged:

    ess/layer{i}/mean         mean over prompts of the mean ESS over units and t
    ess/layer{i}/max          mean over prompts of the max over t of the unit-mean ESS
    ess/layer{i}/utilisation  mean over prompts of the layer's utilisation
                              (core/diagnostics.py: peak ESS / peak TSS, mean over units)

(io.summary_table's per-layer numbers, the ESS of ``variant``). They go into the entry of
``trainer.state.log_history`` for that step (the callback asks the Trainer to log on that
step) and to every callback after this one; the Trainer's reporters come before the user's
callbacks, so ``attach(trainer)`` moves this one first for them to see the values too. With
``out``, each measurement is also appended to a sweep table (sweep/table.py) as model
``model_name`` (default: the run's output_dir) at checkpoint_step = the global step.

Needs ``accelerate`` (transformers.Trainer does): pip install 'ess-explorer[train]'.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from transformers import TrainerCallback

from ..analysis import analyze
from ..io import summary_table
from .inputs import Run, load_prompts
from .run import sweep_scope
from .table import result_table, shard_path, write_shard

__all__ = ["ESSCallback", "layer_logs"]

PREFIX = "ess"


def layer_logs(results, variant: str = "tolerance") -> dict[str, float]:
    """The logged values (module docstring) of a list of ESSResults of the same layers."""
    tables = [summary_table(result, variant=variant) for result in results]
    logs = {}
    for layer in tables[0]["layer"]:
        rows = [table[table["layer"] == layer].iloc[0] for table in tables]
        for name, column in (("mean", "mean_ess"), ("max", "max_ess"), ("utilisation", "utilisation")):
            logs[f"{PREFIX}/layer{int(layer)}/{name}"] = float(np.mean([row[column] for row in rows]))
    return logs


class ESSCallback(TrainerCallback):
    """A transformers TrainerCallback that measures ESS on fixed prompts (module docstring).

    prompts : strings (tokenised with ``tokenizer`` or the Trainer's processing_class), token
        id lists, or a prompt file (sweep/inputs.py: load_prompts).
    every_n_steps : measure when global_step % every_n_steps == 0.
    layers, tol, relative, gates, stride, units : as in analyze; scope as in sweep (default the
        reset-aware "unit" for a relative tolerance, SWEEP_SCOPE), so the table it appends is a sweep's.
    out : optional sweep folder that each measurement is appended to.

    ``history`` holds (step, logs) of every measurement.
    """

    def __init__(
        self,
        prompts,
        *,
        every_n_steps: int = 100,
        layers=None,
        tokenizer=None,
        variant: str = "tolerance",
        out=None,
        model_name: str | None = None,
        **analysis,
    ):
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a positive integer, got {every_n_steps!r}")
        unknown = set(analysis) - {"tol", "relative", "scope", "gates", "stride", "units"}
        if unknown:
            raise ValueError(
                f"unknown options {sorted(unknown)}; ESSCallback takes tol, relative, scope, gates, stride, units"
            )
        self.prompts = load_prompts(prompts)
        self.every_n_steps = every_n_steps
        self.layers = layers
        self.tokenizer = tokenizer
        self.variant = variant
        self.out = out
        self.model_name = model_name
        self.analysis = {**analysis, "scope": sweep_scope(analysis.get("scope"), analysis.get("relative", True))}
        self.history: list[tuple[int, dict]] = []
        self._pending: tuple[int, dict] | None = None

    def attach(self, trainer) -> "ESSCallback":
        """Put this callback first in ``trainer``'s list, so that every reporter logs its values."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def measure(self, model, tokenizer=None) -> list:
        """ESSResults of every prompt under ``model`` as it is now (eval mode, no gradients)."""
        model = getattr(model, "module", model)  # a DistributedDataParallel wrapper
        tokenizer = self.tokenizer or tokenizer
        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                results = []
                for prompt in self.prompts:
                    if isinstance(prompt, str):
                        if tokenizer is None:
                            raise ValueError("ESSCallback got text prompts but no tokenizer: pass tokenizer= or ids")
                        result = analyze(
                            model,
                            prompt=prompt,
                            tokenizer=tokenizer,
                            layers=self.layers,
                            progress=False,
                            keep_operators=None,
                            **self.analysis,
                        )
                    else:
                        result = analyze(
                            model,
                            prompt,
                            tokenizer=tokenizer,
                            layers=self.layers,
                            progress=False,
                            keep_operators=None,
                            **self.analysis,
                        )
                    results.append(result)
        finally:
            model.train(training)
        return results

    def on_train_begin(self, args, state, control, processing_class=None, **kwargs):
        """Text prompts need a tokenizer: refused before the first training step, not at the
        first measurement after training has run for a while."""
        if self.tokenizer is None and processing_class is None and any(isinstance(p, str) for p in self.prompts):
            raise ValueError(
                "ESSCallback got text prompts but neither tokenizer= nor a Trainer with a processing_class "
                "(tokenizer): pass tokenizer= to ESSCallback, or give the prompts as token ids"
            )
        return control

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        if step % self.every_n_steps or model is None or not state.is_world_process_zero:
            return control
        results = self.measure(model, processing_class)
        logs = layer_logs(results, self.variant)
        self.history.append((step, logs))
        self._pending = (step, logs)
        control.should_log = True  # so that this step has a log entry to carry the values
        if self.out is not None:
            self._append(results, step, self.model_name or str(args.output_dir))
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending is None or self._pending[0] != state.global_step:
            return control
        values = self._pending[1]
        self._pending = None
        if logs is not None:
            logs.update(values)  # what the callbacks after this one receive
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)  # the Trainer appended a copy of logs before calling us
        return control

    def _append(self, results, step: int, name: str) -> None:
        run = Run(name, step, name)
        tables = [result_table(r, prompt_id=i, checkpoint_step=step) for i, r in enumerate(results)]
        meta = {
            "run": run.to_dict(),
            "prompt_ids": list(range(len(results))),
            "n_tokens": [r.length for r in results],
            "analysis": dict(results[0].meta),
            "backend": "callback",
        }
        write_shard(shard_path(self.out, name, step, 0), pa.concat_tables(tables), meta)
