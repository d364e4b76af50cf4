"""Entry point of the `torch.backends` group: `import torch` registers `pjrt`."""


def _autoload() -> None:
    import torch_pjrt  # noqa: F401  (importing registers the device)
