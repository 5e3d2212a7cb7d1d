"""Reading DeepSpeed JSON, accelerate YAML (for DeepSpeed or FSDP) and Lightning YAML configs for ``zeromon
lint``, and what the installed DeepSpeed knows about its own config.

Every problem with the file itself is a ``ZeromonError`` naming the file, and for a parse error the
parser's line and column (``ds.json:3:17: Expecting ',' delimiter``), never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any

from zeromon.analysis.lint import STATIC_SCHEMA, ConfigSchema
from zeromon.analysis.lint_lightning import flavor_of, strategy_location
from zeromon.analysis.lint_schema import STATIC_SCHEMA_VERSION
from zeromon.analysis.lint_types import (
    CHECKED_SECTIONS,
    OTHER_MODEL_SECTIONS,
    STATIC_TYPES,
    UNCHECKED,
    FieldType,
)
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen

_JSON_HINT = ("DeepSpeed configs read by accelerate and the Hugging Face Trainer are strict JSON: no comments, "
              "no trailing commas, double-quoted keys")


@frozen
class LoadedConfig:
    path: Path  # the file named on the command line
    # "deepspeed" (a DeepSpeed JSON), "accelerate" (an accelerate YAML for DeepSpeed), "accelerate-fsdp" (an
    # accelerate YAML for FSDP) or "lightning" (a LightningCLI or Fabric YAML with an FSDPStrategy)
    kind: str
    deepspeed: dict[str, Any] | None  # the DeepSpeed JSON: the file itself, or the one deepspeed_config_file names
    deepspeed_path: Path | None
    accelerate: dict[str, Any] | None  # the accelerate YAML's top level
    duplicate_keys: tuple[str, ...] = ()  # key paths repeated within one JSON object
    relative_deepspeed_file: bool = False  # deepspeed_config_file was a relative path
    lightning: dict[str, Any] | None = None  # the Lightning YAML's top level


class _Object(dict[str, Any]):
    """A JSON object that remembers the keys it saw twice (json.loads keeps the last silently)."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        seen: set[str] = set()
        self.repeated = [k for k, _ in pairs if k in seen or seen.add(k)]  # type: ignore[func-returns-value]


def _plain(value: Any, path: str, repeated: list[str]) -> Any:
    """Plain dicts again, collecting the dotted paths of repeated keys."""
    if isinstance(value, _Object):
        repeated.extend(f"{path}.{k}" if path else k for k in dict.fromkeys(value.repeated))
        return {k: _plain(v, f"{path}.{k}" if path else k, repeated) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, path, repeated) for v in value]
    return value


