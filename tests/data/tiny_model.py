"""A small real model whose parameter counts are known by hand, for `zeromon plan --model` (tests/test_planner.py).

    embed   Embedding(200, 16)                  3200   (the head reuses this weight: counted once)
    blocks  2 x (Linear(16, 64) + Linear(64, 16))  2 x (1088 + 1040) = 4256
    mixer   two direct 48x48 parameters         4608   (the module with the most parameters of its own)
    norm    LayerNorm(16)                         32
    head    Linear(16, 200, bias=False), tied to embed.weight
    total   3200 + 4256 + 4608 + 32 = 12096; largest layer (DeepSpeed's definition) 4608, while the
            largest single tensor is the 3200-element embedding.
"""

from __future__ import annotations

import torch
from torch import nn

TOTAL_PARAMS = 12096
LARGEST_LAYER_PARAMS = 4608


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(48, 48))
        self.b = nn.Parameter(torch.zeros(48, 48))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.a @ self.b)[:16, :16]


class TinyTied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(200, 16)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)) for _ in range(2)))
        self.mixer = Mixer()
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 200, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.mixer(self.blocks(self.embed(tokens)))))


def build() -> nn.Module:
    return TinyTied()


def broken() -> nn.Module:
    raise RuntimeError("this factory fails on purpose")


def not_a_module() -> dict[str, int]:
    return {"params": 1}
