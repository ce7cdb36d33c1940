"""Integrations of OpenMLA with model libraries (each imported on demand).

    from openmla.integrations import transformers   # Hugging Face transformers' DeepSeek models
"""
