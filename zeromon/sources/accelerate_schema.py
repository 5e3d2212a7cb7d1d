"""What the installed accelerate's FSDP launcher accepts, read from accelerate itself.

The facts ``zeromon lint`` checks an accelerate FSDP config against come from accelerate's own parser and
lists where accelerate is importable: the ``accelerate launch`` argument group "FSDP Arguments" (keys,
defaults, the FSDP versions), ``accelerate.utils.constants``' FSDP_* lists (the choices), the config
file's dataclass (its top-level keys), ``DistributedType`` and the ``accelerate to-fsdp2`` converter's
tables (what FSDP2 drops, and what each FSDP1 strategy becomes). Without accelerate, the static list.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import sys

from zeromon.analysis.lint_fsdp_schema import (
    STATIC_ACCELERATE_FSDP,
    STATIC_ACCELERATE_VERSION,
    AccelerateFsdpSchema,
)


def installed_accelerate_schema() -> AccelerateFsdpSchema:
    """The installed accelerate's facts, as cheaply as they can be known.

    With the release the static list was written from (a test checks the two agree), the static list named
    as the installed version's: importing accelerate imports torch, several seconds cold. Another release:
    read from accelerate itself. None installed, or one that cannot be read: the static list.
    """
    try:
        version = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        return STATIC_ACCELERATE_FSDP
    if version == STATIC_ACCELERATE_VERSION:
        return dataclasses.replace(STATIC_ACCELERATE_FSDP, origin=f"accelerate {version} (installed)")
    return accelerate_schema() or STATIC_ACCELERATE_FSDP


def accelerate_schema() -> AccelerateFsdpSchema | None:
    """The installed accelerate's FSDP facts; None when accelerate is not importable or has moved them.

    Anything printed while importing goes to stderr, so that ``--json`` output stays clean.
    """
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _accelerate_schema()
    except Exception:  # any import or API change in accelerate: fall back to the static list
        return None
    finally:
        logging.disable(disabled)


def _accelerate_schema() -> AccelerateFsdpSchema:
    import accelerate
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.commands.to_fsdp2 import ARGUMENT_KEY_MAPPING, ARGUMENT_VALUE_MAPPING, ConversionStatus
    from accelerate.utils import DistributedType, constants

    group = next(g for g in launch_command_parser()._action_groups if g.title == "FSDP Arguments")
    actions = {a.dest: a for a in group._group_actions}
    # fsdp_ignored_modules has no flag: the launcher reads it from the file alone (prepare_multi_gpu_env)
    keys = frozenset(actions) | {"fsdp_ignored_modules"}
    # the flags whose default is "true" or "false"; fsdp_reshard_after_forward is a boolean for FSDP2 alone (a
    # strategy name for FSDP1, as its help says), so the lint checks it by version
    bools = frozenset(name for name, a in actions.items() if str(a.default).lower() in ("true", "false")
                      and name != "fsdp_reshard_after_forward")
    dropped = {key: {ConversionStatus.REMOVED: "removed", ConversionStatus.NOT_YET_IMPLEMENTED:
                     "not yet implemented"}[status]
               for key, status in ARGUMENT_KEY_MAPPING.items() if isinstance(status, ConversionStatus)}
    top_level = frozenset(ClusterConfig.__dataclass_fields__) | {"fp16", "dynamo_backend"}  # process_config's
    return AccelerateFsdpSchema(
        top_level=top_level,
        distributed_types=tuple(t.value for t in DistributedType),
        fsdp_keys=keys,
        defaults={name: a.default for name, a in actions.items()},
        bool_keys=bools,
        fsdp_versions=tuple(actions["fsdp_version"].choices or ("1", "2")),
        sharding_strategies=tuple(constants.FSDP_SHARDING_STRATEGY),
        auto_wrap_policies=tuple(constants.FSDP_AUTO_WRAP_POLICY),
        backward_prefetch=tuple(constants.FSDP_BACKWARD_PREFETCH),
        state_dict_types=tuple(constants.FSDP_STATE_DICT_TYPE),
        fsdp2_state_dict_types=tuple(constants.FSDP2_STATE_DICT_TYPE),
        fsdp2_dropped=dropped,
        fsdp2_reshard_of=dict(ARGUMENT_VALUE_MAPPING["fsdp_sharding_strategy"]),
        origin=f"accelerate {accelerate.__version__} (installed)",
    )
