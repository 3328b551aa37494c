"""The pi0 family: SigLIP-style vision, a Gemma-style VLM backbone with a prefix KV cache, and a
flow-matching action expert (pi0's layout). omni_ros's own checkpoints are this family.

    configuration.py  ModelConfig (what config.json stores)     presets.py     built-in sizes
    vision.py / backbone.py / action_expert.py / gemma.py         the modules
    modeling.py       Pi0Model: embed_prefix -> prefill -> denoise_step, sample, loss
    processing.py     Pi0Processor: observations <-> tensors, normalization, relative actions
"""
