"""Adapters from our packed THD batches to the training stacks users run.

One module per stack, each importing its stack lazily (inside functions), so importing
``energon_pack.integrations`` costs nothing:

* :mod:`energon_pack.integrations.hf`: Hugging Face transformers Qwen2-VL / Qwen2.5-VL /
  Qwen3-VL forward keyword arguments, a varlen attention, and the packed loss.
* :mod:`energon_pack.integrations.bridge`: Megatron-Bridge's VLM and GPT-SFT roads (batch forms, dataset
  providers, config checks over one table of Bridge's rules, Bridge-described datasets).
"""
