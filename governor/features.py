"""The workload features the policy decides on, shared by the daemon, the clients and the model pipeline.

One module, so the trainer and the daemon cannot drift apart: the order and encoding of the tree's inputs live here.
The five features are those of the paper's tree (docs/energy-model.md): model type, GPU utilization, layers, hidden
size and average sequence length (tokens per sample, not the padded length).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ModelType = Literal["encoder", "decoder"]

# The tree's input vector, in this order. model_type is encoded as a number so that a scikit-learn tree can split on it.
FEATURE_ORDER: tuple[str, ...] = ("model_type", "gpu_util", "num_layers", "hidden_size", "seq_len")
MODEL_TYPE_CODES: dict[str, int] = {"encoder": 0, "decoder": 1}

# Physical ranges, well past any model an Orin can fine-tune: what a client may claim, so that every number downstream
# (the energy model's estimate, the exporter, the reports) is finite and nonzero. A job has at least one token per
# sample; the largest published models have about 100 layers and a hidden size of about 16k; 4M tokens a sample is past
# any context window.
MAX_LAYERS = 1000
MAX_HIDDEN_SIZE = 1 << 17
MIN_SEQ_LEN = 1.0
MAX_SEQ_LEN = float(1 << 22)


def finite_number(v):
    """A before-validator for a float field: an int becomes a float; a boolean, NaN or an infinity is refused.
    JSON has no NaN, but Python's json module accepts it: refused here, where the number is read."""
    if isinstance(v, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(v, int):
        return float(v)
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


class Features(BaseModel):
    """What a job tells the daemon about itself. Strict: a string where a number belongs is an error, not a guess."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model_type: ModelType
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_HIDDEN_SIZE)
    seq_len: float = Field(ge=MIN_SEQ_LEN, le=MAX_SEQ_LEN, description="average tokens per sample")
    gpu_util: float | None = Field(default=None, ge=0, le=100, description="GPU utilization, percent")

    _finite = field_validator("seq_len", "gpu_util", mode="before")(finite_number)

    @classmethod
    def of(cls, carrier: Features) -> Features:
        """The Features alone of a model that carries more (a register request's parameters, with its name and pid)."""
        return cls.model_validate({name: getattr(carrier, name) for name in cls.model_fields})

    def vector(self) -> list[float]:
        """The tree's input, in FEATURE_ORDER. gpu_util must be known by now (measured when the client gave none)."""
        if self.gpu_util is None:
            raise ValueError("gpu_util must be measured before the features are encoded")
        return [float(self.encoded(name)) for name in FEATURE_ORDER]

    def encoded(self, name: str) -> float:
        value = getattr(self, name)
        return MODEL_TYPE_CODES[value] if name == "model_type" else float(value)


# Hugging Face config.model_type values whose models are encoder-only; anything else with a causal LM head is a decoder.
ENCODER_MODEL_TYPES = frozenset(
    {"bert", "roberta", "deberta", "deberta-v2", "distilbert", "albert", "electra", "xlm-roberta", "camembert",
     "mpnet", "modernbert", "megatron-bert", "ernie", "rembert"}
)


class IncompleteHFConfig(ValueError):
    """A Hugging Face config that does not tell the structural features ``missing`` (snake_case, for a caller to word
    as its own options): ``why`` says what it lacks."""

    def __init__(self, why: str, missing: list[str]):
        super().__init__(f"{why}: missing {', '.join(missing)}")
        self.why, self.missing = why, missing


_CONFIG_WORDS = {"num_layers": "layer count", "hidden_size": "hidden size"}


def from_hf_config(config, given: dict | None = None) -> dict:
    """Structural features from a Hugging Face PretrainedConfig (or a dict of its fields).

    Returns model_type, num_layers and hidden_size; seq_len and gpu_util come from the data and the GPU. ``given``:
    those the caller names itself, which win over the config's and stand in for what it does not name. Raises
    IncompleteHFConfig for what is still missing.

    An encoder-decoder (T5, BART, Whisper) is neither kind the tree was trained on, and its ``num_layers`` counts the
    encoder's alone: its model_type and num_layers must be given.
    """
    given = {k: v for k, v in (given or {}).items() if v is not None}
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    hf_type = str(get("model_type", "") or "").lower()
    if get("is_encoder_decoder", False):
        missing = [k for k in ("model_type", "num_layers") if k not in given]
        if missing:
            raise IncompleteHFConfig(f"model_type {hf_type!r} is an encoder-decoder model, which the tree does not "
                                     "know (it knows encoder-only and decoder-only models)", missing)
    found = {"num_layers": get("num_hidden_layers") or get("n_layer") or get("num_layers"),
             "hidden_size": get("hidden_size") or get("n_embd") or get("d_model")}
    missing = [k for k, v in found.items() if not v and k not in given]
    if missing:
        raise IncompleteHFConfig(f"config of model_type {hf_type!r} names no "
                                 f"{' or '.join(_CONFIG_WORDS[k] for k in missing)}", missing)
    is_encoder = hf_type in ENCODER_MODEL_TYPES or (not get("is_decoder", False) and hf_type.endswith("bert"))
    return {"model_type": "encoder" if is_encoder else "decoder", **{k: int(v) for k, v in found.items() if v},
            **given}
