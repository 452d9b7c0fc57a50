"""hvdtorch inside other frameworks' training loops.

lightning.py is the Lightning strategy (``import hvdtorch.integrations.lightning``
registers ``strategy="hvdtorch"``).

Ray Train needs no module: docs/integrations.md shows hvdtorch under
Ray's TorchTrainer. Nothing here is imported eagerly by this file: each
integration needs its optional dependency.
"""
