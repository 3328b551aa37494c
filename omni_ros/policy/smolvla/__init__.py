"""The SmolVLA family (LeRobot's SmolVLA checkpoints): SmolVLM's SigLIP + pixel-shuffle connector and the first
layers of its Llama-style decoder over [images, prompt, state], and a narrower action expert alternating
self- and cross-attention to the prefix KV cache.

    configuration.py  SmolVLAConfig (vision / text / expert sizes, tile, tokenizer, dims)
    modules.py        Llama RMSNorm / SiLU MLP / decoder layer, SmolVLM vision + connector, its RoPE
    modeling.py       SmolVLAModel: embed_prefix -> prefill -> denoise_step, sample
    processing.py     SmolVLAProcessor: LeRobot's image, prompt and state conventions
"""
