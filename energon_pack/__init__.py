"""energon_pack: streaming online sequence packing for Megatron-Energon (THD batches, no dropped samples, exact resume)."""

__version__ = "0.1.0"
