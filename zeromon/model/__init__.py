"""Events, samples and the recording codec shared by the agent and every client (stdlib only; reading
uses orjson when it is installed, as zeromon's own install has it)."""

from zeromon.model.events import (
    COLLECTIVE_OPS,
    MEMORY_CATEGORIES,
    AgentStats,
    CollectiveEvent,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    Phase,
    PhaseSpan,
    Record,
    RunInfo,
    StepSummary,
    Timing,
    ZeroMeaning,
)
from zeromon.model.jsonl import RecordingWriter
from zeromon.model.kinds import FORMAT_VERSION, encode_record, rank_file_name
from zeromon.model.recording import Recording, iter_records, read_recording
from zeromon.model.run_files import read_run

__all__ = [
    "COLLECTIVE_OPS",
    "FORMAT_VERSION",
    "MEMORY_CATEGORIES",
    "AgentStats",
    "CollectiveEvent",
    "DeviceSample",
    "MemorySample",
    "Notice",
    "OomEvent",
    "Phase",
    "PhaseSpan",
    "Record",
    "Recording",
    "RecordingWriter",
    "RunInfo",
    "StepSummary",
    "Timing",
    "ZeroMeaning",
    "encode_record",
    "iter_records",
    "rank_file_name",
    "read_recording",
    "read_run",
]
