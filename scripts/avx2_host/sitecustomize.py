"""An AVX2-only host, as far as the software can tell, on an AVX-512 one: imported by every Python started with this
folder on ``PYTHONPATH`` and ``DRAFTSMITH_EMULATE_AVX2=1`` (``scripts/as_avx2_host`` sets both).

torch's own kernels are capped by ``ATEN_CPU_CAPABILITY=avx2``, oneDNN's by ``ONEDNN_MAX_CPU_ISA=AVX2`` and MKL's by
``MKL_ENABLE_INSTRUCTIONS=AVX2`` (the wrapper sets them); what they do not reach is code that asks torch which
instructions the CPU has: vLLM's CPU build loads its AVX2 kernels (``vllm/_C_AVX2``) only where
``torch.cpu._is_avx512_supported()`` is false. Here those questions answer as on an AVX2 host.

Not emulated: the cores themselves (clock, caches, memory). On an AMD EPYC Zen 4 host the emulation ran a float32
EAGLE-3 step and the target's float32 features ~10% faster than the AVX2 host (Zen 3) of BENCHMARKS.md did.
"""

import os

if os.environ.get("DRAFTSMITH_EMULATE_AVX2"):
    try:
        import torch.cpu as _cpu
    except ImportError:  # an interpreter without torch: nothing to answer
        _cpu = None
    for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if _cpu is not None and hasattr(_cpu, _name):
            setattr(_cpu, _name, lambda: False)