def _read_text(path: Path, what: str = "config file") -> str:
    if not path.exists():
        raise ZeromonError(f"{path}: no such {what}")
    if path.is_dir():
        raise ZeromonError(f"{path}: is a directory, not a {what}",
                           hint="give a DeepSpeed JSON (ds_config.json) or an accelerate YAML config")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ZeromonError(f"{path}: not UTF-8 text (byte {exc.start}): not a JSON or YAML config") from None
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_deepspeed_json(path: Path) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A DeepSpeed JSON config as a dict, and the key paths that appear twice in one object."""
    text = _read_text(path)
    try:
        data = json.loads(text, object_pairs_hook=_Object)
    except json.JSONDecodeError as exc:
        raise ZeromonError(f"{path}:{exc.lineno}:{exc.colno}: {exc.msg}", hint=_JSON_HINT) from None
    except RecursionError:
        raise ZeromonError(f"{path}: nested too deeply to be a DeepSpeed config") from None
    except ValueError as exc:  # an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise ZeromonError(f"{path}: {str(exc).split(';')[0]}: not a number a DeepSpeed config holds") from None
    if not isinstance(data, dict):
        raise ZeromonError(f"{path}: the top level is {_kind_of(data)}, expected a JSON object {{...}} of "
                           "DeepSpeed settings")
    repeated: list[str] = []
    try:
        return _plain(data, "", repeated), tuple(repeated)
    except RecursionError:
        raise ZeromonError(f"{path}: nested too deeply to be a DeepSpeed config") from None


def _kind_of(value: Any) -> str:
    if value is None:
        return "empty (null)"
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def _read_yaml(path: Path) -> Any:
    import yaml

    text = _read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise ZeromonError(f"{path}{where}: {what}") from None
    except yaml.YAMLError as exc:
        raise ZeromonError(f"{path}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ZeromonError(f"{path}: nested too deeply to be an accelerate config") from None
    except ValueError as exc:  # an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise ZeromonError(f"{path}: {str(exc).split(';')[0]}: not a number an accelerate config holds") from None


def _is_json(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return True
    if suffix in (".yaml", ".yml"):
        return False
    return _read_text(path).lstrip().startswith("{")


def load_config(path: Path) -> LoadedConfig:
    """Read CONFIG: a DeepSpeed JSON (``.json``, or any file starting with ``{``), an accelerate YAML (for
    DeepSpeed or FSDP) or a Lightning YAML whose strategy is an FSDPStrategy."""
    if _is_json(path):
        config, repeated = read_deepspeed_json(path)
        return LoadedConfig(path, "deepspeed", config, path, None, repeated)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ZeromonError(f"{path}: the top level is {_kind_of(data)}, expected an accelerate config (a mapping "
                           "with distributed_type and a deepspeed_config or fsdp_config block) or a Lightning one "
                           "(trainer: strategy: ...)")
    if _is_lightning(data):
        return _lightning_config(path, data)
    distributed = str(data.get("distributed_type")).upper()
    fsdp = data.get("fsdp_config")
    if distributed == "FSDP" or (distributed != "DEEPSPEED" and fsdp and data.get("deepspeed_config") is None):
        if fsdp is not None and not isinstance(fsdp, dict):
            raise ZeromonError(f"{path}: fsdp_config is {_kind_of(fsdp)}, expected a mapping of accelerate's FSDP "
                               "settings")
        return LoadedConfig(path, "accelerate-fsdp", None, None, data)
    block = data.get("deepspeed_config")
    if block is None and "deepspeed_config" in data and distributed == "DEEPSPEED":
        block = data["deepspeed_config"] = {}  # an empty block: accelerate's defaults (ZeRO-2)
    if block is None:
        looks_deepspeed = "zero_optimization" in data or "train_batch_size" in data
        raise ZeromonError(
            f"{path}: no deepspeed_config or fsdp_config block (distributed_type: "
            f"{data.get('distributed_type', 'not set')}); zeromon lint reads DeepSpeed JSON configs, accelerate "
            "configs for DeepSpeed or FSDP, and Lightning configs with an FSDPStrategy",
            hint=("this looks like a DeepSpeed config written in YAML: DeepSpeed reads JSON, so save it as .json"
                  if looks_deepspeed else "run `accelerate config` and choose DeepSpeed or FSDP, or lint the "
                  "DeepSpeed JSON"))
    if not isinstance(block, dict):
        raise ZeromonError(f"{path}: deepspeed_config is {_kind_of(block)}, expected a mapping of accelerate's "
                           "DeepSpeed settings")
    file_value = block.get("deepspeed_config_file")
    if file_value in (None, "", "none"):
        return LoadedConfig(path, "accelerate", None, None, data)
    if not isinstance(file_value, str):
        raise ZeromonError(f"{path}: deepspeed_config.deepspeed_config_file is {_kind_of(file_value)}, expected "
                           "a path to a DeepSpeed JSON")
    # os.path's: '~name' of a user this machine does not know stays as written (as a shell leaves it), where
    # Path.expanduser raises RuntimeError
    named = Path(os.path.expanduser(file_value))
    target = named if named.is_absolute() else path.parent / named
    if not target.exists() and not named.is_absolute() and named.exists():
        target = named  # accelerate itself opens it relative to the launch directory
    if not target.exists():
        tried = str(target) if named.is_absolute() else f"{target} (or {named} from the current directory)"
        raise ZeromonError(f"{path}: deepspeed_config.deepspeed_config_file {file_value!r}: no such file: {tried}")
    config, repeated = read_deepspeed_json(target)
    return LoadedConfig(path, "accelerate", config, target, data, repeated, not named.is_absolute())


def _is_lightning(data: dict[str, Any]) -> bool:
    """A LightningCLI or Fabric config: settings under trainer: or fabric:, or a strategy, and none of accelerate's."""
    accelerate_keys = ("distributed_type", "compute_environment", "deepspeed_config", "fsdp_config")
    return not any(k in data for k in accelerate_keys) and (
        isinstance(data.get("trainer"), dict) or isinstance(data.get("fabric"), dict) or "strategy" in data)


def _lightning_config(path: Path, data: dict[str, Any]) -> LoadedConfig:
    found = strategy_location(data)
    if found is None:
        raise ZeromonError(f"{path}: no trainer.strategy: without one Lightning runs its default strategy, not "
                           "FSDP, and zeromon lint checks Lightning's FSDPStrategy",
                           hint="set trainer: strategy: {class_path: lightning.pytorch.strategies.FSDPStrategy, "
                                "init_args: {...}}")
    where, value = found
    if isinstance(value, dict) and not isinstance(value.get("class_path"), str):
        raise ZeromonError(f"{path}: {where} has no class_path (a mapping strategy is class_path: ... with "
                           "init_args: ...)", hint="class_path: lightning.pytorch.strategies.FSDPStrategy")
    if flavor_of(where, value) is None:
        named = value.get("class_path") if isinstance(value, dict) else value
        raise ZeromonError(f"{path}: {where} is {named!r}: zeromon lint checks Lightning's FSDPStrategy "
                           "(class_path lightning.pytorch.strategies.FSDPStrategy or lightning.fabric.strategies."
                           "FSDPStrategy, or strategy: fsdp)",
                           hint="for DeepSpeedStrategy, lint the DeepSpeed JSON its config argument names")
    for block in ("init_args", "dict_kwargs"):
        inner = value.get(block) if isinstance(value, dict) else None
        if inner is not None and not isinstance(inner, dict):
            raise ZeromonError(f"{path}: {where}.{block} is {_kind_of(inner)}, expected a mapping of "
                               "FSDPStrategy's arguments")
    return LoadedConfig(path, "lightning", None, None, None, lightning=data)


# ------------------------------------------------------------------------------------ DeepSpeed's own schema


def installed_schema() -> ConfigSchema:
    """What the installed DeepSpeed accepts, as cheaply as it can be known.

    With the release STATIC_SCHEMA was written from (a test checks the two agree), the static list, named
    as the installed version's: importing DeepSpeed and torch to read it again costs 1.5 s warm and
    several seconds cold. Another release: read from DeepSpeed itself. None installed: the static list.
    """
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return STATIC_SCHEMA
    if version == STATIC_SCHEMA_VERSION:
        return dataclasses.replace(STATIC_SCHEMA, origin=f"DeepSpeed {version} (installed)")
    return deepspeed_schema() or STATIC_SCHEMA


def deepspeed_schema() -> ConfigSchema | None:
    """The keys, removed keys, deprecations and defaults of the installed DeepSpeed, read from its pydantic
    config models and its config parser; None when DeepSpeed is not importable (use STATIC_SCHEMA).

    Costs the import of DeepSpeed (and torch), about 1.5 s. DeepSpeed logs to stdout on import, at
    warning level and below, things that are no news to a config check ("Setting accelerator to
    CPU"): those are dropped, errors are kept, and anything printed goes to stderr so that ``--json``
    output stays clean.
    """
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _deepspeed_schema()
    except Exception:  # any import or API change in DeepSpeed: fall back to the static list
        return None
    finally:
        logging.disable(disabled)


def _deepspeed_schema() -> ConfigSchema:
    import deepspeed
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig
    from deepspeed.utils.config import TIMERS_THROUGHPUT

    sections: dict[str, frozenset[str]] = {}
    deprecated: dict[str, str] = {}
    types: dict[str, FieldType] = {}

    def model_of(annotation: Any) -> type | None:
        for candidate in (annotation, *typing.get_args(annotation)):
            if isinstance(candidate, type) and issubclass(candidate, DeepSpeedConfigModel):
                return candidate
        return None

    def validated(model: Any) -> set[str]:
        decorators = getattr(model, "__pydantic_decorators__", None)
        found: set[str] = set()
        for decorator in getattr(decorators, "field_validators", {}).values():
            found.update(decorator.info.fields)
        return found

    def walk(model: Any, section: str) -> None:
        keys = set()
        for name, info in model.model_fields.items():
            keys.add(name)
            if info.alias:
                keys.add(info.alias)  # populate_by_name: both spellings are accepted
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get("deprecated"):
                new = str(extra.get("new_param") or "")  # a field name, or prose ("offload_param or ...")
                deprecated[f"{section}.{name}"] = f"{section}.{new}" if new.isidentifier() else new or "nothing"
            field_type = _field_type(info, DeepSpeedConfigModel) if section in CHECKED_SECTIONS else None
            if name in validated(model):  # a validator of its own (fp16.loss_scale): what zeromon wrote down
                field_type = STATIC_TYPES.get(f"{section}.{name}", field_type)
            if field_type is not None and f"{section}.{name}" not in UNCHECKED:
                types.update({f"{section}.{key}": field_type for key in (name, info.alias) if key})
            sub = model_of(info.annotation)
            for key in dict.fromkeys((info.alias, name) if sub is not None else ()):
                if key:
                    walk(sub, f"{section}.{key}")
        sections[section] = frozenset(keys)

    walk(DeepSpeedZeroConfig, "zero_optimization")
    walk(DeepSpeedFP16Config, "fp16")
    walk(DeepSpeedBF16Config, "bf16")
    for section, model in _other_section_models().items():
        walk(model, section)
    sections[""] = frozenset(_top_level_keys(ds_config)) | STATIC_SCHEMA.sections[""]
    sections["timers"] = frozenset({TIMERS_THROUGHPUT})  # get_timers_config reads this key alone
    removed = {k: v for k, v in getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}).items()}
    removed.update({f"zero_optimization.{k}": v
                    for k, v in getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {}).items()})
    overlap = tuple(bool(DeepSpeedZeroConfig(stage=s).overlap_comm) for s in range(4))
    pin_default = bool(DeepSpeedZeroOffloadOptimizerConfig.model_fields["pin_memory"].default)
    return ConfigSchema(sections=sections, removed=removed, deprecated=deprecated,
                        overlap_comm_default=(overlap[0], overlap[1], overlap[2], overlap[3]),
                        pin_memory_default=pin_default, origin=f"DeepSpeed {deepspeed.__version__} (installed)",
                        types=types)


