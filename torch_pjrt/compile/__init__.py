"""torch.compile support: the "pjrt" Dynamo backend (see backend.py)."""
