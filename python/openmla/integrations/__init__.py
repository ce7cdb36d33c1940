"""Integrations of OpenMLA with model libraries and serving engines (each imported on demand).

    from openmla.integrations import transformers   # Hugging Face transformers' DeepSeek models
    from openmla.integrations import vllm           # vLLM's FlashMLA calls (install() / patch())
    from openmla.integrations import sglang         # SGLang's sgl_kernel.flash_mla

How each engine is switched, and what it gains: docs/engines.md.
"""
