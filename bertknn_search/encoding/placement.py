"""Placement: where the encoder runs (CPU or which GPU) and in what arithmetic (fp32, bf16, int8)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertknn_search.config import PRECISIONS
from bertknn_search.errors import ConfigError, IndexMismatchError, ModelLoadError


@dataclass(frozen=True)
class Placement:
    """Where the encoder runs: the torch device, the precision chosen for it and why.

    Attributes:
        device: a torch.device (typed loosely so that importing this module does not import torch).
        dtype: the dtype the weights are loaded in (float32 for int8, whose blocks are quantized after).
        precision: "fp32", "bf16" or "int8" (never "auto": this is what auto chose).
        why: how it was chosen, for the line an ingest prints.
    """

    device: Any
    dtype: Any
    precision: str = "fp32"
    why: str = ""

    def describe(self) -> str:
        """One line for stderr: what the encoder computes in, where, and how to change it."""
        return f"encoder: {self.precision} on {self.device} ({self.why})"


DEVICES = "auto, cpu, cuda or cuda:N"
# CPU flags (as /proc/cpuinfo names them) that make bf16 matrix products fast on a CPU.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
OVERRIDE = "--precision fp32|bf16|int8 overrides"


def int8_available() -> bool:
    """Whether torch can run dynamically quantized int8 Linear layers here (fbgemm on x86, qnnpack on ARM)."""
    import torch

    engines = set(torch.backends.quantized.supported_engines) - {"none"}
    return bool(engines) and hasattr(torch.ao.quantization, "quantize_dynamic")


def choose_precision(
    requested: str, device_type: str, cpu_flags: frozenset[str], int8_ok: bool = True
) -> tuple[str, str]:
    """The arithmetic the encoder uses: ``requested``, or for "auto" the fastest exact-enough one here.

    - GPU: bf16 (tensor cores, fp32's range; the keys agree with fp32 to cosine 0.9999).
    - CPU with AVX512-BF16 or AMX: bf16, about twice fp32's speed there.
    - Any other CPU: fp32. bf16 without those instructions is emulated and several times slower than
      fp32. int8 (dynamic quantization of the blocks' Linear layers) is faster (2x for a question with
      BERT-base on an AVX2 CPU) but not exact enough to be chosen unasked: on trained MiniLM it changed
      kNN's top word for 1.4% of contexts and a quarter of the 10 nearest (README, *Performance*).

    Args:
        requested: one of ``PRECISIONS``.
        device_type: "cpu" or "cuda".
        cpu_flags: the CPU's feature flags (``threads.cpu_flags``).
        int8_ok: whether torch can run int8 here (``int8_available``).

    Returns:
        (precision, why it was chosen).

    Raises:
        ConfigError: an unknown precision, or int8 where it cannot run (a GPU, or a torch without it).
    """
    if requested not in PRECISIONS:
        raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested == "int8" and device_type != "cpu":
        raise ConfigError(
            "precision int8 (from --precision or the index) runs on a CPU only: torch's dynamic int8"
            " quantization has no GPU kernels; use --device cpu, or an index encoded in fp32 or bf16"
        )
    if requested == "int8" and not int8_ok:
        raise ConfigError("precision int8 is not available in this torch build; use --precision fp32")
    if requested != "auto":
        return requested, "set by --precision or the index"
    if device_type != "cpu":
        return "bf16", f"auto: bf16 on a GPU; {OVERRIDE}"
    found = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags]
    if found:
        return "bf16", f"auto: this CPU has {found[0].upper().replace('_', '-')}; {OVERRIDE}"
    return "fp32", f"auto: no AVX512-BF16 or AMX on this CPU, so bf16 would be slower; {OVERRIDE}"


def place(device: str, precision: str = "auto") -> Placement:
    """Choose device and precision (see ``choose_precision``).

    This is the one place that branches on the device kind. On the CPU, torch's thread pool is sized
    to the cores this process may use (see ``threads.size_torch_threads``).

    Raises:
        ConfigError: ``device`` is not one of auto, cpu, cuda, cuda:N, or N is not a GPU here; a
            precision that cannot run here.
        ModelLoadError: a GPU was asked for and there is none.
    """
    import torch

    from bertknn_search.encoding.threads import cpu_flags, size_torch_threads

    name = device.strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    kind, colon, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (
        colon and (kind == "cpu" or not (index.isascii() and index.isdigit()))
    ):
        raise ConfigError(f"device {device!r} (--device or BERTKNN_DEVICE) is not one of {DEVICES}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"--device {device} asked for, but no CUDA GPU is available; use --device cpu"
            )
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise ConfigError(
                f"device {device!r} asked for, but this machine has {count} GPU(s):"
                f" cuda:0 to cuda:{count - 1}"
            )
    chosen, why = choose_precision(precision, kind, cpu_flags(), int8_available())
    size_torch_threads()
    dtype = torch.bfloat16 if chosen == "bf16" else torch.float32
    return Placement(torch.device(name), dtype, chosen, why)


def check_precision(index_precision: str, encoder_precision: str, where: str) -> None:
    """Refuse to add contexts of another precision to an index: its keys would not be comparable.

    Raises:
        IndexMismatchError: the two differ.
    """
    if index_precision != encoder_precision:
        raise IndexMismatchError(
            f"index at {where} holds contexts encoded in {index_precision}, not {encoder_precision};"
            f" use --precision {index_precision} (or auto) or another --index"
        )
