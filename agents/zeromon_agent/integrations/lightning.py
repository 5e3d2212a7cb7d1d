"""zeromon in Lightning's loggers: ``ZeromonCallback``, a Lightning ``Callback``.

    from zeromon_agent.integrations.lightning import ZeromonCallback
    trainer = L.Trainer(..., callbacks=[ZeromonCallback()])

At ``on_train_start`` it attaches the agent to the trainer's model (the strategy's outermost: DDP,
FSDP, the DeepSpeed engine) and first optimizer, starting it unless ``zeromon run`` already did. At
the batches where the trainer writes its logs (``log_every_n_steps``) it logs the agent's newest
figures through the LightningModule's ``log`` (keys under ``zeromon/``, docs/trainers.md), so every
logger of the trainer gets them in the same row as the loss. A new finding is written as text to
the loggers that take text (TensorBoard's ``add_text``, W&B's ``log_text``, MLflow's ``log_text``)
and as a warning of the ``zeromon.integrations.lightning`` logger, on global rank 0.

``ZeromonCallback`` is built on ``lightning.pytorch`` (``pytorch_lightning`` where only that is
installed); ``ZeromonPLCallback`` on ``pytorch_lightning``, for a Trainer imported under that name.
Each imports its framework when first looked up (PEP 562), not with this module.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from zeromon_agent.integrations.report import DEFAULT_PREFIX, TrainerReport, guarded

__all__ = ["ZeromonCallback", "ZeromonPLCallback"]  # noqa: F822 - made on first lookup (__getattr__)

log = logging.getLogger("zeromon.integrations.lightning")


def __getattr__(name: str) -> Any:
    if name in ("ZeromonCallback", "ZeromonPLCallback"):
        cls = _callback_class(_framework(name), name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _framework(name: str) -> Any:
    if name == "ZeromonPLCallback":
        return importlib.import_module("pytorch_lightning")
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return importlib.import_module("pytorch_lightning")


def _log_due(trainer: Any) -> bool:
    """Whether the trainer writes its step logs after this batch: Lightning's own test (its logger
    connector's ``should_update_logs``); every batch where that is not found (``self.log`` keeps the
    newest value until the trainer writes)."""
    connector = getattr(trainer, "_logger_connector", None)
    due = getattr(connector, "should_update_logs", True)
    return bool(due)


def write_text(logger: Any, key: str, text: str, step: int) -> bool:
    """``text`` to a logger that takes text: TensorBoard's SummaryWriter.add_text, W&B's log_text,
    MLflow's log_text (an artifact file per step). False for a logger that takes numbers only (CSV)."""
    if callable(getattr(logger, "log_text", None)):  # WandbLogger
        logger.log_text(key=key, columns=["step", "finding"], data=[[str(step), text]])
        return True
    experiment: Any = getattr(logger, "experiment", None)
    if callable(getattr(experiment, "add_text", None)):  # TensorBoardLogger's SummaryWriter
        experiment.add_text(key, text, global_step=step)
        return True
    run_id = getattr(logger, "run_id", None)
    if run_id is not None and callable(getattr(experiment, "log_text", None)):  # MLFlowLogger's MlflowClient
        experiment.log_text(run_id, text, f"{key}/step-{step}.txt")
        return True
    return False


def _callback_class(pl: Any, name: str) -> type:
    class ZeromonCallback(pl.Callback):  # type: ignore[misc,name-defined]  # the framework, imported above
        """Attaches the zeromon agent at train start and logs its newest per-step figures at the
        trainer's log cadence (keys under ``prefix``, docs/trainers.md). Never raises into training."""

        def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
            self.report = TrainerReport(prefix)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            optimizers: list[Any] = guarded("integration_objects", lambda: list(trainer.optimizers), [])
            model = guarded("integration_objects", lambda: trainer.strategy.model, None)
            self.report.attach(model, optimizers[0] if optimizers else None)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            if not guarded("integration_cadence", lambda: _log_due(trainer), True):
                return
            values, texts = self.report.read()
            if values:
                guarded("integration_log", lambda: self._log(pl_module, values), None)
            if texts:
                guarded("integration_text", lambda: self._write(trainer, texts), None)

        @staticmethod
        def _log(pl_module: Any, values: dict[str, float]) -> None:
            for key, value in values.items():
                # batch_size: nothing to infer from the batch (the values are per step, not per sample).
                pl_module.log(key, float(value), on_step=True, on_epoch=False, prog_bar=False, logger=True,
                              batch_size=1)

        def _write(self, trainer: Any, texts: list[str]) -> None:
            if not trainer.is_global_zero:
                return
            key = self.report.prefix + "findings_text"  # not the count's key: W&B keeps one type a key
            for text in texts:
                log.warning("zeromon: %s", text)
                for logger in trainer.loggers:
                    write_text(logger, key, text, trainer.global_step)

    ZeromonCallback.__name__ = ZeromonCallback.__qualname__ = name
    return ZeromonCallback
