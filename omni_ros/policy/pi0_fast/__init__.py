"""The pi0-FAST family: pi0's PaliGemma backbone (SigLIP, Gemma) decoding FAST action tokens one at a time.

configuration.py  Pi0FastConfig (architecture, prompt and decoding rules of LeRobot 0.6.1's `pi0_fast`)
modeling.py       Pi0FastModel: embed_prefix -> prefill (first-token logits) -> decode_step, greedy `generate`
fast.py           FastDetokenizer: generated PaliGemma ids -> FAST ids -> BPE -> DCT coefficients -> actions
processing.py     Pi0FastProcessor: observations -> inputs (the pi0-FAST prompt), actions back to robot units
runner.py         Pi0FastTorchRunner: the KV-cached greedy decode loop, timed per token
"""