def _other_section_models() -> dict[str, type]:
    """The pydantic models of DeepSpeed's OTHER_MODEL_SECTIONS, by the key path of the block each is built from."""
    from deepspeed.comm.config import CommsLoggerConfig
    from deepspeed.compile.config import CompileConfig
    from deepspeed.monitor.config import CometConfig, CSVConfig, TensorBoardConfig, WandbConfig
    from deepspeed.runtime.config import HybridEngineConfig
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.utils.config import DeepSpeedThroughputTimerConfig

    models: dict[str, type] = {"tensorboard": TensorBoardConfig, "wandb": WandbConfig, "csv_monitor": CSVConfig,
                               "comet": CometConfig, "compile": CompileConfig, "hybrid_engine": HybridEngineConfig,
                               "comms_logger": CommsLoggerConfig, "timers.throughput": DeepSpeedThroughputTimerConfig,
                               "tensor_parallel": TPTrainingConfig}
    assert tuple(models) == OTHER_MODEL_SECTIONS
    return models


def _field_type(info: Any, config_model: type) -> FieldType | None:
    """A pydantic field of DeepSpeed's config models as zeromon's lint checks it; None for what it leaves to
    other rules (the stage, an int enum) or cannot say (a field of any object)."""
    annotation, optional = info.annotation, False
    args = typing.get_args(annotation)
    if type(None) in args:
        optional = True
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else annotation

    def bound(name: str) -> float | None:
        found = [getattr(meta, name) for meta in info.metadata if getattr(meta, name, None) is not None]
        return found[0] if found else None

    if annotation in (bool, int, float):
        return FieldType(annotation.__name__, optional, ge=bound("ge"), gt=bound("gt"), le=bound("le"))
    choices = _choices(annotation)
    if choices is not None:
        return FieldType("choice", optional, choices=choices) if choices else None
    origin, args = typing.get_origin(annotation) or annotation, typing.get_args(annotation)
    if origin in (list, tuple) and not args:  # a bare list or tuple: any items
        return FieldType("list", optional)
    item_choices = _choices(args[0]) if origin is list and len(args) == 1 else None
    if item_choices:  # List[Literal[...]]
        return FieldType("list", optional, choices=item_choices)
    if origin is dict and args in ((), (str, Any)):  # JSON's keys are strings: any object
        return FieldType("section", optional)
    return _class_field_type(annotation, optional, config_model)


