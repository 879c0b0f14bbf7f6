"""GPT-SFT JSONL: mmap line index, lazy tokenisation, token-budget sampler, in-batch THD packer."""
