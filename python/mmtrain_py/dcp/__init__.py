"""PyTorch Distributed Checkpoints through PyTorch's own code (bridge.py)."""
