"""Integrations: scaledl's collectives inside other training frameworks.

Each module imports its framework, so none is imported here (``import scaledl`` stays light):

- :mod:`scaledl.integrations.lightning`: ``ScaledlStrategy``, a PyTorch Lightning
  ``DDPStrategy`` whose gradient buckets are averaged by a scaledl algorithm
  (``pip install lightning``);
- :mod:`scaledl.integrations.accelerate`: ``register_comm_hook`` for a model prepared by
  Hugging Face Accelerate (``pip install accelerate``).
"""
