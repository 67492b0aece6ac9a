"""ESSCallback: ESS logged while a zoo architecture trains equals analyze on the saved checkpoints."""

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate: pip install 'ess-explorer[train]'")

from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments  # noqa: E402

from ess_explorer import ESSCallback, analyze, load_model, run_sweep, zoo  # noqa: E402
from ess_explorer.core.diagnostics import layer_diagnostics  # noqa: E402
from ess_explorer.sweep import read_table  # noqa: E402
from ess_explorer.sweep.run import SWEEP_SCOPE  # noqa: E402

STEPS, EVERY = 30, 10


def test_logged_ess_equals_analyze_of_each_checkpoint(tmp_path):
    name = "llama"
    task = zoo.task_of(name)
    _, tokenizer = zoo.load(name)
    config = AutoConfig.from_pretrained(zoo.model_dir(name))
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")  # fresh weights, the zoo's shape
    batch = task.sample(256, seed=0)
    data = [{"input_ids": i, "labels": y} for i, y in zip(batch.input_ids, batch.labels)]
    prompts = [task.prompt(seed=s) for s in (1, 2)]
    output_dir = str(tmp_path / "run")
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=STEPS,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        logging_steps=7,
        save_steps=EVERY,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    callback = ESSCallback(prompts, every_n_steps=EVERY, out=tmp_path / "ess")  # tokenizer: the processing_class
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[callback])
    callback.attach(trainer)
    trainer.train()

    logged = {entry["step"]: entry for entry in trainer.state.log_history if "ess/layer0/mean" in entry}
    assert sorted(logged) == [10, 20, 30]
    assert "loss" in logged[10]  # the same entry as the Trainer's own log of that step
    assert not any("ess/layer0/mean" in e for e in trainer.state.log_history if e.get("step") == 7)
    for step in (10, 20, 30):
        saved, _ = load_model(f"{output_dir}/checkpoint-{step}")
        # at the scope of a sweep (the callback appends a sweep's table)
        results = [analyze(saved, prompt=p, tokenizer=tokenizer, progress=False, scope=SWEEP_SCOPE) for p in prompts]
        for layer in (0, 1):
            per_prompt = [r.layers[layer] for r in results]
            unit_mean = [np.asarray(lay.tolerance_ess, dtype=float).mean(0) for lay in per_prompt]
            expected = {
                "mean": np.mean([u.mean() for u in unit_mean]),
                "max": np.mean([u.max() for u in unit_mean]),
                "utilisation": np.mean([layer_diagnostics(lay)["utilisation"] for lay in per_prompt]),
            }
            for key, value in expected.items():
                assert logged[step][f"ess/layer{layer}/{key}"] == pytest.approx(value, rel=1e-9), (step, layer, key)
    assert len({logged[s]["ess/layer1/mean"] for s in logged}) > 1  # measured on the weights of each step

    # The table the callback appended equals a sweep over the run's checkpoints.
    appended = read_table(tmp_path / "ess")
    assert sorted(appended.checkpoint_step.unique()) == [10, 20, 30]
    again = run_sweep(output_dir, prompts, out=tmp_path / "sweep", progress=False).table()
    pd.testing.assert_frame_equal(appended, again, check_exact=True)