def _choices(annotation: Any) -> tuple[str, ...] | None:
    """The values of a Literal or an Enum, () when they are not all strings; None for other annotations."""
    import enum

    if typing.get_origin(annotation) is typing.Literal:
        values = typing.get_args(annotation)
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = tuple(m.value for m in annotation)
    else:
        return None
    return values if all(isinstance(v, str) for v in values) else ()


def _class_field_type(annotation: Any, optional: bool, config_model: type) -> FieldType | None:
    import pathlib

    if not isinstance(annotation, type) or annotation is object:
        return None
    if annotation is str:
        return FieldType("str", optional)
    if annotation is pathlib.Path:
        return FieldType("path", optional)
    if issubclass(annotation, config_model):
        return FieldType("section", optional)
    if issubclass(annotation, str | int | float | list | dict | tuple | pathlib.PurePath):
        return None  # a type pydantic reads some JSON value as, that zeromon does not mirror
    # arbitrary_types_allowed: an isinstance check, which no value read from JSON passes
    return FieldType("object", optional, python_type=f"{annotation.__module__}.{annotation.__qualname__}")


def _top_level_keys(ds_config: Any) -> set[str]:
    """The top-level keys DeepSpeedConfig reads: its parser run on a dict that records every key looked up."""
    seen: set[str] = set()

    class Keys:
        def __init__(self, data: dict[str, Any]) -> None:
            self.data = data

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return key in self.data

        def __iter__(self) -> typing.Iterator[str]:
            return iter(self.data)

    class Recorder(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
            seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> Any:
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return super().__contains__(key)

        def keys(self) -> Any:
            return Keys(dict(self))

    parser = object.__new__(ds_config.DeepSpeedConfig)
    parser.world_size, parser.global_rank = 1, 0
    parser._initialize_params(Recorder({"train_batch_size": 1}))
    return seen
