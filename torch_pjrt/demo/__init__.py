"""The demo: a small GPT trained on the pjrt device from plain PyTorch code."""
