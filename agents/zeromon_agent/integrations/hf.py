"""zeromon in Hugging Face Trainer's loggers: ``ZeromonCallback``, a ``transformers.TrainerCallback``.

    from zeromon_agent.integrations.hf import ZeromonCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ZeromonCallback()])

At ``on_train_begin`` it attaches the agent to the trainer's model (the outermost: DDP, FSDP or the
DeepSpeed engine) and optimizer, starting it unless ``zeromon run`` already did. At each trainer step's
first ``on_log`` it adds the agent's newest figures to the logs under ``zeromon/`` (docs/trainers.md), so that the
``report_to`` integrations (TensorBoard, W&B, MLflow, ...) write them with the loss.

The Trainer calls its callbacks in list order, ``report_to``'s integrations before those passed as
``callbacks=`` (Trainer.__init__: ``default_callbacks + callbacks``), and every one gets the same
``logs`` dict: keys added by a later callback reach none of the integrations. So at train begin the
callback moves itself ahead of the first integration in the trainer's callback list. The callback
API does not hand callbacks the trainer; it is found once, as the ``self`` of the frames that call
the hook.

transformers is imported when ``ZeromonCallback`` is first looked up (PEP 562), not with this module.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

from zeromon_agent.integrations.report import DEFAULT_PREFIX, TrainerReport, guarded

__all__ = ["ZeromonCallback"]  # noqa: F822 - made on first lookup (__getattr__)

log = logging.getLogger("zeromon.integrations.hf")

# How far up the trainer's frames are looked for: this module's own two or three, the hook,
# CallbackHandler.call_event and .on_train_begin, the Trainer's loop; a few more for subclasses.
_FRAMES_UP = 10


def __getattr__(name: str) -> Any:
    if name == "ZeromonCallback":
        cls = _callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _calling_objects(handler_type: type, trainer_type: type) -> tuple[Any, Any]:
    """(the CallbackHandler, the Trainer) found as ``self`` in the frames that called the hook, or None."""
    handler = trainer = None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES_UP):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if handler is None and isinstance(owner, handler_type):
            handler = owner
        elif isinstance(owner, trainer_type):
            trainer = owner
            break
        frame = frame.f_back
    return handler, trainer


def _ahead_of_integrations(callbacks: list[Any], callback: Any) -> list[Any] | None:
    """``callbacks`` with ``callback`` moved just ahead of the first report_to integration (None: it is
    there already, or there is none)."""
    others = [c for c in callbacks if c is not callback]
    first = next((i for i, c in enumerate(others) if type(c).__module__.startswith("transformers.integrations")),
                 None)
    if first is None or callbacks.index(callback) <= first:
        return None
    return others[:first] + [callback] + others[first:]


def _callback_class() -> type:
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_callback import CallbackHandler

    class ZeromonCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
        """Attaches the zeromon agent at train begin and adds its newest per-step figures to each step's log
        (keys under ``prefix``, docs/trainers.md); new findings go to the ``zeromon.integrations.hf``
        logger as warnings, on the main process. Never raises into training."""

        def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
            self.report = TrainerReport(prefix)
            self.figures_at: int | None = None  # the trainer step whose log carries the figures

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                           **kwargs: Any) -> None:
            handler, trainer = guarded("integration_frames", lambda: _calling_objects(CallbackHandler, Trainer),
                                       (None, None))
            if handler is not None:
                guarded("integration_order", lambda: self._go_ahead(handler), None)
            if trainer is not None:  # the outermost model (DDP, FSDP, the DeepSpeed engine): hooks see its forward
                self.report.attach(trainer.model_wrapped, trainer.optimizer)
            else:  # the agent finds the outermost module on its first forward
                self.report.attach(None, optimizer)

        def _go_ahead(self, handler: Any) -> None:
            reordered = _ahead_of_integrations(handler.callbacks, self)
            if reordered is not None:
                # A new list: the event being dispatched goes on over the old one undisturbed.
                handler.callbacks = reordered

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs is None:
                return
            values, texts = self.report.read()
            # Once a trainer step, with its first log: a later log at the same step (the end of training's summary,
            # an evaluation) gets none, or a logger would keep two points of one key at one step.
            step = getattr(state, "global_step", None)
            if values and (step is None or step != self.figures_at):
                self.figures_at = step
                logs.update(values)
                guarded("integration_history", lambda: _add_to_history(state, values), None)
            if texts and getattr(state, "is_world_process_zero", True):
                for text in texts:
                    log.warning("zeromon: %s", text)

    return ZeromonCallback


def _add_to_history(state: Any, values: dict[str, float]) -> None:
    """The values in the trainer's log history too (trainer_state.json), which copied the logs before
    the callbacks saw them; only into this step's entry."""
    history = state.log_history
    if history and history[-1].get("step") == state.global_step:
        history[-1].update(values)
