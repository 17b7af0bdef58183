"""The dtype behind each name the options use: --compress (the wire), --amp (autocast) and
--compute-dtype (ZeRO-3's gathers and reduce-scatters)."""
import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
